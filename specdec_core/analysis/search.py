"""Full-text search over prompts and outputs: "every request whose output mentions X".

DuckDB's FTS extension would need a download; a scan with bound contains() / regular-expression
parameters over the two text columns is fast enough at a million rows (bench/bench_pages.py).
"""

from __future__ import annotations

import string

import duckdb
import pandas as pd

from specdec_core.analysis.query import CHOSEN_ROWS, NO_FILTERS, Filters, chosen_rows
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label

SEARCH_FIELDS = ("prompt", "output_text")
SEARCH_MODES = ("contains", "regex")


class SearchError(ValueError):
    """A search that can't run (an invalid regular expression, no field to search)."""


# Characters of context each side of a match: the excerpt reads whole in a table at 1440 px.
EXCERPT_CHARS = 32
# Where a match is looked for first: the output is what a contaminated hit got wrong.
EXCERPT_ORDER = ("output_text", "prompt")
EXCERPT_FIELD_NAMES = {"output_text": "output", "prompt": "prompt"}

def regex_literal(text: str) -> str:
    """`text` as a regular expression (RE2, DuckDB's) that matches it literally: RE2 reads a backslash
    before any ASCII punctuation as that character."""
    return "".join("\\" + ch if ch in string.punctuation else ch for ch in text)


def _condition(field: str, mode: str, case_sensitive: bool) -> str:
    """Whether the request's `field` holds $text (or, as a regular expression, matches it)."""
    if mode == "contains":
        # contains(), not ILIKE: with the pattern a bound value DuckDB scans it as a general pattern, an
        # order of magnitude slower (docs/benchmarks.md); with text, % and _ are no wildcards.
        return f"contains(r.{field}, $text)" if case_sensitive else f"contains(lower(r.{field}), lower($text))"
    return f"regexp_matches(r.{field}, $text, '{'c' if case_sensitive else 'i'}')"


def _match(fields: tuple[str, ...], mode: str, case_sensitive: bool) -> str:
    return " OR ".join(_condition(f, mode, case_sensitive) for f in fields)


def first_matches_sql(where: str, fields: tuple[str, ...], mode: str, case_sensitive: bool) -> str:
    """How many requests `where` picks match, and the ids and time span of the first $limit in time order:
    the scan reads only the searched texts, the ids and the times (at 20M rows it read every column the
    page lists for every row first, 1.9 s of 3.9)."""
    return f"""
SELECT list(request_id ORDER BY ts, request_id), min(ts), max(ts), any_value(matches) AS matches FROM (
    SELECT unnest(first, recursive := true), matches FROM (
        SELECT min_by({{'request_id': r.request_id, 'ts': r.ts}}, (r.ts, r.request_id), $limit) AS first,
               count(*) AS matches
        FROM requests r WHERE {where} AND ({_match(fields, mode, case_sensitive)})))
"""


def matching_requests_with_excerpts_sql(where: str, fields: tuple[str, ...], mode: str, case_sensitive: bool,
                                        matches: str = "count(*) OVER ()") -> str:
    """The requests `where` picks whose `fields` hold $text, in time order (the first $limit), each with the
    field it matched in first and the match with the text around it; `matches` counts every match (given:
    the count of a first pass that chose the rows).

    The excerpt is cut only from the rows listed (the LIMIT), never over the whole log. Group 1 of the
    locating pattern ($locate) is the text before the first match and group 2 the match: a user's own groups
    come after."""
    match = _match(fields, mode, case_sensitive)
    ordered = [f for f in EXCERPT_ORDER if f in fields]
    located = " ".join(f"WHEN {_condition(f, mode, case_sensitive)} THEN '{EXCERPT_FIELD_NAMES[f]}'" for f in ordered)
    matched_text = " ".join(f"WHEN '{EXCERPT_FIELD_NAMES[f]}' THEN r.{f}" for f in ordered)
    flags, chars = "c" if case_sensitive else "i", int(EXCERPT_CHARS)
    return f"""
WITH found AS (
    SELECT r.request_id, r.ts, {deployment_label('r')} AS deployment, r.target_model, r.cache_hit,
           r.max_tokens, r.output_tokens, r.prompt, r.output_text, {matches} AS matches
    FROM requests r
    WHERE {where} AND ({match})
    ORDER BY r.ts, r.request_id LIMIT $limit
), located AS (
    SELECT *, CASE {located} END AS match_field
    FROM found r
), matched AS (
    SELECT *, CASE match_field {matched_text} END AS matched_text
    FROM located r
), cut AS (
    SELECT *, regexp_extract(matched_text, $locate, ['before', 'hit'], '{flags}') AS parts
    FROM matched
)
SELECT request_id, ts, deployment, target_model, cache_hit, max_tokens, output_tokens,
       left(prompt, 160) AS prompt_preview, left(output_text, 160) AS output_preview, match_field,
       CASE WHEN length(parts.before) > {chars} THEN '…' ELSE '' END || right(parts.before, {chars})
           AS match_before,
       parts.hit AS match_text,
       left(substr(matched_text, length(parts.before) + length(parts.hit) + 1), {chars})
           || CASE WHEN length(matched_text) - length(parts.before) - length(parts.hit) > {chars}
                   THEN '…' ELSE '' END AS match_after,
       matches
FROM cut
ORDER BY ts, request_id
"""


def search_requests(store: Store, text: str, *, fields: tuple[str, ...] = SEARCH_FIELDS, mode: str = "contains",
                    case_sensitive: bool = False, filters: Filters = NO_FILTERS, limit: int = 500) -> pd.DataFrame:
    """Requests whose prompt or output (as `fields` say) contains `text` (or matches it as a regular
    expression), in time order; `matches` on each row counts every match, beyond `limit` too.

    Each row says where it matched: `match_field` (output, else prompt), the first match there
    (`match_text`, as the log has it) and up to EXCERPT_CHARS characters before and after it
    (`match_before`, `match_after`; an ellipsis where the text goes on)."""
    if mode not in SEARCH_MODES:
        raise SearchError(f"search mode {mode!r}: one of {', '.join(SEARCH_MODES)}")
    fields = tuple(f for f in SEARCH_FIELDS if f in fields)
    if not fields:
        raise SearchError(f"choose at least one field to search: {', '.join(SEARCH_FIELDS)}")
    where, params = filters.named_where()
    locate = "(?s:(.*?))(" + (regex_literal(text) if mode == "contains" else text) + ")"
    given = {**params, "text": text, "limit": limit}
    try:
        with store.read() as con:
            chosen = chosen_rows(con, first_matches_sql(where, fields, mode, case_sensitive), given)
            sql = matching_requests_with_excerpts_sql(CHOSEN_ROWS, fields, mode, case_sensitive, "$matches::BIGINT")
            return con.execute(sql, {"text": text, "limit": limit, "locate": locate,
                                     **chosen, "matches": chosen["matches"] or 0}).df()
    except (duckdb.InvalidInputException, duckdb.BinderException) as exc:
        # A pattern RE2 refuses: as the text searched, or inside $locate (an unclosed \Q quotes its ")").
        if isinstance(exc, duckdb.BinderException) and "Pattern failed to parse" not in str(exc):
            raise
        raise SearchError(f"not a valid regular expression ({exc}); or search for the text as it is") from exc
