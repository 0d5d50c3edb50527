"""The storage engine: a DuckDB file or a DuckLake, its connection and snapshots, schema and conversions.

Ingest (`specdec_core.ingest`) writes into it and the derived tables (`specdec_core.derived`) are built in
it; the faces (app, pages, CLI) import from these three packages' `__init__`, not from the modules inside."""

from specdec_core.formats.files import LogReadError
from specdec_core.store.connection import Store, StoreError, resolve_db

__all__ = ["LogReadError", "Store", "StoreError", "resolve_db"]
