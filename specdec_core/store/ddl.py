"""The store's tables: created, brought up to date column by column, and the changes said in words."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import duckdb

from specdec_core.store.errors import ForeignDatabaseError
from specdec_core.store.schema import (
    UNKEYED_TABLES,
    column_migrations_sql,
    columns_to_relax,
    drop_key_sql,
    is_specdec_store,
    relax_not_null_sql,
    requests_ddl,
    schema_sql,
)
from specdec_core.store.sql import identifier, list_literal, literal, scalar
from specdec_core.store.working_copy import compact_after_write

# 2: requests.seed run-length encoded in a DuckDB file (_encode_seed); 3: a DuckDB file written anew in DuckDB 1.5's
# storage format (working_copy.STORAGE_VERSION), so the rows written before get its compression too.
SCHEMA_VERSION = 3


def is_lake(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's database is a DuckLake (which has no PRIMARY KEY or UNIQUE constraints)."""
    return scalar(con, "SELECT type FROM duckdb_databases() WHERE database_name = current_database()") == "ducklake"


def create_tables(con: duckdb.DuckDBPyConnection, ddl: str) -> None:
    """Run CREATE TABLE (or ADD COLUMN) statements; in a lake without their keys, which its writers keep unique
    themselves, and without the compression a column of a DuckDB file is given (Parquet's are the lake's)."""
    if is_lake(con):
        ddl = re.sub(r"\s+USING COMPRESSION \w+", "", re.sub(r"\s+PRIMARY KEY\b", " NOT NULL", ddl))
    con.execute(ddl)




# Where `specdec migrate` collects what the writes it runs changed in the store's shape (schema_changes()).
_SCHEMA_CHANGES: ContextVar[list[str] | None] = ContextVar("specdec_schema_changes", default=None)


@contextmanager
def schema_changes() -> Iterator[list[str]]:
    """The changes ensure_schema makes to a store's tables within this block, in words, once each."""
    changes: list[str] = []
    token = _SCHEMA_CHANGES.set(changes)
    try:
        yield changes
    finally:
        _SCHEMA_CHANGES.reset(token)


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    tables: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                                     "WHERE database_name = current_database()").fetchall():
        tables.setdefault(table, set()).add(column)
    return tables


def _all_ddl() -> str:
    """Every table this version makes, and the columns it added to older ones."""
    return schema_sql() + "\n" + column_migrations_sql()


_VERSION_ROW_SQL = f"INSERT INTO meta VALUES ('schema_version', {literal(str(SCHEMA_VERSION))})"


@functools.cache
def _current_columns() -> dict[str, frozenset[str]]:
    """Every table and column this version's DDL makes: those of an empty database that ran it."""
    with duckdb.connect() as con:
        con.execute(_all_ddl())
        return {table: frozenset(columns) for table, columns in _columns(con).items()}


@functools.cache
def _current_columns_probe() -> str:
    return " UNION ALL ".join(
        f"SELECT NULL FROM (SELECT {', '.join(identifier(c) for c in sorted(columns))} FROM {identifier(table)} LIMIT 0)"
        for table, columns in sorted(_current_columns().items()))


def _holds_current_columns(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether every table and column of this version's DDL is there, bound rather than listed; a missing one leaves
    the transaction as it was (store.sql.has_table)."""
    try:
        con.execute(_current_columns_probe())
    except (duckdb.CatalogException, duckdb.BinderException):
        return False
    return True


def ensure_schema(con: duckdb.DuckDBPyConnection, new_file: bool = False) -> None:
    """Create missing tables and add the columns a newer version has: cheap, so every write does it.

    Every write to a lake rewrites meta's schema_version row: two overlapping writers then conflict at
    commit, so neither commits a batch judged without the other's rows. `new_file`: the connection's database
    is a DuckDB file created empty by this write, which only needs the tables (the probes cost about 7 ms of
    a 190-200 ms first ingest of 30 lines, alternated with them)."""
    if new_file:
        create_tables(con, _all_ddl())
        con.execute(_VERSION_ROW_SQL)
        return
    report = _SCHEMA_CHANGES.get()
    # A file store of this version, nearly every write's: one statement binds its columns (1 ms), where listing them
    # from duckdb_columns() took 7 ms of a small write (15 ms under the test suite's load). Not in a lake, whose
    # catalog binds each table by a query of its own (5.3 ms against 4.6 ms).
    lake = is_lake(con)
    current = report is None and not lake and _holds_current_columns(con)
    before = {table: set(columns) for table, columns in _current_columns().items()} if current else _columns(con)
    refuse_foreign(con, before)
    # Run only where a table or column is missing: on a store that has them all its 50 statements changed
    # nothing and took 8 ms of each write (a lake's: more).
    if any(not columns <= before.get(table, set()) for table, columns in _current_columns().items()):
        create_tables(con, _all_ddl())
    constraints = con.execute("SELECT table_name, constraint_type, unnest(constraint_column_names) "
                              "FROM duckdb_constraints() WHERE database_name = current_database() "
                              f"AND list_contains({list_literal(['requests', *UNKEYED_TABLES])}, table_name)"
                              ).fetchall()
    relaxed = columns_to_relax({c for t, kind, c in constraints if t == "requests" and kind == "NOT NULL"})
    keyed = [t for t, (column, _) in UNKEYED_TABLES.items() if (t, "PRIMARY KEY", column) in constraints]
    if relaxed:
        con.execute(relax_not_null_sql(relaxed))
    for table in keyed:
        con.execute(drop_key_sql(table))
    # A file's writers take turns (its lock): the row is only written when it changes.
    stored = None if lake else scalar(con, "SELECT max(value) FROM meta WHERE key = 'schema_version'")
    if lake or stored != str(SCHEMA_VERSION):
        if stored == "1":
            _encode_seed(con)
        if stored in ("1", "2"):  # the old row groups too: the store into a fresh file, in today's format
            compact_after_write(con)
        con.execute("DELETE FROM meta WHERE key = 'schema_version'")
        con.execute(_VERSION_ROW_SQL)
    if report is not None and before:  # a store that had tables: what this write changed in them
        after = _columns(con)
        said = [f"added table {t}" for t in sorted(set(after) - set(before))]
        said += [f"added column {t}.{c}" for t in sorted(before) for c in sorted(after.get(t, set()) - before[t])]
        said += [f"let requests.{c} be unknown (NULL)" for c in relaxed]
        said += [f"dropped the key of {table} (kept unique by every ingest)" for table in keyed]
        said += ["wrote requests again, its seed column run-length encoded"] if stored == "1" else []
        said += ["wrote the store anew in DuckDB 1.5's storage format"] if stored in ("1", "2") else []
        report.extend(x for x in said if x not in report)


def _encode_seed(con: duckdb.DuckDBPyConnection) -> None:
    """Schema version 2: a DuckDB file's requests table written again, its seed run-length encoded
    (schema._COMPRESSION); the store then goes into a fresh file (ensure_schema). Once, at about 90 s for 20M rows."""
    con.execute(requests_ddl().replace("CREATE TABLE IF NOT EXISTS requests", "CREATE TABLE requests_encoded", 1))
    con.execute("INSERT INTO requests_encoded BY NAME SELECT * FROM requests")
    con.execute("DROP TABLE requests")
    con.execute("ALTER TABLE requests_encoded RENAME TO requests")


def refuse_foreign(con: duckdb.DuckDBPyConnection, tables: dict[str, set[str]]) -> None:
    """Raise ForeignDatabaseError when the database holds tables and is not a specdec store (of any version)."""
    if tables and not is_specdec_store(con, tables):
        names = sorted(tables)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ForeignDatabaseError(f"not a specdec store (it holds other tables: {shown}); left as it was")
