"""Values an ingest writes into its statements instead of binding them come back from DuckDB exactly."""

from __future__ import annotations

import math

import duckdb
import pytest

from specdec_core.store.sql import has_table, literal, sql_list

TEXTS = ["", "it's", "a\x00b", "é\U0001F600", '"quoted"', "\\'; DROP TABLE x; --", None]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize(("values", "sql_type"), [
    ([0.1, None, -0.0, 1e-300, 5e-324, 1.7976931348623157e308, 2.0**53 + 2, float("inf"), float("nan")], "DOUBLE"),
    ([2**63 - 1, -(2**63), 0, None], "BIGINT"),
    ([2**100, -(2**127), 2**63, None], "HUGEINT"),
    (TEXTS, "VARCHAR"),
    ([["\n", "a\x00"], [], None, ["x", None]], "VARCHAR[]"),
    ([True, None, False], "BOOLEAN"),
    ([], "VARCHAR"),
])
def test_a_list_written_into_sql_reads_back_as_itself(values, sql_type):
    got = duckdb.connect().execute(f"SELECT {sql_list(values, sql_type)}").fetchall()[0][0]
    assert len(got) == len(values) and all(
        same(g, v) if not isinstance(v, list) else g == v for g, v in zip(got, values, strict=True)), (values, got)


@pytest.mark.parametrize("text", [t for t in TEXTS if t is not None], ids=repr)
def test_a_text_written_as_a_literal_reads_back_as_itself(text):
    assert duckdb.connect().execute(f"SELECT {literal(text)}").fetchall() == [(text,)]


@pytest.mark.parametrize("form", ["file", "lake"])
def test_has_table_finds_tables_and_leaves_a_write_going_when_one_is_missing(tmp_path, form):
    from helpers import rec, write_jsonl

    from specdec_core.ingestion.load import ingest
    from specdec_core.store.connection import Store

    db = str(tmp_path / "s.duckdb") if form == "file" else f"ducklake:{tmp_path / 's.sqlite'}"
    ingest(Store(db), [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    with Store(db).write() as con:
        con.execute("CREATE TEMP TABLE scratch AS SELECT 1 AS x")
        assert [has_table(con, name) for name in ("requests", "summary_contaminated", "temp.scratch")] == [True] * 3
        assert [has_table(con, name) for name in ("nope", "temp.requests", "follow_offsets")] == [False] * 3
        con.execute("INSERT INTO meta VALUES ('after_a_missing_table', 'written')")
    with Store(db).read() as con:
        assert con.execute("SELECT value FROM meta WHERE key = 'after_a_missing_table'").fetchall() == [("written",)]
