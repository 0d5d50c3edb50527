"""SQL text made from values that can't be bound as parameters (ATTACH, LOAD, SET, lists in DDL): quoted here only."""

from __future__ import annotations

from collections.abc import Iterable

import duckdb


def literal(text: str) -> str:
    """`text` as a SQL string literal, its quotes included."""
    return "'" + text.replace("'", "''") + "'"


def list_literal(texts: Iterable[str]) -> str:
    """A SQL list of string literals: ['a', 'b']."""
    return "[" + ", ".join(literal(t) for t in texts) + "]"


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    """The single value a query returns (fetched fully: DuckDB keeps a half-read result pending)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None
