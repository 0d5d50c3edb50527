"""SQL text made from values that can't be bound as parameters (ATTACH, LOAD, SET, lists in DDL), or that an ingest
writes into its statements so as to bind none (sql_list): quoted here only."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

import duckdb


def literal(text: str) -> str:
    """`text` as a SQL string literal, its quotes included (a NUL, which would end the statement's text, as chr(0))."""
    quoted = "'" + text.replace("'", "''") + "'"
    return quoted.replace("\0", "' || chr(0) || '") if "\0" in text else quoted


def identifier(name: str) -> str:
    """`name` as a quoted SQL identifier (a column or table a file or the schema names)."""
    return '"' + name.replace('"', '""') + '"'


# Values written into a statement instead of bound: DuckDB's Python client imports pandas to bind its first
# parameter (0.3 s), and a process that only ingests (the CLI's, a follower's) needs no pandas.
def _as_text(value: Any) -> Any:
    """A value (None, bool, int, float, str, or a list of them) as the text DuckDB casts back to it exactly (a
    float: the shortest text that reads back as that double); None stays None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return [_as_text(v) for v in value]
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    raise TypeError(f"no SQL text for a {type(value).__name__}")


def sql_list(values: Sequence[Any], sql_type: str) -> str:
    """A Python list as an SQL expression of type `sql_type`[] holding those values exactly (items of sql_type: None,
    bool, int, float or str, or lists of them where it ends in []). Written as one JSON text of the
    values' texts, cast: a list literal of 100,000 values takes DuckDB 0.7 s to bind, this 0.1 s."""
    depth = sql_type.count("[]")
    structure = "[" * (depth + 1) + '"VARCHAR"' + "]" * (depth + 1)
    text = json.dumps(_as_text(list(values)), ensure_ascii=True)
    return f"from_json({literal(text)}, {literal(structure)})::{sql_type}[]"


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


def has_table(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether `name` (a table or view, as a statement would find it) exists: bound, not looked up in
    duckdb_tables(), which lists every attached catalog's tables with their sizes (in a lake's write: 14 ms a
    call, against 0.3 ms). A name that is not there leaves the transaction as it was."""
    try:
        con.execute(f"SELECT 1 FROM {name} LIMIT 0")
    except duckdb.CatalogException:
        return False
    return True
