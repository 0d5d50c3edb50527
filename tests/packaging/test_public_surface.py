"""The names users import from the package's top and from `specdec_core.store`, whatever package they moved to."""

from __future__ import annotations

import specdec_core
from specdec_core import derived, ingestion, store


def test_top_level_ingest_and_migrate_are_the_functions_not_the_packages():
    assert specdec_core.ingest is ingestion.ingest and callable(specdec_core.ingest)
    assert specdec_core.migrate is derived.migrate and callable(specdec_core.migrate)
    assert specdec_core.IngestResult is ingestion.IngestResult


def test_names_the_store_package_exported_before_the_split_still_import_from_it():
    from specdec_core.store import IngestLimits, IngestResult, Store, ingest, migrate

    assert (ingest, migrate, IngestResult, IngestLimits) == (ingestion.ingest, derived.migrate,
                                                           ingestion.IngestResult, ingestion.IngestLimits)
    assert Store is store.Store
