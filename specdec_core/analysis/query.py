"""How every triage question runs: the filters (bound parameters, never SQL text) and the choice between
the summaries and the rows. Contamination is judged over the whole log (a hit's source may lie outside
the filtered window); filters choose which hits are shown."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

import pandas as pd

from specdec_core.derived import summaries as summary
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label, named_params


def selection_time(text: str, *, end: bool = False) -> datetime:
    """A time as a person writes it, or pastes it from the tool (`--start`/`--end`, `--since`/`--until`, a
    link's `start=`/`end=`, an annotation): ISO 8601, UTC unless it says. RFC 3339's lowercase `t` and `z` read
    as `T` and `Z` (Python 3.11's fromisoformat takes only the first), and a trailing ` UTC` as every time the
    tool shows itself is written (`2026-11-20 08:00:03 UTC`, analysis.status.fmt_time). The end is inclusive,
    through the last microsecond of what it names: a date alone is that whole day, so a start and an end of the
    same date are that day; a time without a fraction is that whole second (or minute, or hour), so an end
    pasted from what the tool shows (to the second) keeps the requests logged later in that second, as
    Elasticsearch rounds an `lte` date up. Raises ValueError."""
    text = text.strip()
    said_utc = text[-4:].upper() == " UTC"
    body = text[:-4].rstrip() if said_utc else text
    ts = datetime.fromisoformat(body[:-1] + "+00:00" if body[-1:] in ("Z", "z") else body)
    if said_utc and ts.tzinfo is not None:
        raise ValueError(f"{text!r} gives its zone twice")
    if end:
        ts += _unit_named(body) - timedelta(microseconds=1)
    return ts if ts.tzinfo else ts.replace(tzinfo=timezone.utc)


# A time of day as fromisoformat reads it after the date's separator: its digits, with or without colons, and
# a fraction; then the zone, if any.
_TIME_OF_DAY = re.compile(r"[Tt ](?P<clock>[0-9]{2}(?::?[0-9]{2}){0,2})(?P<fraction>[.,][0-9]+)?(?:[Zz+-].*)?")


def _unit_named(body: str) -> timedelta:
    """The span the last figure of a time names (that the time is the start of): a day for a date alone, an
    hour, a minute or a second for a time of day without a fraction; a microsecond where it has one."""
    if not any(c in body for c in "Tt: "):  # a date alone, in any form fromisoformat reads
        return timedelta(days=1)
    found = _TIME_OF_DAY.search(body)
    if found is None or found["fraction"]:
        return timedelta(microseconds=1)
    figures = len(found["clock"].replace(":", "")) // 2
    return (timedelta(hours=1), timedelta(minutes=1), timedelta(seconds=1))[figures - 1]


@dataclass(frozen=True)
class Filters:
    start: datetime | None = None
    end: datetime | None = None
    deployments: tuple[str, ...] = ()
    target_models: tuple[str, ...] = ()
    draft_models: tuple[str, ...] = ()  # NO_DRAFT selects requests without speculation

    def named_where(self, alias: str = "r") -> tuple[str, dict[str, Any]]:
        """A WHERE clause over the requests table and its parameters, bound by name (`$filter_...`)."""
        conditions = self._conditions(alias)
        return " AND ".join(["TRUE", *(c for c, _, _ in conditions)]), {name: v for _, name, v in conditions}

    def _conditions(self, alias: str) -> list[tuple[str, str, Any]]:
        """(condition over $name, name, value) for each filter set."""
        conditions: list[tuple[str, str, Any]] = []
        if self.start is not None:
            conditions.append((f"{alias}.ts >= $filter_start", "filter_start", self.start))
        if self.end is not None:
            conditions.append((f"{alias}.ts <= $filter_end", "filter_end", self.end))
        for values, name, column in ((self.deployments, "filter_deployments", deployment_label(alias)),
                                     (self.target_models, "filter_target_models", f"{alias}.target_model"),
                                     (self.draft_models, "filter_draft_models", draft_label(alias))):
            if values:
                conditions.append((f"list_contains(${name}, {column})", name, list(values)))
        return conditions


NO_FILTERS = Filters()

# Hits in a minute-summary relation `c`.
HITS = "coalesce(sum(c.requests) FILTER (WHERE c.cache_hit), 0)"


draft_label = summary.draft_label


# A question's SQL, built around what it reads: the filters' condition over `requests r` (rows), a
# relation shaped like summary_minute (minute), the filters other than time over a summary table `c`
# (whole), or both a minute relation and the row condition (ranged). Parameters are bound by name.
Rows = Callable[[str], str]
Minutes = Callable[[str], str]
Whole = Callable[[str], str]
Ranged = Callable[[str, str], str]


@dataclass(frozen=True)
class Histogram:
    """A question answered from a histogram relation (`key`, `value`, `n`): `whole` builds it from a summary
    under the filters other than time (a condition over `c`), `rows` from the requests the filters pick (over
    `requests r`, time included), and `answer` (connection, relation, params) reads it. Under a time range
    the rows' GROUP BY reads two columns where quantile_cont sorted every value of each group: the output
    lengths of half a 20M-row log 0.64 -> 0.08 s, the buffers warm."""
    whole: Whole
    rows: Rows
    answer: Callable[[Any, str, dict[str, Any]], pd.DataFrame]


def df(store: Store, rows: Rows, filters: Filters, params: dict[str, Any] | None = None, *,
       minute: Minutes | None = None, whole: Whole | None = None, ranged: Ranged | None = None,
       histogram: Histogram | None = None, summarized: Whole | None = None) -> pd.DataFrame:
    """Answer a question: from the summaries when they can (`minute` over a relation shaped like
    summary_minute; `whole` without a time range; `histogram` under any filter; `summarized`, under any
    filter, the filters' condition over summary tables `c`; `ranged`, the rows helped by the summaries), else
    `rows` over the requests with the filters' condition. Each builder is a function of what it reads;
    `params` are the question's own, bound by name beside the filters' `$filter_*` (a histogram reads only
    the filters')."""
    with store.read() as con:
        if histogram is not None and summary.ready(con):
            if whole_from_summaries(con, filters):
                dims, dim_params = summary.named_dimension_where(filters)
                return histogram.answer(con, histogram.whole(dims), dim_params)
            where, where_params = filters.named_where()
            return histogram.answer(con, histogram.rows(where), where_params)
        return ask(con, rows, filters, params, minute=minute, whole=whole, ranged=ranged,
                   summarized=summarized).df()


def whole_from_summaries(con: Any, filters: Filters) -> bool:
    """Whether a `whole` answer applies: no time range, and summaries this code may use."""
    return filters.start is None and filters.end is None and summary.ready(con)


def ask(con: Any, rows: Rows, filters: Filters, params: dict[str, Any] | None = None, *,
        minute: Minutes | None = None, whole: Whole | None = None, ranged: Ranged | None = None,
        summarized: Whole | None = None) -> Any:
    """Run the question's best builder (as `df` chooses) and return the cursor."""
    params = dict(params or {})
    where, where_params = filters.named_where()
    if minute is not None and summary.ready(con):
        source, source_params = summary.named_minute_source(filters, (where, where_params))
        sql, params = minute(source), params | source_params
    elif whole is not None and whole_from_summaries(con, filters):
        dims, dim_params = summary.named_dimension_where(filters)
        sql, params = whole(dims), params | dim_params
    elif summarized is not None and summary.ready(con):
        over, over_params = filters.named_where("c")
        sql, params = summarized(over), params | over_params
    elif ranged is not None and summary.ready(con):
        source, where, source_params = minute_source(filters)
        sql, params = ranged(source, where), params | source_params
    else:
        sql, params = rows(where), params | where_params
    return execute(con, sql, params)


def minute_source(filters: Filters) -> tuple[str, str, dict[str, Any]]:
    """What a `ranged` builder reads: the minute relation of the selection, the rows' condition (over
    `requests r`), and the parameters both name."""
    where, where_params = filters.named_where()
    source, source_params = summary.named_minute_source(filters, (where, where_params))
    return source, where, source_params | where_params


def execute(con: Any, sql: str, params: dict[str, Any]) -> Any:
    """`sql` with the parameters it names: DuckDB refuses any it does not."""
    return con.execute(sql, named_params(sql, params))


# The requests `r` a first query chose by id (a page's first rows, found from the summaries): bound as a list,
# since the planner would otherwise join every candidate row with its verdicts before keeping the first; their
# time span lets the scans skip row groups.
CHOSEN_ROWS = "r.request_id IN (SELECT unnest($ids::VARCHAR[])) AND r.ts >= $first AND r.ts <= $last"


# The contaminated hits among the chosen rows, from their summary in time order: the rows' time span bounds the scan.
CHOSEN_CONTAMINATED = ("(SELECT * FROM summary_contaminated WHERE request_id IN (SELECT unnest($ids::VARCHAR[])) "
                       "AND ts >= $first AND ts <= $last)")


def chosen_verdicts(rows: str) -> str:
    """Two CTEs over the chosen rows (`rows`: a relation of CHOSEN_ROWS' requests): `c`, each contaminated hit's
    source, differing fields and source's arm from its summaries, which the rows' time range bounds; `h`, the
    verdict of a clean hit that overran its max_tokens, from hit_sources. There are seldom any, and then
    hit_sources is not read: at 20M requests it holds 19M verdicts, and a lake finds a few ids among them by
    reading every row group (1.3 s)."""
    return f"""c AS (SELECT c.request_id, c.source_request_id, c.differing_fields, i.source_experiment
           FROM {CHOSEN_CONTAMINATED} c JOIN summary_impact_hits i USING (request_id)
           WHERE i.ts >= $first AND i.ts <= $last),
     h AS (SELECT h.request_id, h.source_request_id, h.differing_fields FROM hit_sources h
           WHERE h.request_id IN (SELECT request_id FROM {rows} WHERE cache_hit AND output_tokens > max_tokens
                                  AND request_id NOT IN (SELECT request_id FROM c)))"""


def chosen_rows(con: Any, ids_sql: str, params: dict[str, Any]) -> dict[str, Any]:
    """The parameters of CHOSEN_ROWS for the rows `ids_sql` chooses (one row: their ids as a list, their first
    and last `ts`, then any other columns the query names, kept under those names)."""
    cursor = execute(con, ids_sql, params)
    ids, first, last, *others = cursor.fetchall()[0]
    return {"ids": ids or [], "first": first, "last": last,
            **{column[0]: value for column, value in zip(cursor.description[3:], others, strict=True)}}


def one(store: Store, rows: Rows, filters: Filters, **summaries: Any) -> dict[str, Any]:
    frame = df(store, rows, filters, **summaries)
    return {k: native(v) for k, v in frame.iloc[0].items()}


def native(value: Any) -> Any:
    """numpy scalars as plain Python values, missing as None: callers format and compare them."""
    if value is None or value is pd.NaT or (not isinstance(value, str) and pd.isna(value)):
        return None
    return value.item() if hasattr(value, "item") and not isinstance(value, pd.Timestamp) else value


def _bucket_for(span_seconds: float) -> str:
    for seconds, name in ((2 * 3600, "1 minute"), (12 * 3600, "5 minutes"), (3 * 86400, "1 hour")):
        if span_seconds <= seconds:
            return name
    return "1 day"


def time_span_sql(where: str) -> str:
    return f"SELECT epoch(max(ts)) - epoch(min(ts)) AS span FROM requests r WHERE {where}"


def time_span_minute_sql(source: str) -> str:
    return f"SELECT epoch(max(last_ts)) - epoch(min(first_ts)) AS span FROM {source} c"


def time_bucket(store: Store, filters: Filters) -> str:
    """An interval that gives a readable number of points over the filtered time range."""
    span = one(store, time_span_sql, filters, minute=time_span_minute_sql)["span"]
    return _bucket_for(float(span or 0))


def row(cursor: Any) -> dict[str, Any]:
    names = [d[0] for d in cursor.description]
    return {k: native(v) for k, v in zip(names, cursor.fetchall()[0], strict=True)}


def over_time(store: Store, rows: Rows, minute: Minutes, filters: Filters, bucket: str | None) -> pd.DataFrame:
    """A question asked per time bucket, bound as `$bucket` (default: one that gives a readable number of
    points)."""
    # Summary minutes align with every bucket offered (1 minute to 1 day, UTC).
    return df(store, rows, filters, {"bucket": bucket or time_bucket(store, filters)}, minute=minute)
