"""The store writes each identity in SQL (ingestion/identities.py); the library is the reference.

Random batches of valid records, with values on the edges that serialisation can get wrong (floats that
round to zero or print in exponent form, seeds past 64 bits, stop lists out of order with repeats,
control characters and astral characters in strings, a redacted prompt, fields a log marks unknown),
are ingested; every stored fingerprint and canonical identity must be the library's for that record.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from helpers import rec, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core.contract import fields as contract
from specdec_core.contract.identity import (
    canonical_json,
    fingerprint,
    identity,
    identity_with_unknown,
    sha256_hex,
)
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
FLOATS = st.one_of(st.sampled_from([0.0, -0.0, 1e-7, 4e-7, 5e-7, 6e-7, 0.0000005, 1.0, 0.7, 1e16, 1e300, 2.5e-6]),
                   st.floats(min_value=0, max_value=1e6, allow_nan=False, allow_infinity=False))
TOP_P = st.one_of(st.none(), st.sampled_from([1.0, 0.9, 1e-9, 0.1234565]),
                  st.floats(min_value=1e-12, max_value=1.0, allow_nan=False))
INT64 = st.integers(min_value=0, max_value=2**63 - 1)


@st.composite
def records(draw, i: int) -> tuple[dict, list[str]]:
    prompt = draw(TEXT)
    record = rec(
        f"r{i}", prompt=prompt, target_model=draw(TEXT.filter(bool)),
        draft_model=draw(st.one_of(st.none(), st.just("none"), TEXT)),
        num_speculative_tokens=draw(st.one_of(st.none(), st.just(0), INT64)),
        temperature=draw(FLOATS), top_p=draw(TOP_P), top_k=draw(st.one_of(st.none(), st.just(0), INT64)),
        max_tokens=draw(st.integers(min_value=1, max_value=2**63 - 1)),
        seed=draw(st.one_of(st.none(), st.integers(min_value=-(2**120), max_value=2**120))),
        stop=draw(st.one_of(st.none(), st.lists(TEXT, max_size=4))), tokenizer_version=draw(TEXT),
    )
    if draw(st.booleans()):  # a redacted log: only the prompt's hash, in either case
        record.pop("prompt")
        digest = sha256_hex(prompt)
        record["prompt_hash"] = digest.upper() if draw(st.booleans()) else digest
    unknown = draw(st.lists(st.sampled_from(contract.IDENTITY_FIELDS), unique=True, max_size=3))
    for name in unknown:
        record.pop(name, None)
        if name == "prompt":
            record.pop("prompt_hash", None)
    if unknown:
        record["__unknown__"] = sorted(unknown)
    return record, unknown


@st.composite
def batches(draw) -> list[tuple[dict, list[str]]]:
    n = draw(st.integers(min_value=1, max_value=40))
    batch = [draw(records(i)) for i in range(n)]
    # Repeats of one identity under other request ids: the distinct tuples are what is fingerprinted.
    return batch + [({**r, "request_id": r["request_id"] + "-again"}, u) for r, u in batch[: n // 3]]


def expected_identity(record: dict, unknown: list[str]) -> str:
    plain = {k: v for k, v in record.items() if k != "__unknown__"}
    return canonical_json(identity_with_unknown(plain, unknown))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(batch=batches())
def test_every_stored_fingerprint_and_identity_is_the_librarys(batch):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "ids.duckdb")
        log = write_jsonl(Path(tmp) / "ids.jsonl", [json.dumps(r, ensure_ascii=False) for r, _ in batch])
        result = ingest(store, [str(log)])
        assert result.quarantined == 0 and result.accepted == len(batch)
        with store.read() as con:
            stored = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
            kept = dict(con.execute("SELECT fingerprint, identity::VARCHAR FROM identities").fetchall())
            greedy = dict(con.execute("SELECT fingerprint, greedy FROM identities").fetchall())
    for record, unknown in batch:
        text = expected_identity(record, unknown)
        fp = sha256_hex(text)
        assert stored[record["request_id"]] == fp, (record, text)
        assert json.loads(kept[fp]) == json.loads(text)
        assert greedy[fp] == (json.loads(text).get("temperature", -1.0) == 0.0)


def test_identity_columns_hold_the_canonical_values(tmp_path):
    records = [rec("a", temperature=0.70000049, top_p=0.9, top_k=0, stop=["b", "a", "b"], draft_model="none",
                   seed=2**100),
               rec("b", temperature=0.0, top_p=0.5, seed=7)]  # greedy: top_p and seed are left out
    store = Store(tmp_path / "cols.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "cols.jsonl", records))])
    with store.read() as con:
        rows = con.execute("SELECT temperature, top_p, top_k, stop, draft_model, seed, greedy FROM identities "
                           "ORDER BY temperature DESC").fetchall()
    assert rows == [(0.7, 0.9, None, '["a", "b"]', None, 2**100, False),
                    (0.0, None, None, "[]", "llama-1b", None, True)]


def test_an_identity_given_whole_is_kept_with_the_same_columns_as_a_logged_one(tmp_path):
    """A hit's cached_fingerprint names an identity the log never shows: it is stored from the object, its
    columns (a seed past 64 bits, a stop set, a rounded temperature) as a logged request's would be."""
    source = rec("src", temperature=0.70000049, top_p=0.9, stop=["b", "a", "b"], seed=2**100 + 1)
    hit = rec("hit", cache_hit=True, cached_fingerprint=identity(source))
    whole, logged = Store(tmp_path / "whole.duckdb"), Store(tmp_path / "logged.duckdb")
    ingest(whole, [str(write_jsonl(tmp_path / "whole.jsonl", [hit]))])
    ingest(logged, [str(write_jsonl(tmp_path / "logged.jsonl", [source]))])
    columns = "fingerprint, temperature, top_p, stop, seed, greedy, identity::VARCHAR"
    with logged.read() as con:
        expected = con.execute(f"SELECT {columns} FROM identities").fetchall()
    with whole.read() as con:
        kept = con.execute(f"SELECT {columns} FROM identities WHERE fingerprint = ?", [fingerprint(source)]).fetchall()
    assert kept == expected and kept[0][4] == 2**100 + 1
