"""SQL text made from values that can't be bound as parameters (ATTACH, LOAD, SET, lists in DDL): quoted here only."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import duckdb


def literal(text: str) -> str:
    """`text` as a SQL string literal, its quotes included."""
    return "'" + text.replace("'", "''") + "'"


def list_literal(texts: Iterable[str]) -> str:
    """A SQL list of string literals: ['a', 'b']."""
    return "[" + ", ".join(literal(t) for t in texts) + "]"


# The contract's deployment is optional. The figures, the pages and the reports show a request that logged none
# under the empty name; the judging of hits keeps it apart from one that logged '': a hit is judged within its
# own deployment's cache. The partition holds no NUL: a lake's scan that a join filters on a stored partition
# writes the value into its catalog query, where a NUL ends the text. So none is chr(1) alone, and a name's
# chr(1) and NUL are written chr(1) chr(1) and chr(1) '0' (no name comes out as chr(1) alone, or as another's).
def deployment_label(alias: str | None = "r") -> str:
    """SQL: the deployment a figure groups a request under ('' for none)."""
    return f"coalesce({_column(alias, 'deployment')}, '')"


def deployment_partition(alias: str | None = "r") -> str:
    """SQL: the deployment whose cache a hit is judged in (chr(1) for none, apart from a logged '')."""
    return partition_of(_column(alias, "deployment"))


def partition_of(deployment: str) -> str:
    """SQL: deployment_partition of the deployment `deployment` (an SQL expression; NULL for none)."""
    return f"coalesce(replace(replace({deployment}, chr(1), chr(1) || chr(1)), chr(0), chr(1) || '0'), chr(1))"


def _column(alias: str | None, name: str) -> str:
    return f"{alias}.{name}" if alias else name


def named_params(sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters `sql` names ($name): DuckDB refuses any it does not."""
    named = set(re.findall(r"\$(\w+)", sql))
    return {name: value for name, value in params.items() if name in named}


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | dict | None = None):
    """The single value a query returns (fetched fully: DuckDB keeps a half-read result pending)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None
