"""The six symptoms of a cache key narrower than the request identity, each with its evidence."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from specdec_core.analysis.cache import key_ratio_by_deployment
from specdec_core.analysis.overview import HeadlineCounts, headline_counts
from specdec_core.analysis.query import (
    NO_FILTERS,
    Filters,
    ask,
    df,
    draft_label,
    execute,
    minute_source,
    one,
    row,
)
from specdec_core.analysis.status import plural
from specdec_core.derived import summaries as summary
from specdec_core.derived.aliases import PROMPT_BIT, identity_columns, stands_for
from specdec_core.derived.summaries import output_identity_columns
from specdec_core.store.connection import Store


@dataclass(frozen=True)
class RedFlag:
    """One symptom: `id` names the question (one of RED_FLAG_IDS); the faces decide where it is shown."""

    id: str
    title: str
    flagged: bool | None  # None: not enough data to judge (say what would settle it)
    evidence: str
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "flagged": self.flagged, "evidence": self.evidence, "title": self.title,
                "numbers": self.numbers}


RED_FLAG_IDS: tuple[str, ...] = ("identical_outputs", "replay_disagrees", "biased_experiments", "impossible_lengths",
                                 "hit_rate_too_good", "few_keys")


def shared_outputs_sql(pairs: str) -> str:
    """Outputs returned for more than one identity, over `pairs`: (out_hash, fingerprint, hits), the requests
    folded to their (output, identity) pairs first, so only those meet the identities table. Outputs are
    grouped by a hash of the text: a heuristic count. A partial identity (a hit whose log left fields unknown)
    that another identity of the same output stands for is not another identity of it (derived/aliases.py)."""
    return f"""
WITH f AS ({pairs}), g AS (
    SELECT f.out_hash, f.fingerprint, f.hits, {identity_columns()} FROM f JOIN identities i USING (fingerprint)
), stood_for AS (
    -- An inner join: as a semi join on these conditions, DuckDB compared every pair of rows. One that stands for a
    -- partial identity knows its prompt and target where it does, equal: joined on those too, an output many
    -- identities share ("", "Yes") is not compared pair by pair.
    SELECT a.out_hash, a.fingerprint FROM (SELECT * FROM g WHERE unknown_bits <> 0 AND unknown_bits & {PROMPT_BIT} = 0) a
    JOIN g b ON a.out_hash = b.out_hash AND a.target_model = b.target_model AND a.prompt = b.prompt
    WHERE {stands_for('a', 'b')}
    UNION
    SELECT a.out_hash, a.fingerprint FROM (SELECT * FROM g WHERE unknown_bits & {PROMPT_BIT} <> 0) a
    JOIN g b ON a.out_hash = b.out_hash AND a.target_model = b.target_model WHERE {stands_for('a', 'b')}
), o AS (
    -- Greedy speculative decoding is lossless: identities that differ only in their draft share outputs
    -- legitimately, so the draft fields count only for sampled requests.
    SELECT g.out_hash, count(DISTINCT ({output_identity_columns('g')})) FILTER (WHERE s.fingerprint IS NULL)
           AS identities, sum(g.hits) AS hits
    FROM g LEFT JOIN stood_for s USING (out_hash, fingerprint) GROUP BY 1
)
SELECT count(*) FILTER (WHERE identities > 1) AS shared_outputs,
       coalesce(sum(hits) FILTER (WHERE identities > 1), 0)::BIGINT AS hits_with_shared_output,
       coalesce(sum(hits), 0)::BIGINT AS hits
FROM o
"""


def shared_outputs_rows_sql(where: str) -> str:
    """Over the rows: DuckDB's 64-bit hash, within one query."""
    return shared_outputs_sql("SELECT hash(r.output_text) AS out_hash, r.fingerprint, "
                              f"count(*) FILTER (WHERE r.cache_hit) AS hits FROM requests r WHERE {where} GROUP BY 1, 2")


def shared_outputs_whole_sql(dims: str) -> str:
    """Without a time range, from the outputs summary (texts by their MD5 there): no output text is read."""
    return shared_outputs_sql("SELECT c.out_hash, c.fingerprint, sum(c.hits) AS hits FROM summary_outputs c "
                              f"WHERE {dims} GROUP BY 1, 2")


def shared_outputs_range_sql(source: str, where: str) -> str:
    """A time range: over summary_request_outputs, the output and its deciding identity fields as stored
    64-bit hashes (the rows' answer counts the fields themselves: exact but for a hash collision among the
    range's identities). The minute relation `source` is not needed. Not for a store with partial identities:
    a hash can't say which identity stands for one (_identical_outputs asks the rows instead)."""
    return f"""
WITH o AS (
    SELECT r.out_hash, count(DISTINCT r.out_identity) AS identities, count(*) FILTER (WHERE r.cache_hit) AS hits
    FROM summary_request_outputs r WHERE {where} GROUP BY 1
)
SELECT count(*) FILTER (WHERE identities > 1) AS shared_outputs,
       coalesce(sum(hits) FILTER (WHERE identities > 1), 0)::BIGINT AS hits_with_shared_output,
       coalesce(sum(hits), 0)::BIGINT AS hits
FROM o
"""


def hit_rate_trend_sql(where: str) -> str:
    return f"""
-- The window split at its midpoint in time: two aggregate passes, no sort.
WITH w AS (SELECT min(r.ts) + (max(r.ts) - min(r.ts)) / 2 AS mid FROM requests r WHERE {where})
SELECT avg(r.cache_hit::INT) FILTER (WHERE r.ts < w.mid) AS first_half,
       avg(r.cache_hit::INT) FILTER (WHERE r.ts >= w.mid) AS second_half
FROM requests r, w WHERE {where}
"""


def hit_rate_trend_halves_sql(source: str, where: str) -> str:
    """The same halves from the minute relation `source`, split at `$trend_mid` (the selection's midpoint, read
    from `source` first and bound, so that the one minute read from the rows is skipped to in the scan): the
    minutes before and after the one that holds it, and that minute's rows split at it. A minute's rows all share
    its `minute`, so no other minute straddles the midpoint. That minute's requests are read from
    summary_request_outputs (every request, its labels as the filters read them, in time order: the scan skips to
    the minute, where the rows of a log not written in time order are all read). The rows' answer reads every
    request's time: 0.28 s of the red flags at 20M rows in a lake."""
    return f"""
WITH halves AS (
    SELECT c.minute < $trend_minute::TIMESTAMPTZ AS first, c.cache_hit, c.requests FROM {source} c
    WHERE c.minute <> $trend_minute::TIMESTAMPTZ
    UNION ALL
    SELECT r.ts < $trend_mid::TIMESTAMPTZ AS first, r.cache_hit, 1 AS requests FROM summary_request_outputs r
    WHERE {where} AND r.ts >= $trend_minute::TIMESTAMPTZ AND r.ts < $trend_minute::TIMESTAMPTZ + INTERVAL 1 minute
)
SELECT coalesce(sum(requests) FILTER (WHERE first AND cache_hit), 0) / sum(requests) FILTER (WHERE first) AS first_half,
       coalesce(sum(requests) FILTER (WHERE NOT first AND cache_hit), 0) / sum(requests) FILTER (WHERE NOT first)
           AS second_half
FROM halves
"""


def hit_rate_trend(store: Store, filters: Filters) -> dict[str, Any]:
    """The hit rate in the first and the second half of the selection's time span."""
    with store.read() as con:
        if not summary.ready(con):
            return row(ask(con, hit_rate_trend_sql, filters))
        source, where, params = minute_source(filters)
        mid, minute = execute(con, "SELECT mid, time_bucket(INTERVAL 1 minute, mid) FROM (SELECT min(c.first_ts) "
                                   f"+ (max(c.last_ts) - min(c.first_ts)) / 2 AS mid FROM {source} c)",
                              params).fetchall()[0]
        # An empty selection has no midpoint: every comparison with it is NULL, and both halves are too.
        return row(execute(con, hit_rate_trend_halves_sql(source, where),
                           params | {"trend_mid": mid, "trend_minute": minute}))


# A temperature the log left unknown (LiteLLM's hits) is said so: concatenated, its NULL made the arm's name None.
_TEMPERATURE = "coalesce('T=' || temperature, 'T unknown')"


def experiment_bias_sql(where: str) -> str:
    return f"""
-- Grouped by the arm's columns, labelled after: one string per arm, not per request.
SELECT target_model || ' / ' || draft || ' / ' || {_TEMPERATURE} AS arm, requests, contaminated FROM (
    SELECT r.target_model, {draft_label()} AS draft, r.temperature, count(*) AS requests,
           count(h.request_id) AS contaminated
    FROM requests r LEFT JOIN (SELECT request_id FROM hit_sources WHERE contaminated) h USING (request_id)
    WHERE {where} GROUP BY ALL HAVING count(h.request_id) > 0
)
ORDER BY contaminated DESC, arm LIMIT 5
"""


def experiment_bias_minute_sql(source: str) -> str:
    """The same arms from the minute summary, whose rows are per target, draft and temperature already."""
    return f"""
SELECT target_model || ' / ' || draft_model || ' / ' || {_TEMPERATURE} AS arm, requests, contaminated FROM (
    SELECT c.target_model, c.draft_model, c.temperature, sum(c.requests)::BIGINT AS requests,
           sum(c.contaminated)::BIGINT AS contaminated
    FROM {source} c GROUP BY ALL HAVING sum(c.contaminated) > 0
)
ORDER BY contaminated DESC, arm LIMIT 5
"""


def replay_summary_sql(where: str) -> str:
    return f"""
SELECT count(*) AS replays, count(*) FILTER (WHERE p.classification NOT IN ('match', 'near_tie', 'unavailable'))
       AS disagreeing
FROM (SELECT DISTINCT ON (request_id) * FROM replays ORDER BY request_id, replayed_at DESC) p
JOIN requests r USING (request_id) WHERE {where}
"""


# Hits on never-seen identities beyond this share of a deployment's hits are not explained by entries
# that predate the log window.
FIRST_SIGHT_HIT_SHARE = 0.05


def _holds_partial_identities(store: Store) -> bool:
    """Whether one identity of the store may stand for another: its logs left different sets of identity fields
    unknown (LiteLLM's hits and misses). Not where every request lacks the same ones (OpenInference's top_k)."""
    with store.read() as con:
        return con.execute("SELECT count(DISTINCT coalesce(unknown, [])) FROM identities").fetchall()[0][0] > 1


def _identical_outputs(store: Store, filters: Filters, head: HeadlineCounts) -> RedFlag:
    shared = one(store, shared_outputs_rows_sql, filters, whole=shared_outputs_whole_sql,
                 ranged=None if _holds_partial_identities(store) else shared_outputs_range_sql)
    trend = hit_rate_trend(store, filters)
    rising = (trend["second_half"] or 0) > (trend["first_half"] or 0)
    shared_share = shared["hits_with_shared_output"] / shared["hits"] if shared["hits"] else 0.0
    return RedFlag(
        "identical_outputs", "Identical outputs although parameters differ",
        bool(shared["shared_outputs"] > 0 and head.contaminated_hits > 0),
        f"{shared['shared_outputs']} output texts were returned for requests that differ in more than their "
        f"draft model ({shared_share:.0%} of hits are on such outputs); hit rate {_pct(trend['first_half'])} in the "
        "first half of the window, "
        f"{_pct(trend['second_half'])} in the second{' (rising)' if rising else ''}.",
        {"shared_outputs": shared["shared_outputs"], "rising": rising},
    )


def _replay_disagrees(store: Store, filters: Filters) -> RedFlag:
    replays = one(store, replay_summary_sql, filters)
    title = "Offline replay does not match production"
    if not replays["replays"]:
        return RedFlag("replay_disagrees", title, None,
                       "No request replayed yet: replay the most suspicious requests to settle this.", {})
    return RedFlag(
        "replay_disagrees", title, bool(replays["disagreeing"] > 0),
        f"{replays['disagreeing']} of {replays['replays']} replayed requests disagree with production "
        "beyond numerical near-ties.",
        dict(replays),
    )


def _biased_experiments(store: Store, filters: Filters) -> RedFlag:
    arms = df(store, experiment_bias_sql, filters, minute=experiment_bias_minute_sql)
    worst = "; ".join(f"{a.arm}: {a.contaminated} of {a.requests}" for a in arms.itertuples())
    return RedFlag(
        "biased_experiments", "Experiment arms compared on each other's outputs", not arms.empty,
        f"Arms served another identity's cached output: {worst}." if worst
        else "No experiment arm received another identity's output.",
        {"arms": len(arms)},
    )


def _impossible_lengths(head: HeadlineCounts) -> RedFlag:
    return RedFlag(
        "impossible_lengths", "Output lengths impossible for max_tokens", bool(head.length_violations > 0),
        f"{plural(head.length_violations, 'request')} returned more tokens than their max_tokens.",
        {"length_violations": head.length_violations},
    )


# What the ceiling of a deployment's hit rate means, in one sentence for the pages.
CEILING_MEANING = ("The ceiling is the share of a deployment's requests that repeat an identity it was already "
                   "asked for: a correct key can hit on those only, so a hit rate above it is impossible.")


def _hit_rate_too_good(ratios: pd.DataFrame, filters: Filters) -> RedFlag:
    """Too good where the hit rate passes its ceiling, or where hits on never-served identities pass their
    share; the evidence names, per deployment, only what holds. With a start of its own a time range's
    ceiling leaves out the identities asked for before it, so there only the never-served hits (judged over
    the whole log) count."""
    # A hit whose log left identity fields unknown can't be told a first sight or not: it counts on neither side.
    ratios = ratios.assign(judged=ratios["hits"] - ratios["partial_hits"])
    first_sight_share = ratios["first_sight_hits"] / ratios["judged"].where(ratios["judged"] > 0)
    above = (ratios["hit_rate"] > ratios["max_correct_hit_rate"] + 1e-9) & (filters.start is None)
    never_served = first_sight_share > FIRST_SIGHT_HIT_SHARE
    too_good = ratios.assign(above=above, never_served=never_served)[above | never_served]
    evidence = []
    for d in too_good.itertuples():
        why = []
        if d.above:
            why.append(f"hit rate {d.hit_rate:.0%}, above the {d.max_correct_hit_rate:.0%} a correct key could reach")
        if d.never_served:
            why.append(f"{d.first_sight_hits:,} of {d.judged:,} hits ({d.first_sight_hits / d.judged:.0%}) were for "
                       f"an identity this deployment had never served before{_partial_note(d)}")
        evidence.append(f"{d.deployment or '(none)'}: {'; '.join(why)}")
    if too_good.empty:
        evidence = [_within_bounds(d, filters) for d in ratios.itertuples() if d.hits]
    judged = "" if filters.start is None or not too_good.empty else (
        " The ceiling is not judged over a time range that starts after the log does: the identities asked "
        "for before it are not counted.")
    return RedFlag(
        "hit_rate_too_good", "Hit rate too good for this workload", not too_good.empty,
        (". ".join(evidence) + "." if evidence else "No cache hits in this selection.") + judged,
        {"deployments": len(too_good), "above_ceiling": int(too_good.above.sum()) if not too_good.empty else 0},
    )


def _partial_note(d: Any) -> str:
    return (f" ({plural(d.partial_hits, 'hit')} more left identity fields unknown: whether "
            f"{'it was a first sight' if d.partial_hits == 1 else 'they were first sights'} can't be told)"
            if d.partial_hits else "")


def _within_bounds(d: Any, filters: Filters) -> str:
    """Why a deployment's hit rate is not too good: its own numbers against each bound that was judged."""
    if d.judged:
        text = (f"{d.deployment or '(none)'}: {d.first_sight_hits:,} of {d.judged:,} hits "
                f"({d.first_sight_hits / d.judged:.0%}) on identities never served before, within the "
                f"{FIRST_SIGHT_HIT_SHARE:.0%} that entries older than the log explain{_partial_note(d)}")
    else:
        text = (f"{d.deployment or '(none)'}: whether its {plural(d.hits, 'hit')} served identities never served "
                "before can't be told: the log left identity fields unknown on each")
    if filters.start is None:
        text += f"; hit rate {d.hit_rate:.0%}, within the {d.max_correct_hit_rate:.0%} a correct key could reach"
    return text


def _few_keys(ratios: pd.DataFrame) -> RedFlag:
    narrow = ratios[ratios["keys_per_identity"] < 1 - 1e-9]
    return RedFlag(
        "few_keys", "Few unique cache keys for many unique identities", not narrow.empty,
        "; ".join(f"{d.deployment or '(none)'}: {plural(d.unique_keys, 'key')} for "
                  f"{plural(d.unique_identities, 'identity', 'identities')}"
                  for d in narrow.itertuples())
        or "Every deployment has at least one key per identity.",
        {"deployments": len(narrow)},
    )


def red_flags(store: Store, filters: Filters = NO_FILTERS, head: HeadlineCounts | None = None) -> list[RedFlag]:
    """The six symptoms, in RED_FLAG_IDS order. `head` is `headline(store, filters)` when the caller has it;
    without it only the counts the flags read are asked (not the headline's distinct counts)."""
    head = head if head is not None else headline_counts(store, filters)
    ratios = key_ratio_by_deployment(store, filters)
    return [
        _identical_outputs(store, filters, head),
        _replay_disagrees(store, filters),
        _biased_experiments(store, filters),
        _impossible_lengths(head),
        _hit_rate_too_good(ratios, filters),
        _few_keys(ratios),
    ]


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.0%}"
