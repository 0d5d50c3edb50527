"""Cache questions: hit rate per model combination and over time, keys per identity, latency, acceptance."""

from __future__ import annotations

from typing import Any

import pandas as pd

from specdec_core.analysis.query import (
    HITS,
    NO_FILTERS,
    Filters,
    Histogram,
    df,
    draft_label,
    over_time,
)
from specdec_core.derived.aliases import resolved_keys, resolved_request_keys, resolved_rows
from specdec_core.derived.summaries import NO_DRAFT, PARTIAL_HIT, histogram_quantiles
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


def hit_rate_by_combination_sql(where: str) -> str:
    return f"""
SELECT r.target_model, {draft_label()} AS draft_model, count(*) AS requests,
       count(*) FILTER (WHERE r.cache_hit) AS hits, avg(r.cache_hit::INT) AS hit_rate,
       count(*) FILTER (WHERE h.contaminated) AS contaminated_hits
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where}
GROUP BY ALL ORDER BY requests DESC, target_model, draft_model
"""


def hit_rate_by_combination_minute_sql(source: str) -> str:
    return f"""
SELECT c.target_model, c.draft_model, sum(c.requests)::BIGINT AS requests, {HITS}::BIGINT AS hits,
       {HITS} / sum(c.requests) AS hit_rate, sum(c.contaminated)::BIGINT AS contaminated_hits
FROM {source} c
GROUP BY ALL ORDER BY requests DESC, target_model, draft_model
"""


def hit_rate_by_combination(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    return df(store, hit_rate_by_combination_sql, filters, minute=hit_rate_by_combination_minute_sql)


def hit_rate_over_time_sql(where: str) -> str:
    return f"""
SELECT time_bucket(CAST($bucket AS INTERVAL), r.ts) AS bucket, r.target_model || ' / ' || {draft_label()} AS combination,
       count(*) AS requests, avg(r.cache_hit::INT) AS hit_rate
FROM requests r
WHERE {where}
GROUP BY ALL ORDER BY bucket, combination
"""


def hit_rate_over_time_minute_sql(source: str) -> str:
    return f"""
SELECT time_bucket(CAST($bucket AS INTERVAL), c.minute) AS bucket, c.target_model || ' / ' || c.draft_model AS combination,
       sum(c.requests)::BIGINT AS requests, {HITS} / sum(c.requests) AS hit_rate
FROM {source} c
GROUP BY ALL ORDER BY bucket, combination
"""


def hit_rate_over_time(store: Store, filters: Filters = NO_FILTERS, bucket: str | None = None) -> pd.DataFrame:
    return over_time(store, hit_rate_over_time_sql, hit_rate_over_time_minute_sql, filters, bucket)


def key_ratio_by_deployment_sql(where: str) -> str:
    return f"""
SELECT {deployment_label()} AS deployment, count(*) AS requests,
       count(DISTINCT r.cache_key) AS unique_keys, count(DISTINCT r.fingerprint) AS unique_identities,
       count(DISTINCT r.cache_key) / count(DISTINCT r.fingerprint) AS keys_per_identity,
       avg(r.cache_hit::INT) AS hit_rate,
       -- A correct key can't hit more often than this: every distinct identity misses at least once.
       1 - count(DISTINCT r.fingerprint) / count(*) AS max_correct_hit_rate,
       count(*) FILTER (WHERE r.cache_hit) AS hits,
       -- Hits on an identity the deployment had never seen: only a shared key (or an entry older than
       -- the log) can serve those.
       count(*) FILTER (WHERE h.first_sight) AS first_sight_hits,
       -- Hits whose log left identity fields unknown: whether they are first sights can't be told.
       count(*) FILTER (WHERE {PARTIAL_HIT}) AS partial_hits
FROM {resolved_rows()} r LEFT JOIN hit_sources h USING (request_id) WHERE r.cache_key IS NOT NULL AND {where}
GROUP BY ALL ORDER BY deployment
"""


def key_ratio_by_deployment_whole_sql(dims: str) -> str:
    return f"""
SELECT c.deployment, sum(c.requests)::BIGINT AS requests,
       count(DISTINCT c.key_id) AS unique_keys, count(DISTINCT c.fp_id) AS unique_identities,
       count(DISTINCT c.key_id) / count(DISTINCT c.fp_id) AS keys_per_identity,
       sum(c.hits) / sum(c.requests) AS hit_rate,
       1 - count(DISTINCT c.fp_id) / sum(c.requests) AS max_correct_hit_rate,
       sum(c.hits)::BIGINT AS hits, sum(c.first_sight)::BIGINT AS first_sight_hits,
       sum(c.partial_hits)::BIGINT AS partial_hits
FROM {resolved_keys()} c WHERE {dims}
GROUP BY ALL ORDER BY deployment
"""


# A time range: the counts from the minute summary (and the rows of the minutes it cuts through), less those
# of the range's requests without a known cache key (few: they are read through the key's null mask); the
# distinct keys and identities come from the per-request key hashes.
def key_ratio_by_deployment_range_sql(source: str, where: str) -> str:
    return f"""
WITH c AS (
    SELECT c.deployment, sum(c.requests)::BIGINT AS requests, {HITS}::BIGINT AS hits,
           coalesce(sum(c.first_sight), 0)::BIGINT AS first_sight_hits,
           coalesce(sum(c.partial_hits), 0)::BIGINT AS partial_hits
    FROM {source} c GROUP BY 1
), u AS (
    SELECT {deployment_label()} AS deployment, count(*) AS requests,
           count(*) FILTER (WHERE r.cache_hit) AS hits, count(*) FILTER (WHERE h.first_sight) AS first_sight_hits,
           count(*) FILTER (WHERE {PARTIAL_HIT}) AS partial_hits
    FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE r.cache_key IS NULL AND {where} GROUP BY 1
), k AS (
    SELECT c.deployment, c.requests - coalesce(u.requests, 0) AS requests, c.hits - coalesce(u.hits, 0) AS hits,
           c.first_sight_hits - coalesce(u.first_sight_hits, 0) AS first_sight_hits,
           c.partial_hits - coalesce(u.partial_hits, 0) AS partial_hits
    FROM c LEFT JOIN u USING (deployment)
), d AS (
    -- By the stored 64-bit hashes, as the headline's range counts (overview.key_counts_range_sql).
    SELECT r.deployment, count(DISTINCT r.key_hash) AS unique_keys, count(DISTINCT r.identity_hash) AS unique_identities
    FROM {resolved_request_keys()} r WHERE {where} GROUP BY 1
)
SELECT deployment, k.requests, d.unique_keys, d.unique_identities,
       d.unique_keys / d.unique_identities AS keys_per_identity, k.hits / k.requests AS hit_rate,
       1 - d.unique_identities / k.requests AS max_correct_hit_rate, k.hits, k.first_sight_hits, k.partial_hits
FROM k JOIN d USING (deployment) ORDER BY deployment
"""


def key_ratio_by_deployment(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Unique cache keys per unique identity; below 1 means identities share keys."""
    return df(store, key_ratio_by_deployment_sql, filters, whole=key_ratio_by_deployment_whole_sql,
              ranged=key_ratio_by_deployment_range_sql)


def latency_hit_vs_miss_sql(where: str) -> str:
    return f"""
SELECT CASE WHEN r.cache_hit THEN 'hit' ELSE 'miss' END AS outcome, count(r.latency_ms) AS requests,
       avg(r.latency_ms) AS mean_ms, quantile_cont(r.latency_ms, 0.5) AS p50_ms,
       quantile_cont(r.latency_ms, 0.95) AS p95_ms
FROM requests r WHERE {where} AND r.latency_ms IS NOT NULL
GROUP BY ALL ORDER BY outcome
"""


def _latency_from_histogram(con: Any, source: str, params: dict[str, Any]) -> pd.DataFrame:
    s = histogram_quantiles(con, source, params, {"p50_ms": 0.5, "p95_ms": 0.95})
    return pd.DataFrame({"outcome": s["key"], "requests": s["total"], "mean_ms": s["mean"], "p50_ms": s["p50_ms"],
                         "p95_ms": s["p95_ms"]})


def latency_hit_vs_miss(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    return df(store, latency_hit_vs_miss_sql, filters, histogram=_LATENCY)


_OUTCOME = "CASE WHEN {}.cache_hit THEN 'hit' ELSE 'miss' END AS key"
_LATENCY = Histogram(
    whole=lambda dims: f"(SELECT {_OUTCOME.format('c')}, c.value, c.n FROM summary_latency c WHERE {dims})",
    rows=lambda where: (f"(SELECT {_OUTCOME.format('r')}, r.latency_ms AS value, count(*) AS n FROM requests r "
                        f"WHERE {where} AND r.latency_ms IS NOT NULL GROUP BY ALL)"),
    answer=_latency_from_histogram)


def acceptance_rate(accepted_tokens: float | None, draft_tokens: float | None) -> float | None:
    """Draft tokens the target accepted per draft token proposed; None when nothing was proposed.

    The one definition: the SQL below builds its ratio with `acceptance_rate_sql`, and a page showing
    one request's rate calls this.
    """
    if accepted_tokens is None or not draft_tokens:
        return None
    return accepted_tokens / draft_tokens


def acceptance_rate_sql(accepted_tokens: str, draft_tokens: str) -> str:
    """`acceptance_rate` over two SQL expressions (NULL when nothing was proposed)."""
    return f"{accepted_tokens} / nullif({draft_tokens}, 0)"


def acceptance_by_combination_sql(where: str) -> str:
    return f"""
SELECT r.target_model, {draft_label()} AS draft_model, count(*) AS decoded_requests,
       sum(r.draft_tokens) AS draft_tokens, sum(r.accepted_tokens) AS accepted_tokens,
       {acceptance_rate_sql('sum(r.accepted_tokens)', 'sum(r.draft_tokens)')} AS acceptance_rate,
       -- Tokens accepted per verification step: each step proposes num_speculative_tokens.
       sum(r.accepted_tokens) / nullif(sum(r.draft_tokens / nullif(r.num_speculative_tokens, 0)), 0)
           AS mean_accepted_length
FROM requests r
WHERE {where} AND NOT r.cache_hit AND r.draft_tokens > 0 AND {draft_label()} <> '{NO_DRAFT}'
GROUP BY ALL ORDER BY target_model, draft_model
"""


def acceptance_by_combination_minute_sql(source: str) -> str:
    return f"""
SELECT c.target_model, c.draft_model, sum(c.decoded_requests)::BIGINT AS decoded_requests,
       sum(c.draft_tokens) AS draft_tokens, sum(c.accepted_tokens) AS accepted_tokens,
       {acceptance_rate_sql('sum(c.accepted_tokens)', 'sum(c.draft_tokens)')} AS acceptance_rate,
       sum(c.accepted_tokens) / nullif(sum(c.steps), 0) AS mean_accepted_length
FROM {source} c
WHERE NOT c.cache_hit AND c.draft_model <> '{NO_DRAFT}'
GROUP BY ALL HAVING sum(c.decoded_requests) > 0 ORDER BY target_model, draft_model
"""


def acceptance_by_combination(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Speculation health of decoded (missed) requests: acceptance rate and accepted length per step."""
    return df(store, acceptance_by_combination_sql, filters, minute=acceptance_by_combination_minute_sql)


