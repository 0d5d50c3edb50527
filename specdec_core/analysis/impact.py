"""Who was hurt: the wrong outputs each consumer (or arm, or deployment) received, and the experiment arms'
figures read again without their contaminated hits (../shared/remediation.md, "Who was hurt").

Without a time range every answer comes from two small summaries (`summary_audience`, `summary_impact_hits`);
with one, from the rows. An arm's clean figures are its figures less its contaminated hits': the sums the
summaries hold subtract exactly.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import pandas as pd

from specdec_core.analysis.query import (
    CHOSEN_ROWS,
    NO_FILTERS,
    Filters,
    ask,
    chosen_rows,
    chosen_verdicts,
    df,
    execute,
    native,
    time_bucket,
)
from specdec_core.contract.names import IMPACT_DIMENSIONS
from specdec_core.derived import summaries as summary
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


@dataclass(frozen=True)
class Impact:
    """What one consumer (arm, deployment) received: `value` is '' where the log names none."""

    value: str
    requests: int
    contaminated_hits: int
    length_violations: int
    first: datetime | None  # the first contaminated hit or length violation it received
    last: datetime | None

    @property
    def affected(self) -> bool:
        return self.contaminated_hits > 0 or self.length_violations > 0

    def as_json(self) -> dict[str, Any]:
        return {"value": self.value, "requests": self.requests, "contaminated_hits": self.contaminated_hits,
                "length_violations": self.length_violations, "first": rfc3339(self.first),
                "last": rfc3339(self.last)}


@dataclass(frozen=True)
class AllClean:
    """A figure over all of an arm's requests and over its clean ones (without its contaminated hits)."""

    all: float | None
    clean: float | None

    @property
    def difference(self) -> float | None:
        """How far the contaminated hits moved the figure: all minus clean."""
        return None if self.all is None or self.clean is None else self.all - self.clean

    def as_json(self) -> dict[str, Any]:
        return {"all": self.all, "clean": self.clean}


@dataclass(frozen=True)
class CrossFeeding:
    """Contaminated hits that arm `arm` received from outputs produced for arm `served_from`."""

    arm: str
    served_from: str  # '' where the source is not in the log or belongs to no arm
    hits: int


@dataclass(frozen=True)
class ArmFigures:
    arm: str
    requests: AllClean
    mean_output_tokens: AllClean
    mean_latency_ms: AllClean
    acceptance_rate: AllClean  # accepted over draft tokens, summed

    @property
    def contaminated_hits(self) -> int:
        return int((self.requests.all or 0) - (self.requests.clean or 0))

    def as_json(self) -> dict[str, Any]:
        return {"arm": self.arm, "requests": self.requests.as_json(),
                "mean_output_tokens": self.mean_output_tokens.as_json(),
                "mean_latency_ms": self.mean_latency_ms.as_json(), "acceptance_rate": self.acceptance_rate.as_json()}


@dataclass(frozen=True)
class ExperimentImpact:
    cross_feeding: tuple[CrossFeeding, ...]
    arms: tuple[ArmFigures, ...]

    def as_json(self) -> dict[str, Any]:
        return {"cross_feeding": [{"arm": c.arm, "served_from": c.served_from, "hits": c.hits}
                                  for c in self.cross_feeding],
                "arms": [a.as_json() for a in self.arms]}


def rfc3339(ts: datetime | None) -> str | None:
    """UTC with milliseconds, or microseconds where the log had them (as the mismatch report writes `ts`)."""
    if ts is None:
        return None
    ts = ts.astimezone(timezone.utc) if ts.tzinfo else ts
    text = ts.strftime("%Y-%m-%dT%H:%M:%S.%f")
    return (text[:-3] if ts.microsecond % 1000 == 0 else text) + "Z"


def _column(by: str, alias: str) -> str:
    if by not in IMPACT_DIMENSIONS:
        raise ValueError(f"impact by {by!r}: expected one of {', '.join(IMPACT_DIMENSIONS)}")
    return f"coalesce({alias}.{by}, '')"


VIOLATION = "r.output_tokens > r.max_tokens"  # an output longer than its request allowed


# --- per consumer, arm or deployment ---------------------------------------------------------------------

def _by_rows_sql(col: str, where: str) -> str:
    return f"""
SELECT {col} AS value, count(*) AS requests, count(*) FILTER (WHERE h.contaminated) AS contaminated_hits,
       count(*) FILTER (WHERE {VIOLATION}) AS length_violations,
       min(r.ts) FILTER (WHERE h.contaminated OR {VIOLATION}) AS first,
       max(r.ts) FILTER (WHERE h.contaminated OR {VIOLATION}) AS last
FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE {where} GROUP BY ALL
"""

def _by_summary_sql(col: str, requests: str, hits_where: str) -> str:
    """Per value: `requests` (value, requests, violations, first_v, last_v) beside the contaminated hits'
    summary (`hits_where`: the filters over it, `c`)."""
    return f"""
WITH a AS ({requests}),
     h AS (SELECT {col} AS value, count(*) AS hits, min(c.ts) AS first_h, max(c.ts) AS last_h
           FROM summary_impact_hits c WHERE {hits_where} GROUP BY ALL)
SELECT a.value, a.requests, coalesce(h.hits, 0) AS contaminated_hits, a.violations AS length_violations,
       least(a.first_v, h.first_h) AS first, greatest(a.last_v, h.last_h) AS last
FROM a LEFT JOIN h USING (value)
"""


def _by_whole_sql(col: str, dims: str) -> str:
    return _by_summary_sql(col, f"""SELECT {col} AS value, sum(c.requests)::BIGINT AS requests,
       sum(c.violations)::BIGINT AS violations, min(c.first_violation) AS first_v, max(c.last_violation) AS last_v
FROM summary_audience c WHERE {dims} GROUP BY ALL""", dims)


# A time range: the requests' counts from their rows (the audience summary holds no time), the contaminated hits
# from their summary, which holds each one's time; no hit joined to its verdict (at 20M rows, 1.3-1.6 s).
def _by_ranged_sql(row_col: str, col: str, where: str, hits_where: str) -> str:
    return _by_summary_sql(col, f"""SELECT {row_col} AS value, count(*)::BIGINT AS requests,
       count(*) FILTER (WHERE {VIOLATION})::BIGINT AS violations,
       min(r.ts) FILTER (WHERE {VIOLATION}) AS first_v, max(r.ts) FILTER (WHERE {VIOLATION}) AS last_v
FROM requests r WHERE {where} GROUP BY ALL""", hits_where)


def named_affected(rows: tuple[Impact, ...]) -> tuple[int, int, Impact | None]:
    """(how many named consumers or arms received wrong outputs, how many are named, the figures of the requests
    that name none when they received any): a log that names no consumer has no "1 of 1 consumers", and consumers
    are counted as experiment arms are, the unnamed apart."""
    named = [r for r in rows if r.value]
    unnamed = next((r for r in rows if not r.value and r.affected), None)
    return sum(r.affected for r in named), len(named), unnamed


def impact(store: Store, by: str = "consumer", filters: Filters = NO_FILTERS) -> tuple[Impact, ...]:
    """Per value of `by` (consumer, experiment or deployment): its requests, the contaminated hits and length
    violations it received and the first and last of them; the most affected first."""
    row_column, summary_column = _column(by, "r"), _column(by, "c")
    rows_where = filters.named_where()[0]  # the same parameters as the summaries' condition
    frame = df(store, lambda where: _by_rows_sql(row_column, where), filters,
               whole=lambda dims: _by_whole_sql(summary_column, dims),
               summarized=lambda over: _by_ranged_sql(row_column, summary_column, rows_where, over))
    out = [Impact(value=str(r["value"]), requests=int(r["requests"]), contaminated_hits=int(r["contaminated_hits"]),
                  length_violations=int(r["length_violations"]), first=_time(r["first"]), last=_time(r["last"]))
           for r in frame.to_dict("records")]
    return tuple(sorted(out, key=lambda i: (-i.contaminated_hits, -i.length_violations, i.value)))


def _time(value: Any) -> datetime | None:
    value = native(value)
    return None if value is None else pd.Timestamp(value).to_pydatetime()


# --- experiment arms ----------------------------------------------------------------------------------------

def _cross_rows_sql(where: str) -> str:
    return f"""
SELECT coalesce(r.experiment, '') AS arm, coalesce(s.experiment, '') AS served_from, count(*) AS hits
FROM requests r JOIN hit_sources h USING (request_id) LEFT JOIN requests s ON s.request_id = h.source_request_id
WHERE h.contaminated AND {where} GROUP BY ALL
"""
def _cross_whole_sql(dims: str) -> str:
    return f"""
SELECT c.experiment AS arm, c.source_experiment AS served_from, count(*) AS hits
FROM summary_impact_hits c WHERE {dims} GROUP BY ALL
"""

# Each arm's sums over all its rows (a_*) and over its contaminated hits (c_*): clean = all - contaminated.
def _arms_rows_sql(where: str) -> str:
    return f"""
SELECT coalesce(r.experiment, '') AS arm, count(*) AS a_n, sum(r.output_tokens) AS a_tokens,
       count(r.latency_ms) AS a_latency_n, sum(r.latency_ms) AS a_latency,
       sum(r.draft_tokens) FILTER (WHERE {summary.BOTH_TOKENS}) AS a_draft,
       sum(r.accepted_tokens) FILTER (WHERE {summary.BOTH_TOKENS}) AS a_accepted,
       count(*) FILTER (WHERE h.contaminated) AS c_n,
       sum(r.output_tokens) FILTER (WHERE h.contaminated) AS c_tokens,
       count(r.latency_ms) FILTER (WHERE h.contaminated) AS c_latency_n,
       sum(r.latency_ms) FILTER (WHERE h.contaminated) AS c_latency,
       sum(r.draft_tokens) FILTER (WHERE h.contaminated AND {summary.BOTH_TOKENS}) AS c_draft,
       sum(r.accepted_tokens) FILTER (WHERE h.contaminated AND {summary.BOTH_TOKENS}) AS c_accepted
FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE {where} GROUP BY ALL
"""
def _arms_summary_sql(requests: str, hits_where: str) -> str:
    return f"""
WITH a AS ({requests}),
     h AS (SELECT c.experiment AS arm, count(*) AS c_n, sum(c.output_tokens) AS c_tokens,
                  count(c.latency_ms) AS c_latency_n, sum(c.latency_ms) AS c_latency, sum(c.draft_tokens) AS c_draft,
                  sum(c.accepted_tokens) AS c_accepted
           FROM summary_impact_hits c WHERE {hits_where} GROUP BY ALL)
SELECT * FROM a LEFT JOIN h USING (arm)
"""


def _arms_whole_sql(dims: str) -> str:
    return _arms_summary_sql(f"""SELECT c.experiment AS arm, sum(c.requests) AS a_n, sum(c.output_tokens) AS a_tokens,
       sum(c.latency_n) AS a_latency_n, sum(c.latency_sum) AS a_latency, sum(c.draft_tokens) AS a_draft,
       sum(c.accepted_tokens) AS a_accepted
FROM summary_audience c WHERE {dims} GROUP BY ALL""", dims)


def _arms_ranged_sql(where: str, hits_where: str) -> str:
    """A time range: each arm's sums over its rows, its contaminated hits' from their summary (as _by_ranged_sql)."""
    return _arms_summary_sql(f"""SELECT coalesce(r.experiment, '') AS arm, count(*) AS a_n,
       sum(r.output_tokens) AS a_tokens, count(r.latency_ms) AS a_latency_n, sum(r.latency_ms) AS a_latency,
       sum(r.draft_tokens) FILTER (WHERE {summary.BOTH_TOKENS}) AS a_draft,
       sum(r.accepted_tokens) FILTER (WHERE {summary.BOTH_TOKENS}) AS a_accepted
FROM requests r WHERE {where} GROUP BY ALL""", hits_where)


def _ratio(num: Any, den: Any) -> float | None:
    num, den = native(num), native(den)
    return None if num is None or not den else float(num) / float(den)


def _less(a: Any, c: Any) -> float:
    return float(native(a) or 0) - float(native(c) or 0)


def _arm(row: dict[str, Any]) -> ArmFigures:
    return ArmFigures(
        arm=str(row["arm"]),
        requests=AllClean(int(row["a_n"]), int(_less(row["a_n"], row["c_n"]))),
        mean_output_tokens=AllClean(_ratio(row["a_tokens"], row["a_n"]),
                                    _ratio(_less(row["a_tokens"], row["c_tokens"]), _less(row["a_n"], row["c_n"]))),
        mean_latency_ms=AllClean(_ratio(row["a_latency"], row["a_latency_n"]),
                                 _ratio(_less(row["a_latency"], row["c_latency"]),
                                        _less(row["a_latency_n"], row["c_latency_n"]))),
        acceptance_rate=AllClean(_ratio(row["a_accepted"], row["a_draft"]),
                                 _ratio(_less(row["a_accepted"], row["c_accepted"]),
                                        _less(row["a_draft"], row["c_draft"]))),
    )


def experiment_impact(store: Store, filters: Filters = NO_FILTERS) -> ExperimentImpact:
    """Which arm's outputs each arm received (the cross-feeding), and each arm's figures with and without its
    contaminated hits, so that an A/B comparison can be read again on clean rows."""
    rows_where = filters.named_where()[0]
    cross = df(store, _cross_rows_sql, filters, whole=_cross_whole_sql, summarized=_cross_whole_sql)
    arms = df(store, _arms_rows_sql, filters, whole=_arms_whole_sql,
              summarized=lambda over: _arms_ranged_sql(rows_where, over))
    feeding = sorted((CrossFeeding(str(r["arm"]), str(r["served_from"]), int(r["hits"]))
                      for r in cross.to_dict("records")), key=lambda c: (-c.hits, c.arm, c.served_from))
    figures = sorted((_arm(r) for r in arms.to_dict("records")), key=lambda a: (a.arm == "", a.arm))
    return ExperimentImpact(cross_feeding=tuple(feeding), arms=tuple(figures))


# --- for the page and the customer notice --------------------------------------------------------------------

def _over_time_rows_sql(where: str) -> str:
    return f"""
SELECT time_bucket(CAST($bucket AS INTERVAL), r.ts) AS bucket, coalesce(r.consumer, '') AS consumer,
       count(*) FILTER (WHERE h.contaminated) AS contaminated_hits,
       count(*) FILTER (WHERE {VIOLATION}) AS length_violations
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where} AND (h.contaminated OR {VIOLATION}) GROUP BY ALL ORDER BY bucket, consumer
"""


def _over_time_summary_sql(where: str) -> str:
    """From the summaries of the contaminated hits and of the violations (`where`: the filters over either, `c`)."""
    return f"""
SELECT bucket, consumer, sum(hits)::BIGINT AS contaminated_hits, sum(violations)::BIGINT AS length_violations
FROM (SELECT time_bucket(CAST($bucket AS INTERVAL), c.ts) AS bucket, c.consumer, count(*) AS hits, 0 AS violations
      FROM summary_impact_hits c WHERE {where} GROUP BY ALL
      UNION ALL
      SELECT time_bucket(CAST($bucket AS INTERVAL), c.ts), c.consumer, 0, count(*)
      FROM summary_violations c WHERE {where} GROUP BY ALL)
GROUP BY ALL ORDER BY bucket, consumer
"""


def wrong_outputs_over_time(store: Store, filters: Filters = NO_FILTERS, bucket: str | None = None) -> pd.DataFrame:
    """Per time bucket and consumer: the contaminated hits and length violations received (`wrong`: both)."""
    bucket = bucket or time_bucket(store, filters)
    with store.read() as con:
        if summary.ready(con):
            where, params = filters.named_where("c")
            frame = execute(con, _over_time_summary_sql(where), params | {"bucket": bucket}).df()
        else:
            frame = ask(con, _over_time_rows_sql, filters, {"bucket": bucket}).df()
    frame["wrong"] = frame["contaminated_hits"] + frame["length_violations"]
    return frame


def _chosen_affected_sql() -> str:
    """`_affected_sql` over the rows CHOSEN_ROWS picks, their verdicts found as `chosen_verdicts` finds them."""
    return f"""
WITH r AS (SELECT * FROM requests r WHERE {CHOSEN_ROWS} AND coalesce(r.consumer, '') = $consumer),
     {chosen_verdicts("r")},
     s AS (SELECT s.request_id, s.experiment FROM requests s WHERE s.request_id IN (SELECT source_request_id FROM h))
SELECT r.request_id, r.ts, CASE WHEN c.request_id IS NOT NULL THEN 'contaminated_hit' ELSE 'length_violation' END
           AS kind,
       coalesce(r.consumer, '') AS consumer, coalesce(r.experiment, '') AS experiment,
       {deployment_label()} AS deployment, r.cache_key, coalesce(c.source_request_id, h.source_request_id)
           AS source_request_id,
       coalesce(c.source_experiment, s.experiment, '') AS served_from,
       coalesce(c.differing_fields, h.differing_fields) AS differing_fields, r.target_model, r.draft_model,
       r.max_tokens, r.output_tokens, left(r.output_text, 200) AS output_preview, r.unknown_fields
FROM r LEFT JOIN c USING (request_id) LEFT JOIN h USING (request_id) LEFT JOIN s ON s.request_id = h.source_request_id
WHERE c.request_id IS NOT NULL OR {VIOLATION}
ORDER BY r.ts, r.request_id
"""


def _affected_sql(where: str, one_consumer: bool = True) -> str:
    """The affected requests `where` picks: `$consumer`'s, or every consumer's (`one_consumer` False), by consumer."""
    whose = "coalesce(r.consumer, '') = $consumer" if one_consumer else "TRUE"
    return f"""
SELECT r.request_id, r.ts, CASE WHEN h.contaminated THEN 'contaminated_hit' ELSE 'length_violation' END AS kind,
       coalesce(r.consumer, '') AS consumer, coalesce(r.experiment, '') AS experiment,
       {deployment_label()} AS deployment, r.cache_key, h.source_request_id,
       coalesce(s.experiment, '') AS served_from, h.differing_fields, r.target_model, r.draft_model,
       r.max_tokens, r.output_tokens, left(r.output_text, 200) AS output_preview, r.unknown_fields
FROM requests r LEFT JOIN hit_sources h USING (request_id) LEFT JOIN requests s ON s.request_id = h.source_request_id
WHERE {where} AND {whose} AND (h.contaminated OR {VIOLATION})
ORDER BY coalesce(r.consumer, ''), r.ts, r.request_id
"""


def _first_affected_ids_sql(where: str, limit: int) -> str:
    """The ids of `_affected_sql`'s first `limit` rows from the summaries (`where`: the filters over them, `c`):
    the first contaminated hits and the first violations, merged."""
    return f"""
WITH hits AS (
    SELECT c.request_id, c.ts FROM summary_impact_hits c WHERE {where} AND c.consumer = $consumer
    ORDER BY c.ts, c.request_id LIMIT {limit}
), violations AS (
    SELECT c.request_id, c.ts FROM summary_violations c WHERE {where} AND c.consumer = $consumer
    ORDER BY c.ts, c.request_id LIMIT {limit}
)
SELECT list(request_id), min(ts), max(ts) FROM (
    SELECT * FROM (SELECT * FROM hits UNION SELECT * FROM violations) ORDER BY ts, request_id LIMIT {limit})
"""


def affected_requests(store: Store, consumer: str | None, filters: Filters = NO_FILTERS,
                      limit: int | None = None) -> pd.DataFrame:
    """The requests for which `consumer` ('' for none logged; None: every consumer, one after the other) received a
    contaminated hit or an over-long output: what a customer notice lists. A row that is both is listed once, as a
    contaminated hit. `limit`: the first that many (a page shows those; the CSV holds them all). `unknown_fields`
    comes last: the fields each row's log left unknown (a LiteLLM hit's max_tokens), which the page says are
    unknown and the CSV leaves empty."""
    if consumer is None:
        if limit is not None:
            raise ValueError("a limit is for one consumer's page of rows")
        with store.read() as con:
            return ask(con, lambda where: _affected_sql(where, one_consumer=False), filters, {}).df()
    params = {"consumer": consumer}
    with store.read() as con:
        if limit is None:
            return ask(con, _affected_sql, filters, params).df()
        if not summary.ready(con):
            return ask(con, lambda where: f"{_affected_sql(where)} LIMIT {int(limit)}", filters, params).df()
        where, where_params = filters.named_where("c")
        # Only the first rows are joined with their verdicts and sources.
        chosen = chosen_rows(con, _first_affected_ids_sql(where, int(limit)), params | where_params)
        return execute(con, _chosen_affected_sql(), params | chosen).df()


def _affected_count_sql(where: str) -> str:
    """How many requests `_affected_sql` lists, from the summaries (`where`: the filters over them, `c`): the
    contaminated hits that are not also violations, plus the violations."""
    return f"""
SELECT (SELECT count(*) FROM summary_impact_hits c WHERE {where} AND c.consumer = $consumer AND c.violation IS NOT TRUE)
     + (SELECT count(*) FROM summary_violations c WHERE {where} AND c.consumer = $consumer)
"""


def affected_count(store: Store, consumer: str, filters: Filters = NO_FILTERS) -> int:
    """How many rows `affected_requests` lists for `consumer`."""
    params = {"consumer": consumer}
    with store.read() as con:
        if summary.ready(con):
            where, where_params = filters.named_where("c")
            cursor = execute(con, _affected_count_sql(where), params | where_params)
        else:
            cursor = ask(con, lambda where: f"SELECT count(*) FROM ({_affected_sql(where)})", filters, params)
        return int(cursor.fetchall()[0][0])


def affected_csv(store: Store, consumer: str | None, filters: Filters = NO_FILTERS, *, raw: bool = False) -> bytes:
    """The CSV a customer notice attaches: `affected_requests` (None: every consumer's) with `ts` in RFC 3339,
    written as the mismatch report is: its log text (an output's first characters, a consumer's name) can't run as
    a spreadsheet formula unless `raw`, and a carriage return in it can't split a row."""
    from specdec_core.analysis.report import report_csv

    return report_csv(affected_rows(store, consumer, filters), raw=raw)


def affected_rows(store: Store, consumer: str | None, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """`affected_csv`'s rows: `affected_requests` with `ts` in RFC 3339 and no `unknown_fields`."""
    frame = affected_requests(store, consumer, filters).drop(columns="unknown_fields")
    frame["ts"] = [rfc3339(pd.Timestamp(t).to_pydatetime()) for t in frame["ts"]]
    return frame
