"""What the sidebar offers and the headline numbers."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from specdec_core.analysis.query import (
    HITS,
    NO_FILTERS,
    Filters,
    ask,
    draft_label,
    row,
)
from specdec_core.derived import summaries as summary
from specdec_core.derived.aliases import resolved_keys, resolved_request_keys, resolved_rows
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


@dataclass(frozen=True)
class FilterOptions:
    """What the filters can choose from, the log's first and last request, and the span a time control
    should cover (`span_start`..`span_end`) with how many requests lie beyond it."""

    deployments: tuple[str, ...]
    target_models: tuple[str, ...]
    draft_models: tuple[str, ...]
    start: datetime | None
    end: datetime | None
    span_start: datetime | None
    span_end: datetime | None
    outside_span: int


# The filters that name values, each with what one value is called.
NAMED_FILTERS = (("deployments", "deployment"), ("target_models", "target model"), ("draft_models", "draft model"))


def values_not_held(options: FilterOptions, asked: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Per named filter (`deployments`, ...), the values `asked` names that the store does not hold: a filter
    of those selects nothing for that reason (the CLI and the dashboard's links say so)."""
    return {key: missing for key, _ in NAMED_FILTERS
            if (missing := [v for v in asked.get(key, ()) if v not in getattr(options, key)])}


def filter_options(store: Store, span_limits: tuple[datetime, datetime] | None = None) -> FilterOptions:
    """What the filters can choose from, and the span a time control should cover: the bulk of the requests,
    within `span_limits` (a face's own bounds on what it can show; default: what a datetime can hold)."""
    with store.read() as con:
        def values(sql: str) -> tuple[str, ...]:
            return tuple(row[0] for row in con.execute(sql).fetchall())

        if summary.ready(con):  # the minute summary holds the labels already
            start, end = con.execute("SELECT min(first_ts), max(last_ts) FROM summary_minute").fetchall()[0]
            table, deployment, draft = "summary_minute r", "deployment", "draft_model"
        else:
            start, end = con.execute("SELECT min(ts), max(ts) FROM requests").fetchall()[0]
            table, deployment, draft = "requests r", deployment_label(None), draft_label()
        span_start, span_end, outside = _time_span(con, start, end, span_limits or DATETIME_LIMITS)
        return FilterOptions(
            deployments=values(f"SELECT DISTINCT {deployment} FROM {table} ORDER BY 1"),
            target_models=values(f"SELECT DISTINCT target_model FROM {table} ORDER BY 1"),
            draft_models=values(f"SELECT DISTINCT {draft} FROM {table} ORDER BY 1"),
            start=start, end=end, span_start=span_start, span_end=span_end, outside_span=outside,
        )


# A time span stays within its limits (by default, away from datetime's own year 1 and 9999) and covers
# the bulk of the requests: a log whose clock was unset for a few lines (epoch 0, year 1) keeps
# an incident's hour selectable. The bulk is the 1st to 99th percentile, widened by its own width (at
# least an hour) on each side: a log spread evenly over its range keeps all of it.
SPAN_QUANTILES = (0.01, 0.99)
DATETIME_LIMITS = (datetime(2, 1, 1, tzinfo=timezone.utc), datetime(9998, 12, 31, tzinfo=timezone.utc))


def _time_span(con: Any, start: Any, end: Any, limits: tuple[datetime, datetime]) -> tuple[Any, Any, int]:
    if start is None:
        return None, None, 0
    if limits[0] <= start and end <= limits[1] and (end - start).days <= 366:
        return start, end, 0  # no outliers worth the scan
    low, high = con.execute("SELECT quantile_disc(ts, $low), quantile_disc(ts, $high) FROM requests",
                            dict(zip(("low", "high"), SPAN_QUANTILES, strict=True))).fetchall()[0]
    margin = max(high - low, timedelta(hours=1))
    # The window's bounds, kept within the limits ...
    low = low - margin if low - limits[0] > margin else limits[0]
    high = high + margin if limits[1] - high > margin else limits[1]
    # ... then the first and last requests inside it.
    low, high, outside = con.execute(
        "SELECT min(ts) FILTER (WHERE ts >= $low), max(ts) FILTER (WHERE ts <= $high), "
        "count(*) FILTER (WHERE ts < $low OR ts > $high) FROM requests",
        {"low": max(low, limits[0]), "high": min(high, limits[1])}
    ).fetchall()[0]
    if low is None:  # every request lies beyond the limits
        low = high = min(max(start, limits[0]), limits[1])
    return low, high, outside


# --- the headline numbers ----------------------------------------------------------------------------------

def headline_sql(where: str) -> str:
    return f"""
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
def headline_minute_sql(source: str) -> str:
    return f"""
SELECT coalesce(sum(c.requests), 0)::BIGINT AS requests, {HITS}::BIGINT AS hits,
       {HITS} / sum(c.requests) AS hit_rate,
       coalesce(sum(c.contaminated), 0)::BIGINT AS contaminated_hits,
       sum(c.contaminated) / nullif({HITS}, 0) AS contaminated_rate,
       coalesce(sum(c.violations), 0)::BIGINT AS length_violations,
       min(c.first_ts) AS first_ts, max(c.last_ts) AS last_ts
FROM {source} c
"""

# A time range: the rows fold once to their distinct (deployment, key, identity) triples; the three counts
# are taken from those, a few hundred thousand rows however many millions the range holds. A request whose
# log leaves its cache key unknown has no key to count, share or collide on: it is left out, as the
# summaries leave it out.
def key_counts_sql(where: str) -> str:
    return f"""
WITH p AS MATERIALIZED (
    SELECT {deployment_label()} AS deployment, r.cache_key, r.fingerprint FROM {resolved_rows()} r
    WHERE r.cache_key IS NOT NULL AND {where} GROUP BY ALL
)
SELECT (SELECT count(*) FROM (SELECT 1 FROM p GROUP BY deployment, cache_key)) AS unique_keys,
       (SELECT count(*) FROM (SELECT 1 FROM p GROUP BY deployment, fingerprint)) AS unique_identities,
       (SELECT count(*) FROM (SELECT 1 FROM p GROUP BY deployment, cache_key HAVING count(*) > 1)) AS key_collisions
"""
# The same where the summaries stand (a time range, the dashboard's path): over summary_request_keys, keys and
# identities as the 64-bit hashes stored there, a few integers a row instead of two 64-character texts; exact
# but for a hash collision among the range's keys. The text path above stays the reference the tests hold it to.
def key_counts_range_sql(source: str, where: str) -> str:
    return f"""
WITH p AS MATERIALIZED (SELECT r.key_hash, r.identity_hash FROM {resolved_request_keys()} r WHERE {where} GROUP BY ALL)
SELECT (SELECT count(*) FROM (SELECT 1 FROM p GROUP BY key_hash)) AS unique_keys,
       (SELECT count(*) FROM (SELECT 1 FROM p GROUP BY identity_hash)) AS unique_identities,
       (SELECT count(*) FROM (SELECT 1 FROM p GROUP BY key_hash HAVING count(*) > 1)) AS key_collisions
"""
def key_counts_whole_sql(dims: str) -> str:
    return f"""
WITH k AS (SELECT deployment, key_id, fp_id FROM {resolved_keys()} c WHERE {dims})
SELECT (SELECT count(DISTINCT key_id) FROM k) AS unique_keys,
       (SELECT count(DISTINCT (deployment, fp_id)) FROM k) AS unique_identities,
       (SELECT count(*) FROM (SELECT 1 FROM {resolved_keys('summary_shared_keys')} c WHERE {dims} GROUP BY key_id
                              HAVING count(DISTINCT fp_id) > 1))
           AS key_collisions
"""


@dataclass(frozen=True)
class HeadlineCounts:
    """The headline's counts (headline_sql's columns, in its order)."""

    requests: int
    hits: int
    hit_rate: float | None
    contaminated_hits: int
    contaminated_rate: float | None
    length_violations: int
    first_ts: datetime | None
    last_ts: datetime | None


@dataclass(frozen=True)
class Headline(HeadlineCounts):
    """The counts and the distinct ones (in the order `specdec stats --json` prints them)."""

    unique_keys: int
    unique_identities: int
    key_collisions: int
    quarantined: int
    keys_per_identity: float | None


def _counts(con: Any, filters: Filters) -> dict[str, Any]:
    return row(ask(con, headline_sql, filters, minute=headline_minute_sql))


def headline_counts(store: Store, filters: Filters = NO_FILTERS) -> HeadlineCounts:
    """The headline's counts alone (requests, hits, contaminated hits, length violations): no distinct counts."""
    with store.read() as con:
        return HeadlineCounts(**_counts(con, filters))


def headline(store: Store, filters: Filters = NO_FILTERS) -> Headline:
    """Requests, hit rate, contaminated hits, length violations, collisions, keys per identity."""
    with store.read() as con:  # one connection for the three: opening one costs as much as a small query
        out = _counts(con, filters)
        out.update(row(ask(con, key_counts_sql, filters, whole=key_counts_whole_sql, ranged=key_counts_range_sql)))
        out["quarantined"] = con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
    out["keys_per_identity"] = (out["unique_keys"] / out["unique_identities"]) if out["unique_identities"] else None
    return Headline(**out)


