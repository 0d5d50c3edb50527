"""Keep `hit_sources` and the summaries up to date after a batch, at a cost that follows the batch, not the store.

The batch's rows are in the temp table `batch` (already in `requests`), and `backfilled` holds stored
misses whose cache key the batch supplied. What may change:

- the batch's own hits;
- stored hits of a (deployment, cache_key) the batch touched, at or after its earliest row there: a
  late miss may now be their latest earlier miss;
- stored hits that were the first sight of their identity, when the batch holds an earlier row of it;
- stored hits whose logged source link names a request of the batch.

Only those are judged again, against every stored miss of their keys (however old). The summaries are
then rebuilt for the minutes and keys those rows fall in; histograms take the batch's counts. The
result equals a full rebuild (`judge_hits` + `build_summaries`), which the tests hold it to.
"""

from __future__ import annotations

import duckdb

from specdec_core.store.connection import scalar
from specdec_core.store.hit_sources import _ROW, hit_sources_sql
from specdec_core.store.summaries import (
    CONTAMINATED_SQL,
    KEY_PAIRS_SQL,
    LATENCY_SQL,
    LENGTHS_SQL,
    MINUTE_SQL,
    SHARED_KEYS_SQL,
    VERSION_SQL,
    over,
)

_DEP = "coalesce(deployment, chr(0))"
_TOUCHED = f"""
SELECT {_DEP} AS dep, cache_key, fingerprint, ts, request_id FROM batch
UNION ALL SELECT {_DEP}, cache_key, fingerprint, ts, request_id FROM backfilled
UNION ALL SELECT {_DEP}, old_key, fingerprint, ts, request_id FROM backfilled"""


def update_derived(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Judge the hits the batch may have changed, then update every summary from them."""
    _rejudge_set(con, ingest_id)
    stored = scalar(con, "SELECT count(*) FROM rejudge WHERE stored")
    con.execute("CREATE OR REPLACE TEMP TABLE judged_now AS " + hit_sources_sql(
        rows=f"{_ROW} r WHERE EXISTS (SELECT 1 FROM rejudge k WHERE k.dep = {_DEP.replace('deployment', 'r.deployment')}"
             " AND k.cache_key IS NOT DISTINCT FROM r.cache_key)",
        hits="SELECT * FROM r WHERE cache_hit AND request_id IN (SELECT request_id FROM rejudge)",
        firsts=f"({_ROW} r WHERE EXISTS (SELECT 1 FROM rejudge k WHERE k.dep = "
               f"{_DEP.replace('deployment', 'r.deployment')} AND k.fingerprint = r.fingerprint))",
        links=f"({_ROW} WHERE request_id IN (SELECT source_link FROM rejudge WHERE source_link IS NOT NULL))"))
    if stored:
        since = scalar(con, "SELECT min(ts) FROM rejudge WHERE stored")
        con.execute("DELETE FROM hit_sources WHERE hit_ts >= ? AND request_id IN "
                    "(SELECT request_id FROM rejudge WHERE stored)", [since])
    con.execute("INSERT INTO hit_sources BY NAME SELECT * FROM judged_now")
    _update_minutes(con)
    _update_keys(con)
    con.execute(f"INSERT INTO summary_lengths BY NAME {over(LENGTHS_SQL, 'batch')}")
    con.execute(f"INSERT INTO summary_latency BY NAME {over(LATENCY_SQL, 'batch')}")
    _update_contaminated(con, stored)
    con.execute(VERSION_SQL)


def _rejudge_set(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """`rejudge`: every hit whose verdict the batch may change (see the module's list), with what finds its rows."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE touched AS
        SELECT dep, cache_key, min(ts) AS since FROM ({_TOUCHED}) GROUP BY ALL
    """)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE touched_fps AS
        WITH b AS (SELECT {_DEP} AS dep, fingerprint, min(ts) AS batch_first FROM batch GROUP BY ALL)
        SELECT b.*, (SELECT min(r.ts) FROM requests r WHERE r.ingest_id <> {ingest_id}
                     AND r.fingerprint = b.fingerprint AND {_DEP.replace('deployment', 'r.deployment')} = b.dep
                    ) AS stored_first
        FROM b
    """)
    stored_row = f"SELECT r.*, {_DEP.replace('deployment', 'r.deployment')} AS dep FROM requests r"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE rejudge AS
        WITH stored AS (
            SELECT s.request_id FROM ({stored_row}) s JOIN touched k
              ON s.dep = k.dep AND s.cache_key IS NOT DISTINCT FROM k.cache_key AND s.ts >= k.since
            WHERE s.cache_hit AND s.ingest_id <> {ingest_id}
            UNION
            SELECT s.request_id FROM ({stored_row}) s JOIN touched_fps f
              ON s.dep = f.dep AND s.fingerprint = f.fingerprint AND s.ts <= f.stored_first
            WHERE s.cache_hit AND f.batch_first < f.stored_first AND s.ingest_id <> {ingest_id}
            UNION
            SELECT r.request_id FROM requests r
            WHERE r.cache_hit AND r.ingest_id <> {ingest_id}
              AND r.source_link IN (SELECT request_id FROM batch)
        )
        SELECT request_id, {_DEP} AS dep, cache_key, fingerprint, source_link, ts, false AS stored
        FROM batch WHERE cache_hit
        UNION ALL
        SELECT r.request_id, {_DEP.replace('deployment', 'r.deployment')}, r.cache_key, r.fingerprint,
               r.source_link, r.ts, true
        FROM requests r SEMI JOIN stored s USING (request_id)
    """)


def _update_minutes(con: duckdb.DuckDBPyConnection) -> None:
    """Every minute holding a batch row or a rejudged hit, rebuilt from its rows."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE minutes AS
        SELECT DISTINCT time_bucket(INTERVAL 1 minute, ts) AS minute
        FROM (SELECT ts FROM batch UNION ALL SELECT ts FROM rejudge UNION ALL SELECT ts FROM backfilled)
    """)
    lo, hi = con.execute("SELECT min(minute), max(minute) + INTERVAL 1 minute FROM minutes").fetchall()[0]
    if lo is None:
        return
    con.execute("DELETE FROM summary_minute WHERE minute IN (SELECT minute FROM minutes)")
    # The ts bounds let DuckLake skip every data file outside them; the minute list then picks exactly.
    rows = ("(SELECT * FROM requests WHERE ts >= $lo AND ts < $hi "
            "AND time_bucket(INTERVAL 1 minute, ts) IN (SELECT minute FROM minutes))")
    hits = "(SELECT * FROM hit_sources WHERE hit_ts >= $lo AND hit_ts < $hi)"
    con.execute(f"INSERT INTO summary_minute BY NAME {over(MINUTE_SQL, rows, hits)}", {"lo": lo, "hi": hi})


def _update_keys(con: duckdb.DuckDBPyConnection) -> None:
    """The (deployment, cache_key) groups the batch or a rejudged hit touched, rebuilt from their rows.

    A key keeps its key_id and an identity its fp_id; new ones are numbered after the highest.
    """
    con.execute("""
        CREATE OR REPLACE TEMP TABLE touched_keys AS
        SELECT DISTINCT CASE WHEN dep = chr(0) THEN '' ELSE dep END AS deployment, cache_key
        FROM (SELECT dep, cache_key FROM touched UNION ALL SELECT dep, cache_key FROM rejudge)
    """)
    rows = ("(SELECT r.* FROM requests r SEMI JOIN touched_keys k ON coalesce(r.deployment, '') = k.deployment "
            "AND r.cache_key IS NOT DISTINCT FROM k.cache_key)")
    hits = f"(SELECT * FROM hit_sources WHERE request_id IN (SELECT request_id FROM {rows} x WHERE x.cache_hit))"
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE new_pairs AS
        WITH pairs AS ({over(KEY_PAIRS_SQL, rows, hits)}),
        old_keys AS (SELECT DISTINCT s.deployment, s.cache_key, s.key_id FROM summary_keys s
                     SEMI JOIN touched_keys k ON s.deployment = k.deployment
                     AND s.cache_key IS NOT DISTINCT FROM k.cache_key),
        old_fps AS (SELECT DISTINCT fingerprint, fp_id FROM summary_keys
                    WHERE fingerprint IN (SELECT fingerprint FROM pairs)),
        top AS (SELECT coalesce(max(key_id), 0) AS k, coalesce(max(fp_id), 0) AS f FROM summary_keys),
        keys AS (
            SELECT p.deployment, p.cache_key, coalesce(o.key_id, (SELECT k FROM top) + dense_rank() OVER (
                       PARTITION BY o.key_id IS NULL ORDER BY p.deployment, p.cache_key)) AS key_id
            FROM (SELECT DISTINCT deployment, cache_key FROM pairs) p
            LEFT JOIN old_keys o ON o.deployment = p.deployment AND o.cache_key IS NOT DISTINCT FROM p.cache_key
        ),
        fps AS (
            SELECT p.fingerprint, coalesce(o.fp_id, (SELECT f FROM top) + dense_rank() OVER (
                       PARTITION BY o.fp_id IS NULL ORDER BY p.fingerprint)) AS fp_id
            FROM (SELECT DISTINCT fingerprint FROM pairs) p LEFT JOIN old_fps o USING (fingerprint)
        )
        SELECT pairs.*, keys.key_id, fps.fp_id
        FROM pairs JOIN keys ON keys.deployment = pairs.deployment
             AND keys.cache_key IS NOT DISTINCT FROM pairs.cache_key JOIN fps USING (fingerprint)
    """)
    con.execute("""DELETE FROM summary_keys s WHERE EXISTS (SELECT 1 FROM touched_keys k
                   WHERE s.deployment = k.deployment AND s.cache_key IS NOT DISTINCT FROM k.cache_key)""")
    con.execute("INSERT INTO summary_keys BY NAME SELECT * FROM new_pairs")
    con.execute("DELETE FROM summary_shared_keys WHERE key_id IN (SELECT key_id FROM new_pairs)")
    where = "WHERE key_id IN (SELECT key_id FROM new_pairs)"
    con.execute(f"INSERT INTO summary_shared_keys BY NAME {SHARED_KEYS_SQL.replace('{where}', where)}")


def _update_contaminated(con: duckdb.DuckDBPyConnection, stored: int) -> None:
    if stored:
        con.execute("DELETE FROM summary_contaminated WHERE request_id IN (SELECT request_id FROM rejudge WHERE stored)")
    rows = ("(SELECT * FROM requests WHERE ts >= (SELECT min(ts) FROM rejudge) "
            "AND request_id IN (SELECT request_id FROM rejudge))")
    con.execute(f"INSERT INTO summary_contaminated BY NAME {over(CONTAMINATED_SQL, rows, 'judged_now')}")
