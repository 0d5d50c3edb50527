"""Bring `hit_sources` and the summaries up to date after a batch, at a cost that follows the batch, not the store.

The batch is the rows of `requests` with the ingest's id; `backfilled` holds stored misses whose
cache key the batch supplied (ingestion/load.py, `_backfill_cache_keys`). What a batch may change:

- its own hits' verdicts;
- stored hits of a (deployment, cache_key) whose misses changed (the batch's misses, the backfilled
  ones), at or after the earliest such miss: a late miss may now be their latest earlier miss;
- stored hits that were the first sight of their identity, when the batch holds a row of it (an
  earlier one makes them not the first);
- stored hits whose logged source link names a request of the batch (the source arrived late).

Only those are judged again, against every stored miss of their keys however old. The minutes their
rows fall in are then recounted (or, where only the batch added rows, add its counts); the key/identity
pairs and the histograms add what changed; the batch's rows are appended to the per-request key hashes.
The result equals a full rebuild (`judge_hits` + `build_summaries`); tests/store/test_incremental.py
holds it to that after every batch of random logs, late files, ties and source links included.
"""

from __future__ import annotations

import duckdb

from specdec_core.derived import summaries
from specdec_core.derived.hit_sources import (
    FOLD_LAST_MISS_SQL,
    LAST_MISS_FOLDED,
    MISS_COLUMNS,
    ROW_SQL,
    hit_sources_sql,
    last_miss_sql,
)
from specdec_core.derived.summaries import (
    AUDIENCE_KEYS,
    AUDIENCE_MERGE,
    AUDIENCE_SQL,
    COMPACT_OUTPUTS_SQL,
    CONTAMINATED_SQL,
    IMPACT_HITS_SQL,
    LATENCY_SQL,
    LENGTHS_SQL,
    MINUTE_MERGE,
    MINUTE_SQL,
    OUTPUTS_SQL,
    REQUEST_KEYS_SQL,
    SHARED_KEYS_SQL,
    draft_label,
    folded_sql,
    over,
    request_outputs_sql,
)
from specdec_core.store.sql import deployment_label, deployment_partition, literal, scalar

_DEP = deployment_partition("r")

# The judging's rows for the hits in `{HITS}`: the misses of their keys (from {SINCE} on: see
# JUDGE_WINDOW_SECONDS), when their identities were first seen, their linked sources.
_REJUDGE_ROWS = f"""hits AS (SELECT * FROM ({ROW_SQL}) q WHERE cache_hit AND ts >= {{FIRST}}
                                             AND request_id IN (SELECT request_id FROM {{HITS}})),
hit_keys AS (SELECT DISTINCT dep, cache_key FROM hits),
miss_rows AS ({{MISSES}}),
hit_fps AS (SELECT DISTINCT dep, fingerprint FROM hits),
-- When each identity was first seen, kept up to date with the batch already (identity_first_seen).
first_rows AS (SELECT f.dep, f.fingerprint, f.first_ts AS ts FROM identity_first_seen f
               SEMI JOIN hit_fps h ON h.dep = f.dep AND h.fingerprint = f.fingerprint),
link_rows AS (SELECT * FROM ({ROW_SQL}) q WHERE request_id IN (SELECT source_link FROM hits))"""

# A hit's source is the latest earlier miss of its key. For a hit that key_last_miss can't settle (its key has
# a stored miss later than it: a late file) that almost always lies in the last hour before the earliest such
# hit: those misses are read first, a scan bounded in time that skips the store's older row groups. A hit with
# a miss of its key in the window is settled (the latest one before it lies there too); only the hits left
# without one are judged again against the whole history of their keys.
JUDGE_WINDOW_SECONDS = 3600


# The stored misses of the hits' keys from {SINCE} on.
_STORED_MISSES = f"""SELECT q.* FROM ({ROW_SQL}) q SEMI JOIN hit_keys k ON k.dep = q.dep AND k.cache_key = q.cache_key
              WHERE NOT q.cache_hit AND q.ts >= {{SINCE}}"""
# For hits later than every stored miss of their key (`fast`): that key's latest stored miss (`last_miss`) and
# the misses this batch added or gave a key (`new_misses`) are all the misses their source can be.
_LATEST_MISSES = f"""SELECT {MISS_COLUMNS} FROM last_miss
              UNION ALL SELECT m.* FROM new_misses m SEMI JOIN hit_keys k ON k.dep = m.dep AND k.cache_key = m.cache_key"""


def _judge(hits: str, first: str, since: str | None = None) -> str:
    """The verdicts of the hits in the table `hits`: against the stored misses of their keys from `since` on, or
    (no `since`) against the latest misses of their keys (`_LATEST_MISSES`)."""
    misses = _LATEST_MISSES if since is None else _STORED_MISSES.replace("{SINCE}", since)
    return hit_sources_sql(rows=_REJUDGE_ROWS.replace("{MISSES}", misses).replace("{FIRST}", first)
                           .replace("{HITS}", hits))


def update_derived(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Judge the hits the batch `ingest_id` may have changed, then bring every summary up to date from them."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE batch AS
        SELECT request_id, ts, {_DEP} AS dep, {deployment_label(None)} AS deployment, cache_key, cache_hit, fingerprint,
               source_file, source_line
        FROM requests r WHERE ingest_id = ?
    """, [ingest_id])
    _rejudge_set(con, ingest_id)
    _update_first_seen(con)
    first = _timestamp_literal(con, "SELECT min(ts) FROM rejudge")
    _judge_rejudged(con, first)
    # The verdicts they had: the pairs' first-sight counts change by the difference.
    con.execute("CREATE OR REPLACE TEMP TABLE old_verdicts AS SELECT request_id, first_sight FROM hit_sources "
                "WHERE false")
    if scalar(con, "SELECT count(*) FROM rejudge WHERE stored"):
        con.execute("INSERT INTO old_verdicts SELECT request_id, first_sight FROM hit_sources "
                    "WHERE request_id IN (SELECT request_id FROM rejudge WHERE stored)")
        con.execute("DELETE FROM hit_sources WHERE request_id IN (SELECT request_id FROM rejudge WHERE stored)")
    con.execute("INSERT INTO hit_sources BY NAME SELECT * FROM judged_now")
    con.execute("INSERT INTO key_last_miss BY NAME " + last_miss_sql("SELECT * FROM new_misses"))
    _fold_when_doubled(con, "key_last_miss", LAST_MISS_FOLDED, FOLD_LAST_MISS_SQL)
    # The rows whose summaries may differ now: the batch's, the rejudged hits', the backfilled misses'.
    _update_minutes(con, ingest_id)
    _update_keys(con, ingest_id)
    for table, sql, keys in (("summary_lengths", LENGTHS_SQL, _LENGTH_KEYS), ("summary_latency", LATENCY_SQL, _LATENCY_KEYS)):
        _add_counts(con, table, over(sql, f"r.ingest_id = {int(ingest_id)}"), keys)
    _append_outputs(con, ingest_id)
    _append_request_keys(con, ingest_id)
    con.execute("INSERT INTO summary_request_outputs BY NAME "
                + over(request_outputs_sql(), f"r.ingest_id = {int(ingest_id)}"))
    con.execute("DELETE FROM summary_contaminated WHERE request_id IN (SELECT request_id FROM rejudge)")
    # The verdicts just written for `rejudge` are `judged_now`: joined to it, not to every stored verdict.
    con.execute("INSERT INTO summary_contaminated BY NAME " + over(
        CONTAMINATED_SQL.replace("JOIN hit_sources h", "JOIN judged_now h"),
        f"r.ts >= {first} AND r.request_id IN (SELECT request_id FROM judged_now)"))
    _add_audience(con, ingest_id)
    con.execute("DELETE FROM summary_impact_hits WHERE request_id IN (SELECT request_id FROM rejudge)")
    con.execute("INSERT INTO summary_impact_hits BY NAME " + over(
        IMPACT_HITS_SQL.replace("JOIN hit_sources h", "JOIN judged_now h"),
        f"r.ts >= {first} AND r.request_id IN (SELECT request_id FROM judged_now)"))
    # The summaries' version needs no rewrite: the ingest's migrate_connection found it current or rebuilt them.


def _judge_rejudged(con: duckdb.DuckDBPyConnection, first: str) -> None:
    """`judged_now`: the verdicts of the hits in `rejudge` (their earliest time: `first`).

    A hit later than every stored miss of its key (live traffic: nearly all) has as source that key's latest
    stored miss or one of the batch's: judged from key_last_miss, reading no stored misses. The others (a late
    file's hits, stored hits a late miss may now source) are judged against the stored misses of their keys.
    """
    con.execute(f"CREATE OR REPLACE TEMP TABLE new_misses AS SELECT {MISS_COLUMNS} FROM batch "
                f"WHERE NOT cache_hit AND cache_key IS NOT NULL "
                f"UNION ALL SELECT {MISS_COLUMNS} FROM backfilled WHERE NOT cache_hit")
    # key_last_miss still holds the misses stored before this batch: its own are added after the judging.
    con.execute("CREATE OR REPLACE TEMP TABLE last_miss AS " + last_miss_sql(
        "SELECT k.* FROM key_last_miss k SEMI JOIN rejudge r ON r.dep = k.dep AND r.cache_key = k.cache_key"))
    con.execute("CREATE OR REPLACE TEMP TABLE fast AS SELECT r.request_id FROM rejudge r "
                "LEFT JOIN last_miss l ON l.dep = r.dep AND l.cache_key = r.cache_key WHERE l.ts IS NULL OR l.ts <= r.ts")
    # No hit to judge (a batch of misses nobody hit again yet): the judging's joins would still read the
    # identities and first sights of the whole store, 35 ms at 5M rows, to find nothing.
    empty = "" if scalar(con, "SELECT count(*) FROM fast") else " LIMIT 0"
    con.execute(f"CREATE OR REPLACE TEMP TABLE judged_now AS SELECT * FROM ({_judge('fast', first)}){empty}")
    con.execute("CREATE OR REPLACE TEMP TABLE slow AS SELECT * FROM rejudge WHERE request_id NOT IN "
                "(SELECT request_id FROM fast)")
    if not scalar(con, "SELECT count(*) FROM slow"):
        return
    slow_first = _timestamp_literal(con, "SELECT min(ts) FROM slow")
    window = _timestamp_literal(con, f"SELECT min(ts) - INTERVAL {int(JUDGE_WINDOW_SECONDS)} SECOND FROM slow")
    con.execute("CREATE OR REPLACE TEMP TABLE judged_slow AS " + _judge("slow", slow_first, window))
    con.execute("CREATE OR REPLACE TEMP TABLE unsettled AS SELECT request_id FROM judged_slow "
                "WHERE source_request_id IS NULL")
    if scalar(con, "SELECT count(*) FROM unsettled"):
        con.execute("DELETE FROM judged_slow WHERE request_id IN (SELECT request_id FROM unsettled)")
        con.execute("INSERT INTO judged_slow " + _judge("unsettled", slow_first, "'-infinity'::TIMESTAMPTZ"))
    con.execute("INSERT INTO judged_now BY NAME SELECT * FROM judged_slow")


def _update_first_seen(con: duckdb.DuckDBPyConnection) -> None:
    """Bring the batch's rows into `identity_first_seen`: an earlier time replaces a later one."""
    con.execute("CREATE OR REPLACE TEMP TABLE batch_first_seen AS SELECT dep, fingerprint, min(ts) AS first_ts "
                "FROM batch GROUP BY 1, 2")
    con.execute("""
        UPDATE identity_first_seen f SET first_ts = b.first_ts FROM batch_first_seen b
        WHERE f.dep = b.dep AND f.fingerprint = b.fingerprint AND b.first_ts < f.first_ts
    """)
    con.execute("""
        INSERT INTO identity_first_seen SELECT * FROM batch_first_seen b
        WHERE NOT EXISTS (SELECT 1 FROM identity_first_seen f WHERE f.dep = b.dep AND f.fingerprint = b.fingerprint)
    """)


def _rejudge_set(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """`rejudge`: every hit whose verdict the batch may change (the module's list), with its time and key.

    Each search of the stored rows is bounded in time where it can be, so that live traffic (a batch
    later than everything stored) reads only the newest part of the store.
    """
    con.execute("""
        CREATE OR REPLACE TEMP TABLE touched AS
        SELECT dep, cache_key, min(ts) AS since FROM (
            SELECT dep, cache_key, ts FROM batch WHERE NOT cache_hit
            UNION ALL SELECT dep, cache_key, ts FROM backfilled
        ) WHERE cache_key IS NOT NULL GROUP BY ALL
    """)
    since = _timestamp_literal(con, "SELECT min(since) FROM touched")
    batch_first = _timestamp_literal(con, "SELECT min(ts) FROM batch")
    stored = (f"r.request_id, r.ts, {deployment_label('r')} AS deployment, r.cache_key, r.fingerprint, "
              f"{_DEP}, r.ingest_id <> {int(ingest_id)}")
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE rejudge AS
        SELECT DISTINCT ON (request_id) * FROM (
            SELECT request_id, ts, deployment, cache_key, fingerprint, dep, false AS stored FROM batch WHERE cache_hit
            UNION ALL
            SELECT {stored} FROM requests r JOIN touched t ON t.dep = {_DEP} AND t.cache_key = r.cache_key
            WHERE r.cache_hit AND r.ts >= t.since AND r.ts >= {since}
            UNION ALL
            SELECT {stored} FROM requests r WHERE r.cache_hit AND r.source_link IN (SELECT request_id FROM batch)
            UNION ALL
            -- A first sight stops being one when the batch holds an earlier row of its identity.
            SELECT {stored} FROM requests r SEMI JOIN batch b ON b.dep = {_DEP} AND b.fingerprint = r.fingerprint
            WHERE r.cache_hit AND r.ts > {batch_first}
              AND r.request_id IN (SELECT request_id FROM hit_sources WHERE first_sight)
        ) ORDER BY request_id, stored
    """)


def _timestamp_literal(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """A time the query returns, as a SQL constant: a scan skips the row groups a constant bound rules out,
    which a subquery's bound can't do. A batch without such a time gives a bound no row passes."""
    value = scalar(con, f"SELECT coalesce(({sql})::VARCHAR, 'infinity')")
    return literal(value) + "::TIMESTAMPTZ"


def _minute(ts: str) -> str:
    return f"time_bucket(INTERVAL 1 minute, {ts})"


def _update_minutes(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Minutes where stored rows changed (rejudged hits, misses given a key) are counted again; minutes that
    only gained the batch's rows (live traffic: all of them) add the batch's counts to theirs, so a batch into
    a busy minute does not count the minute's every row again."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE recount AS SELECT DISTINCT {_minute('ts')} AS minute "
                "FROM (SELECT ts FROM rejudge WHERE stored UNION ALL SELECT ts FROM backfilled)")
    con.execute(f"CREATE OR REPLACE TEMP TABLE added AS SELECT DISTINCT {_minute('ts')} AS minute "
                f"FROM batch WHERE {_minute('ts')} NOT IN (SELECT minute FROM recount)")
    _replace_minutes(con, "recount", over(MINUTE_SQL, _in_minutes("recount")))
    # The batch's hits were all judged now: their verdicts are judged_now's rows.
    batch_rows = over(MINUTE_SQL.replace("JOIN hit_sources h", "JOIN judged_now h"),
                      f"{_in_minutes('added')} AND r.ingest_id = {int(ingest_id)}")
    merged = ", ".join(f"{how}({name}) AS {name}" for name, how in MINUTE_MERGE.items())
    _replace_minutes(con, "added", f"SELECT * EXCLUDE ({', '.join(MINUTE_MERGE)}), {merged} FROM ("
                                   "SELECT * FROM summary_minute WHERE minute IN (SELECT minute FROM added) "
                                   f"UNION ALL BY NAME {batch_rows}) GROUP BY ALL")


def _in_minutes(minutes: str) -> str:
    # The range (the ? bounds) lets the scan skip what lies outside it; the list keeps only those minutes.
    return f"r.ts >= ? AND r.ts < ? AND {_minute('r.ts')} IN (SELECT minute FROM {minutes})"


def _replace_minutes(con: duckdb.DuckDBPyConnection, minutes: str, rows: str) -> None:
    """Replace summary_minute's rows of the minutes listed in the table `minutes` by `rows` (over _in_minutes)."""
    lo, hi = con.execute(f"SELECT min(minute), max(minute) + INTERVAL 1 minute FROM {minutes}").fetchall()[0]
    if lo is None:
        return
    con.execute(f"CREATE OR REPLACE TEMP TABLE minute_rows AS {rows}", [lo, hi])
    con.execute(f"DELETE FROM summary_minute WHERE minute IN (SELECT minute FROM {minutes})")
    con.execute("INSERT INTO summary_minute BY NAME SELECT * FROM minute_rows")


def _update_keys(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Add what the batch changed to the (deployment, cache_key, fingerprint) pairs: its rows, the stored misses
    that got a key, the first sights rejudged hits gained or lost. A key or identity keeps its number."""
    # Rows without a cache key have no pair, as in a full build (its join on the key drops them).
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE pair_delta AS
        WITH added AS (
            SELECT r.request_id, r.ts, {deployment_label('r')} AS deployment, r.cache_key, r.fingerprint,
                   r.target_model, {draft_label()} AS draft_model, r.cache_hit
            FROM requests r WHERE r.ingest_id = {int(ingest_id)} AND r.cache_key IS NOT NULL
            UNION ALL
            SELECT r.request_id, r.ts, {deployment_label('r')}, r.cache_key, r.fingerprint, r.target_model,
                   {draft_label()}, r.cache_hit
            FROM requests r WHERE r.request_id IN (SELECT request_id FROM backfilled)
        ), sights AS (
            SELECT j.request_id, coalesce(j.first_sight::INT, 0) - coalesce(o.first_sight::INT, 0) AS gained
            FROM judged_now j LEFT JOIN old_verdicts o USING (request_id)
        ), rows AS (
            SELECT a.*, true AS added, coalesce(s.gained, 0) AS gained FROM added a LEFT JOIN sights s USING (request_id)
            UNION ALL
            SELECT j.request_id, j.ts, j.deployment, j.cache_key, j.fingerprint, NULL, NULL, true, false, s.gained
            FROM rejudge j JOIN sights s USING (request_id)
            WHERE j.stored AND j.cache_key IS NOT NULL AND s.gained <> 0
        )
        SELECT deployment, cache_key, fingerprint, any_value(target_model) AS target_model,
               any_value(draft_model) AS draft_model, count(*) FILTER (WHERE added)::BIGINT AS requests,
               count(*) FILTER (WHERE added AND cache_hit)::BIGINT AS hits, coalesce(sum(gained), 0)::BIGINT AS first_sight,
               min(ts) FILTER (WHERE added) AS first_seen, max(ts) FILTER (WHERE added) AS last_seen
        FROM rows GROUP BY 1, 2, 3
    """)
    # The stored pairs of the batch's keys and fingerprints, found in one scan of summary_keys' text columns
    # (its largest cost): the update, the new pairs and the numbers they take are worked out from these few.
    con.execute("""
        CREATE OR REPLACE TEMP TABLE near_keys AS
        SELECT deployment, cache_key, fingerprint, key_id, fp_id FROM summary_keys
        WHERE cache_key IN (SELECT cache_key FROM pair_delta) OR fingerprint IN (SELECT fingerprint FROM pair_delta)
    """)
    # A pair is one (key_id, fp_id): the update matches stored rows on two integers, not on three texts.
    con.execute("""
        UPDATE summary_keys s SET requests = s.requests + d.requests, hits = s.hits + d.hits,
               first_sight = s.first_sight + d.first_sight,
               first_seen = least(s.first_seen, coalesce(d.first_seen, s.first_seen)),
               last_seen = greatest(s.last_seen, coalesce(d.last_seen, s.last_seen))
        FROM (SELECT d.*, n.key_id, n.fp_id FROM pair_delta d JOIN near_keys n USING (deployment, cache_key, fingerprint)) d
        WHERE s.key_id = d.key_id AND s.fp_id = d.fp_id
    """)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE new_pairs AS
        SELECT d.* FROM pair_delta d ANTI JOIN near_keys s
        ON s.deployment = d.deployment AND s.cache_key = d.cache_key AND s.fingerprint = d.fingerprint
    """)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE key_ids AS
        WITH old AS (
            SELECT DISTINCT s.deployment, s.cache_key, s.key_id FROM near_keys s
            SEMI JOIN pair_delta k ON k.deployment = s.deployment AND k.cache_key = s.cache_key
        ), fresh AS (
            SELECT DISTINCT p.deployment, p.cache_key FROM new_pairs p
            ANTI JOIN old o ON o.deployment = p.deployment AND o.cache_key = p.cache_key
        )
        SELECT * FROM old
        UNION ALL
        SELECT deployment, cache_key,
               (SELECT coalesce(max(key_id), 0) FROM summary_keys) + row_number() OVER () AS key_id FROM fresh
    """)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE fp_ids AS
        WITH old AS (
            SELECT DISTINCT fingerprint, fp_id FROM near_keys WHERE fingerprint IN (SELECT fingerprint FROM new_pairs)
        ), fresh AS (SELECT DISTINCT fingerprint FROM new_pairs WHERE fingerprint NOT IN (SELECT fingerprint FROM old))
        SELECT * FROM old
        UNION ALL
        SELECT fingerprint, (SELECT coalesce(max(fp_id), 0) FROM summary_keys) + row_number() OVER () FROM fresh
    """)
    con.execute("""
        INSERT INTO summary_keys BY NAME
        SELECT p.*, k.key_id, f.fp_id FROM new_pairs p
        JOIN key_ids k ON k.deployment = p.deployment AND k.cache_key = p.cache_key
        JOIN fp_ids f USING (fingerprint)
    """)
    con.execute("DELETE FROM summary_shared_keys WHERE key_id IN (SELECT key_id FROM key_ids)")
    con.execute("INSERT INTO summary_shared_keys BY NAME "
                + over(SHARED_KEYS_SQL, "key_id IN (SELECT key_id FROM key_ids)"))


def _append_outputs(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Append the batch's output groups; fold the table again once it has doubled since it was last folded."""
    con.execute("INSERT INTO summary_outputs BY NAME " + over(OUTPUTS_SQL, f"r.ingest_id = {int(ingest_id)}"))
    _fold_when_doubled(con, "summary_outputs", "outputs_compacted", COMPACT_OUTPUTS_SQL)


def _fold_when_doubled(con: duckdb.DuckDBPyConnection, table: str, key: str, fold_sql: str) -> None:
    """Fold a table that batches append to (`fold_sql`) once it holds more than twice its rows when last folded
    (meta's `key`) plus a slack: each row is folded a bounded number of times."""
    rows = scalar(con, f"SELECT count(*) FROM {table}")
    folded = scalar(con, f"SELECT coalesce(max(value::BIGINT), 0) FROM meta WHERE key = '{key}'")
    if rows > 2 * folded + summaries.OUTPUTS_SLACK:
        con.execute(fold_sql)
        con.execute(folded_sql(table, key))


def _append_request_keys(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """The batch's rows, and the stored misses that only now have a cache key (none had a row before)."""
    con.execute("INSERT INTO summary_request_keys BY NAME " + over(REQUEST_KEYS_SQL, f"r.ingest_id = {int(ingest_id)}"))
    if scalar(con, "SELECT count(*) FROM backfilled"):
        con.execute("INSERT INTO summary_request_keys BY NAME "
                    + over(REQUEST_KEYS_SQL, "r.request_id IN (SELECT request_id FROM backfilled)"))


# The columns a histogram row counts (its `n`) by: one row per combination (LENGTHS_SQL, LATENCY_SQL).
_LENGTH_KEYS = ("deployment", "target_model", "draft_model", "max_tokens", "value")
_LATENCY_KEYS = ("deployment", "target_model", "draft_model", "cache_hit", "value")


def _add_counts(con: duckdb.DuckDBPyConnection, table: str, batch_sql: str, keys: tuple[str, ...]) -> None:
    """Add a batch's histogram to a stored one, kept one row per combination of `keys` (NULL included): the
    combinations it has already count up, new ones are added; the rest of the table is left as it is."""
    same = " AND ".join(f"t.{k} IS NOT DISTINCT FROM d.{k}" for k in keys)
    con.execute(f"CREATE OR REPLACE TEMP TABLE counts AS {batch_sql}")
    con.execute(f"UPDATE {table} t SET n = t.n + d.n FROM counts d WHERE {same}")
    con.execute(f"INSERT INTO {table} BY NAME SELECT d.* FROM counts d ANTI JOIN {table} t ON {same}")


def _add_audience(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
    """Add the batch's rows to summary_audience: its figures depend on the rows alone, never on a verdict."""
    same = " AND ".join(f"t.{k} IS NOT DISTINCT FROM d.{k}" for k in AUDIENCE_KEYS)
    merged = ", ".join(f"{name} = {_merge_pair(how, name)}" for name, how in AUDIENCE_MERGE.items())
    con.execute("CREATE OR REPLACE TEMP TABLE audience_counts AS "
                + over(AUDIENCE_SQL, f"r.ingest_id = {int(ingest_id)}"))
    con.execute(f"UPDATE summary_audience t SET {merged} FROM audience_counts d WHERE {same}")
    con.execute(f"INSERT INTO summary_audience BY NAME SELECT d.* FROM audience_counts d ANTI JOIN summary_audience t ON {same}")


def _merge_pair(how: str, name: str) -> str:
    """A stored value `t.name` and a batch's `d.name` merged by `how`; either may be NULL (no violation, no
    latency logged yet), which the merge skips as the aggregate over all rows would."""
    pick = {"sum": f"t.{name} + d.{name}", "min": f"least(t.{name}, d.{name})", "max": f"greatest(t.{name}, d.{name})"}
    return f"coalesce({pick[how]}, t.{name}, d.{name})"
