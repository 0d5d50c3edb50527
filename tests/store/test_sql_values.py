"""Values an ingest writes into its statements instead of binding them come back from DuckDB exactly."""

from __future__ import annotations

import math
from datetime import datetime, timedelta, timezone

import duckdb
import pytest

from specdec_core.store.sql import sql_list, value_sql

EDGES = [None, True, False, 0, -1, 2**63 - 1, -(2**63), 2**63, 2**100, -(2**127), 0.1, -0.0, 1e-300, 5e-324,
         1.7976931348623157e308, 2.0**53 + 2, float("inf"), float("nan"), "", "it's", "a\x00b", "é\U0001F600",
         "\\'; DROP TABLE x; --", datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=timezone.utc),
         datetime(2026, 3, 1, 10, 0, tzinfo=timezone(timedelta(hours=-5, minutes=-30))), datetime(1, 1, 1)]


def same(a: object, b: object) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    return a == b and type(a) is type(b)


@pytest.mark.parametrize("value", EDGES, ids=repr)
def test_a_value_written_into_sql_reads_back_as_itself(value):
    got = duckdb.connect().execute(f"SELECT {value_sql(value)}").fetchall()[0][0]
    assert same(got, value), (value, got)


@pytest.mark.parametrize(("values", "sql_type"), [
    ([0.1, None, -0.0, 1e-300, 2.0**53 + 2, float("nan")], "DOUBLE"),
    ([2**100, -(2**127), None, 0], "HUGEINT"),
    (["", "it's", "a\x00b", "é\U0001F600", '"quoted"', None], "VARCHAR"),
    ([["\n", "a\x00"], [], None, ["x"]], "VARCHAR[]"),
    ([True, None, False], "BOOLEAN"),
    ([], "VARCHAR"),
])
def test_a_list_written_into_sql_reads_back_as_itself(values, sql_type):
    got = duckdb.connect().execute(f"SELECT {sql_list(values, sql_type)}").fetchall()[0][0]
    assert len(got) == len(values) and all(
        same(g, v) if not isinstance(v, list) else g == v for g, v in zip(got, values, strict=True)), (values, got)
