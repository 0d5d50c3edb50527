"""Bring a store written by an older specdec up to date: the one place a store's shape changes.

Reads never write, so a reader that finds derived tables of an older version refuses with the
command to run (`specdec migrate`); every ingest migrates first, within its own transaction.
"""

from __future__ import annotations

import os
import tempfile

import duckdb

from specdec_core.store.connection import Store, StoreError, derived_current
from specdec_core.store.convert import export_tables, load_tables
from specdec_core.store.ddl import schema_changes
from specdec_core.store.hit_sources import judge_hits
from specdec_core.store.lake import LakeError, compact
from specdec_core.store.lake_files import damaged_files, damaged_message
from specdec_core.store.sql import scalar
from specdec_core.store.summaries import build_summaries
from specdec_core.store.verdicts import record_first_verdicts
from specdec_core.store.working_copy import compact_after_write


def migrate_connection(con: duckdb.DuckDBPyConnection) -> bool:
    """Within a write: rejudge hits and rebuild summaries when they predate this version. Returns whether it did."""
    if derived_current(con, alias=None):
        return False
    judge_hits(con)
    build_summaries(con)
    record_first_verdicts(con, None)
    if scalar(con, "SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)"):
        compact_after_write(con)  # the old tables' blocks are free now: the store is written anew
    return True


def migrate(store: Store) -> list[str]:
    """Bring `store` up to date (schema, then derived tables); returns what it changed, in words ([]: nothing).

    A lake's small files are merged as well (writers also do it once they pass a threshold)."""
    def checked(con: duckdb.DuckDBPyConnection) -> bool:
        # "Up to date" is said of the data too: a lake's files the catalog lists must all be there, whole.
        damaged = damaged_files(con) if store.lake is not None else []
        if damaged:
            raise StoreError(damaged_message(damaged, str(store)))
        return migrate_connection(con)

    with schema_changes() as changes:
        rebuilt = store.transact(checked)  # the write adds missing tables and columns first
    if store.lake is not None:
        try:
            compact(store.lake)
        except LakeError as exc:
            raise StoreError(str(exc)) from None
    return [*changes, *(["rejudged hits and rebuilt summaries"] if rebuilt else [])]


def copy_store(source: Store, dest: Store) -> int:
    """Copy every table of `source` into `dest`, a store holding no requests yet (a local file into a shared
    lake, or a lake into a file); dest's derived tables are built anew. Returns the requests copied."""
    with tempfile.TemporaryDirectory(prefix="specdec-copy-") as out:
        os.chmod(out, 0o700)  # the rows of a private store stay private while they are Parquet
        with source.read() as con:
            tables = export_tables(con, out)

        def load(con: duckdb.DuckDBPyConnection) -> int:
            if scalar(con, "SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)"):
                raise StoreError(f"{dest}: already holds requests; copy into a new store")
            load_tables(con, out, tables)
            migrate_connection(con)
            return scalar(con, "SELECT count(*) FROM requests")

        return dest.transact(load)
