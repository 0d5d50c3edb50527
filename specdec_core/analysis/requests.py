"""Single requests: one record, the most suspicious ones, the quarantined lines."""

from __future__ import annotations

from typing import Any

import pandas as pd

from specdec_core.analysis.query import (
    NO_FILTERS,
    Filters,
    df,
)
from specdec_core.store.connection import Store


def request_record(store: Store, request_id: str) -> dict[str, Any] | None:
    """One logged request as a record in the contract's field names, or None."""
    with store.read() as con:
        cur = con.execute(
            "SELECT r.* EXCLUDE (seed), r.seed::VARCHAR AS seed, h.source_request_id, h.contaminated, "
            "h.differing_fields FROM requests r LEFT JOIN hit_sources h USING (request_id) "
            "WHERE r.request_id = ?",
            [request_id],
        )
        rows = cur.fetchall()
        if not rows:
            return None
        record = dict(zip([d[0] for d in cur.description], rows[0], strict=True))
    if record["seed"] is not None:
        record["seed"] = int(record["seed"])
    return record


SUSPICIOUS_SQL = """
SELECT r.request_id, CASE WHEN h.contaminated THEN 'contaminated_hit'
                          WHEN r.output_tokens > r.max_tokens THEN 'length_violation'
                          ELSE 'collision' END AS why
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where} AND (h.contaminated OR r.output_tokens > r.max_tokens)
ORDER BY h.contaminated DESC NULLS LAST, (r.output_tokens > r.max_tokens) DESC, r.ts, r.request_id
LIMIT ?
"""


def suspicious_requests(store: Store, n: int, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """The requests most worth replaying: contaminated hits first, then length violations."""
    return df(store, SUSPICIOUS_SQL, filters, [n])


QUARANTINE_SQL = """
SELECT source_file, source_line, request_id, reason, left(raw, 200) AS raw
FROM quarantine ORDER BY ingest_id, source_file, source_line LIMIT ?
"""


def quarantined_records(store: Store, limit: int = 1000) -> pd.DataFrame:
    with store.read() as con:
        return con.execute(QUARANTINE_SQL, [limit]).df()


