"""Summary tables, kept up to date by every ingest: the dashboard's questions answered from
thousands of rows instead of millions.

- `summary_minute`: additive counts per UTC minute and (deployment, target, draft,
  temperature, cache_hit), with the token sums of every request (the metrics' counters) beside
  those of speculative misses (the acceptance rate), and per identity field the requests that mark it
  unknown and that set it (the logging gaps). Any filter is exact: whole minutes come from here, and
  the rows of the (at most two) minutes a time range cuts through come from
  `requests`, aggregated the same way (`named_minute_source`).
- `summary_keys`: one row per (deployment, cache_key, fingerprint); distinct counts
  and key collisions without a time range (`summary_shared_keys`: the keys' rows that may collide;
  `identity_aliases`: the partial identities that count as another of their key's, derived/aliases.py).
- `summary_lengths`, `summary_latency`: exact histograms (a count per distinct value)
  of output tokens and latency; quantiles without a time range come from these.
- `summary_contaminated`: the contaminated hits with the columns the report shows.
- `summary_outputs`: requests and hits per output text (64 bits of its MD5) and identity, for the
  red flags.
- `summary_request_keys`: one narrow row per request with a cache key: its time, labels, hit flag and
  DuckDB's 64-bit hashes of its key and identity. A time range's distinct keys, identities and collisions
  are counted over these integers instead of the rows' 64-character texts.
- `summary_request_outputs`: one narrow row per request: its time, labels, hit flag, and DuckDB's 64-bit
  hashes of its output text and of the identity fields that decide an output. A time range's red flag of
  identical outputs is counted over these instead of hashing the rows' output texts.
- `summary_audience`: requests, length violations and the sums behind an arm's means, per consumer and
  experiment arm (and the filters' labels): who received what (analysis/impact.py).
- `summary_impact_hits`: each contaminated hit with who received it, its arm, the arm of its source and its
  measures, so an arm's figures can be read without its contaminated hits.
- `summary_violations`: each request whose output overran its max_tokens, in time order, with the labels the
  filters read and its consumer: the Impact page's and the report's first violations and counts per consumer
  without reading every row's token counts.
- `summary_first_verdicts`: the hits first judged contaminated (derived/verdicts.py), counted per labels and
  differing fields: the monitoring counters read these few rows, not one row per hit ever judged.

A question with a time range that the histograms or distinct counts can't answer
goes to `requests`, as it would without summaries. `from_rows()` forces that path:
the tests hold every summary answer equal to the row answer.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime, timedelta, timezone
from typing import Any

import duckdb
import numpy as np

from specdec_core.contract import fields as contract
from specdec_core.derived import aliases
from specdec_core.derived.verdicts import build_first_verdict_counts
from specdec_core.store.schema import (
    READ_EDGES,
    READ_SUMMARIES,
    VERSION_SQL,
    current_version_sql,
)
from specdec_core.store.sql import deployment_label, named_params

NO_DRAFT = "none"
MINUTE = timedelta(minutes=1)
_ROWS_ONLY: ContextVar[bool] = ContextVar("specdec_rows_only", default=False)


def draft_label(alias: str = "r") -> str:
    return f"coalesce(nullif({alias}.draft_model, 'none'), '{NO_DRAFT}')"


_SPECULATIVE = f"NOT r.cache_hit AND r.draft_tokens > 0 AND {draft_label()} <> '{NO_DRAFT}'"

# The identity fields whose logging gaps (analysis/gaps.py) the minute summary counts: requests that mark the
# field unknown (`unknown_<field>`) and that set it (`set_<field>`). The shipped contract's, at import: a field a
# program adds later (fields.define) has no column, and its gaps are counted over the rows.
def gap_fields() -> tuple[str, ...]:
    """The current contract's identity fields a log can leave unset or unknown (a request always has a prompt
    and a target model)."""
    return tuple(f for f in contract.IDENTITY_FIELDS if f not in ("prompt", "target_model"))


GAP_FIELDS = gap_fields()
GAP_MEASURES = ",\n".join(f"count(*) FILTER (WHERE list_contains(r.unknown_fields, '{f}')) AS unknown_{f}, "
                          f"count(r.{f}) AS set_{f}" for f in GAP_FIELDS)

# A hit whose log left identity fields unknown: whether it is a first sight can't be told (hit_sources' first_sight
# is NULL for it, derived/hit_sources.py), so the first-sight evidence counts it apart.
def partial(alias: str | None = "r") -> str:
    """SQL: whether a request's log left fields unknown (`alias` None: the bare column): the judging gives such a
    hit no first-sight verdict (derived/hit_sources.py), and the summaries count it apart."""
    return f"len(coalesce({alias + '.' if alias else ''}unknown_fields, [])) > 0"


PARTIAL_HIT = f"r.cache_hit AND {partial()}"

# The minute summary's columns as aggregates over `requests r LEFT JOIN hit_sources h`.
MINUTE_DIMENSIONS = f"""
time_bucket(INTERVAL 1 minute, r.ts) AS minute, {deployment_label('r')} AS deployment, r.target_model,
{draft_label()} AS draft_model, r.temperature, r.cache_hit"""
MINUTE_MEASURES = f"""
count(*) AS requests,
count(*) FILTER (WHERE h.contaminated) AS contaminated,
count(*) FILTER (WHERE h.first_sight) AS first_sight,
count(*) FILTER (WHERE r.output_tokens > r.max_tokens) AS violations,
min(r.ts) AS first_ts, max(r.ts) AS last_ts,
min(r.ts) FILTER (WHERE h.contaminated) AS first_contaminated,
max(r.ts) FILTER (WHERE h.contaminated) AS last_contaminated,
count(*) FILTER (WHERE {_SPECULATIVE}) AS decoded_requests,
sum(r.draft_tokens) FILTER (WHERE {_SPECULATIVE}) AS draft_tokens,
sum(r.accepted_tokens) FILTER (WHERE {_SPECULATIVE}) AS accepted_tokens,
sum(r.draft_tokens / nullif(r.num_speculative_tokens, 0)) FILTER (WHERE {_SPECULATIVE}) AS steps,
sum(r.draft_tokens) AS logged_draft_tokens, sum(r.accepted_tokens) AS logged_accepted_tokens,
{GAP_MEASURES},
count(*) FILTER (WHERE {PARTIAL_HIT}) AS partial_hits"""
# A column is added last (version 15 added partial_hits), where a store's ALTER puts it: a time range's cut minutes
# are read beside the stored ones by UNION ALL, column by column.

# How two rows of one minute and dimensions combine into one (derived/incremental.py adds a batch's rows to a
# minute's this way): every measure above, by the aggregate that merges it.
MINUTE_MERGE = {"requests": "sum", "contaminated": "sum", "first_sight": "sum", "partial_hits": "sum",
                "violations": "sum", "first_ts": "min", "last_ts": "max", "first_contaminated": "min", "last_contaminated": "max",
                "decoded_requests": "sum", "draft_tokens": "sum", "accepted_tokens": "sum", "steps": "sum",
                "logged_draft_tokens": "sum", "logged_accepted_tokens": "sum",
                **{f"{what}_{f}": "sum" for f in GAP_FIELDS for what in ("unknown", "set")}}

# Each summary's rows over the requests `where` picks (a condition over `requests r`): all of them (TRUE) for a
# full build, those a batch touched for an update (derived/incremental.py). `hit_sources` names the verdicts read:
# the stored ones, or an update's just judged (a relation with hit_sources' columns); `rows`, where the requests
# are read from: `requests`, or a relation with its columns (an update's copy of its batch's rows).
def minute_sql(where: str = "TRUE", *, hit_sources: str = "hit_sources", rows: str = "requests") -> str:
    return f"""SELECT {MINUTE_DIMENSIONS}, {MINUTE_MEASURES}
FROM {rows} r LEFT JOIN {hit_sources} h USING (request_id) WHERE {where} GROUP BY ALL"""


def pairs_sql(where: str = "TRUE") -> str:
    return f"""SELECT {deployment_label('r')} AS deployment, r.cache_key, r.fingerprint,
       any_value(r.target_model) AS target_model, any_value({draft_label()}) AS draft_model,
       count(*) AS requests, count(*) FILTER (WHERE r.cache_hit) AS hits,
       count(*) FILTER (WHERE h.first_sight) AS first_sight, count(*) FILTER (WHERE {PARTIAL_HIT}) AS partial_hits,
       min(r.ts) AS first_seen, max(r.ts) AS last_seen
FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE {where} GROUP BY 1, 2, 3"""


def lengths_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    return f"""SELECT {deployment_label('r')} AS deployment, r.target_model, {draft_label()} AS draft_model,
       r.max_tokens, r.output_tokens AS value, count(*) AS n
FROM {rows} r WHERE {where} GROUP BY ALL"""


def latency_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    return f"""SELECT {deployment_label('r')} AS deployment, r.target_model, {draft_label()} AS draft_model,
       r.cache_hit, r.latency_ms AS value, count(*) AS n
FROM {rows} r WHERE r.latency_ms IS NOT NULL AND {where} GROUP BY ALL"""


def contaminated_sql(where: str = "TRUE", *, hit_sources: str = "hit_sources") -> str:
    return f"""SELECT r.request_id, r.ts, {deployment_label('r')} AS deployment, r.cache_key,
       h.source_request_id, h.source_ts, h.differing_fields, h.fingerprint_mismatch, r.target_model,
       {draft_label()} AS draft_model, r.temperature, r.max_tokens, r.seed::VARCHAR AS seed,
       r.tokenizer_version, r.output_tokens, left(r.output_text, 120) AS output_preview
FROM requests r JOIN {hit_sources} h USING (request_id) WHERE h.contaminated AND {where}"""


# Requests per consumer and arm with the labels the filters read; a violation's times; the sums an arm's means and
# acceptance rate divide (acceptance over rows that logged both token counts).
BOTH_TOKENS = "r.draft_tokens IS NOT NULL AND r.accepted_tokens IS NOT NULL"


def audience_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    return f"""SELECT {deployment_label('r')} AS deployment, r.target_model, {draft_label()} AS draft_model,
       coalesce(r.consumer, '') AS consumer, coalesce(r.experiment, '') AS experiment,
       count(*) AS requests, count(*) FILTER (WHERE r.output_tokens > r.max_tokens) AS violations,
       min(r.ts) FILTER (WHERE r.output_tokens > r.max_tokens) AS first_violation,
       max(r.ts) FILTER (WHERE r.output_tokens > r.max_tokens) AS last_violation,
       sum(r.output_tokens)::HUGEINT AS output_tokens, count(r.latency_ms) AS latency_n,
       sum(r.latency_ms) AS latency_sum,
       sum(r.draft_tokens) FILTER (WHERE {BOTH_TOKENS})::HUGEINT AS draft_tokens,
       sum(r.accepted_tokens) FILTER (WHERE {BOTH_TOKENS})::HUGEINT AS accepted_tokens
FROM {rows} r WHERE {where} GROUP BY ALL"""


AUDIENCE_KEYS = ("deployment", "target_model", "draft_model", "consumer", "experiment")
AUDIENCE_MERGE = {"requests": "sum", "violations": "sum", "first_violation": "min", "last_violation": "max",
                  "output_tokens": "sum", "latency_n": "sum", "latency_sum": "sum", "draft_tokens": "sum",
                  "accepted_tokens": "sum"}


def impact_hits_sql(where: str = "TRUE", *, hit_sources: str = "hit_sources") -> str:
    """Each contaminated hit: who received it, its arm and its source's arm ('' where the source is not in the log).

    The sources' arms are read for the sources alone: joined to every request, a 20M-row lake's rebuild built
    a hash table of all of them and ran out of its writer's 1 GB."""
    sources = f"SELECT source_request_id FROM {hit_sources} WHERE contaminated"
    return f"""SELECT r.request_id, r.ts, {deployment_label('r')} AS deployment, r.target_model,
       {draft_label()} AS draft_model, coalesce(r.consumer, '') AS consumer,
       coalesce(r.experiment, '') AS experiment, coalesce(s.experiment, '') AS source_experiment,
       r.output_tokens > r.max_tokens AS violation, r.output_tokens, r.latency_ms,
       CASE WHEN {BOTH_TOKENS} THEN r.draft_tokens END AS draft_tokens,
       CASE WHEN {BOTH_TOKENS} THEN r.accepted_tokens END AS accepted_tokens
FROM requests r JOIN {hit_sources} h USING (request_id)
LEFT JOIN (SELECT request_id, experiment FROM requests WHERE request_id IN ({sources})) s
       ON s.request_id = h.source_request_id
WHERE h.contaminated AND {where}"""


def violations_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    """Each request of `where` whose output overran its max_tokens, as summary_violations holds it."""
    return f"""SELECT r.request_id, r.ts, {deployment_label('r')} AS deployment, r.target_model,
       {draft_label()} AS draft_model, coalesce(r.consumer, '') AS consumer
FROM {rows} r WHERE r.output_tokens > r.max_tokens AND {where}"""


VIOLATIONS_BUILD_SQL = f"CREATE OR REPLACE TABLE summary_violations AS {violations_sql()} ORDER BY r.ts, r.request_id"


def shared_keys_sql(where: str = "TRUE") -> str:
    """The pairs of keys that more than one fingerprint used (`where` over summary_keys): those more than one
    identity used, and those whose only other fingerprints are aliases (derived/aliases.py). A filter only removes
    pairs, so a key shared under any filter is among these: collisions are counted over this small table."""
    return f"""SELECT * FROM summary_keys
WHERE key_id IN (SELECT key_id FROM summary_keys WHERE {where} GROUP BY key_id HAVING count(*) > 1)"""


def outputs_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    """Each output text per identity and labels, by 64 bits of the text's MD5 (stable across DuckDB versions, as
    stored values must be; taken once per group, not per request): the identical-outputs red flag without
    hashing every output text of the log. A batch appends its own rows, so one (text, identity, labels) may
    have several: read it summed."""
    return f"""SELECT md5_number_lower(output_text) AS out_hash, * EXCLUDE (output_text) FROM (
    SELECT r.output_text, r.fingerprint, {deployment_label('r')} AS deployment, r.target_model,
           {draft_label()} AS draft_model, count(*) AS requests, count(*) FILTER (WHERE r.cache_hit) AS hits
    FROM {rows} r WHERE {where} GROUP BY ALL)"""


def key_hash(deployment: str, text: str) -> str:
    """The SQL of a key's (or an identity's) stored hash, from its deployment ('' for none) and its text."""
    return f"hash({deployment}, {text})"


def request_keys_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    """The rows of the requests `where` picks that have a cache key, as summary_request_keys holds them: labels as
    the filters read them (Filters.where applies to this table as to `requests r`), the key and identity (each
    with its deployment) as DuckDB's 64-bit hash, as the time-range counts used to hash them from the text at
    every question. Exact but for a hash collision among a range's keys (about one chance in 30 million for a
    million keys)."""
    return f"""SELECT r.ts, {deployment_label('r')} AS deployment, r.target_model,
       {draft_label()} AS draft_model, r.cache_hit,
       {key_hash(deployment_label("r"), "r.cache_key")} AS key_hash,
       {key_hash(deployment_label("r"), "r.fingerprint")} AS identity_hash
FROM {rows} r WHERE r.cache_key IS NOT NULL AND {where}"""


def output_identity_columns(alias: str = "i") -> str:
    """The identity columns (of `identities` as `alias`) that decide an output: all of them, but the draft's
    only for sampled requests (greedy speculative decoding is lossless)."""
    return ", ".join(f"CASE WHEN NOT {alias}.greedy THEN {alias}.{f.name} END" if f.lossless_when_greedy
                     else f"{alias}.{f.name}" for f in contract.FIELDS if f.identity)


def request_outputs_sql(where: str = "TRUE", *, rows: str = "requests") -> str:
    """Every request of `where` as summary_request_outputs holds it: labels as the filters read them, the output
    text and the identity fields that decide it as DuckDB's 64-bit hashes (the same hash as the row answer's). The
    identity's hash is taken once per identity, not per request (1M requests: 0.21 s against 0.30 s)."""
    return f"""SELECT r.ts, {deployment_label('r')} AS deployment, r.target_model,
       {draft_label()} AS draft_model, r.cache_hit, hash(r.output_text) AS out_hash, i.out_identity
FROM {rows} r JOIN (SELECT i.fingerprint, hash(({output_identity_columns()})) AS out_identity FROM identities i) i
     USING (fingerprint) WHERE {where}"""


# Batches append rows a group already has; once the table has grown past twice its size when last one row per
# group (plus OUTPUTS_SLACK rows), it is folded again: each row is folded a bounded number of times.
OUTPUTS_SLACK = 100_000
# meta is rewritten by DELETE and INSERT: a DuckLake table has no key for INSERT OR REPLACE to go by.
def folded_sql(table: str, key: str) -> str:
    """Record in meta under `key` how many rows `table` holds just after being folded (or built)."""
    return f"DELETE FROM meta WHERE key = '{key}'; INSERT INTO meta SELECT '{key}', count(*)::VARCHAR FROM {table}"


OUTPUTS_COMPACTED_SQL = folded_sql("summary_outputs", "outputs_compacted")
COMPACT_OUTPUTS_SQL = ("CREATE OR REPLACE TABLE summary_outputs AS SELECT * EXCLUDE (requests, hits), "
                       "sum(requests)::BIGINT AS requests, sum(hits)::BIGINT AS hits FROM summary_outputs GROUP BY ALL")


def build_sql() -> str:
    """Every summary table built from `requests` and `hit_sources`: the full rebuild."""
    return f"""
CREATE OR REPLACE TABLE summary_minute AS {minute_sql()} ORDER BY minute;

CREATE OR REPLACE TABLE summary_keys AS
-- key_id and fp_id number the keys and fingerprints densely: distinct counts over integers, not 64-char text.
WITH pairs AS ({pairs_sql()}), keys AS (
    SELECT deployment, cache_key, row_number() OVER () AS key_id FROM (SELECT DISTINCT deployment, cache_key FROM pairs)
), fps AS (
    SELECT fingerprint, row_number() OVER () AS fp_id FROM (SELECT DISTINCT fingerprint FROM pairs)
)
SELECT pairs.* EXCLUDE (partial_hits), keys.key_id, fps.fp_id, pairs.partial_hits  -- added last, as in MINUTE_MEASURES
FROM pairs JOIN keys USING (deployment, cache_key) JOIN fps USING (fingerprint);

CREATE OR REPLACE TABLE summary_shared_keys AS {shared_keys_sql()};
{aliases.BUILD_SQL};
CREATE OR REPLACE TABLE summary_lengths AS {lengths_sql()};
CREATE OR REPLACE TABLE summary_latency AS {latency_sql()};
CREATE OR REPLACE TABLE summary_contaminated AS {contaminated_sql()} ORDER BY r.ts, r.request_id;
CREATE OR REPLACE TABLE summary_outputs AS {outputs_sql()};
CREATE OR REPLACE TABLE summary_audience AS {audience_sql()};
CREATE OR REPLACE TABLE summary_impact_hits AS {impact_hits_sql()} ORDER BY r.ts, r.request_id;
{VIOLATIONS_BUILD_SQL};
-- In time order: a range's scan skips the row groups outside it.
CREATE OR REPLACE TABLE summary_request_keys AS {request_keys_sql()} ORDER BY r.ts;
CREATE OR REPLACE TABLE summary_request_outputs AS {request_outputs_sql()} ORDER BY r.ts;
{OUTPUTS_COMPACTED_SQL};
{VERSION_SQL};
"""


def build_summaries(con: duckdb.DuckDBPyConnection) -> None:
    """Rebuild every summary table from `requests` and `hit_sources` (inside the ingest's write), and the
    counts of the first verdicts from their record, which a rebuild keeps (derived/verdicts.py)."""
    con.execute(build_sql())
    build_first_verdict_counts(con)


@contextmanager
def from_rows() -> Iterator[None]:
    """Answer every question from `requests` within this block (the reference the tests compare with)."""
    token = _ROWS_ONLY.set(True)
    try:
        yield
    finally:
        _ROWS_ONLY.reset(token)


def ready(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether this store's summaries exist, match this code and may be used."""
    if _ROWS_ONLY.get():
        return False
    told = READ_SUMMARIES.get()
    if told is not None and told[0] is con:  # found when the read began
        return told[1]
    rows = con.execute(current_version_sql()).fetchall()
    return bool(rows) and rows[0][0]


def named_dimension_where(filters: Any, alias: str = "c") -> tuple[str, dict[str, Any]]:
    """The filters other than time over a summary table, bound by name (`$dim_...`)."""
    clauses, params = ["TRUE"], {}
    for values, column in ((filters.deployments, "deployment"), (filters.target_models, "target_model"),
                           (filters.draft_models, "draft_model")):
        if values:
            clauses.append(f"list_contains($dim_{column}, {alias}.{column})")
            params[f"dim_{column}"] = list(values)
    return " AND ".join(clauses), params


def _utc(ts: datetime | None) -> datetime | None:
    """A naive time is UTC, as the store's session reads it; aware ones are compared as they are."""
    return ts.replace(tzinfo=timezone.utc) if ts is not None and ts.tzinfo is None else ts


def _floor_minute(ts: datetime) -> datetime:
    return ts.replace(second=0, microsecond=0)


def _ceil_minute(ts: datetime) -> datetime:
    floor = _floor_minute(ts)
    return floor if floor == ts else floor + MINUTE


def named_minute_source(filters: Any, row_where: tuple[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """A relation shaped like `summary_minute` holding exactly the filtered requests, bound by name.

    Whole minutes inside [start, end] come from the summary; the rows of a minute the
    range cuts through are aggregated from `requests` (`row_where` is the full filter
    over `requests r`, time included, as `Filters.named_where()` gives it).
    """
    dims, params = named_dimension_where(filters)
    start, end = _utc(filters.start), _utc(filters.end)
    # Minutes wholly inside: [lo, hi). `end` is inclusive, so a row at `end` lies before end + 1 µs.
    end_excl = None if end is None else end + timedelta(microseconds=1)
    lo = None if start is None else _ceil_minute(start)
    hi = None if end_excl is None else _floor_minute(end_excl)
    whole = [dims]
    if lo is not None:
        whole.append("c.minute >= $minute_lo")
        params["minute_lo"] = lo
    if hi is not None:
        whole.append("c.minute < $minute_hi")
        params["minute_hi"] = hi
    parts = [f"SELECT * FROM summary_minute c WHERE {' AND '.join(whole)}"]
    edges = []
    if lo is not None and hi is not None and lo >= hi:
        edges = [(start, end_excl)]  # no whole minute: every row comes from `requests`
    else:
        if lo is not None and start < lo:
            edges.append((start, lo))
        if hi is not None and hi < end_excl:
            edges.append((hi, end_excl))
    if edges:
        where, row_params = row_where
        spans = " OR ".join(f"(r.ts >= $minute_edge{i}_from AND r.ts < $minute_edge{i}_to)" for i in range(len(edges)))
        edge_sql = (f"SELECT {MINUTE_DIMENSIONS}, {MINUTE_MEASURES} "
                    f"FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE {where} AND ({spans}) GROUP BY ALL")
        edge_params = dict(row_params)
        for i, (lower, upper) in enumerate(edges):
            edge_params[f"minute_edge{i}_from"], edge_params[f"minute_edge{i}_to"] = lower, upper
        # Kept, every measure is computed: the cut minutes' verdicts are then looked up by their ids, not
        # hit_sources hashed whole (20M rows: 1.8 s cold against 3.2 s; inline, a question's few measures
        # gain less than the second read of the rows costs).
        rows = f"SELECT * FROM requests r WHERE {where} AND ({spans})"
        kept = _kept_edges(f"SELECT {MINUTE_DIMENSIONS}, {MINUTE_MEASURES} FROM ({rows}) r LEFT JOIN (SELECT * FROM "
                           f"hit_sources WHERE request_id IN (SELECT request_id FROM ({rows}))) h USING (request_id) "
                           "GROUP BY ALL", edge_params)
        parts.append(f"SELECT * FROM {kept}" if kept else edge_sql)
        params |= {} if kept else edge_params
    return "(" + " UNION ALL ".join(parts) + ")", params


def _kept_edges(sql: str, params: dict[str, Any]) -> str | None:
    """The table holding `sql`'s rows, made once per state of a DuckDB file being read (schema.READ_EDGES);
    None elsewhere (a write, a lake). Every question of a page with a time range aggregates the same cut
    minutes from the rows: at 20M rows not in time order, 0.6-1.9 s each, a dozen times a page."""
    told = READ_EDGES.get()
    if told is None:
        return None
    con, kept, lock = told
    named = named_params(sql, params)
    # An instant keyed in one zone: the sidebar's times and the summaries' own differ in their UTC object
    # (pytz's, datetime's), and each page aggregated the same minutes again (1.1 s at 20M rows).
    key = (sql, tuple(sorted((k, repr(_utc(v).astimezone(timezone.utc) if isinstance(v, datetime) else v))
                             for k, v in named.items())))
    with lock:
        if key not in kept:
            name = f"memory.main.specdec_edges_{len(kept)}"
            con.execute(f"CREATE TABLE {name} AS {sql}", named)
            kept[key] = name
        return kept[key]


def histogram_quantiles(con: duckdb.DuckDBPyConnection, source: str, params: list[Any] | dict[str, Any],
                        quantiles: dict[str, float], count_above_key: bool = False) -> dict[str, list[Any]]:
    """Box statistics per `key` of a histogram relation (`key`, `value`, `n`), as the rows would give them.

    Returns the columns `key`, `total`, `min`, `max`, `mean`, one per named quantile and, with
    `count_above_key`, `above_key`: how many values exceed their (numeric) key. quantile_cont
    interpolates between the values at 0-based positions floor(q(N-1)) and ceil(q(N-1)) of the
    sorted column; the value at position i is the first whose running count exceeds i. Worked
    out here over the few thousand histogram rows: the same in SQL took longer to plan than this
    takes to run.
    """
    arrays = con.execute(f"SELECT key, value, sum(n)::BIGINT AS n FROM {source} GROUP BY ALL ORDER BY key, value",
                         params).fetchnumpy()
    keys, values, counts = arrays["key"], arrays["value"], arrays["n"]
    columns = ["key", "total", "min", "max", "mean", *quantiles, *(["above_key"] if count_above_key else [])]
    rows: list[list[Any]] = []
    # A null key (max_tokens a log left unknown) is a group of its own, last: a masked entry compares as masked,
    # and its rows went into the group before them.
    null = np.ma.getmaskarray(keys)
    filled = np.ma.getdata(keys)
    changed = ((filled[1:] != filled[:-1]) & ~null[1:] & ~null[:-1]) | (null[1:] != null[:-1])
    edges = [0, *(np.flatnonzero(changed) + 1), len(keys)]
    for start, end in zip(edges[:-1], edges[1:], strict=True):
        if start == end:
            continue
        v, n = values[start:end], counts[start:end]
        upto = np.cumsum(n)
        total = int(upto[-1])
        key = None if null[start] else filled[start]
        row = [key, total, v[0], v[-1], float(np.dot(v.astype(np.float64), n)) / total]
        for q in quantiles.values():
            pos = q * (total - 1)
            low = float(v[np.searchsorted(upto, math.floor(pos), side="right")])
            high = float(v[np.searchsorted(upto, math.ceil(pos), side="right")])
            row.append(low + (pos - math.floor(pos)) * (high - low))
        if count_above_key:
            row.append(0 if key is None else int(n[v > key].sum()))
        rows.append(row)
    return {name: [row[i] for row in rows] for i, name in enumerate(columns)}
