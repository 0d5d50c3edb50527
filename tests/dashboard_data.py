"""The logs and stores the dashboard's tests (AppTest) and the browser's tests (a served dashboard) open."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from helpers import rec, write_jsonl

from specdec_core.contract.identity import DecodeRequest
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

if TYPE_CHECKING:
    from specdec_core.decoding.engine import SpecDecoder


T0 = "2026-03-01T10:"


def incident_records() -> list[dict]:
    """prod: one miss, one clean hit and two hits served to other identities (r4 also longer than its
    max_tokens); staging: two misses of other prompts on a second target model."""
    return [
        rec("r1", ts=T0 + "00:00Z"),
        rec("r2", ts=T0 + "01:00Z", cache_hit=True, latency_ms=5.0),
        rec("r3", ts=T0 + "02:00Z", cache_hit=True, max_tokens=16, latency_ms=5.0),
        rec("r4", ts=T0 + "03:00Z", cache_hit=True, max_tokens=2, draft_model="llama-3b", latency_ms=5.0),
        rec("s1", ts=T0 + "05:00Z", deployment="staging", cache_key="k-9", prompt="Other", target_model="qwen-7b",
            draft_model=None, draft_tokens=None, accepted_tokens=None),
        rec("s2", ts=T0 + "06:00Z", deployment="staging", cache_key="k-10", prompt="Third",
            target_model="qwen-7b", draft_model=None, draft_tokens=None, accepted_tokens=None),
    ]


def build_db(folder: Path, records: list, name: str = "triage") -> Path:
    log = write_jsonl(folder / f"{name}.jsonl", records)
    db = folder / f"{name}.duckdb"
    ingest(Store(db), [str(log)])
    return db


def build_incident_db(folder: Path) -> Path:
    """The incident database; the browser test opens the same one."""
    return build_db(folder, incident_records(), "incident")


SCRIPT = "<script>alert(1)</script>"


HTML_OUTPUT = '<img src=x onerror="alert(2)"><b>bold</b> & [link](javascript:alert(3))'


HTML_DEPLOYMENT = "<i>prod</i>"


HTML_MODEL = "m[x](javascript:alert(4))"


# An image in markdown loads from the address the log gave it, as the on-call engineer opens the page.
HTML_CONSUMER = "![c](http://example.invalid/c.png)<u>c</u>"


HTML_REQUEST_ID = "x2[r](javascript:alert(5))"


def html_records() -> list[dict]:
    """A miss and a contaminated hit on it whose every name and text would be markup if shown unescaped."""
    html = {"deployment": HTML_DEPLOYMENT, "target_model": HTML_MODEL, "consumer": HTML_CONSUMER}
    return [
        rec("x1", ts=T0 + "00:00Z", prompt=SCRIPT, output_text=HTML_OUTPUT, **html),
        rec(HTML_REQUEST_ID, ts=T0 + "01:00Z", prompt=SCRIPT, cache_hit=True, output_text=HTML_OUTPUT, max_tokens=2,
            **html),
    ]


PROMPT = "The cache key"


TINY = {"target_model": "tiny-target", "draft_model": "tiny-draft-a", "num_speculative_tokens": 4,
        "temperature": 0.0, "tokenizer_version": "tiny-tok-v1", "prompt": PROMPT}


def build_foreign_db(folder: Path, engine: SpecDecoder) -> tuple[Path, dict]:
    """m1 (max_tokens 24) put its output under key k; h1 (max_tokens 6) hit k and was served it.
    Returns the database and what the tiny models answer for max_tokens 24 and 6."""
    outputs = {n: engine.generate(DecodeRequest(max_tokens=n, **TINY)) for n in (24, 6)}
    assert outputs[24].text != outputs[6].text
    long = outputs[24]
    served = {"output_text": long.text, "output_tokens": len(long.token_ids), "cache_key": "k"}
    db = build_db(folder, [
        rec("m1", ts="2026-03-01T10:00:00Z", max_tokens=24, draft_tokens=long.draft_tokens,
            accepted_tokens=long.accepted_tokens, **served, **TINY),
        rec("h1", ts="2026-03-01T10:01:00Z", max_tokens=6, cache_hit=True, **served, **TINY),
    ])
    return db, outputs


# Deployment names that markdown would turn into a link, a mail link or an icon: log text must stay inert.
HOSTILE_DEPLOYMENTS = ('=HYPERLINK("http://evil.example/x","click")', "http://evil.example",
                       "www.evil.example", "ops@evil.example", ":material/warning: :smile:")
