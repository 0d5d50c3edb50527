"""A record that is exactly the file's usual one skips two parses (validation.exact_sql): the answer must not change.

Each hostile log is ingested twice, once with exact records taking their short path and once with every record
taking the general one, and the two stores must hold the same rows and the same rejects, reason for reason.
"""

from __future__ import annotations

import json
import random

import duckdb
import pytest
from helpers import rec, write_jsonl
from test_ingest_fuzz import HOSTILE, hostile_log

from specdec_core.contract.fields import FIELD_NAMES
from specdec_core.store import validation
from specdec_core.store.connection import Store
from specdec_core.store.ingest import ingest

EXTRA_VALUES = [None, 1, -2.5, True, "x", "", "{\"looks\": \"like json\"}", [], ["a", 1], {}, {"a": {"b": [1, None]}},
                "é\n\"\\", 2**64, 1e300]


def with_other_fields(seed: int, n: int = 300) -> list[str]:
    """Records as services log them: the contract's fields, then fields it does not name, some hostile."""
    rng = random.Random(seed)
    lines = []
    for i in range(n):
        record = rec(f"o{i}", cache_hit=rng.random() < 0.5)
        record.update(trace_id=f"{i:032x}", retries=i % 3, tags=["ab", f"v{i % 5}"],
                      metadata={"team": "search", "arm": {"n": i % 2, "note": "{\"a\": 1}"}})
        if rng.random() < 0.3:
            record[rng.choice(["trace_id", "retries", "tags", "metadata"])] = rng.choice(EXTRA_VALUES)
        if rng.random() < 0.3:
            record[rng.choice(FIELD_NAMES[1:])] = rng.choice(HOSTILE)
        if rng.random() < 0.05:
            record["metadata"] = record.pop("metadata")  # same keys, another order
        lines.append(json.dumps(record, ensure_ascii=rng.random() < 0.2))
    return lines


def compact(lines: list[str]) -> list[str]:
    """The same records as a compact writer (our own service) writes them; broken lines stay as they are."""
    out = []
    for line in lines:
        try:
            out.append(json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":")))
        except ValueError:
            out.append(line)
    return out


def stored(store: Store) -> tuple[list, list]:
    with store.read() as con:
        rows = con.execute("SELECT * EXCLUDE (ingest_id) FROM requests ORDER BY request_id").fetchall()
        rejects = con.execute("SELECT source_line, request_id, reason, raw FROM quarantine ORDER BY source_line"
                              ).fetchall()
    return rows, rejects


def exact_records(path) -> int:
    """How many of a file's records are exact, as the check finds them."""
    con = duckdb.connect()
    con.execute(f"CREATE TABLE lines AS SELECT raw FROM read_csv('{path}', columns = {{'raw': 'VARCHAR'}}, "
                "delim = chr(1), quote = '', escape = '', header = false, auto_detect = false)")
    layout = validation.record_layout(con, "SELECT raw FROM lines")
    if layout is None:
        return 0
    return con.execute(f"SELECT count(*) FILTER (WHERE {validation.exact_sql(layout)}) FROM ("
                       f"SELECT raw, TRY(from_json(raw, {validation.texts_type(layout)})) AS s FROM lines)").fetchone()[0]


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("shape", ["hostile", "hostile compact", "other fields", "other fields compact"])
def test_exact_records_are_judged_as_the_general_path_judges_them(tmp_path, monkeypatch, seed, shape):
    lines = hostile_log(seed) if shape.startswith("hostile") else with_other_fields(seed)
    if shape.endswith("compact"):
        lines = compact(lines)
    path = write_jsonl(tmp_path / "log.jsonl", lines)
    exact = exact_records(path)
    if shape == "other fields":
        # DuckDB writes a nested value back without the spaces a spaced writer put in it: none is exact here.
        assert exact == 0
    else:
        assert 10 < exact < len(lines)  # both paths are taken

    answers = []
    for enabled in (True, False):
        monkeypatch.setattr(validation, "_EXACT_RECORDS", enabled)
        store = Store(tmp_path / f"exact-{enabled}.duckdb")
        result = ingest(store, [str(path)])
        answers.append((result.read, result.accepted, result.duplicates, result.quarantined, *stored(store)))
    assert answers[0][:4] == answers[1][:4]
    assert answers[0][4] == answers[1][4]  # every stored row, column by column
    assert answers[0][5] == answers[1][5]  # every reject, reason by reason
    assert answers[0][1] > 10 and answers[0][3] > 10


def test_a_record_that_only_looks_usual_takes_the_general_path(tmp_path):
    # Same keys in the same order, but a value written another way than DuckDB writes it back (a string for a
    # number, a number with an exponent, an escaped character, a space, a key twice): each is checked in full.
    good = rec("good")
    lines = [json.dumps(rec(f"g{i}"), separators=(",", ":")) for i in range(20)]
    variants = {
        "as-string": json.dumps(good, separators=(",", ":")).replace('"max_tokens":64', '"max_tokens":"64"'),
        "exponent": json.dumps(good, separators=(",", ":")).replace('"max_tokens":64', '"max_tokens":6.4e1'),
        "escaped": json.dumps(rec("escaped", prompt="é"), separators=(",", ":"), ensure_ascii=True),
        "spaced": json.dumps(good, separators=(",", ":")).replace('"max_tokens":64', '"max_tokens": 64'),
        "bool-as-int": json.dumps(good, separators=(",", ":")).replace('"cache_hit":false', '"cache_hit":0'),
        "twice": json.dumps(good, separators=(",", ":"))[:-1] + ',"max_tokens":65}',
    }
    for name, line in variants.items():
        lines.append(line.replace('"request_id":"good"', f'"request_id":"{name}"'))
    path = write_jsonl(tmp_path / "looks.jsonl", lines)
    assert exact_records(path) == 21  # the 20, and the 0 standing for a boolean (a number where the usual has one)
    result = ingest(Store(tmp_path / "s.duckdb"), [str(path)])
    rows, rejects = stored(Store(tmp_path / "s.duckdb"))
    reasons = {r[1]: r[2] for r in rejects}
    assert reasons == {
        "as-string": 'max_tokens: expected an integer >= 1, got "64"',
        "bool-as-int": "cache_hit: expected a boolean, got 0",
        "twice": "duplicate field: max_tokens appears more than once",
    }
    assert {r[0] for r in rows} >= {"exponent", "escaped", "spaced"} and result.accepted == 23
