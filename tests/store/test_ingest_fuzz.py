"""Ingest never fails on what a record holds: random hostile values are accepted or quarantined, one by one.

Each record is a good one with a few fields replaced by values chosen to sit on type and range
edges (integers past 64 and 128 bits, NaN, nested JSON, odd timestamps, escapes), keys dropped or
added, or the line itself broken. Whatever comes, the ingest finishes, read = accepted +
duplicates + quarantined, every reason is one line naming what broke, and every accepted row
carries the library's own fingerprint of that record.
"""

from __future__ import annotations

import json
import random

import pytest
from helpers import BASE, rec, write_jsonl

from specdec_core.contract.fields import FIELD_NAMES
from specdec_core.contract.identity import fingerprint
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

HOSTILE = [
    None, True, False, 0, -0.0, 1, -1, 64.0, 64.5, 2**31, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 2**127,
    2**130, 1e19, 1e300, -1e300, float("nan"), float("inf"), 1e-300, 0.9999999, 1.0000001, "", " ", "64", "0.5",
    "true", "null", "none", "é\u0000\n\"\\", "\U0001F600", "2026-03-01T10:00:00Z", "2026-03-01", "infinity",
    "epoch", "2026-02-30T10:00:00Z", "9999-12-31T23:59:59.999999Z", "0000-01-01T00:00:00Z", [], ["a", "b"],
    ["a", 1], [None], [[]], {}, {"prompt": "x"}, {"a": {"b": [1, 2]}}, "x" * 300,
]


def hostile_log(seed: int, n: int = 300) -> list[str]:
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        record = rec(f"f{i}", cache_hit=rng.random() < 0.5)
        for name in rng.sample(FIELD_NAMES[1:], rng.randint(1, 3)):  # the request_id stays unique
            record[name] = rng.choice(HOSTILE)
        if rng.random() < 0.1:
            record.pop(rng.choice(list(record)), None)
        if rng.random() < 0.1:
            record[rng.choice(["extra", "Max_Tokens", "prompt ", ""])] = rng.choice(HOSTILE)
        line = json.dumps(record, ensure_ascii=rng.random() < 0.5)  # NaN and Infinity as JSON5 does
        if rng.random() < 0.05:
            line = line[: rng.randrange(len(line))]
        lines.append(line)
    return lines


@pytest.mark.parametrize("seed", [1, 2])
def test_hostile_values_are_accepted_or_quarantined_one_by_one(tmp_path, seed):
    lines = hostile_log(seed)
    store = Store(tmp_path / "fuzz.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "fuzz.jsonl", lines))])
    assert result.read == len(lines)
    assert result.accepted + result.duplicates + result.quarantined == result.read
    assert result.accepted > 10 and result.quarantined > 100  # both paths are exercised
    with store.read() as con:
        reasons = con.execute("SELECT source_line, reason, raw FROM quarantine").fetchall()
        accepted = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
    assert len(reasons) == result.quarantined
    known = (*FIELD_NAMES, "bad JSON", "not a JSON object", "missing required field", "prompt_hash", "record")
    for line, reason, raw in reasons:
        assert "\n" not in reason and reason.startswith(known), reason
        assert raw == lines[line - 1]  # quoted exactly as it came
    by_id = {json.loads(line)["request_id"]: json.loads(line) for line in lines
             if line.endswith("}") and json.loads(line).get("request_id")}
    for request_id, fp in accepted.items():
        assert fp == fingerprint(by_id[request_id]), request_id


def test_a_hostile_value_in_every_field_leaves_the_good_records_loaded(tmp_path):
    # One record per (field, value): the worst case for a vectorised pass that casts whole columns.
    lines = [json.dumps(rec("good-first"))]
    lines += [json.dumps(rec(f"h{i}-{name}", **{name: value}))
              for name in FIELD_NAMES[1:] for i, value in enumerate(HOSTILE) if BASE.get(name, 0) != value]
    lines.append(json.dumps(rec("good-last")))
    store = Store(tmp_path / "each.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "each.jsonl", lines))])
    assert result.read == len(lines) and result.accepted + result.quarantined == len(lines)
    with store.read() as con:
        ids = {r[0] for r in con.execute("SELECT request_id FROM requests").fetchall()}
    assert {"good-first", "good-last"} <= ids
