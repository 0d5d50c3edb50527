"""The triage store: the DuckDB file, its schema and migrations, ingest, and the tables derived from requests.

The faces (app, pages, CLI) import from here, not from the modules inside."""

from specdec_core.formats.files import LogReadError
from specdec_core.store.connection import Store, StoreError, resolve_db
from specdec_core.store.ingest import IngestResult, ingest
from specdec_core.store.migrate import migrate
from specdec_core.store.staging import IngestLimits

__all__ = ["IngestLimits", "IngestResult", "LogReadError", "Store", "StoreError", "ingest", "migrate", "resolve_db"]
