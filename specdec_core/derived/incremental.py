"""Bring `hit_sources` and the summaries up to date after a batch, at a cost that follows the batch, not the store.

The batch is the rows of `requests` with the ingest's id, and the stored misses whose cache key it supplied
(ingestion/load.py, `backfill_cache_keys`: a relation the caller names). What a batch may change:

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

Each step takes the relations it reads as arguments and returns the name of the one it makes, so
`update_derived` reads as the data flow; it drops the temp tables its steps made (`_temp`) at the end.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass

import duckdb

from specdec_core.derived import aliases, summaries
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
    COMPACT_OUTPUTS_SQL,
    MINUTE_MERGE,
    PARTIAL_HIT,
    audience_sql,
    contaminated_sql,
    draft_label,
    folded_sql,
    impact_hits_sql,
    latency_sql,
    lengths_sql,
    minute_sql,
    outputs_sql,
    request_keys_sql,
    request_outputs_sql,
    shared_keys_sql,
    violations_sql,
)
from specdec_core.derived.verdicts import record_first_verdicts
from specdec_core.store.sql import deployment_label, deployment_partition, literal, scalar

_DEP = deployment_partition("r")


@dataclass(frozen=True)
class Batch:
    """One ingest batch as the update reads it: its id, the relation of its rows (`_batch_rows`: request_id,
    ts, dep, deployment, cache_key, cache_hit, fingerprint, source_file, source_line) and the relation of the
    stored misses it gave a cache key (the same columns, the key as it now is)."""

    ingest_id: int
    rows: str
    backfilled: str
    requests: str = "requests"  # where its rows of `requests` are read: the table, or a copy of them (BATCH_COPY_ROWS)

    @property
    def where(self) -> str:
        """The batch's rows of `requests r`, as a condition."""
        return f"r.ingest_id = {int(self.ingest_id)}"


# The temp tables the update under way has made (`_temp`), which it drops at its end. Kept here, not listed from
# duckdb_tables() before and after: that lists every table of a lake's catalog too, 14 ms a call.
_MADE: ContextVar[set[str] | None] = ContextVar("specdec_update_temp_tables", default=None)


def _temp(con: duckdb.DuckDBPyConnection, name: str, sql: str) -> str:
    """Make the temp table `name` from `sql` and return its name: the one place the update's relations are made."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {name} AS {sql}")
    made = _MADE.get()
    if made is not None:
        made.add(name)
    return name


# A lake's batch of at most this many rows is read from the store once, into a temp table the update's steps read
# (but its prompts, which none of them reads): each step found its rows in the lake itself, through a catalog query
# filtered by column statistics (1.6 ms) and a Parquet read of its own. A larger batch is read where it is stored,
# as a file store's always is (its row groups skipped by their ingest ids): no copy of its texts in memory.
BATCH_COPY_ROWS = 100_000


def update_derived(con: duckdb.DuckDBPyConnection, ingest_id: int, backfilled: str, copy_rows: bool = False) -> None:
    """Judge the hits the batch `ingest_id` may have changed (`backfilled`: the stored misses it gave a cache key),
    then bring every summary up to date from them; `copy_rows`: read the batch's rows once into memory first."""
    made: set[str] = set()
    token = _MADE.set(made)
    try:
        _update(con, ingest_id, backfilled, copy_rows)
    finally:
        _MADE.reset(token)
    for name in sorted(made):
        con.execute(f"DROP TABLE temp.{name}")


def _update(con: duckdb.DuckDBPyConnection, ingest_id: int, backfilled: str, copy_rows: bool) -> None:
    source = (_temp(con, "batch_requests", f"SELECT * EXCLUDE (prompt) FROM requests WHERE ingest_id = {int(ingest_id)}")
              if copy_rows else "requests")
    batch = Batch(ingest_id, _batch_rows(con, ingest_id, source), backfilled, source)
    rejudge = _rejudge_set(con, batch)
    _update_first_seen(con, batch)
    first = _timestamp_literal(con, f"SELECT min(ts) FROM {rejudge}")
    new_misses = _new_misses(con, batch)
    judged = _judge_rejudged(con, rejudge, new_misses, first)
    old_verdicts = _replace_verdicts(con, rejudge, judged)
    con.execute("INSERT INTO key_last_miss BY NAME " + last_miss_sql(f"SELECT * FROM {new_misses}"))
    _fold_when_doubled(con, "key_last_miss", LAST_MISS_FOLDED, FOLD_LAST_MISS_SQL)
    # The rows whose summaries may differ now: the batch's, the rejudged hits', the backfilled misses'.
    _update_minutes(con, batch, rejudge, judged)
    _update_keys(con, batch, rejudge, judged, old_verdicts)
    _add_counts(con, "summary_lengths", lengths_sql(batch.where, rows=batch.requests), _LENGTH_KEYS)
    _add_counts(con, "summary_latency", latency_sql(batch.where, rows=batch.requests), _LATENCY_KEYS)
    _append_outputs(con, batch)
    _append_request_keys(con, batch)
    con.execute("INSERT INTO summary_request_outputs BY NAME " + request_outputs_sql(batch.where, rows=batch.requests))
    con.execute("INSERT INTO summary_violations BY NAME "  # a row's own figures
                + violations_sql(batch.where, rows=batch.requests))
    # The verdicts just written for `rejudge` are `judged`: joined to it, not to every stored verdict.
    rejudged_rows = f"r.ts >= {first} AND r.request_id IN (SELECT request_id FROM {judged})"
    con.execute(f"DELETE FROM summary_contaminated WHERE request_id IN (SELECT request_id FROM {rejudge})")
    con.execute("INSERT INTO summary_contaminated BY NAME " + contaminated_sql(rejudged_rows, hit_sources=judged))
    _add_audience(con, batch)
    con.execute(f"DELETE FROM summary_impact_hits WHERE request_id IN (SELECT request_id FROM {rejudge})")
    con.execute("INSERT INTO summary_impact_hits BY NAME " + impact_hits_sql(rejudged_rows, hit_sources=judged))
    record_first_verdicts(con, ingest_id, among=rejudge)  # no other hit's verdict changed
    # The summaries' version needs no rewrite: the ingest's migrate_connection found it current or rebuilt them.


def _batch_rows(con: duckdb.DuckDBPyConnection, ingest_id: int, source: str) -> str:
    """The batch's rows (of `source`: requests, or its copy of them) with what the judging reads of them."""
    return _temp(con, "batch", f"""
        SELECT request_id, ts, {_DEP} AS dep, {deployment_label(None)} AS deployment, cache_key, cache_hit, fingerprint,
               source_file, source_line
        FROM {source} r WHERE ingest_id = {int(ingest_id)}
    """)


def _rejudge_set(con: duckdb.DuckDBPyConnection, batch: Batch) -> str:
    """Every hit whose verdict the batch may change (the module's list), with its time and key, and whether it
    was stored before the batch.

    Each search of the stored rows is bounded in time where it can be, so that live traffic (a batch
    later than everything stored) reads only the newest part of the store.
    """
    touched = _temp(con, "touched", f"""
        SELECT dep, cache_key, min(ts) AS since FROM (
            SELECT dep, cache_key, ts FROM {batch.rows} WHERE NOT cache_hit
            UNION ALL SELECT dep, cache_key, ts FROM {batch.backfilled}
        ) WHERE cache_key IS NOT NULL GROUP BY ALL
    """)
    since = _timestamp_literal(con, f"SELECT min(since) FROM {touched}")
    batch_first = _timestamp_literal(con, f"SELECT min(ts) FROM {batch.rows}")
    stored = (f"r.request_id, r.ts, {deployment_label('r')} AS deployment, r.cache_key, r.fingerprint, "
              f"{_DEP}, r.ingest_id <> {int(batch.ingest_id)}")
    return _temp(con, "rejudge", f"""
        SELECT DISTINCT ON (request_id) * FROM (
            SELECT request_id, ts, deployment, cache_key, fingerprint, dep, false AS stored FROM {batch.rows}
            WHERE cache_hit
            UNION ALL
            SELECT {stored} FROM requests r JOIN {touched} t ON t.dep = {_DEP} AND t.cache_key = r.cache_key
            WHERE r.cache_hit AND r.ts >= t.since AND r.ts >= {since}
            UNION ALL
            SELECT {stored} FROM requests r WHERE r.cache_hit AND r.source_link IN (SELECT request_id FROM {batch.rows})
            UNION ALL
            -- A first sight stops being one when the batch holds an earlier row of its identity. A stored hit
            -- is a first sight when no earlier row has its identity (hit_sources_sql): its time is its identity's
            -- first (identity_first_seen, not yet updated with the batch's rows), which is one row per identity
            -- to read where hit_sources' first_sight column is one per hit (0.5 s of a write at 20M rows).
            SELECT {stored} FROM requests r
            JOIN identity_first_seen f ON f.dep = {_DEP} AND f.fingerprint = r.fingerprint
            JOIN (SELECT dep, fingerprint, min(ts) AS ts FROM {batch.rows} GROUP BY ALL) b
              ON b.dep = f.dep AND b.fingerprint = f.fingerprint
            WHERE r.cache_hit AND r.ts > {batch_first} AND r.ts <= f.first_ts AND b.ts < r.ts
        ) ORDER BY request_id, stored
    """)


def _update_first_seen(con: duckdb.DuckDBPyConnection, batch: Batch) -> None:
    """Bring the batch's rows into `identity_first_seen`: an earlier time replaces a later one."""
    firsts = _temp(con, "batch_first_seen", f"SELECT dep, fingerprint, min(ts) AS first_ts FROM {batch.rows} "
                                            "GROUP BY 1, 2")
    con.execute(f"""
        UPDATE identity_first_seen f SET first_ts = b.first_ts FROM {firsts} b
        WHERE f.dep = b.dep AND f.fingerprint = b.fingerprint AND b.first_ts < f.first_ts
    """)
    con.execute(f"""
        INSERT INTO identity_first_seen SELECT * FROM {firsts} b
        WHERE NOT EXISTS (SELECT 1 FROM identity_first_seen f WHERE f.dep = b.dep AND f.fingerprint = b.fingerprint)
    """)


def _new_misses(con: duckdb.DuckDBPyConnection, batch: Batch) -> str:
    """The misses this batch added or gave a key (MISS_COLUMNS)."""
    return _temp(con, "new_misses", f"SELECT {MISS_COLUMNS} FROM {batch.rows} WHERE NOT cache_hit "
                                    f"AND cache_key IS NOT NULL "
                                    f"UNION ALL SELECT {MISS_COLUMNS} FROM {batch.backfilled} WHERE NOT cache_hit")


# A hit's source is the latest earlier miss of its key. For a hit that key_last_miss can't settle (its key has
# a stored miss later than it: a late file) that almost always lies in the last hour before the earliest such
# hit: those misses are read first, a scan bounded in time that skips the store's older row groups. A hit with
# a miss of its key in the window is settled (the latest one before it lies there too); only the hits left
# without one are judged again against the whole history of their keys.
JUDGE_WINDOW_SECONDS = 3600


def _rejudge_rows(hits: str, first: str, misses: str) -> str:
    """The judging's rows (hit_sources_sql's `rows`) for the hits listed in the relation `hits` (none earlier than
    `first`): the misses of their keys (`misses`, over the CTE hit_keys), when their identities were first seen,
    their linked sources."""
    return f"""hits AS (SELECT * FROM ({ROW_SQL}) q WHERE cache_hit AND ts >= {first}
                                             AND request_id IN (SELECT request_id FROM {hits})),
hit_keys AS (SELECT DISTINCT dep, cache_key FROM hits),
miss_rows AS ({misses}),
hit_fps AS (SELECT DISTINCT dep, fingerprint FROM hits),
-- When each identity was first seen, kept up to date with the batch already (identity_first_seen).
first_rows AS (SELECT f.dep, f.fingerprint, f.first_ts AS ts FROM identity_first_seen f
               SEMI JOIN hit_fps h ON h.dep = f.dep AND h.fingerprint = f.fingerprint),
link_rows AS (SELECT * FROM ({ROW_SQL}) q WHERE request_id IN (SELECT source_link FROM hits))"""


def _stored_misses(since: str) -> str:
    """The stored misses of the hits' keys (the CTE hit_keys) from `since` on."""
    return f"""SELECT q.* FROM ({ROW_SQL}) q SEMI JOIN hit_keys k ON k.dep = q.dep AND k.cache_key = q.cache_key
              WHERE NOT q.cache_hit AND q.ts >= {since}"""


def _latest_misses(last_miss: str, new_misses: str) -> str:
    """For hits later than every stored miss of their key: that key's latest stored miss (`last_miss`) and the
    misses this batch added or gave a key (`new_misses`) are all the misses their source can be."""
    return f"""SELECT {MISS_COLUMNS} FROM {last_miss}
              UNION ALL SELECT m.* FROM {new_misses} m SEMI JOIN hit_keys k ON k.dep = m.dep AND k.cache_key = m.cache_key"""


def _judge(hits: str, first: str, misses: str) -> str:
    """The verdicts of the hits in the relation `hits` against `misses` (`_stored_misses` or `_latest_misses`)."""
    return hit_sources_sql(rows=_rejudge_rows(hits, first, misses))


def _judge_rejudged(con: duckdb.DuckDBPyConnection, rejudge: str, new_misses: str, first: str) -> str:
    """The verdicts of the hits in `rejudge` (their earliest time: `first`).

    A hit later than every stored miss of its key (live traffic: nearly all) has as source that key's latest
    stored miss or one of the batch's (`new_misses`): judged from key_last_miss, reading no stored misses. The
    others (a late file's hits, stored hits a late miss may now source) are judged against the stored misses of
    their keys.
    """
    # key_last_miss still holds the misses stored before this batch: its own are added after the judging.
    last_miss = _temp(con, "last_miss", last_miss_sql(
        f"SELECT k.* FROM key_last_miss k SEMI JOIN {rejudge} r ON r.dep = k.dep AND r.cache_key = k.cache_key"))
    fast = _temp(con, "fast", f"SELECT r.request_id FROM {rejudge} r LEFT JOIN {last_miss} l "
                              "ON l.dep = r.dep AND l.cache_key = r.cache_key WHERE l.ts IS NULL OR l.ts <= r.ts")
    # No hit to judge (a batch of misses nobody hit again yet): the judging's joins would still read the
    # identities and first sights of the whole store, 35 ms at 5M rows, to find nothing.
    empty = "" if scalar(con, f"SELECT count(*) FROM {fast}") else " LIMIT 0"
    judged = _temp(con, "judged_now",
                   f"SELECT * FROM ({_judge(fast, first, _latest_misses(last_miss, new_misses))}){empty}")
    slow = _temp(con, "slow", f"SELECT * FROM {rejudge} WHERE request_id NOT IN (SELECT request_id FROM {fast})")
    if not scalar(con, f"SELECT count(*) FROM {slow}"):
        return judged
    slow_first = _timestamp_literal(con, f"SELECT min(ts) FROM {slow}")
    window = _timestamp_literal(con, f"SELECT min(ts) - INTERVAL {int(JUDGE_WINDOW_SECONDS)} SECOND FROM {slow}")
    judged_slow = _temp(con, "judged_slow", _judge(slow, slow_first, _stored_misses(window)))
    unsettled = _temp(con, "unsettled", f"SELECT request_id FROM {judged_slow} WHERE source_request_id IS NULL")
    if scalar(con, f"SELECT count(*) FROM {unsettled}"):
        con.execute(f"DELETE FROM {judged_slow} WHERE request_id IN (SELECT request_id FROM {unsettled})")
        con.execute(f"INSERT INTO {judged_slow} "
                    + _judge(unsettled, slow_first, _stored_misses("'-infinity'::TIMESTAMPTZ")))
    con.execute(f"INSERT INTO {judged} BY NAME SELECT * FROM {judged_slow}")
    return judged


def _replace_verdicts(con: duckdb.DuckDBPyConnection, rejudge: str, judged: str) -> str:
    """Write the verdicts `judged` into hit_sources in place of the rejudged stored hits' (`rejudge`); returns the
    relation of the verdicts those had: the pairs' first-sight counts change by the difference."""
    old_verdicts = _temp(con, "old_verdicts", "SELECT request_id, first_sight FROM hit_sources WHERE false")
    if scalar(con, f"SELECT count(*) FROM {rejudge} WHERE stored"):
        rejudged = f"request_id IN (SELECT request_id FROM {rejudge} WHERE stored)"
        con.execute(f"INSERT INTO {old_verdicts} SELECT request_id, first_sight FROM hit_sources WHERE {rejudged}")
        con.execute(f"DELETE FROM hit_sources WHERE {rejudged}")
    con.execute(f"INSERT INTO hit_sources BY NAME SELECT * FROM {judged}")
    return old_verdicts


def _timestamp_literal(con: duckdb.DuckDBPyConnection, sql: str) -> str:
    """A time the query returns, as a SQL constant: a scan skips the row groups a constant bound rules out,
    which a subquery's bound can't do. A batch without such a time gives a bound no row passes."""
    value = scalar(con, f"SELECT coalesce(({sql})::VARCHAR, 'infinity')")
    return literal(value) + "::TIMESTAMPTZ"


def _minute(ts: str) -> str:
    return f"time_bucket(INTERVAL 1 minute, {ts})"


def _update_minutes(con: duckdb.DuckDBPyConnection, batch: Batch, rejudge: str, judged: str) -> None:
    """Minutes where stored rows changed (rejudged hits, misses given a key) are counted again; minutes that
    only gained the batch's rows (live traffic: all of them) add the batch's counts to theirs, so a batch into
    a busy minute does not count the minute's every row again."""
    recount = _temp(con, "recount", f"SELECT DISTINCT {_minute('ts')} AS minute FROM "
                                    f"(SELECT ts FROM {rejudge} WHERE stored UNION ALL SELECT ts FROM {batch.backfilled})")
    added = _temp(con, "added", f"SELECT DISTINCT {_minute('ts')} AS minute FROM {batch.rows} "
                                f"WHERE {_minute('ts')} NOT IN (SELECT minute FROM {recount})")
    recounted = _in_minutes(con, recount)
    if recounted:
        _replace_minutes(con, recount, minute_sql(recounted))
    if added_rows := _in_minutes(con, added):
        # The batch's hits were all judged now: their verdicts are `judged`'s rows.
        batch_rows = minute_sql(f"{added_rows} AND {batch.where}", hit_sources=judged, rows=batch.requests)
        merged = ", ".join(f"{how}({name}) AS {name}" for name, how in MINUTE_MERGE.items())
        _replace_minutes(con, added, f"SELECT * EXCLUDE ({', '.join(MINUTE_MERGE)}), {merged} FROM ("
                                     f"SELECT * FROM summary_minute WHERE minute IN (SELECT minute FROM {added}) "
                                     f"UNION ALL BY NAME {batch_rows}) GROUP BY ALL")


def _in_minutes(con: duckdb.DuckDBPyConnection, minutes: str) -> str | None:
    """The rows of `requests r` in the minutes the relation `minutes` lists; None when it lists none. The range
    (constant bounds) lets the scan skip what lies outside it; the list keeps only those minutes."""
    lo, hi = con.execute(f"SELECT min(minute)::VARCHAR, (max(minute) + INTERVAL 1 minute)::VARCHAR "
                         f"FROM {minutes}").fetchall()[0]
    if lo is None:
        return None
    return (f"r.ts >= {literal(lo)}::TIMESTAMPTZ AND r.ts < {literal(hi)}::TIMESTAMPTZ "
            f"AND {_minute('r.ts')} IN (SELECT minute FROM {minutes})")


def _replace_minutes(con: duckdb.DuckDBPyConnection, minutes: str, rows: str) -> None:
    """Replace summary_minute's rows of the minutes listed in the relation `minutes` by `rows`."""
    minute_rows = _temp(con, "minute_rows", rows)
    con.execute(f"DELETE FROM summary_minute WHERE minute IN (SELECT minute FROM {minutes})")
    con.execute(f"INSERT INTO summary_minute BY NAME SELECT * FROM {minute_rows}")


def _update_keys(con: duckdb.DuckDBPyConnection, batch: Batch, rejudge: str, judged: str, old_verdicts: str) -> None:
    """Add what the batch changed to the (deployment, cache_key, fingerprint) pairs: its rows, the stored misses
    that got a key, the first sights rejudged hits gained or lost (`judged` against `old_verdicts`). A key or
    identity keeps its number."""
    # Rows without a cache key have no pair, as in a full build (its join on the key drops them).
    pair_delta = _temp(con, "pair_delta", f"""
        WITH added AS (
            SELECT r.request_id, r.ts, {deployment_label('r')} AS deployment, r.cache_key, r.fingerprint,
                   r.target_model, {draft_label()} AS draft_model, r.cache_hit, {PARTIAL_HIT} AS partial_hit
            FROM {batch.requests} r WHERE {batch.where} AND r.cache_key IS NOT NULL
            UNION ALL
            SELECT r.request_id, r.ts, {deployment_label('r')}, r.cache_key, r.fingerprint, r.target_model,
                   {draft_label()}, r.cache_hit, {PARTIAL_HIT}
            FROM requests r WHERE r.request_id IN (SELECT request_id FROM {batch.backfilled})
        ), sights AS (
            SELECT j.request_id, coalesce(j.first_sight::INT, 0) - coalesce(o.first_sight::INT, 0) AS gained
            FROM {judged} j LEFT JOIN {old_verdicts} o USING (request_id)
        ), rows AS (
            SELECT a.*, true AS added, coalesce(s.gained, 0) AS gained FROM added a LEFT JOIN sights s USING (request_id)
            UNION ALL
            SELECT j.request_id, j.ts, j.deployment, j.cache_key, j.fingerprint, NULL, NULL, true, false, false,
                   s.gained
            FROM {rejudge} j JOIN sights s USING (request_id)
            WHERE j.stored AND j.cache_key IS NOT NULL AND s.gained <> 0
        )
        SELECT deployment, cache_key, fingerprint, any_value(target_model) AS target_model,
               any_value(draft_model) AS draft_model, count(*) FILTER (WHERE added)::BIGINT AS requests,
               count(*) FILTER (WHERE added AND cache_hit)::BIGINT AS hits, coalesce(sum(gained), 0)::BIGINT AS first_sight,
               count(*) FILTER (WHERE added AND partial_hit)::BIGINT AS partial_hits,
               min(ts) FILTER (WHERE added) AS first_seen, max(ts) FILTER (WHERE added) AS last_seen
        FROM rows GROUP BY 1, 2, 3
    """)
    # The stored pairs of the batch's keys and fingerprints, found in one scan of summary_keys' text columns
    # (its largest cost): the update, the new pairs and the numbers they take are worked out from these few.
    near_keys = _temp(con, "near_keys", f"""
        SELECT deployment, cache_key, fingerprint, key_id, fp_id FROM summary_keys
        WHERE cache_key IN (SELECT cache_key FROM {pair_delta}) OR fingerprint IN (SELECT fingerprint FROM {pair_delta})
    """)
    # A pair is one (key_id, fp_id): the update matches stored rows on two integers, not on three texts.
    con.execute(f"""
        UPDATE summary_keys s SET requests = s.requests + d.requests, hits = s.hits + d.hits,
               first_sight = s.first_sight + d.first_sight, partial_hits = s.partial_hits + d.partial_hits,
               first_seen = least(s.first_seen, coalesce(d.first_seen, s.first_seen)),
               last_seen = greatest(s.last_seen, coalesce(d.last_seen, s.last_seen))
        FROM (SELECT d.*, n.key_id, n.fp_id FROM {pair_delta} d JOIN {near_keys} n USING (deployment, cache_key, fingerprint)) d
        WHERE s.key_id = d.key_id AND s.fp_id = d.fp_id
    """)
    new_pairs = _temp(con, "new_pairs", f"""
        SELECT d.* FROM {pair_delta} d ANTI JOIN {near_keys} s
        ON s.deployment = d.deployment AND s.cache_key = d.cache_key AND s.fingerprint = d.fingerprint
    """)
    key_ids = _temp(con, "key_ids", f"""
        WITH old AS (
            SELECT DISTINCT s.deployment, s.cache_key, s.key_id FROM {near_keys} s
            SEMI JOIN {pair_delta} k ON k.deployment = s.deployment AND k.cache_key = s.cache_key
        ), fresh AS (
            SELECT DISTINCT p.deployment, p.cache_key FROM {new_pairs} p
            ANTI JOIN old o ON o.deployment = p.deployment AND o.cache_key = p.cache_key
        )
        SELECT * FROM old
        UNION ALL
        SELECT deployment, cache_key,
               (SELECT coalesce(max(key_id), 0) FROM summary_keys) + row_number() OVER () AS key_id FROM fresh
    """)
    fp_ids = _temp(con, "fp_ids", f"""
        WITH old AS (
            SELECT DISTINCT fingerprint, fp_id FROM {near_keys} WHERE fingerprint IN (SELECT fingerprint FROM {new_pairs})
        ), fresh AS (SELECT DISTINCT fingerprint FROM {new_pairs} WHERE fingerprint NOT IN (SELECT fingerprint FROM old))
        SELECT * FROM old
        UNION ALL
        SELECT fingerprint, (SELECT coalesce(max(fp_id), 0) FROM summary_keys) + row_number() OVER () FROM fresh
    """)
    con.execute(f"""
        INSERT INTO summary_keys BY NAME
        SELECT p.*, k.key_id, f.fp_id FROM {new_pairs} p
        JOIN {key_ids} k ON k.deployment = p.deployment AND k.cache_key = p.cache_key
        JOIN {fp_ids} f USING (fingerprint)
    """)
    grown = _temp(con, "grown_keys", f"SELECT k.key_id FROM {key_ids} k SEMI JOIN {new_pairs} p "
                                     "ON p.deployment = k.deployment AND p.cache_key = k.cache_key")
    aliases.update_aliases(con, grown)
    con.execute(f"DELETE FROM summary_shared_keys WHERE key_id IN (SELECT key_id FROM {key_ids})")
    con.execute("INSERT INTO summary_shared_keys BY NAME "
                + shared_keys_sql(f"key_id IN (SELECT key_id FROM {key_ids})"))


def _append_outputs(con: duckdb.DuckDBPyConnection, batch: Batch) -> None:
    """Append the batch's output groups; fold the table again once it has doubled since it was last folded."""
    con.execute("INSERT INTO summary_outputs BY NAME " + outputs_sql(batch.where, rows=batch.requests))
    _fold_when_doubled(con, "summary_outputs", "outputs_compacted", COMPACT_OUTPUTS_SQL)


def _fold_when_doubled(con: duckdb.DuckDBPyConnection, table: str, key: str, fold_sql: str) -> None:
    """Fold a table that batches append to (`fold_sql`) once it holds more than twice its rows when last folded
    (meta's `key`) plus a slack: each row is folded a bounded number of times."""
    rows = scalar(con, f"SELECT count(*) FROM {table}")
    folded = scalar(con, f"SELECT coalesce(max(value::BIGINT), 0) FROM meta WHERE key = {literal(key)}")
    if rows > 2 * folded + summaries.OUTPUTS_SLACK:
        con.execute(fold_sql)
        con.execute(folded_sql(table, key))


def _append_request_keys(con: duckdb.DuckDBPyConnection, batch: Batch) -> None:
    """The batch's rows, and the stored misses that only now have a cache key (none had a row before)."""
    con.execute("INSERT INTO summary_request_keys BY NAME " + request_keys_sql(batch.where, rows=batch.requests))
    if scalar(con, f"SELECT count(*) FROM {batch.backfilled}"):
        con.execute("INSERT INTO summary_request_keys BY NAME "
                    + request_keys_sql(f"r.request_id IN (SELECT request_id FROM {batch.backfilled})"))


# The columns a histogram row counts (its `n`) by: one row per combination (lengths_sql, latency_sql).
_LENGTH_KEYS = ("deployment", "target_model", "draft_model", "max_tokens", "value")
_LATENCY_KEYS = ("deployment", "target_model", "draft_model", "cache_hit", "value")


def _add_counts(con: duckdb.DuckDBPyConnection, table: str, batch_sql: str, keys: tuple[str, ...]) -> None:
    """Add a batch's histogram to a stored one, kept one row per combination of `keys` (NULL included): the
    combinations it has already count up, new ones are added; the rest of the table is left as it is."""
    same = " AND ".join(f"t.{k} IS NOT DISTINCT FROM d.{k}" for k in keys)
    counts = _temp(con, "counts", batch_sql)
    con.execute(f"UPDATE {table} t SET n = t.n + d.n FROM {counts} d WHERE {same}")
    con.execute(f"INSERT INTO {table} BY NAME SELECT d.* FROM {counts} d ANTI JOIN {table} t ON {same}")


def _add_audience(con: duckdb.DuckDBPyConnection, batch: Batch) -> None:
    """Add the batch's rows to summary_audience: its figures depend on the rows alone, never on a verdict."""
    same = " AND ".join(f"t.{k} IS NOT DISTINCT FROM d.{k}" for k in AUDIENCE_KEYS)
    merged = ", ".join(f"{name} = {_merge_pair(how, name)}" for name, how in AUDIENCE_MERGE.items())
    counts = _temp(con, "audience_counts", audience_sql(batch.where, rows=batch.requests))
    con.execute(f"UPDATE summary_audience t SET {merged} FROM {counts} d WHERE {same}")
    con.execute(f"INSERT INTO summary_audience BY NAME SELECT d.* FROM {counts} d ANTI JOIN summary_audience t ON {same}")


def _merge_pair(how: str, name: str) -> str:
    """A stored value `t.name` and a batch's `d.name` merged by `how`; either may be NULL (no violation, no
    latency logged yet), which the merge skips as the aggregate over all rows would."""
    pick = {"sum": f"t.{name} + d.{name}", "min": f"least(t.{name}, d.{name})", "max": f"greatest(t.{name}, d.{name})"}
    return f"coalesce({pick[how]}, t.{name}, d.{name})"
