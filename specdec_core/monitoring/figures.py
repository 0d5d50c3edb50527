"""The store's figures as the metrics contract names them (shared/metrics.md): the one place they are read.

Every figure comes from the tables the dashboard and `specdec stats` read (the summaries, or, where a store
has none yet, the same summaries' SQL over the rows), so a scrape and the Overview agree for the same store.
Label values come from the logs, so each label keeps its `top` values by request volume and folds the rest
into `"other"`: a log with a million deployment names yields at most `top + 1` deployments here, and the
folding happens in DuckDB, never in Python.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import duckdb

from specdec_core.store import summaries as summary
from specdec_core.store.connection import Store
from specdec_core.store.sql import literal
from specdec_core.store.verdicts import FIRST_VERDICT_COUNTS_SQL

OTHER = "other"
DEFAULT_TOP = 50

Row = tuple[Any, ...]


@dataclass(frozen=True)
class Figures:
    """Each metric's rows: its label values in the contract's order, then its value(s)."""

    requests: tuple[Row, ...]  # deployment, target_model, draft_model, cache_hit ("true"/"false"), count
    contaminated_first: tuple[Row, ...]  # deployment, target_model, draft_model, hits first judged contaminated
    contaminated_now: tuple[Row, ...]  # deployment, target_model, draft_model, hits contaminated now
    contaminated_fields: tuple[Row, ...]  # deployment, field, hits (first verdicts)
    length_violations: tuple[Row, ...]  # deployment, target_model, count
    tokens: tuple[Row, ...]  # deployment, target_model, draft_model, sum of draft_tokens, of accepted_tokens
    keys: tuple[Row, ...]  # deployment, distinct cache keys, distinct identities, keys shared by identities
    newest: tuple[Row, ...]  # deployment, ts of the newest request (Unix seconds)
    replays: tuple[Row, ...]  # classification, count
    quarantined: int
    folded: tuple[Row, ...]  # label, how many distinct values were folded into "other"


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}


def _text_list(values: list[str]) -> str:
    """`values` as a SQL list of texts. Written into the SQL rather than bound: DuckDB's Python client imports
    pandas at the first value a process binds (0.5-0.9 s), which was most of a restarted exporter's first
    scrape. A log's NUL (which ends a literal for DuckDB's parser) is spelled chr(0)."""
    return "[" + ", ".join(" || chr(0) || ".join(literal(part) for part in v.split("\0")) for v in values) + "]::VARCHAR[]"


def _fold(column: str, values: list[str]) -> str:
    return f"CASE WHEN list_contains({_text_list(values)}, {column}) THEN {column} ELSE '{OTHER}' END"


# The three labels' values with the most requests; ties go to the name that sorts first, so every reader of
# one store keeps the same ones (a restarted exporter exports the same series).
TOP_VALUES_SQL = "SELECT {column} FROM {minute} GROUP BY 1 ORDER BY sum(requests) DESC, 1 LIMIT {top}"
DISTINCT_VALUES_SQL = "SELECT count(DISTINCT {column}) FROM {minute}"

# The contract's token sums (every accepted record's draft_tokens and accepted_tokens) are the minute
# summary's logged sums, not its speculative ones (those are the Overview's acceptance rate).
REQUESTS_SQL = """SELECT {dep}, {target}, {draft}, CASE WHEN cache_hit THEN 'true' ELSE 'false' END,
       sum(requests)::BIGINT, sum(violations)::BIGINT, max(last_ts), sum(contaminated)::BIGINT,
       coalesce(sum(logged_draft_tokens), 0)::BIGINT, coalesce(sum(logged_accepted_tokens), 0)::BIGINT
FROM {minute} GROUP BY ALL"""

# Hits as first judged contaminated (store/verdicts.py), per label set, from {verdicts}: their counts per
# labels and field list (summary_first_verdicts, or the same counted over the rows).
CONTAMINATED_SQL = "SELECT {dep}, {target}, {draft}, sum(hits)::BIGINT FROM {verdicts} GROUP BY ALL"
# Split after counting: a few distinct field lists, however many hits share them.
CONTAMINATED_FIELDS_SQL = """SELECT {dep}, field, sum(hits)::BIGINT FROM (
    SELECT deployment, unnest(string_split(differing_fields, ';')) AS field, hits FROM {verdicts})
WHERE field <> '' GROUP BY ALL"""

# Keys, identities and collisions per deployment, as the Overview's headline counts them for one deployment
# (analysis/overview.py KEY_COUNTS_WHOLE_SQL); a folded deployment's counts add up, keys being per deployment.
KEYS_SUMMARY_SQL = """WITH k AS (
    SELECT deployment, count(DISTINCT key_id) AS keys, count(DISTINCT fp_id) AS identities
    FROM summary_keys GROUP BY 1
), c AS (
    SELECT deployment, count(*) AS collisions FROM (
        SELECT deployment, key_id FROM summary_shared_keys GROUP BY ALL HAVING count(*) > 1) GROUP BY 1
)
SELECT {dep}, sum(keys)::BIGINT, sum(identities)::BIGINT, coalesce(sum(collisions), 0)::BIGINT
FROM k LEFT JOIN c USING (deployment) GROUP BY ALL"""
KEYS_ROWS_SQL = """WITH p AS (
    SELECT coalesce(r.deployment, '') AS deployment, r.cache_key, r.fingerprint FROM requests r
    WHERE r.cache_key IS NOT NULL GROUP BY ALL
), per_key AS (SELECT deployment, cache_key, count(*) AS n FROM p GROUP BY ALL),
k AS (
    SELECT deployment, count(*) AS keys, count(*) FILTER (WHERE n > 1) AS collisions FROM per_key GROUP BY 1
), i AS (SELECT deployment, count(DISTINCT fingerprint) AS identities FROM p GROUP BY 1)
SELECT {dep}, sum(keys)::BIGINT, sum(identities)::BIGINT, sum(collisions)::BIGINT
FROM k JOIN i USING (deployment) GROUP BY ALL"""


def read_figures(store: Store, top: int = DEFAULT_TOP) -> Figures:
    """Every metric's figures for `store` as it is now, each label folded to its `top` values plus "other".

    Read from the summaries alone (a few rows per minute and label set, per key, per first-verdict label
    set), so a first read costs about what a later one does, whatever the number of requests stored.
    """
    if top < 1:
        raise ValueError(f"top: expected a number >= 1, got {top}")
    with store.read() as con:
        return _read(con, top)


def _verdicts(tables: set[str], ready: bool) -> str:
    """The first verdicts counted per labels and field list: the summary, or (no summaries: the row path) the
    same counted over their record; a store none of whose ingests has recorded them yet counts its current
    verdicts, which its next ingest records as first verdicts."""
    if ready:
        return "summary_first_verdicts"
    source = "contaminated_first_verdicts" if "contaminated_first_verdicts" in tables else (
        f"({summary.over(summary.CONTAMINATED_SQL, 'TRUE')})")
    return f"({FIRST_VERDICT_COUNTS_SQL.format(verdicts=source)})"


def _read(con: duckdb.DuckDBPyConnection, top: int) -> Figures:
    quarantined = con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
    replays = tuple(con.execute("SELECT classification, count(*) FROM replays GROUP BY 1 ORDER BY 1").fetchall())
    ready = summary.ready(con)
    if not ready and not con.execute("SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)").fetchall()[0][0]:
        return Figures((), (), (), (), (), (), (), (), replays, quarantined, ())
    minute = "summary_minute" if ready else f"({summary.over(summary.MINUTE_SQL, 'TRUE')})"

    tops: dict[str, list[str]] = {}
    folded = []
    for label in ("deployment", "target_model", "draft_model"):
        tops[label] = [r[0] for r in con.execute(TOP_VALUES_SQL.format(column=label, minute=minute,
                                                                       top=int(top))).fetchall()]
        distinct = con.execute(DISTINCT_VALUES_SQL.format(column=label, minute=minute)).fetchall()[0][0]
        folded.append((label, max(0, distinct - len(tops[label]))))
    names = {"dep": _fold("deployment", tops["deployment"]), "target": _fold("target_model", tops["target_model"]),
             "draft": _fold("draft_model", tops["draft_model"]), "minute": minute,
             "verdicts": _verdicts(_tables(con), ready)}

    def rows(sql: str) -> list[Row]:
        return con.execute(sql.format(**names)).fetchall()

    per_labels = rows(REQUESTS_SQL)
    requests = tuple(r[:5] for r in per_labels)
    violations: dict[tuple[str, str], int] = {}
    newest: dict[str, Any] = {}
    contaminated_now: dict[Row, int] = {}  # as the headline counts them: the minute summary's
    tokens: dict[Row, tuple[int, int]] = {}
    for dep, target, draft, _hit, _n, v, last, c, drafted, accepted in per_labels:
        combo = (dep, target, draft)
        contaminated_now[combo] = contaminated_now.get(combo, 0) + c
        before = tokens.get(combo, (0, 0))
        tokens[combo] = (before[0] + drafted, before[1] + accepted)
        violations[(dep, target)] = violations.get((dep, target), 0) + v
        newest[dep] = last if dep not in newest or last > newest[dep] else newest[dep]
    keys_sql = KEYS_SUMMARY_SQL if ready else KEYS_ROWS_SQL
    return Figures(
        requests=requests,
        contaminated_first=tuple(rows(CONTAMINATED_SQL)),
        contaminated_now=tuple((*k, n) for k, n in contaminated_now.items() if n),
        contaminated_fields=tuple(rows(CONTAMINATED_FIELDS_SQL)),
        length_violations=tuple((d, t, n) for (d, t), n in sorted(violations.items())),
        tokens=tuple((*k, *sums) for k, sums in sorted(tokens.items())),
        keys=tuple(rows(keys_sql)),
        newest=tuple((d, ts.timestamp()) for d, ts in sorted(newest.items())),
        replays=replays,
        quarantined=quarantined,
        folded=tuple(folded),
    )
