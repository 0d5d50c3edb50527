"""The triage store: the DuckDB file, its schema and migrations, ingest, and the tables derived from requests."""

from specdec_core.store.connection import Store, StoreError
from specdec_core.store.ingest import IngestResult, ingest
from specdec_core.store.migrate import migrate

__all__ = ["IngestResult", "Store", "StoreError", "ingest", "migrate"]
