"""Contaminated hits: which, since when, and how often per deployment."""

from __future__ import annotations

from typing import Any

import pandas as pd

from specdec_core.analysis.query import (
    CHOSEN_ROWS,
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


def contaminated_hits(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000, unknown: bool = False
                      ) -> pd.DataFrame:
    """Hits that served another identity's output, with the request that put it in the cache. `unknown`: with
    each hit's `unknown_fields` last (what its log left unknown, which a table says is unknown)."""
    with store.read() as con:
        if summary.ready(con):  # the same rows, joined and labelled at ingest; every filter applies
            where, params = filters.named_where("c")
            hits = execute(con, contaminated_hits_summary_sql(where), params | {"limit": limit}).df()
        else:
            hits = ask(con, contaminated_hits_sql, filters, {"limit": limit}).df()
        if unknown:
            hits["unknown_fields"] = _unknown_fields(con, hits)
        return hits


def _unknown_fields(con: Any, hits: pd.DataFrame) -> list[Any]:
    """Each row's unknown fields (None where its log left none unknown). Only a store holding a partial identity
    is read for them, and then only the rows' time span."""
    if hits.empty or not execute(con, "SELECT count(*) FROM (SELECT 1 FROM identities WHERE unknown IS NOT NULL "
                                      "LIMIT 1)", {}).fetchall()[0][0]:
        return [None] * len(hits)
    params = {"ids": list(hits.request_id), "first": hits.ts.min().to_pydatetime(),
              "last": hits.ts.max().to_pydatetime()}
    found = dict(execute(con, f"SELECT r.request_id, r.unknown_fields FROM requests r WHERE {CHOSEN_ROWS} "
                              "AND r.unknown_fields IS NOT NULL", params).fetchall())
    return [found.get(r) for r in hits.request_id]


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


