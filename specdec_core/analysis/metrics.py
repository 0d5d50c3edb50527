"""The SQL behind every chart and number, one function per triage question.

Every query takes the same `Filters`, applied through bound parameters: filter
values are data, never SQL. Contamination is judged over the whole log (a hit's
source may lie outside the filtered window); filters choose which hits are shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd

from specdec_core.store import summaries as summary
from specdec_core.store.connection import Store
from specdec_core.store.summaries import NO_DRAFT, histogram_quantiles, minute_source  # noqa: F401 (NO_DRAFT: the "no speculation" label)


@dataclass(frozen=True)
class Filters:
    start: datetime | None = None
    end: datetime | None = None
    deployments: tuple[str, ...] = ()
    target_models: tuple[str, ...] = ()
    draft_models: tuple[str, ...] = ()  # NO_DRAFT selects requests without speculation

    def where(self, alias: str = "r") -> tuple[str, list[Any]]:
        """A WHERE clause over the requests table and its parameters."""
        clauses, params = ["TRUE"], []
        if self.start is not None:
            clauses.append(f"{alias}.ts >= ?")
            params.append(self.start)
        if self.end is not None:
            clauses.append(f"{alias}.ts <= ?")
            params.append(self.end)
        if self.deployments:
            clauses.append(f"list_contains(?, coalesce({alias}.deployment, ''))")
            params.append(list(self.deployments))
        if self.target_models:
            clauses.append(f"list_contains(?, {alias}.target_model)")
            params.append(list(self.target_models))
        if self.draft_models:
            clauses.append(f"list_contains(?, {_draft_label(alias)})")
            params.append(list(self.draft_models))
        return " AND ".join(clauses), params


NO_FILTERS = Filters()


_draft_label = summary.draft_label


# Answers a question without a time range from the summaries: (connection, {dims} clause, its params).
WholeAnswer = Callable[[Any, str, list[Any]], pd.DataFrame]


def _df(store: Store, sql: str, filters: Filters, extra: list[Any] | None = None,
        leading: list[Any] | None = None, *, minute: str | None = None,
        whole: str | WholeAnswer | None = None) -> pd.DataFrame:
    """Answer a question: from the summaries when they can (`minute` SQL over {source}, a relation shaped
    like summary_minute; `whole` SQL with {dims}, or a function of it, without a time range), else `sql`
    over the rows with the filters' WHERE (as often as it says {where}). `leading`/`extra` bind the ?
    before and after."""
    with store.read() as con:
        if callable(whole):
            if _whole_from_summaries(con, filters):
                return whole(con, *summary.dimension_where(filters))
            whole = None
        return _run(con, sql, filters, extra, leading, minute=minute, whole=whole).df()


def _whole_from_summaries(con: Any, filters: Filters) -> bool:
    """Whether a `whole` answer applies: no time range, and summaries this code may use."""
    return filters.start is None and filters.end is None and summary.ready(con)


def _run(con: Any, sql: str, filters: Filters, extra: list[Any] | None = None, leading: list[Any] | None = None,
         *, minute: str | None = None, whole: str | None = None) -> Any:
    extra, leading = extra or [], leading or []
    if minute is not None and summary.ready(con):
        source, params = minute_source(filters, filters.where())
        return con.execute(minute.replace("{source}", source), leading + params + extra)
    if whole is not None and _whole_from_summaries(con, filters):
        dims, params = summary.dimension_where(filters)
        return con.execute(whole.replace("{dims}", dims), leading + params * whole.count("{dims}") + extra)
    where, params = filters.where()
    return con.execute(sql.replace("{where}", where), leading + params * sql.count("{where}") + extra)


def _one(store: Store, sql: str, filters: Filters, **summaries: str) -> dict[str, Any]:
    frame = _df(store, sql, filters, **summaries)
    return {k: _native(v) for k, v in frame.iloc[0].items()}


def _native(value: Any) -> Any:
    """numpy scalars as plain Python values, missing as None: callers format and compare them."""
    if value is None or value is pd.NaT or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") and not isinstance(value, pd.Timestamp) else value


def _bucket_for(span_seconds: float) -> str:
    for seconds, name in ((2 * 3600, "1 minute"), (12 * 3600, "5 minutes"), (3 * 86400, "1 hour")):
        if span_seconds <= seconds:
            return name
    return "1 day"


def time_bucket(store: Store, filters: Filters) -> str:
    """An interval that gives a readable number of points over the filtered time range."""
    span = _one(store, "SELECT epoch(max(ts)) - epoch(min(ts)) AS span FROM requests r WHERE {where}", filters,
                minute="SELECT epoch(max(last_ts)) - epoch(min(first_ts)) AS span FROM {source} c")["span"]
    return _bucket_for(float(span or 0))


# --- what the sidebar offers -------------------------------------------------------------------------------


def filter_options(store: Store) -> dict[str, Any]:
    with store.read() as con:
        def values(sql: str) -> list[str]:
            return [row[0] for row in con.execute(sql).fetchall()]

        if summary.ready(con):  # the minute summary holds the labels already
            start, end = con.execute("SELECT min(first_ts), max(last_ts) FROM summary_minute").fetchall()[0]
            table, deployment, draft = "summary_minute r", "deployment", "draft_model"
        else:
            start, end = con.execute("SELECT min(ts), max(ts) FROM requests").fetchall()[0]
            table, deployment, draft = "requests r", "coalesce(deployment, '')", _draft_label()
        span_start, span_end, outside = _time_span(con, start, end)
        return {
            "deployments": values(f"SELECT DISTINCT {deployment} FROM {table} ORDER BY 1"),
            "target_models": values(f"SELECT DISTINCT target_model FROM {table} ORDER BY 1"),
            "draft_models": values(f"SELECT DISTINCT {draft} FROM {table} ORDER BY 1"),
            "start": start,
            "end": end,
            # What a time-range control should span, and how many requests lie beyond it.
            "span_start": span_start,
            "span_end": span_end,
            "outside_span": outside,
        }


# A time control spans the years a browser can place exactly (Streamlit's slider: 1684 to 2255) ...
SPAN_LIMITS = (datetime(1700, 1, 1, tzinfo=timezone.utc), datetime(2250, 1, 1, tzinfo=timezone.utc))
# ... and the bulk of the requests: a log whose clock was unset for a few lines (epoch 0, year 1) keeps
# an incident's hour selectable. The bulk is the 1st to 99th percentile, widened by its own width (at
# least an hour) on each side: a log spread evenly over its range keeps all of it.
SPAN_QUANTILES = (0.01, 0.99)


def _time_span(con: Any, start: Any, end: Any) -> tuple[Any, Any, int]:
    if start is None:
        return None, None, 0
    if SPAN_LIMITS[0] <= start and end <= SPAN_LIMITS[1] and (end - start).days <= 366:
        return start, end, 0  # no outliers worth the scan
    low, high = con.execute("SELECT quantile_disc(ts, ?), quantile_disc(ts, ?) FROM requests",
                            list(SPAN_QUANTILES)).fetchall()[0]
    margin = max(high - low, timedelta(hours=1))
    # The window's bounds, kept within the limits (and away from datetime's own year 1 and 9999) ...
    low = low - margin if low - SPAN_LIMITS[0] > margin else SPAN_LIMITS[0]
    high = high + margin if SPAN_LIMITS[1] - high > margin else SPAN_LIMITS[1]
    # ... then the first and last requests inside it.
    low, high, outside = con.execute(
        "SELECT min(ts) FILTER (WHERE ts >= $1), max(ts) FILTER (WHERE ts <= $2), "
        "count(*) FILTER (WHERE ts < $1 OR ts > $2) FROM requests", [max(low, SPAN_LIMITS[0]), min(high, SPAN_LIMITS[1])]
    ).fetchall()[0]
    if low is None:  # every request lies beyond the limits
        low = high = min(max(start, SPAN_LIMITS[0]), SPAN_LIMITS[1])
    return low, high, outside


# --- the headline numbers ----------------------------------------------------------------------------------

HEADLINE_SQL = """
SELECT count(*) AS requests,
       count(*) FILTER (WHERE r.cache_hit) AS hits,
       avg(r.cache_hit::INT) AS hit_rate,
       count(*) FILTER (WHERE h.contaminated) AS contaminated_hits,
       count(*) FILTER (WHERE h.contaminated) / nullif(count(*) FILTER (WHERE r.cache_hit), 0)
           AS contaminated_rate,
       count(*) FILTER (WHERE r.output_tokens > r.max_tokens) AS length_violations,
       min(r.ts) AS first_ts, max(r.ts) AS last_ts
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where}
"""
_HITS = "coalesce(sum(c.requests) FILTER (WHERE c.cache_hit), 0)"
HEADLINE_MINUTE_SQL = f"""
SELECT coalesce(sum(c.requests), 0)::BIGINT AS requests, {_HITS}::BIGINT AS hits,
       {_HITS} / sum(c.requests) AS hit_rate,
       coalesce(sum(c.contaminated), 0)::BIGINT AS contaminated_hits,
       sum(c.contaminated) / nullif({_HITS}, 0) AS contaminated_rate,
       coalesce(sum(c.violations), 0)::BIGINT AS length_violations,
       min(c.first_ts) AS first_ts, max(c.last_ts) AS last_ts
FROM {{source}} c
"""

KEY_COUNTS_SQL = """
WITH k AS (SELECT coalesce(r.deployment, '') AS deployment, r.cache_key, r.fingerprint FROM requests r WHERE {where})
SELECT (SELECT count(DISTINCT (deployment, cache_key)) FROM k) AS unique_keys,
       (SELECT count(DISTINCT (deployment, fingerprint)) FROM k) AS unique_identities,
       (SELECT count(*) FROM (SELECT 1 FROM k GROUP BY deployment, cache_key HAVING count(DISTINCT fingerprint) > 1))
           AS key_collisions
"""
KEY_COUNTS_WHOLE_SQL = """
WITH k AS (SELECT deployment, key_id, fp_id FROM summary_keys c WHERE {dims})
SELECT (SELECT count(DISTINCT key_id) FROM k) AS unique_keys,
       (SELECT count(DISTINCT (deployment, fp_id)) FROM k) AS unique_identities,
       (SELECT count(*) FROM (SELECT 1 FROM summary_shared_keys c WHERE {dims} GROUP BY key_id HAVING count(*) > 1))
           AS key_collisions
"""


def headline(store: Store, filters: Filters = NO_FILTERS) -> dict[str, Any]:
    """Requests, hit rate, contaminated hits, length violations, collisions, keys per identity."""
    with store.read() as con:  # one connection for the three: opening one costs as much as a small query
        out = _row(_run(con, HEADLINE_SQL, filters, minute=HEADLINE_MINUTE_SQL))
        out.update(_row(_run(con, KEY_COUNTS_SQL, filters, whole=KEY_COUNTS_WHOLE_SQL)))
        out["quarantined"] = con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
    out["keys_per_identity"] = (out["unique_keys"] / out["unique_identities"]) if out["unique_identities"] else None
    return out


def _row(cursor: Any) -> dict[str, Any]:
    names = [d[0] for d in cursor.description]
    return {k: _native(v) for k, v in zip(names, cursor.fetchall()[0], strict=True)}


# --- cache -------------------------------------------------------------------------------------------------

HIT_RATE_BY_COMBINATION_SQL = f"""
SELECT r.target_model, {_draft_label()} AS draft_model, count(*) AS requests,
       count(*) FILTER (WHERE r.cache_hit) AS hits, avg(r.cache_hit::INT) AS hit_rate,
       count(*) FILTER (WHERE h.contaminated) AS contaminated_hits
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {{where}}
GROUP BY ALL ORDER BY requests DESC, target_model, draft_model
"""


HIT_RATE_BY_COMBINATION_MINUTE_SQL = f"""
SELECT c.target_model, c.draft_model, sum(c.requests)::BIGINT AS requests, {_HITS}::BIGINT AS hits,
       {_HITS} / sum(c.requests) AS hit_rate, sum(c.contaminated)::BIGINT AS contaminated_hits
FROM {{source}} c
GROUP BY ALL ORDER BY requests DESC, target_model, draft_model
"""


def hit_rate_by_combination(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    return _df(store, HIT_RATE_BY_COMBINATION_SQL, filters, minute=HIT_RATE_BY_COMBINATION_MINUTE_SQL)


HIT_RATE_OVER_TIME_SQL = f"""
SELECT time_bucket(CAST(? AS INTERVAL), r.ts) AS bucket, r.target_model || ' / ' || {_draft_label()} AS combination,
       count(*) AS requests, avg(r.cache_hit::INT) AS hit_rate
FROM requests r
WHERE {{where}}
GROUP BY ALL ORDER BY bucket, combination
"""


HIT_RATE_OVER_TIME_MINUTE_SQL = f"""
SELECT time_bucket(CAST(? AS INTERVAL), c.minute) AS bucket, c.target_model || ' / ' || c.draft_model AS combination,
       sum(c.requests)::BIGINT AS requests, {_HITS} / sum(c.requests) AS hit_rate
FROM {{source}} c
GROUP BY ALL ORDER BY bucket, combination
"""


def hit_rate_over_time(store: Store, filters: Filters = NO_FILTERS, bucket: str | None = None) -> pd.DataFrame:
    # Summary minutes align with every bucket offered (1 minute to 1 day, UTC).
    return _df(store, HIT_RATE_OVER_TIME_SQL, filters, leading=[bucket or time_bucket(store, filters)],
               minute=HIT_RATE_OVER_TIME_MINUTE_SQL)


KEY_RATIO_BY_DEPLOYMENT_SQL = """
SELECT coalesce(r.deployment, '') AS deployment, count(*) AS requests,
       count(DISTINCT r.cache_key) AS unique_keys, count(DISTINCT r.fingerprint) AS unique_identities,
       count(DISTINCT r.cache_key) / count(DISTINCT r.fingerprint) AS keys_per_identity,
       avg(r.cache_hit::INT) AS hit_rate,
       -- A correct key can't hit more often than this: every distinct identity misses at least once.
       1 - count(DISTINCT r.fingerprint) / count(*) AS max_correct_hit_rate,
       count(*) FILTER (WHERE r.cache_hit) AS hits,
       -- Hits on an identity the deployment had never seen: only a shared key (or an entry older than
       -- the log) can serve those.
       count(*) FILTER (WHERE h.first_sight) AS first_sight_hits
FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE {where}
GROUP BY ALL ORDER BY deployment
"""


KEY_RATIO_BY_DEPLOYMENT_WHOLE_SQL = """
SELECT c.deployment, sum(c.requests)::BIGINT AS requests,
       count(DISTINCT c.key_id) AS unique_keys, count(DISTINCT c.fp_id) AS unique_identities,
       count(DISTINCT c.key_id) / count(DISTINCT c.fp_id) AS keys_per_identity,
       sum(c.hits) / sum(c.requests) AS hit_rate,
       1 - count(DISTINCT c.fp_id) / sum(c.requests) AS max_correct_hit_rate,
       sum(c.hits)::BIGINT AS hits, sum(c.first_sight)::BIGINT AS first_sight_hits
FROM summary_keys c WHERE {dims}
GROUP BY ALL ORDER BY deployment
"""


def key_ratio_by_deployment(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Unique cache keys per unique identity; below 1 means identities share keys."""
    return _df(store, KEY_RATIO_BY_DEPLOYMENT_SQL, filters, whole=KEY_RATIO_BY_DEPLOYMENT_WHOLE_SQL)


LATENCY_HIT_VS_MISS_SQL = """
SELECT CASE WHEN r.cache_hit THEN 'hit' ELSE 'miss' END AS outcome, count(r.latency_ms) AS requests,
       avg(r.latency_ms) AS mean_ms, quantile_cont(r.latency_ms, 0.5) AS p50_ms,
       quantile_cont(r.latency_ms, 0.95) AS p95_ms
FROM requests r WHERE {where} AND r.latency_ms IS NOT NULL
GROUP BY ALL ORDER BY outcome
"""


def _latency_from_histogram(con: Any, dims: str, params: list[Any]) -> pd.DataFrame:
    source = ("(SELECT CASE WHEN c.cache_hit THEN 'hit' ELSE 'miss' END AS key, c.value, c.n "
              f"FROM summary_latency c WHERE {dims})")
    s = histogram_quantiles(con, source, params, {"p50_ms": 0.5, "p95_ms": 0.95})
    return pd.DataFrame({"outcome": s["key"], "requests": s["total"], "mean_ms": s["mean"], "p50_ms": s["p50_ms"],
                         "p95_ms": s["p95_ms"]})


def latency_hit_vs_miss(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    return _df(store, LATENCY_HIT_VS_MISS_SQL, filters, whole=_latency_from_histogram)


ACCEPTANCE_BY_COMBINATION_SQL = f"""
SELECT r.target_model, {_draft_label()} AS draft_model, count(*) AS decoded_requests,
       sum(r.draft_tokens) AS draft_tokens, sum(r.accepted_tokens) AS accepted_tokens,
       sum(r.accepted_tokens) / nullif(sum(r.draft_tokens), 0) AS acceptance_rate,
       -- Tokens accepted per verification step: each step proposes num_speculative_tokens.
       sum(r.accepted_tokens) / nullif(sum(r.draft_tokens / nullif(r.num_speculative_tokens, 0)), 0)
           AS mean_accepted_length
FROM requests r
WHERE {{where}} AND NOT r.cache_hit AND r.draft_tokens > 0 AND {_draft_label()} <> '{NO_DRAFT}'
GROUP BY ALL ORDER BY target_model, draft_model
"""


ACCEPTANCE_BY_COMBINATION_MINUTE_SQL = f"""
SELECT c.target_model, c.draft_model, sum(c.decoded_requests)::BIGINT AS decoded_requests,
       sum(c.draft_tokens) AS draft_tokens, sum(c.accepted_tokens) AS accepted_tokens,
       sum(c.accepted_tokens) / nullif(sum(c.draft_tokens), 0) AS acceptance_rate,
       sum(c.accepted_tokens) / nullif(sum(c.steps), 0) AS mean_accepted_length
FROM {{source}} c
WHERE NOT c.cache_hit AND c.draft_model <> '{NO_DRAFT}'
GROUP BY ALL HAVING sum(c.decoded_requests) > 0 ORDER BY target_model, draft_model
"""


def acceptance_by_combination(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Speculation health of decoded (missed) requests: acceptance rate and accepted length per step."""
    return _df(store, ACCEPTANCE_BY_COMBINATION_SQL, filters, minute=ACCEPTANCE_BY_COMBINATION_MINUTE_SQL)


# --- output length -----------------------------------------------------------------------------------------

OUTPUT_LENGTH_BY_MAX_TOKENS_SQL = """
SELECT r.max_tokens, count(*) AS requests, min(r.output_tokens) AS min,
       quantile_cont(r.output_tokens, 0.25) AS q1, median(r.output_tokens) AS median,
       quantile_cont(r.output_tokens, 0.75) AS q3, max(r.output_tokens) AS max,
       count(*) FILTER (WHERE r.output_tokens > r.max_tokens) AS violations
FROM requests r WHERE {where}
GROUP BY ALL ORDER BY r.max_tokens
"""


def _lengths_from_histogram(con: Any, dims: str, params: list[Any]) -> pd.DataFrame:
    source = f"(SELECT c.max_tokens AS key, c.value, c.n FROM summary_lengths c WHERE {dims})"
    s = histogram_quantiles(con, source, params, {"q1": 0.25, "median": 0.5, "q3": 0.75}, count_above_key=True)
    return pd.DataFrame({"max_tokens": s["key"], "requests": s["total"], "min": s["min"], "q1": s["q1"],
                         "median": s["median"], "q3": s["q3"], "max": s["max"], "violations": s["above_key"]})


def output_length_by_max_tokens(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Distribution of output tokens per max_tokens (box statistics), with violation counts."""
    return _df(store, OUTPUT_LENGTH_BY_MAX_TOKENS_SQL, filters, whole=_lengths_from_histogram)


LENGTH_VIOLATIONS_SQL = f"""
SELECT r.request_id, r.ts, coalesce(r.deployment, '') AS deployment, r.max_tokens, r.output_tokens,
       r.cache_hit, h.source_request_id, r.target_model, {_draft_label()} AS draft_model, r.temperature,
       r.cache_key
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {{where}} AND r.output_tokens > r.max_tokens
ORDER BY r.ts, r.request_id LIMIT ?
"""


def length_violations(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000) -> pd.DataFrame:
    """Requests whose output is longer than their max_tokens allows."""
    return _df(store, LENGTH_VIOLATIONS_SQL, filters, [limit])


# --- contamination -----------------------------------------------------------------------------------------

CONTAMINATED_HITS_SQL = f"""
SELECT r.request_id, r.ts, coalesce(r.deployment, '') AS deployment, r.cache_key, h.source_request_id,
       h.source_ts, h.differing_fields, h.fingerprint_mismatch, r.target_model,
       {_draft_label()} AS draft_model, r.temperature, r.max_tokens, r.seed::VARCHAR AS seed,
       r.tokenizer_version, r.output_tokens, left(r.output_text, 120) AS output_preview
FROM requests r JOIN hit_sources h USING (request_id)
WHERE {{where}} AND h.contaminated
ORDER BY r.ts, r.request_id LIMIT ?
"""


CONTAMINATED_HITS_SUMMARY_SQL = """
SELECT * FROM summary_contaminated c WHERE {where} ORDER BY ts, request_id LIMIT ?
"""


def contaminated_hits(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000) -> pd.DataFrame:
    """Hits that served another identity's output, with the request that put it in the cache."""
    with store.read() as con:
        if summary.ready(con):  # the same rows, joined and labelled at ingest; every filter applies
            where, params = filters.where("c")
            return con.execute(CONTAMINATED_HITS_SUMMARY_SQL.replace("{where}", where), params + [limit]).df()
        return _run(con, CONTAMINATED_HITS_SQL, filters, [limit]).df()


MISMATCH_RATE_OVER_TIME_SQL = """
SELECT time_bucket(CAST(? AS INTERVAL), r.ts) AS bucket, coalesce(r.deployment, '') AS deployment,
       count(*) FILTER (WHERE r.cache_hit) AS hits,
       count(*) FILTER (WHERE h.contaminated) AS contaminated_hits,
       count(*) FILTER (WHERE h.contaminated) / nullif(count(*), 0) AS mismatch_rate
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where}
GROUP BY ALL ORDER BY bucket, deployment
"""


MISMATCH_RATE_OVER_TIME_MINUTE_SQL = f"""
SELECT time_bucket(CAST(? AS INTERVAL), c.minute) AS bucket, c.deployment, {_HITS}::BIGINT AS hits,
       sum(c.contaminated)::BIGINT AS contaminated_hits,
       sum(c.contaminated) / nullif(sum(c.requests), 0) AS mismatch_rate
FROM {{source}} c
GROUP BY ALL ORDER BY bucket, deployment
"""


def mismatch_rate_over_time(store: Store, filters: Filters = NO_FILTERS, bucket: str | None = None) -> pd.DataFrame:
    """Contaminated hits per time bucket and deployment, as a share of all requests."""
    return _df(store, MISMATCH_RATE_OVER_TIME_SQL, filters, leading=[bucket or time_bucket(store, filters)],
               minute=MISMATCH_RATE_OVER_TIME_MINUTE_SQL)


CONTAMINATION_WINDOW_SQL = """
SELECT coalesce(r.deployment, '') AS deployment, count(*) AS contaminated_hits,
       min(r.ts) AS first_contaminated, max(r.ts) AS last_contaminated
FROM requests r JOIN hit_sources h USING (request_id)
WHERE {where} AND h.contaminated
GROUP BY ALL ORDER BY deployment
"""


CONTAMINATION_WINDOW_MINUTE_SQL = """
SELECT c.deployment, sum(c.contaminated)::BIGINT AS contaminated_hits,
       min(c.first_contaminated) AS first_contaminated, max(c.last_contaminated) AS last_contaminated
FROM {source} c
GROUP BY ALL HAVING sum(c.contaminated) > 0 ORDER BY deployment
"""


def contamination_window(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Where and since when the cache mixed identities."""
    return _df(store, CONTAMINATION_WINDOW_SQL, filters, minute=CONTAMINATION_WINDOW_MINUTE_SQL)


# --- keys --------------------------------------------------------------------------------------------------

KEY_COLLISIONS_SQL = """
SELECT coalesce(r.deployment, '') AS deployment, r.cache_key, count(DISTINCT r.fingerprint) AS identities,
       count(*) AS requests, count(*) FILTER (WHERE r.cache_hit) AS hits,
       min(r.ts) AS first_seen, max(r.ts) AS last_seen
FROM requests r WHERE {where}
GROUP BY ALL HAVING count(DISTINCT r.fingerprint) > 1
ORDER BY identities DESC, requests DESC, deployment, cache_key LIMIT ?
"""


KEY_COLLISIONS_WHOLE_SQL = """
WITH shared AS (
    SELECT c.key_id, count(*) AS identities, sum(c.requests)::BIGINT AS requests, sum(c.hits)::BIGINT AS hits,
           min(c.first_seen) AS first_seen, max(c.last_seen) AS last_seen,
           any_value(c.deployment) AS deployment, any_value(c.cache_key) AS cache_key
    FROM summary_shared_keys c WHERE {dims}
    GROUP BY c.key_id HAVING count(*) > 1
)
SELECT deployment, cache_key, identities, requests, hits, first_seen, last_seen FROM shared
ORDER BY identities DESC, requests DESC, deployment, cache_key LIMIT ?
"""


def key_collisions(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000) -> pd.DataFrame:
    """Cache keys shared by more than one identity."""
    return _df(store, KEY_COLLISIONS_SQL, filters, [limit], whole=KEY_COLLISIONS_WHOLE_SQL)


KEY_COLLISION_IDENTITIES_SQL = """
SELECT r.fingerprint, count(*) AS requests, count(*) FILTER (WHERE r.cache_hit) AS hits,
       min(r.ts) AS first_seen, max(r.ts) AS last_seen, any_value(r.target_model) AS target_model,
       any_value(coalesce(nullif(r.draft_model, 'none'), 'none')) AS draft_model,
       any_value(r.temperature) AS temperature, any_value(r.max_tokens) AS max_tokens,
       any_value(r.seed)::VARCHAR AS seed, any_value(r.tokenizer_version) AS tokenizer_version,
       any_value(i.identity)::VARCHAR AS identity
FROM requests r JOIN identities i USING (fingerprint)
WHERE {where} AND coalesce(r.deployment, '') = ? AND r.cache_key = ?
GROUP BY r.fingerprint ORDER BY first_seen
"""


def key_collision_identities(store: Store, deployment: str, cache_key: str,
                             filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """The identities that shared one cache key, with counts and first/last seen."""
    return _df(store, KEY_COLLISION_IDENTITIES_SQL, filters, [deployment, cache_key])


# --- single requests ---------------------------------------------------------------------------------------


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
    return _df(store, SUSPICIOUS_SQL, filters, [n])


QUARANTINE_SQL = """
SELECT source_file, source_line, request_id, reason, left(raw, 200) AS raw
FROM quarantine ORDER BY ingest_id, source_file, source_line LIMIT ?
"""


def quarantined_records(store: Store, limit: int = 1000) -> pd.DataFrame:
    with store.read() as con:
        return con.execute(QUARANTINE_SQL, [limit]).df()


# --- the article's six symptoms ----------------------------------------------------------------------------


@dataclass(frozen=True)
class RedFlag:
    key: str
    title: str
    flagged: bool | None  # None: not enough data to judge (say what would settle it)
    evidence: str
    page: str
    numbers: dict[str, Any] = field(default_factory=dict)


SHARED_OUTPUTS_SQL = """
WITH o AS (
    -- Greedy speculative decoding is lossless: identities that differ only in their draft share outputs
    -- legitimately, so the draft fields count only for sampled requests.
    SELECT hash(r.output_text) AS out_hash,  -- # hash-ok: DuckDB's 64-bit hash, a heuristic count
           count(DISTINCT hash(i.prompt, i.target_model,  -- # hash-ok: DuckDB's, within one query i.temperature, i.top_p, i.top_k, i.max_tokens, i.seed,
                               i.stop, i.tokenizer_version, CASE WHEN NOT i.greedy THEN i.draft_model END,
                               CASE WHEN NOT i.greedy THEN i.num_speculative_tokens END)) AS identities,
           count(*) FILTER (WHERE r.cache_hit) AS hits
    FROM requests r JOIN identities i USING (fingerprint) WHERE {where} GROUP BY 1
)
SELECT count(*) FILTER (WHERE identities > 1) AS shared_outputs,
       coalesce(sum(hits) FILTER (WHERE identities > 1), 0)::BIGINT AS hits_with_shared_output,
       coalesce(sum(hits), 0)::BIGINT AS hits
FROM o
"""

HIT_RATE_TREND_SQL = """
-- The window split at its midpoint in time: two aggregate passes, no sort.
WITH w AS (SELECT min(r.ts) + (max(r.ts) - min(r.ts)) / 2 AS mid FROM requests r WHERE {where})
SELECT avg(r.cache_hit::INT) FILTER (WHERE r.ts < w.mid) AS first_half,
       avg(r.cache_hit::INT) FILTER (WHERE r.ts >= w.mid) AS second_half
FROM requests r, w WHERE {where}
"""

EXPERIMENT_BIAS_SQL = f"""
SELECT r.target_model || ' / ' || {_draft_label()} || ' / T=' || r.temperature AS arm, count(*) AS requests,
       count(*) FILTER (WHERE h.contaminated) AS contaminated
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {{where}} GROUP BY ALL HAVING count(*) FILTER (WHERE h.contaminated) > 0
ORDER BY contaminated DESC LIMIT 5
"""

REPLAY_SUMMARY_SQL = """
SELECT count(*) AS replays, count(*) FILTER (WHERE p.classification NOT IN ('match', 'near_tie', 'unavailable'))
       AS disagreeing
FROM (SELECT DISTINCT ON (request_id) * FROM replays ORDER BY request_id, replayed_at DESC) p
JOIN requests r USING (request_id) WHERE {where}
"""


# Hits on never-seen identities beyond this share of a deployment's hits are not explained by entries
# that predate the log window.
FIRST_SIGHT_HIT_SHARE = 0.05


def red_flags(store: Store, filters: Filters = NO_FILTERS, head: dict[str, Any] | None = None) -> list[RedFlag]:
    """The six symptoms of a cache key narrower than the request identity, each with its evidence.

    `head` is `headline(store, filters)` when the caller has it already.
    """
    head = head if head is not None else headline(store, filters)
    shared = _one(store, SHARED_OUTPUTS_SQL, filters)
    trend = _one(store, HIT_RATE_TREND_SQL, filters)
    arms = _df(store, EXPERIMENT_BIAS_SQL, filters)
    replays = _one(store, REPLAY_SUMMARY_SQL, filters)
    ratios = key_ratio_by_deployment(store, filters)
    flags: list[RedFlag] = []

    rising = (trend["second_half"] or 0) > (trend["first_half"] or 0)
    shared_share = shared["hits_with_shared_output"] / shared["hits"] if shared["hits"] else 0.0
    flags.append(RedFlag(
        "identical_outputs", "Identical outputs although parameters differ",
        bool(shared["shared_outputs"] > 0 and head["contaminated_hits"] > 0),
        f"{shared['shared_outputs']} output texts were returned for requests that differ in more than their "
        f"draft model ({shared_share:.0%} of hits are on such outputs); hit rate {_pct(trend['first_half'])} in the "
        "first half of the window, "
        f"{_pct(trend['second_half'])} in the second{' (rising)' if rising else ''}.",
        "Mismatches", {"shared_outputs": shared["shared_outputs"], "rising": rising},
    ))
    if replays["replays"]:
        flags.append(RedFlag(
            "replay_disagrees", "Offline replay does not match production",
            bool(replays["disagreeing"] > 0),
            f"{replays['disagreeing']} of {replays['replays']} replayed requests disagree with production "
            "beyond numerical near-ties.",
            "Replay", dict(replays),
        ))
    else:
        flags.append(RedFlag(
            "replay_disagrees", "Offline replay does not match production", None,
            "No request replayed yet: replay the most suspicious requests to settle this.", "Replay", {},
        ))
    worst = "; ".join(f"{a.arm}: {a.contaminated} of {a.requests}" for a in arms.itertuples())
    flags.append(RedFlag(
        "biased_experiments", "Experiment arms compared on each other's outputs",
        not arms.empty,
        f"Arms served another identity's cached output: {worst}." if worst
        else "No experiment arm received another identity's output.",
        "Mismatches", {"arms": len(arms)},
    ))
    flags.append(RedFlag(
        "impossible_lengths", "Output lengths impossible for max_tokens",
        bool(head["length_violations"] > 0),
        f"{head['length_violations']} requests returned more tokens than their max_tokens.",
        "Output length", {"length_violations": head["length_violations"]},
    ))
    first_sight_share = ratios["first_sight_hits"] / ratios["hits"].where(ratios["hits"] > 0)
    too_good = ratios[(ratios["hit_rate"] > ratios["max_correct_hit_rate"] + 1e-9)
                      | (first_sight_share > FIRST_SIGHT_HIT_SHARE)]
    flags.append(RedFlag(
        "hit_rate_too_good", "Hit rate too good for this workload",
        not too_good.empty,
        "; ".join(f"{d.deployment or '(none)'}: hit rate {d.hit_rate:.0%} (a correct key could reach at most "
                  f"{d.max_correct_hit_rate:.0%}); {d.first_sight_hits:,} of {d.hits:,} hits were for an identity "
                  "this deployment had never served before" for d in too_good.itertuples())
        or "Every deployment's hit rate is within what a correct key could reach, and hits are on identities "
           "seen before.",
        "Cache", {"deployments": len(too_good)},
    ))
    narrow = ratios[ratios["keys_per_identity"] < 1 - 1e-9]
    flags.append(RedFlag(
        "few_keys", "Few unique cache keys for many unique identities",
        not narrow.empty,
        "; ".join(f"{d.deployment or '(none)'}: {d.unique_keys} keys for {d.unique_identities} identities"
                  for d in narrow.itertuples())
        or "Every deployment has at least one key per identity.",
        "Keys", {"deployments": len(narrow)},
    ))
    return flags


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"
