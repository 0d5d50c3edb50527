"""The storage engine: a DuckDB file or a DuckLake, its connection and snapshots, schema and conversions.

Ingest (`specdec_core.ingestion`) writes into it and the derived tables (`specdec_core.derived`) are built in
it; the faces (app, pages, CLI) import from these three packages' `__init__`, not from the modules inside."""

from specdec_core.formats.files import LogReadError
from specdec_core.store.connection import Store, StoreError, resolve_db

__all__ = ["LogReadError", "Store", "StoreError", "resolve_db"]

# Where names this package exported before the ingest pipeline and the derived tables left it now live:
# `from specdec_core.store import ingest` keeps working for code written against the older layout.
_MOVED = {"ingest": "specdec_core.ingestion", "IngestResult": "specdec_core.ingestion",
          "IngestLimits": "specdec_core.ingestion", "migrate": "specdec_core.derived"}


def __getattr__(name: str) -> object:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module 'specdec_core.store' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(home), name)
