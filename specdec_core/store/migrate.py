"""Bring a store written by an older specdec up to date: the one place a store's shape changes.

Reads never write, so a reader that finds derived tables of an older version refuses with the
command to run (`specdec migrate`); every ingest migrates first, within its own transaction.
"""

from __future__ import annotations

import duckdb

from specdec_core.store.connection import Store, StoreError, derived_current
from specdec_core.store.hit_sources import judge_hits
from specdec_core.store.lake import LakeError, compact
from specdec_core.store.summaries import build_summaries


def migrate_connection(con: duckdb.DuckDBPyConnection) -> bool:
    """Within a write: rejudge hits and rebuild summaries when they predate this version. Returns whether it did."""
    if derived_current(con, alias=None):
        return False
    judge_hits(con)
    build_summaries(con)
    return True


def migrate(store: Store) -> bool:
    """Bring `store` up to date (schema, then derived tables); returns whether anything was rebuilt.

    A lake's small files are merged as well (writers also do it once they pass a threshold)."""
    rebuilt = store.transact(migrate_connection)  # the write adds missing tables and columns first
    if store.lake is not None:
        try:
            compact(store.lake)
        except LakeError as exc:
            raise StoreError(str(exc)) from None
    return rebuilt
