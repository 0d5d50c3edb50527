"""Bring a store written by an older specdec up to date: the one place a store's shape changes.

Reads never write, so a reader that finds derived tables of an older version refuses with the
command to run (`specdec migrate`); every ingest migrates first, within its own transaction.
"""

from __future__ import annotations

import os
import tempfile

import duckdb

from specdec_core.derived.hit_sources import judge_hits
from specdec_core.derived.summaries import build_summaries
from specdec_core.derived.upgrades import upgrade_summaries
from specdec_core.derived.verdicts import record_first_verdicts
from specdec_core.store.connection import Store, StoreError, derived_current
from specdec_core.store.convert import export_tables, load_tables, written_by_newer_duckdb
from specdec_core.store.ddl import _columns, refuse_foreign, schema_changes
from specdec_core.store.errors import ForeignDatabaseError
from specdec_core.store.lake import LakeError, compact
from specdec_core.store.lake_files import damaged_files, damaged_message
from specdec_core.store.schema import SUMMARY_VERSION
from specdec_core.store.sql import scalar
from specdec_core.store.working_copy import STORE_ALIAS, attached, compact_after_write


def migrate_connection(con: duckdb.DuckDBPyConnection) -> str | None:
    """Within a write: bring derived tables that predate this version up to date (the summaries' steps since
    their version where there are, else every hit judged again and every summary rebuilt). Returns what it did,
    in words (None: nothing)."""
    if derived_current(con, alias=None):
        return None
    if upgrade_summaries(con):
        return f"brought the summaries up to version {SUMMARY_VERSION}"
    judge_hits(con)
    build_summaries(con)
    record_first_verdicts(con, None)
    if scalar(con, "SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)"):
        compact_after_write(con)  # the old tables' blocks are free now: the store is written anew
    return "rejudged hits and rebuilt summaries"


def migrate(store: Store) -> list[str]:
    """Bring `store` up to date (schema, then derived tables); returns what it changed, in words ([]: nothing).

    A lake's small files are merged as well (writers also do it once they pass a threshold)."""
    def checked(con: duckdb.DuckDBPyConnection) -> str | None:
        # "Up to date" is said of the data too: a lake's files the catalog lists must all be there, whole.
        damaged = damaged_files(con) if store.lake is not None else []
        if damaged:
            raise StoreError(damaged_message(damaged, str(store)))
        return migrate_connection(con)

    with schema_changes() as changes:
        done = store.transact(checked)  # the write adds missing tables and columns first
    if store.lake is not None:
        try:
            compact(store.lake)
        except LakeError as exc:
            raise StoreError(str(exc)) from None
    return [*changes, *([done] if done else [])]


def _held_requests(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(scalar(con, "SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)"))


def check_copy_target(dest: Store) -> None:
    """A StoreError where `dest` can't take a copy (it holds requests, is another application's database, is
    no database), said before anything is read, written or locked there: a refused target is left as it was,
    with nothing beside it. A writer racing this check is still refused by the copy's own write."""
    if not dest.exists:
        return
    if dest.lake is not None:
        with dest.read() as con:
            if _held_requests(con):
                raise StoreError(f"{dest}: already holds requests; copy into a new store")
        return
    path = dest.path
    if path.is_dir():
        raise StoreError(f"{path}: is a folder, not a database file")
    if written_by_newer_duckdb(path):
        return  # the copy's write converts it first, and refuses it then if it holds requests
    try:
        con = attached(os.path.realpath(path), "READ_ONLY")
    except duckdb.Error as exc:
        raise StoreError(f"{path}: not a DuckDB database ({str(exc).splitlines()[0]}); copy into a new store"
                         ) from None
    try:
        con.execute(f"USE {STORE_ALIAS}")
        tables = _columns(con)
        try:
            refuse_foreign(con, tables)
        except ForeignDatabaseError as exc:
            raise ForeignDatabaseError(f"{path}: {exc}") from None
        if "requests" in tables and _held_requests(con):
            raise StoreError(f"{path}: already holds requests; copy into a new store")
    finally:
        con.close()


def copy_store(source: Store, dest: Store) -> int:
    """Copy every table of `source` into `dest`, a store holding no requests yet (a local file into a shared
    lake, or a lake into a file). Returns the requests copied.

    The derived tables are copied as they are: a store that can be read has this version's (Store.read
    refuses an older one). Rebuilt in the copy's one transaction instead, a 20M-row file's ran a lake's
    writer out of its 1 GB (at summary_impact_hits, after 4 minutes)."""
    check_copy_target(dest)
    with tempfile.TemporaryDirectory(prefix="specdec-copy-") as out:
        os.chmod(out, 0o700)  # the rows of a private store stay private while they are Parquet
        with source.read() as con:
            tables = export_tables(con, out)

        def load(con: duckdb.DuckDBPyConnection) -> int:
            if scalar(con, "SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)"):
                raise StoreError(f"{dest}: already holds requests; copy into a new store")
            load_tables(con, out, tables, derived_current=True)
            migrate_connection(con)  # nothing to do, unless the copy's tables are not this version's after all
            return scalar(con, "SELECT count(*) FROM requests")

        return dest.transact(load)
