"""`specdec ingest` + `specdec report` against a plain-Python reading of the contract, on random logs.

The reference below is written from shared/log-schema.md ("Contamination", "Mismatch
report"), one record at a time, with none of the store's SQL: a hit's source is the
latest earlier miss with the same deployment and cache_key (a miss at the same instant
counts as earlier; among misses at one instant, the one logged last); the hit is
contaminated when its identity differs from the source's or from its cached_fingerprint.
The logs are built to hit the hard cases often: timestamp ties, keys shared across
deployments and a null deployment, mixed timestamp spellings, greedy requests that
differ only in seed, redacted prompts, cached fingerprints spelled another way.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from datetime import datetime, timedelta, timezone

import pytest
from helpers import DROP, instant, rec, run_cli, write_jsonl

from specdec_core.contract.identity import canonicalize_identity, identity

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)
PROMPTS = ["P1", "P2", "Grüße"]


def _spell_ts(ms: int, rng: random.Random) -> object:
    at = T0 + timedelta(milliseconds=ms)
    style = rng.randrange(3)
    if style == 0:
        return int(at.timestamp() * 1000)
    if style == 1:
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
    shifted = at.astimezone(timezone(timedelta(hours=2)))
    return shifted.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}+02:00"


def _random_identity(rng: random.Random) -> dict:
    greedy = rng.random() < 0.5
    prompt = rng.choice(PROMPTS)
    fields = {
        "prompt": prompt,
        "target_model": rng.choice(["t8b", "t70b"]),
        "draft_model": rng.choice(["d1", "d2", None, "none"]),
        "num_speculative_tokens": rng.choice([4, 5]),
        "temperature": 0.0 if greedy else rng.choice([0.7, 0.7000000001, 1.0]),
        "top_p": rng.choice([1.0, 0.9]),
        "top_k": rng.choice([None, 0, 40]),
        "max_tokens": rng.choice([16, 64]),
        "seed": rng.choice([None, 1, 2]),
        "stop": rng.choice([None, [], ["b", "a"], ["a", "b", "a"]]),
        "tokenizer_version": rng.choice(["v1", "v1", "v2"]),
    }
    if rng.random() < 0.2:  # redacted: only the prompt's hash is logged
        fields["prompt"] = DROP
        fields["prompt_hash"] = hashlib.sha256(prompt.encode()).hexdigest()
    return fields


def random_log(seed: int, n: int = 400) -> list[dict]:
    rng = random.Random(seed)
    pool = [_random_identity(rng) for _ in range(12)]
    records = []
    for i in range(n):
        fields = rng.choice(pool)
        record = rec(
            f"r{i:04d}",
            ts=_spell_ts(rng.randrange(0, 60_000, 250), rng),  # 240 instants for 400 rows: many ties
            deployment=rng.choice(["prod", "canary", None]),
            cache_key=rng.choice(["K1", "K2", "K3"]),
            cache_hit=rng.random() < 0.6,
            output_tokens=rng.choice([8, 16, 17, 64, 65]),
            **fields,
        )
        if record["cache_hit"] and rng.random() < 0.3:
            cached = identity(rec("x", **(rng.choice(pool) if rng.random() < 0.5 else fields)))
            if cached.get("top_k", 1) is None and rng.random() < 0.5:
                cached["top_k"] = 0  # the same identity, spelled another way
            record["cached_fingerprint"] = cached
        records.append(record)
    return records


def _differing(a: dict, b: dict) -> str:
    return ";".join(sorted(k for k in a if k in b and a[k] != b[k]))


def reference_report(records: list[dict]) -> set[tuple[str, str, str, str]]:
    """(request_id, kind, source_request_id, differing_fields) for every row the report must hold."""
    rows = set()
    for r in records:
        if r["output_tokens"] > r["max_tokens"]:
            rows.add((r["request_id"], "length_violation", "", ""))
        if not r["cache_hit"]:
            continue
        mine, at = identity(r), instant(r["ts"])
        misses = [(instant(m["ts"]), n, m) for n, m in enumerate(records)
                  if not m["cache_hit"] and m["deployment"] == r["deployment"] and m["cache_key"] == r["cache_key"]
                  and instant(m["ts"]) <= at]
        source = max(misses, key=lambda x: (x[0], x[1]))[2] if misses else None
        if source is not None and identity(source) != mine:
            rows.add((r["request_id"], "contaminated_hit", source["request_id"], _differing(mine, identity(source))))
            continue
        cached = r.get("cached_fingerprint")
        if cached is not None and canonicalize_identity(cached) != mine:
            rows.add((r["request_id"], "contaminated_hit", source["request_id"] if source else "",
                      _differing(mine, canonicalize_identity(cached))))
    return rows


cli = run_cli


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_report_equals_the_reference_reading_of_the_contract(tmp_path, seed):
    records = random_log(seed)
    db = tmp_path / "ref.duckdb"
    done = cli("ingest", str(write_jsonl(tmp_path / "log.jsonl", records)), "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["accepted"] == len(records)
    out = tmp_path / "report.csv"
    done = cli("report", "--db", str(db), "--out", str(out))
    assert done.returncode == 0, done.stderr
    with open(out, newline="", encoding="utf-8") as fh:
        got = {(row["request_id"], row["kind"], row["source_request_id"], row["differing_fields"])
               for row in csv.DictReader(fh)}
    expected = reference_report(records)
    assert sum(kind == "contaminated_hit" for _, kind, _, _ in expected) > 20  # the log is a hard one
    assert got == expected


def test_ties_are_broken_the_same_way_whatever_the_order_of_files(tmp_path):
    # Two misses at one instant with different identities, then a hit: the source is the miss
    # logged last, so the verdict is deterministic, and reading the files in another order moves it.
    first = rec("m-a", ts="2026-03-01T10:00:00Z", cache_key="K", draft_model="d1")
    second = rec("m-b", ts="2026-03-01T10:00:00Z", cache_key="K", draft_model="d2")
    hit = rec("h", ts="2026-03-01T10:00:01Z", cache_key="K", cache_hit=True, draft_model="d1")
    sources = []
    for name, lines in (("ab", [first, second, hit]), ("ba", [second, first, hit])):
        db = tmp_path / f"{name}.duckdb"
        assert cli("ingest", str(write_jsonl(tmp_path / f"{name}.jsonl", lines)), "--db", str(db)).returncode == 0
        out = tmp_path / f"{name}.csv"
        assert cli("report", "--db", str(db), "--out", str(out), "--kind", "contaminated_hit").returncode == 0
        with open(out, newline="", encoding="utf-8") as fh:
            sources.append([(r["request_id"], r["source_request_id"]) for r in csv.DictReader(fh)])
    assert sources == [[("h", "m-b")], []]
