"""Questions over time: hit rate per deployment (smoothed), the rows behind a point of a time chart,
latency of hits and misses as a histogram, how fresh the store is."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone

import pandas as pd

from specdec_core.analysis.query import HITS, NO_FILTERS, Filters, df, draft_label, time_bucket
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label

# Smoothing windows offered, in buckets: 1 is no smoothing.
SMOOTHING_WINDOWS = (1, 3, 5, 10)

def _smoothed_sql(buckets: str, preceding: int) -> str:
    """Hit rate per bucket of `buckets` (bucket, deployment, combination, requests, hits) and its trailing
    average over `preceding` earlier buckets."""
    return f"""
WITH b AS ({buckets})
SELECT bucket, deployment, combination, requests, hits, hits / requests AS hit_rate,
       -- Weighted by requests: a quiet bucket moves the line as little as it weighs.
       sum(hits) OVER w / sum(requests) OVER w AS smoothed_hit_rate
FROM b
WINDOW w AS (PARTITION BY deployment, combination ORDER BY bucket ROWS BETWEEN {preceding} PRECEDING AND CURRENT ROW)
ORDER BY deployment, combination, bucket
"""


def hit_rate_by_deployment_over_time_sql(where: str, preceding: int) -> str:
    return _smoothed_sql(f"""
    SELECT time_bucket(CAST($bucket AS INTERVAL), r.ts) AS bucket, {deployment_label()} AS deployment,
           r.target_model || ' / ' || {draft_label()} AS combination, count(*) AS requests,
           count(*) FILTER (WHERE r.cache_hit) AS hits
    FROM requests r WHERE {where} GROUP BY ALL
""", preceding)


def hit_rate_by_deployment_over_time_minute_sql(source: str, preceding: int) -> str:
    return _smoothed_sql(f"""
    SELECT time_bucket(CAST($bucket AS INTERVAL), c.minute) AS bucket, c.deployment,
           c.target_model || ' / ' || c.draft_model AS combination, sum(c.requests)::BIGINT AS requests,
           {HITS}::BIGINT AS hits
    FROM {source} c GROUP BY ALL
""", preceding)


def hit_rate_by_deployment_over_time(store: Store, filters: Filters = NO_FILTERS, bucket: str | None = None,
                                     smoothing: int = 1) -> pd.DataFrame:
    """Hit rate per time bucket, deployment and target / draft combination, with a trailing average
    over `smoothing` buckets (hits over requests of the window)."""
    if smoothing not in SMOOTHING_WINDOWS:
        raise ValueError(f"smoothing: one of {', '.join(map(str, SMOOTHING_WINDOWS))} buckets, got {smoothing}")
    # A window frame's bounds are constants in DuckDB, never parameters: an int checked above.
    preceding = smoothing - 1
    return df(store, lambda where: hit_rate_by_deployment_over_time_sql(where, preceding), filters,
              {"bucket": bucket or time_bucket(store, filters)},
              minute=lambda source: hit_rate_by_deployment_over_time_minute_sql(source, preceding))


def requests_in_window_sql(where: str) -> str:
    return f"""
SELECT r.request_id, r.ts, {deployment_label()} AS deployment, r.cache_hit,
       coalesce(h.contaminated, FALSE) AS contaminated, h.source_request_id, h.differing_fields,
       r.target_model, {draft_label()} AS draft_model, r.max_tokens, r.output_tokens, r.latency_ms, r.cache_key
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where} AND r.ts >= $window_start AND r.ts < $window_end
      AND ($deployment IS NULL OR {deployment_label()} = $deployment)
      AND (NOT $contaminated_only OR h.contaminated) AND ($max_tokens IS NULL OR r.max_tokens = $max_tokens)
      AND (NOT $violations_only OR r.output_tokens > r.max_tokens)
ORDER BY r.ts, r.request_id LIMIT $limit
"""


def requests_in_window(store: Store, filters: Filters, start: datetime, end: datetime, *,
                       deployment: str | None = None, contaminated_only: bool = False,
                       max_tokens: int | None = None, violations_only: bool = False,
                       limit: int = 1000) -> pd.DataFrame:
    """The requests behind one point of a time chart: [start, end), one deployment or all, within the filters."""
    return df(store, requests_in_window_sql, filters,
              {"window_start": start, "window_end": end, "deployment": deployment,
               "contaminated_only": contaminated_only, "max_tokens": max_tokens,
               "violations_only": violations_only, "limit": limit})


# Bins per decade of a log-scaled latency axis: 10 gives bins 26% wide.
LATENCY_BINS_PER_DECADE = 10

def latency_histogram_sql(where: str) -> str:
    return f"""
SELECT CASE WHEN r.cache_hit THEN 'hit' ELSE 'miss' END AS outcome,
       floor(log10(greatest(r.latency_ms, 0.01)) * $bins_per_decade) AS bin, count(*) AS requests
FROM requests r WHERE {where} AND r.latency_ms IS NOT NULL
GROUP BY ALL ORDER BY outcome, bin
"""


def latency_histogram_whole_sql(dims: str) -> str:
    return f"""
SELECT CASE WHEN c.cache_hit THEN 'hit' ELSE 'miss' END AS outcome,
       floor(log10(greatest(c.value, 0.01)) * $bins_per_decade) AS bin, sum(c.n)::BIGINT AS requests
FROM summary_latency c WHERE {dims}
GROUP BY ALL ORDER BY outcome, bin
"""


def latency_histogram(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Requests per latency bin (log-spaced) for hits and misses: columns outcome, low_ms, high_ms, requests."""
    frame = df(store, latency_histogram_sql, filters, {"bins_per_decade": LATENCY_BINS_PER_DECADE},
               whole=latency_histogram_whole_sql)
    bins = frame["bin"].astype(float)
    return pd.DataFrame({"outcome": frame["outcome"], "low_ms": 10 ** (bins / LATENCY_BINS_PER_DECADE),
                         "high_ms": 10 ** ((bins + 1) / LATENCY_BINS_PER_DECADE),
                         "requests": frame["requests"].astype(int)})


FRESHNESS_SQL = "SELECT epoch_us(max(ts)) AS newest_us, count(*) AS requests FROM requests"


@dataclass(frozen=True)
class Freshness:
    """The newest request's time, its lag behind now in seconds (None for an empty store), the request count."""

    newest: datetime | None
    lag_seconds: float | None
    requests: int


def freshness(store: Store, now: datetime | None = None) -> Freshness:
    """The newest request's time and how far it lags behind now (a follow-mode ingest keeps it small).

    A read of the store's snapshot: it never waits for a writer.
    """
    with store.read() as con:
        newest_us, requests = con.execute(FRESHNESS_SQL).fetchall()[0]
    now = now or datetime.now(timezone.utc)
    newest = None if newest_us is None else datetime.fromtimestamp(newest_us / 1e6, tz=timezone.utc)
    lag = None if newest is None else max((now - newest).total_seconds(), 0.0)
    return Freshness(newest=newest, lag_seconds=lag, requests=int(requests))
