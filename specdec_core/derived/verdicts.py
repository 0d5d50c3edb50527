"""Contaminated hits as they were first judged: an append-only record that monitoring counts.

A late file may hold an earlier miss of a key, so a hit judged contaminated today may be judged
clean tomorrow (and the other way round): `hit_sources` and `summary_contaminated` always hold the
current verdicts. A Prometheus counter must never go down, so `specdec_contaminated_hits_total`
counts this table instead: a hit is added the first time any ingest (or migrate) judges it
contaminated, and never removed. Rows only ever join it, so its count is monotone while the store
grows, and the same whichever process reads it (an exporter or follower restart changes nothing).
`summary_first_verdicts` counts its rows per labels and field list, so a scrape reads a few rows, not one per
hit ever judged: each write appends its new verdicts' counts, `build_summaries` counts the whole table again.
"""

from __future__ import annotations

import duckdb

from specdec_core.store.ddl import create_tables
from specdec_core.store.schema import FIRST_VERDICTS_DDL
from specdec_core.store.sql import has_table


def new_verdicts_sql(among: str | None, ingest_id: int | None) -> str:
    """The hits judged contaminated for the first time by this write (`ingest_id`): of every contaminated hit, or only
    of those whose ids the relation `among` lists (the hits a batch judged again: no other verdict changed). The
    record is read for the candidates only: at 20M rows, 6M verdicts on each side cost a follow's write 0.75 s."""
    if among is None:
        candidates = "summary_contaminated"
    else:
        candidates = f"(SELECT * FROM summary_contaminated WHERE request_id IN (SELECT request_id FROM {among}))"
    return f"""
SELECT c.request_id, c.deployment, c.target_model, c.draft_model, c.differing_fields, {'NULL' if ingest_id is None else int(ingest_id)}::BIGINT AS ingest_id
FROM {candidates} c LEFT JOIN contaminated_first_verdicts v ON v.request_id = c.request_id
WHERE v.request_id IS NULL
"""

def first_verdict_counts_sql(verdicts: str) -> str:
    """The verdicts of the relation `verdicts` counted per labels and field list (a summary: `build_summaries`
    counts it anew from the record, each write appends its new verdicts' counts, so a combination may have
    several rows: read it summed). What the monitoring counters read: a few rows however many hits."""
    return f"""SELECT deployment, target_model, draft_model, differing_fields, count(*)::BIGINT AS hits
FROM {verdicts} GROUP BY ALL"""



# Appended rows beyond twice one row per combination, plus this many, fold the table into one row per combination
# again: each row is folded a bounded number of times, and a write only appends (one file in a lake, no update).
FOLD_SLACK = 10_000
FOLD_SQL = """CREATE OR REPLACE TABLE summary_first_verdicts AS
SELECT * EXCLUDE (hits), sum(hits)::BIGINT AS hits FROM summary_first_verdicts GROUP BY ALL"""
ROWS_AND_COMBINATIONS_SQL = """SELECT count(*), count(DISTINCT (deployment, target_model, draft_model, differing_fields))
FROM summary_first_verdicts"""


def build_first_verdict_counts(con: duckdb.DuckDBPyConnection) -> None:
    """Within a write: count the recorded first verdicts into `summary_first_verdicts` anew."""
    create_tables(con, FIRST_VERDICTS_DDL)
    con.execute("CREATE OR REPLACE TABLE summary_first_verdicts AS "
                + first_verdict_counts_sql("contaminated_first_verdicts"))


def record_first_verdicts(con: duckdb.DuckDBPyConnection, ingest_id: int | None, among: str | None = None) -> None:
    """Within a write, after the summaries are current: add the hits judged contaminated for the first time (of those
    `among` lists, when given), and their counts to `summary_first_verdicts`. A batch with none (healthy traffic)
    writes nothing."""
    create_tables(con, FIRST_VERDICTS_DDL)
    if not has_table(con, "summary_contaminated"):
        return  # none before the first accepted row
    con.execute(f"CREATE OR REPLACE TEMP TABLE new_first_verdicts AS {new_verdicts_sql(among, ingest_id)}")
    found = con.execute("SELECT count(*) FROM new_first_verdicts").fetchall()[0][0]
    if found:
        con.execute("INSERT INTO contaminated_first_verdicts SELECT * FROM new_first_verdicts")
        con.execute("INSERT INTO summary_first_verdicts BY NAME "
                    + first_verdict_counts_sql("new_first_verdicts"))
    con.execute("DROP TABLE temp.new_first_verdicts")
    if not found:
        return
    rows, combinations = con.execute(ROWS_AND_COMBINATIONS_SQL).fetchall()[0]
    if rows > 2 * combinations + FOLD_SLACK:
        con.execute(FOLD_SQL)
