"""Contaminated hits: which, since when, and how often per deployment."""

from __future__ import annotations

import pandas as pd

from specdec_core.analysis.query import (
    HITS,
    NO_FILTERS,
    Filters,
    ask,
    df,
    draft_label,
    execute,
    over_time,
)
from specdec_core.derived import summaries as summary
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


def contaminated_hits_sql(where: str) -> str:
    return f"""
SELECT r.request_id, r.ts, {deployment_label()} AS deployment, r.cache_key, h.source_request_id,
       h.source_ts, h.differing_fields, h.fingerprint_mismatch, r.target_model,
       {draft_label()} AS draft_model, r.temperature, r.max_tokens, r.seed::VARCHAR AS seed,
       r.tokenizer_version, r.output_tokens, left(r.output_text, 120) AS output_preview
FROM requests r JOIN hit_sources h USING (request_id)
WHERE {where} AND h.contaminated
ORDER BY r.ts, r.request_id LIMIT $limit
"""


def contaminated_hits_summary_sql(where: str) -> str:
    return f"""
SELECT * FROM summary_contaminated c WHERE {where} ORDER BY ts, request_id LIMIT $limit
"""


def contaminated_hits(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000) -> pd.DataFrame:
    """Hits that served another identity's output, with the request that put it in the cache."""
    with store.read() as con:
        if summary.ready(con):  # the same rows, joined and labelled at ingest; every filter applies
            where, params = filters.named_where("c")
            return execute(con, contaminated_hits_summary_sql(where), params | {"limit": limit}).df()
        return ask(con, contaminated_hits_sql, filters, {"limit": limit}).df()


def mismatch_rate_over_time_sql(where: str) -> str:
    return f"""
SELECT time_bucket(CAST($bucket AS INTERVAL), r.ts) AS bucket, {deployment_label()} AS deployment,
       count(*) FILTER (WHERE r.cache_hit) AS hits,
       count(*) FILTER (WHERE h.contaminated) AS contaminated_hits,
       count(*) FILTER (WHERE h.contaminated) / nullif(count(*), 0) AS mismatch_rate
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where}
GROUP BY ALL ORDER BY bucket, deployment
"""


def mismatch_rate_over_time_minute_sql(source: str) -> str:
    return f"""
SELECT time_bucket(CAST($bucket AS INTERVAL), c.minute) AS bucket, c.deployment, {HITS}::BIGINT AS hits,
       sum(c.contaminated)::BIGINT AS contaminated_hits,
       sum(c.contaminated) / nullif(sum(c.requests), 0) AS mismatch_rate
FROM {source} c
GROUP BY ALL ORDER BY bucket, deployment
"""


def mismatch_rate_over_time(store: Store, filters: Filters = NO_FILTERS, bucket: str | None = None) -> pd.DataFrame:
    """Contaminated hits per time bucket and deployment, as a share of all requests."""
    return over_time(store, mismatch_rate_over_time_sql, mismatch_rate_over_time_minute_sql, filters, bucket)


def contamination_window_sql(where: str) -> str:
    return f"""
SELECT {deployment_label()} AS deployment, count(*) AS contaminated_hits,
       min(r.ts) AS first_contaminated, max(r.ts) AS last_contaminated
FROM requests r JOIN hit_sources h USING (request_id)
WHERE {where} AND h.contaminated
GROUP BY ALL ORDER BY first_contaminated, deployment
"""


def contamination_window_minute_sql(source: str) -> str:
    return f"""
SELECT c.deployment, sum(c.contaminated)::BIGINT AS contaminated_hits,
       min(c.first_contaminated) AS first_contaminated, max(c.last_contaminated) AS last_contaminated
FROM {source} c
GROUP BY ALL HAVING sum(c.contaminated) > 0 ORDER BY first_contaminated, deployment
"""


def contamination_window(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Where and since when the cache mixed identities: a row per deployment, the earliest first."""
    return df(store, contamination_window_sql, filters, minute=contamination_window_minute_sql)


