"""What a load quarantined, by reason: the figures of a mostly rejected load are not the log's."""

from __future__ import annotations

import pandas as pd

from specdec_core.store.connection import Store

# A load is mostly quarantined when more of its records were refused than kept: the figures then show a
# fraction of what the files held, and say so.
MOSTLY = 0.5

QUARANTINE_REASONS_SQL = """
SELECT split_part(reason, ':', 1) AS reason, count(*) AS records, min(reason) AS example
FROM quarantine WHERE $ingest_id IS NULL OR ingest_id = $ingest_id GROUP BY 1 ORDER BY records DESC, reason
"""


def mostly_quarantined(read: int, quarantined: int) -> bool:
    """More than half of the records a load read were quarantined (but not all: that load failed)."""
    return 0 < quarantined < read and quarantined > read * MOSTLY


def quarantine_reasons(store: Store, ingest_id: int | None = None) -> pd.DataFrame:
    """One load's quarantined records (every load's with `ingest_id` None) grouped by reason (the part before
    its first `:`, as `conflict` or a field's name), with how many and one whole reason as an example, the
    largest group first."""
    with store.read() as con:
        return con.execute(QUARANTINE_REASONS_SQL, {"ingest_id": ingest_id}).df()
