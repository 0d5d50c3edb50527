"""Full-text search over prompts and outputs: "every request whose output mentions X".

DuckDB's FTS extension would need a download; a scan with bound ILIKE / regular-expression
parameters over the two text columns is fast enough at a million rows (bench/bench_pages.py).
"""

from __future__ import annotations

import duckdb
import pandas as pd

from specdec_core.analysis.query import NO_FILTERS, Filters, df
from specdec_core.store.connection import Store

SEARCH_FIELDS = ("prompt", "output_text")
SEARCH_MODES = ("contains", "regex")


class SearchError(ValueError):
    """A search that can't run (an invalid regular expression, no field to search)."""


def like_pattern(text: str) -> str:
    """`text` as an ILIKE pattern that matches it anywhere, its own % _ and \\ taken literally."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


SEARCH_SQL = """
SELECT r.request_id, r.ts, coalesce(r.deployment, '') AS deployment, r.target_model, r.cache_hit,
       r.max_tokens, r.output_tokens, left(r.prompt, 160) AS prompt_preview,
       left(r.output_text, 160) AS output_preview, count(*) OVER () AS matches
FROM requests r
WHERE {where} AND ({match})
ORDER BY r.ts, r.request_id LIMIT ?
"""


def _condition(field: str, mode: str, case_sensitive: bool) -> str:
    if mode == "contains":
        return f"r.{field} {'LIKE' if case_sensitive else 'ILIKE'} ? ESCAPE '\\'"
    return f"regexp_matches(r.{field}, ?, '{'c' if case_sensitive else 'i'}')"


def search_requests(store: Store, text: str, *, fields: tuple[str, ...] = SEARCH_FIELDS, mode: str = "contains",
                    case_sensitive: bool = False, filters: Filters = NO_FILTERS, limit: int = 500) -> pd.DataFrame:
    """Requests whose prompt or output (as `fields` say) contains `text` (or matches it as a regular
    expression), in time order; `matches` on each row counts every match, beyond `limit` too."""
    if mode not in SEARCH_MODES:
        raise SearchError(f"search mode {mode!r}: one of {', '.join(SEARCH_MODES)}")
    fields = tuple(f for f in SEARCH_FIELDS if f in fields)
    if not fields:
        raise SearchError(f"choose at least one field to search: {', '.join(SEARCH_FIELDS)}")
    needle = like_pattern(text) if mode == "contains" else text
    match = " OR ".join(_condition(f, mode, case_sensitive) for f in fields)
    try:
        return df(store, SEARCH_SQL.replace("{match}", match), filters, [needle] * len(fields) + [limit])
    except duckdb.InvalidInputException as exc:
        raise SearchError(f"not a valid regular expression ({exc}); or search for the text as it is") from exc
