"""Contaminated hits as they were first judged: an append-only record that monitoring counts.

A late file may hold an earlier miss of a key, so a hit judged contaminated today may be judged
clean tomorrow (and the other way round): `hit_sources` and `summary_contaminated` always hold the
current verdicts. A Prometheus counter must never go down, so `specdec_contaminated_hits_total`
counts this table instead: a hit is added the first time any ingest (or migrate) judges it
contaminated, and never removed. Rows only ever join it, so its count is monotone while the store
grows, and the same whichever process reads it (an exporter or follower restart changes nothing).
"""

from __future__ import annotations

import duckdb

from specdec_core.store.ddl import create_tables

FIRST_VERDICTS_DDL = """
CREATE TABLE IF NOT EXISTS contaminated_first_verdicts (
    request_id VARCHAR PRIMARY KEY,
    deployment VARCHAR,        -- '' for none, as the summaries hold it
    target_model VARCHAR,
    draft_model VARCHAR,       -- 'none' for no speculation
    differing_fields VARCHAR,  -- as first judged: sorted log names joined with ';'
    ingest_id BIGINT           -- the ingest that first judged it contaminated (NULL: by `specdec migrate`)
)
"""

RECORD_NEW_VERDICTS_SQL = """
INSERT INTO contaminated_first_verdicts
SELECT c.request_id, c.deployment, c.target_model, c.draft_model, c.differing_fields, ?
FROM summary_contaminated c
WHERE c.request_id NOT IN (SELECT request_id FROM contaminated_first_verdicts)
"""


def record_first_verdicts(con: duckdb.DuckDBPyConnection, ingest_id: int | None) -> None:
    """Within a write, after the summaries are current: add the hits judged contaminated for the first time."""
    create_tables(con, FIRST_VERDICTS_DDL)
    if con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'summary_contaminated'").fetchall()[0][0]:
        con.execute(RECORD_NEW_VERDICTS_SQL, [ingest_id])  # none before the first accepted row
