"""The store's figures as the metrics contract names them (shared/metrics.md): the one place they are read.

Every figure comes from the tables the dashboard and `specdec stats` read (the summaries, or, where a store
has none yet, the same summaries' SQL over the rows), so a scrape and the Overview agree for the same store.
Label values come from the logs, so every one is bounded: each label keeps its `top` values by request volume
and folds the rest into `"other"`, a value longer than MAX_LABEL_CHARS is cut and marked with a digest of the
whole, and at most `combinations` (deployment, target_model, draft_model) sets are kept, the rest of a
deployment's sets folding into (deployment, "other", "other"). A log with a million names, or names of a
megabyte, yields a scrape of a few MB; the folding happens in DuckDB, never in Python.

The choice of what is kept (`Folds`) is made at the first read and only grows, while there is room, at later
ones: a value or set once folded stays folded, so every counter of a running exporter only grows.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import duckdb

from specdec_core.derived import summaries as summary
from specdec_core.derived.aliases import resolved_keys, resolved_rows
from specdec_core.derived.verdicts import first_verdict_counts_sql
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label, has_table, literal

OTHER = "other"
DEFAULT_TOP = 50
DEFAULT_COMBINATIONS = 1000
LABELS = ("deployment", "target_model", "draft_model")
# A longer label value is cut to its first CUT_CHARS characters, "~" and the first DIGEST_CHARS hex digits of
# the SHA-256 of the whole value (UTF-8): MAX_LABEL_CHARS in all, distinct for distinct values.
MAX_LABEL_CHARS = 128
DIGEST_CHARS = 12
CUT_CHARS = MAX_LABEL_CHARS - DIGEST_CHARS - 1

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
    folded: tuple[Row, ...]  # label ("combination" too), how many distinct values were folded into "other"
    folds: Folds | None = None  # what this read kept: the next read of the same exporter starts from it


@dataclass(frozen=True)
class Folds:
    """The label values (as exported: cut) and label sets a read kept as themselves; everything else is "other".

    A later read keeps all of these and adds new ones only while there is room (`top` values a label,
    `combinations` sets), so what was folded once stays folded and no exported counter falls."""

    deployment: tuple[str, ...] = ()
    target_model: tuple[str, ...] = ()
    draft_model: tuple[str, ...] = ()
    combinations: tuple[str, ...] = ()  # each kept set's key: the SHA-256 of its labels (specdec_sets.k)


def _text_list(values: list[str]) -> str:
    """`values` as a SQL list of texts. Written into the SQL rather than bound: DuckDB's Python client imports
    pandas at the first value a process binds (0.5-0.9 s), which was most of a restarted exporter's first
    scrape. A log's NUL (which ends a literal for DuckDB's parser) is spelled chr(0)."""
    return "[" + ", ".join(" || chr(0) || ".join(literal(part) for part in v.split("\0")) for v in values) + "]::VARCHAR[]"


def cut_label(column: str) -> str:
    """SQL: the label value of `column`, at most MAX_LABEL_CHARS characters (monitoring.cut_value in Python)."""
    return (f"CASE WHEN length({column}) <= {MAX_LABEL_CHARS} THEN {column} ELSE left({column}, {CUT_CHARS}) || "
            f"'~' || left(sha256({column}), {DIGEST_CHARS}) END")


def cut_value(value: str) -> str:
    """The label value exported for `value` (what cut_label computes in DuckDB)."""
    if len(value) <= MAX_LABEL_CHARS:
        return value
    return f"{value[:CUT_CHARS]}~{hashlib.sha256(value.encode()).hexdigest()[:DIGEST_CHARS]}"


# Each read works on temporary tables of this read's connection (gone when it closes). A label value is read
# from the summaries in as few passes as possible: a log's names may be megabytes, and every pass over them
# costs. A value is known by its DuckDB hash and its first PREFIX_CHARS characters (the whole of a value
# that is exported uncut), which sorts and joins cheaply whatever its length.
PREFIX_CHARS = MAX_LABEL_CHARS + 1
_KEY = "hash({c}) AS {h}, left({c}, " + str(PREFIX_CHARS) + ") AS {p}"

# Every value of each label: its key, its exported (cut) value and its requests.
VALUES_SQL = """CREATE OR REPLACE TEMP TABLE specdec_values AS
SELECT label, h, p, {cut} AS c, n FROM ({per_label})"""
VALUES_PER_LABEL_SQL = ("SELECT '{label}' AS label, " + _KEY.format(c="{label}", h="h", p="p") +
                        ", min({label}) AS v, sum(requests) AS n FROM {minute} GROUP BY 2, 3")
# A label's values with the most requests that are not kept yet, as many as there is room for; ties go to the
# name that sorts first, so every reader of one store keeps the same ones (a restarted exporter exports the
# same series).
NEW_VALUES_SQL = """SELECT c FROM specdec_values WHERE label = '{label}' AND NOT list_contains({kept}, c)
GROUP BY c ORDER BY sum(n) DESC, c LIMIT {room}"""
DISTINCT_VALUES_SQL = "SELECT label, count(DISTINCT c) FROM specdec_values GROUP BY 1"
# Each value's exported label: itself (cut) where kept, else "other".
FOLDED_SQL = """CREATE OR REPLACE TEMP TABLE specdec_folded AS
SELECT label, h, p, CASE WHEN list_contains(CASE label {kept} END, c) THEN c ELSE '{other}' END AS f
FROM specdec_values"""
# The minute summary per exported label set and cache_hit (the label sets before the combination bound).
SETS_SQL = """CREATE OR REPLACE TEMP TABLE specdec_sets AS
SELECT coalesce(d.f, 'other') AS dep, coalesce(t.f, 'other') AS target, coalesce(m.f, 'other') AS draft,
       cache_hit, sum(requests)::BIGINT AS requests, sum(violations)::BIGINT AS violations,
       max(last_ts) AS last_ts, sum(contaminated)::BIGINT AS contaminated,
       coalesce(sum(logged_draft_tokens), 0)::BIGINT AS drafted,
       coalesce(sum(logged_accepted_tokens), 0)::BIGINT AS accepted,
       sha256(dep || chr(1) || target || chr(1) || draft) AS k
FROM (SELECT {keys}, cache_hit, sum(requests) AS requests, sum(violations) AS violations,
      max(last_ts) AS last_ts, sum(contaminated) AS contaminated, sum(logged_draft_tokens) AS logged_draft_tokens,
      sum(logged_accepted_tokens) AS logged_accepted_tokens
      FROM {minute} GROUP BY ALL) r
{joins}
GROUP BY ALL"""
# The label sets with the most requests that are not kept yet (by key: the SHA-256 of the three labels, short
# whatever the values, so that the kept sets written into each read's SQL stay small).
NEW_COMBINATIONS_SQL = """SELECT k FROM specdec_sets WHERE k NOT IN (SELECT unnest({kept}))
GROUP BY k ORDER BY sum(requests) DESC, k LIMIT {room}"""
DISTINCT_COMBINATIONS_SQL = "SELECT count(DISTINCT k) FROM specdec_sets"
# Whether each label set is kept; one that is not keeps its deployment and folds its models into "other".
KEPT_SETS_SQL = """CREATE OR REPLACE TEMP TABLE specdec_kept AS
SELECT dep, target, draft, k IN (SELECT unnest({kept})) AS kept FROM specdec_sets GROUP BY ALL"""
MODELS_EXPORTED = "CASE WHEN kept THEN target ELSE 'other' END, CASE WHEN kept THEN draft ELSE 'other' END"


def _fold_join(alias: str, label: str, column: str, key: tuple[str, str] | None = None) -> str:
    """A join giving `column`'s exported label as `{alias}.f` (None: a value no request has, which is "other");
    `key`: the value's key where the row has it already (hash, prefix)."""
    h, prefix = key or (f"hash({column})", f"left({column}, {PREFIX_CHARS})")
    return f"LEFT JOIN specdec_folded {alias} ON {alias}.label = '{label}' AND {alias}.h = {h} AND {alias}.p = {prefix}"


# The contract's token sums (every accepted record's draft_tokens and accepted_tokens) are the minute
# summary's logged sums, not its speculative ones (those are the Overview's acceptance rate).
REQUESTS_SQL = """SELECT dep, """ + MODELS_EXPORTED + """, CASE WHEN cache_hit THEN 'true' ELSE 'false' END,
       sum(requests)::BIGINT, sum(violations)::BIGINT, max(last_ts), sum(contaminated)::BIGINT,
       sum(drafted)::BIGINT, sum(accepted)::BIGINT
FROM specdec_sets JOIN specdec_kept USING (dep, target, draft) GROUP BY ALL"""

# Hits as first judged contaminated (derived/verdicts.py), per label set, from {verdicts}: their counts per
# labels and field list (summary_first_verdicts, or the same counted over the rows).
CONTAMINATED_SQL = """SELECT dep, """ + MODELS_EXPORTED + """, sum(hits)::BIGINT FROM (
    SELECT coalesce(d.f, 'other') AS dep, coalesce(t.f, 'other') AS target, coalesce(m.f, 'other') AS draft, hits
    FROM {verdicts} v {joins}) LEFT JOIN specdec_kept USING (dep, target, draft)
GROUP BY ALL"""
# Split after counting: a few distinct field lists, however many hits share them.
CONTAMINATED_FIELDS_SQL = """SELECT coalesce(d.f, 'other'), field, sum(hits)::BIGINT FROM (
    SELECT deployment, field, sum(hits) AS hits FROM (
        SELECT deployment, unnest(string_split(differing_fields, ';')) AS field, hits FROM {verdicts})
    WHERE field <> '' GROUP BY ALL) x {dep_join}
GROUP BY ALL"""

# Keys, identities and collisions per deployment, as the Overview's headline counts them for one deployment
# (analysis/overview.py KEY_COUNTS_WHOLE_SQL).
KEYS_SUMMARY_SQL = """WITH k AS (
    SELECT """ + _KEY.format(c="deployment", h="h", p="p") + """, count(DISTINCT key_id) AS keys,
           count(DISTINCT fp_id) AS identities
    FROM """ + resolved_keys() + """ GROUP BY 1, 2
), c AS (
    SELECT h, p, count(*) AS collisions FROM (
        SELECT """ + _KEY.format(c="deployment", h="h", p="p") + """, key_id
        FROM """ + resolved_keys("summary_shared_keys") + """ GROUP BY ALL HAVING count(DISTINCT fp_id) > 1)
    GROUP BY 1, 2
)
SELECT h, p, keys, identities, coalesce(collisions, 0) AS collisions FROM k LEFT JOIN c USING (h, p)"""
KEYS_ROWS_SQL = f"""WITH p AS (
    SELECT {deployment_label()} AS deployment, r.cache_key, r.fingerprint FROM {resolved_rows()} r
    WHERE r.cache_key IS NOT NULL GROUP BY ALL
), per_key AS (SELECT deployment, cache_key, count(*) AS n FROM p GROUP BY ALL),
k AS (
    SELECT deployment, count(*) AS keys, count(*) FILTER (WHERE n > 1) AS collisions FROM per_key GROUP BY 1
), i AS (SELECT deployment, count(DISTINCT fingerprint) AS identities FROM p GROUP BY 1)
SELECT """ + _KEY.format(c="deployment", h="h", p="p") + """, keys, identities, collisions
FROM k JOIN i USING (deployment)"""
# Per exported deployment: a folded deployment's counts add up, keys being per deployment.
KEYS_SQL = """SELECT coalesce(d.f, 'other'), sum(keys)::BIGINT, sum(identities)::BIGINT, sum(collisions)::BIGINT
FROM ({per_deployment}) x {keys_join} GROUP BY 1"""


def read_figures(store: Store, top: int = DEFAULT_TOP, folds: Folds | None = None,
                 combinations: int = DEFAULT_COMBINATIONS) -> Figures:
    """Every metric's figures for `store` as it is now, each label folded to its `top` values plus "other", at
    most `combinations` label sets (plus one "other" set per deployment).

    `folds`: what an earlier read kept (its Figures.folds); None decides afresh, by requests.
    Read from the summaries alone (a few rows per minute and label set, per key, per first-verdict label
    set), so a first read costs about what a later one does, whatever the number of requests stored.
    """
    if top < 1:
        raise ValueError(f"top: expected a number >= 1, got {top}")
    if combinations < 1:
        raise ValueError(f"combinations: expected a number >= 1, got {combinations}")
    with store.read() as con:
        return _read(con, top, folds or Folds(), combinations)


def _verdicts(recorded: bool, ready: bool) -> str:
    """The first verdicts counted per labels and field list: the summary, or (no summaries: the row path) the
    same counted over their record; a store none of whose ingests has recorded them yet counts its current
    verdicts, which its next ingest records as first verdicts."""
    if ready:
        return "summary_first_verdicts"
    source = "contaminated_first_verdicts" if recorded else (
        f"({summary.contaminated_sql()})")
    return f"({first_verdict_counts_sql(source)})"


def _read(con: duckdb.DuckDBPyConnection, top: int, folds: Folds, combinations: int) -> Figures:
    quarantined = con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0]
    replays = tuple(con.execute("SELECT classification, count(*) FROM replays GROUP BY 1 ORDER BY 1").fetchall())
    ready = summary.ready(con)
    if not ready and not con.execute("SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)").fetchall()[0][0]:
        return Figures((), (), (), (), (), (), (), (), replays, quarantined, (), folds)
    minute = "summary_minute" if ready else f"({summary.minute_sql()})"

    con.execute(VALUES_SQL.format(cut=cut_label("v"), per_label=" UNION ALL ".join(
        VALUES_PER_LABEL_SQL.format(label=label, minute=minute) for label in LABELS)))
    kept = {label: _admitted(con, lambda known, room, label=label: NEW_VALUES_SQL.format(
        label=label, kept=known, room=room), getattr(folds, label), top) for label in LABELS}
    distinct = dict(con.execute(DISTINCT_VALUES_SQL).fetchall())
    folded = [(label, max(0, distinct.get(label, 0) - len(kept[label]))) for label in LABELS]
    con.execute(FOLDED_SQL.format(other=OTHER, kept=" ".join(
        f"WHEN '{label}' THEN {_text_list(list(kept[label]))}" for label in LABELS)))
    aliases = {"d": "deployment", "t": "target_model", "m": "draft_model"}
    con.execute(SETS_SQL.format(minute=minute, keys=", ".join(
        _KEY.format(c=label, h=f"h{alias}", p=f"p{alias}") for alias, label in aliases.items()), joins="\n".join(
        _fold_join(alias, label, "", (f"r.h{alias}", f"r.p{alias}")) for alias, label in aliases.items())))
    kept_keys = _admitted(con, lambda known, room: NEW_COMBINATIONS_SQL.format(kept=known, room=room),
                          folds.combinations, combinations)
    distinct_sets = con.execute(DISTINCT_COMBINATIONS_SQL).fetchall()[0][0]
    folded.append(("combination", max(0, distinct_sets - len(kept_keys))))
    con.execute(KEPT_SETS_SQL.format(kept=_text_list(list(kept_keys))))
    verdict_joins = "\n".join(_fold_join(alias, label, f"v.{label}") for alias, label in aliases.items())
    dep_join = _fold_join("d", "deployment", "x.deployment")
    keys_join = _fold_join("d", "deployment", "", ("x.h", "x.p"))
    now_kept = Folds(kept["deployment"], kept["target_model"], kept["draft_model"], kept_keys)
    verdicts = _verdicts(has_table(con, "contaminated_first_verdicts"), ready)
    names = {"joins": verdict_joins, "verdicts": verdicts, "dep_join": dep_join,
             "keys_join": keys_join, "per_deployment": KEYS_SUMMARY_SQL if ready else KEYS_ROWS_SQL}

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
    return Figures(
        requests=requests,
        contaminated_first=tuple(rows(CONTAMINATED_SQL)),
        contaminated_now=tuple((*k, n) for k, n in contaminated_now.items() if n),
        contaminated_fields=tuple(rows(CONTAMINATED_FIELDS_SQL)),
        length_violations=tuple((d, t, n) for (d, t), n in sorted(violations.items())),
        tokens=tuple((*k, *sums) for k, sums in sorted(tokens.items())),
        keys=tuple(rows(KEYS_SQL)),
        newest=tuple((d, ts.timestamp()) for d, ts in sorted(newest.items())),
        replays=replays,
        quarantined=quarantined,
        folded=tuple(folded),
        folds=now_kept,
    )


def _admitted(con: duckdb.DuckDBPyConnection, sql: Callable[[str, int], str], kept: tuple[str, ...],
              limit: int) -> tuple[str, ...]:
    """`kept`, and while it holds fewer than `limit`, the best of the rest (`sql(kept as SQL, room)` lists them,
    best first).

    Nothing leaves, and nothing joins once `limit` is reached: a value folded at one read was there while the
    kept ones filled the room, so it is folded at every later read too."""
    room = limit - len(kept)
    if room <= 0:
        return kept
    new = con.execute(sql(_text_list(list(kept)), int(room))).fetchall()
    return kept + tuple(r[0] for r in new)
