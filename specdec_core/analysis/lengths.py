"""Output length against max_tokens, and the requests that break it."""

from __future__ import annotations

from typing import Any

import pandas as pd

from specdec_core.analysis.query import (
    CHOSEN_ROWS,
    NO_FILTERS,
    Filters,
    Histogram,
    ask,
    chosen_rows,
    chosen_verdicts,
    df,
    draft_label,
    execute,
)
from specdec_core.derived import summaries as summary
from specdec_core.derived.summaries import histogram_quantiles
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


def output_length_by_max_tokens_sql(where: str) -> str:
    return f"""
SELECT r.max_tokens, count(*) AS requests, min(r.output_tokens) AS min,
       quantile_cont(r.output_tokens, 0.25) AS q1, median(r.output_tokens) AS median,
       quantile_cont(r.output_tokens, 0.75) AS q3, max(r.output_tokens) AS max,
       count(*) FILTER (WHERE r.output_tokens > r.max_tokens) AS violations
FROM requests r WHERE {where}
GROUP BY ALL ORDER BY r.max_tokens
"""


def _lengths_from_histogram(con: Any, source: str, params: dict[str, Any]) -> pd.DataFrame:
    s = histogram_quantiles(con, source, params, {"q1": 0.25, "median": 0.5, "q3": 0.75}, count_above_key=True)
    # A null max_tokens (unknown on a LiteLLM hit) as the rows give it: <NA> of an integer column.
    keys = pd.array(s["key"], dtype="Int64") if None in s["key"] else s["key"]
    return pd.DataFrame({"max_tokens": keys, "requests": s["total"], "min": s["min"], "q1": s["q1"],
                         "median": s["median"], "q3": s["q3"], "max": s["max"], "violations": s["above_key"]})


def output_length_by_max_tokens(store: Store, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Distribution of output tokens per max_tokens (box statistics), with violation counts."""
    return df(store, output_length_by_max_tokens_sql, filters, histogram=_LENGTHS)


_LENGTHS = Histogram(
    whole=lambda dims: f"(SELECT c.max_tokens AS key, c.value, c.n FROM summary_lengths c WHERE {dims})",
    rows=lambda where: ("(SELECT r.max_tokens AS key, r.output_tokens AS value, count(*) AS n "
                        f"FROM requests r WHERE {where} GROUP BY ALL)"),
    answer=_lengths_from_histogram)


def length_violations_sql(where: str) -> str:
    return f"""
SELECT r.request_id, r.ts, {deployment_label()} AS deployment, r.max_tokens, r.output_tokens,
       r.cache_hit, h.source_request_id, r.target_model, {draft_label()} AS draft_model, r.temperature,
       r.cache_key
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where} AND r.output_tokens > r.max_tokens
ORDER BY r.ts, r.request_id LIMIT $limit
"""


def _first_violations_sql(where: str) -> str:
    """The first `$limit` violations `where` (the filters over the summary, `c`) picks: ids and time span."""
    return f"""SELECT list(request_id), min(ts), max(ts) FROM (
    SELECT c.request_id, c.ts FROM summary_violations c WHERE {where} ORDER BY c.ts, c.request_id LIMIT $limit)"""


def _chosen_violations_sql() -> str:
    """`length_violations_sql` over the rows CHOSEN_ROWS picks, each hit's source found as `chosen_verdicts`
    finds it."""
    return f"""
WITH r AS (SELECT * FROM requests r WHERE {CHOSEN_ROWS}), {chosen_verdicts("r")}
SELECT r.request_id, r.ts, {deployment_label()} AS deployment, r.max_tokens, r.output_tokens,
       r.cache_hit, coalesce(c.source_request_id, h.source_request_id) AS source_request_id, r.target_model,
       {draft_label()} AS draft_model, r.temperature, r.cache_key
FROM r LEFT JOIN c USING (request_id) LEFT JOIN h USING (request_id)
ORDER BY r.ts, r.request_id
"""


def length_violations(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000) -> pd.DataFrame:
    """Requests whose output is longer than their max_tokens allows (the first `limit`, in time order): found in
    their summary, and only those read with their sources."""
    with store.read() as con:
        if not summary.ready(con):
            return ask(con, length_violations_sql, filters, {"limit": limit}).df()
        where, params = filters.named_where("c")
        chosen = chosen_rows(con, _first_violations_sql(where), params | {"limit": limit})
        return execute(con, _chosen_violations_sql(), chosen).df()


