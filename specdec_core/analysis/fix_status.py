"""Is the fix holding: after a deployment's first key of the new scheme, does any hit still come from a key
of an old scheme (an incomplete rollout, or an old entry read under an old assumption)?"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from specdec_core.analysis.query import NO_FILTERS, Filters, execute
from specdec_core.analysis.status import (
    KeySchemeChange,
    fmt_time,
    key_scheme_changes,
    key_shape,
    plural,
    rfc3339_ms,
)
from specdec_core.derived import summaries as summary
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label

# Each fix as a row: its number, deployment, first key of the new scheme, and the old schemes' shapes.
_FIXES = """fixes AS (SELECT f.n, f.deployment, f.since, f.old_prefixes FROM (
    SELECT unnest($fixes::STRUCT(n INTEGER, deployment VARCHAR, since TIMESTAMPTZ, old_prefixes VARCHAR[])[]) AS f))"""


# A key's scheme is its shape, as key_scheme_changes cuts it: all but its last ':'-separated part.
def hits_after_fix_sql(where: str) -> str:
    """Per fix (`n`), the selection's hits on keys of its old schemes after it: none listed, none counted."""
    return f"""
WITH {_FIXES}
SELECT f.n, count(*) AS hits FROM requests r JOIN fixes f ON {deployment_label()} = f.deployment
WHERE {where} AND r.cache_hit AND r.ts > f.since AND contains(r.cache_key, ':')
  AND list_contains(f.old_prefixes, {key_shape("r.cache_key")})
GROUP BY f.n
"""


def hits_after_fix_summary_sql(where: str) -> str:
    """The same counts from the summaries: the old schemes' keys still used after each fix (summary_keys, one row
    per key; none when the fixes hold, and then no request is read), then the selection's hits on those keys
    (summary_request_keys, whose rows are narrow and ordered by time) instead of every row's key text."""
    return f"""
WITH {_FIXES}, old AS (
    SELECT DISTINCT f.n, f.deployment, f.since, {summary.key_hash("c.deployment", "c.cache_key")} AS key_hash
    FROM summary_keys c JOIN fixes f ON c.deployment = f.deployment
    WHERE c.hits > 0 AND c.last_seen > f.since AND contains(c.cache_key, ':')
      AND list_contains(f.old_prefixes, {key_shape("c.cache_key")})
)
SELECT o.n, count(*) AS hits FROM summary_request_keys r JOIN old o ON r.key_hash = o.key_hash
WHERE {where} AND r.cache_hit AND r.deployment = o.deployment AND r.ts > o.since
GROUP BY o.n
"""


def _hits_after(store: Store, filters: Filters, fixes: list[tuple[str, datetime, list[str]]]) -> list[int]:
    """The selection's hits on keys of the old `prefixes` after each fix (deployment, since, prefixes), in one
    statement: a read per fix cost the Overview 34 openings and version checks on a 20M-row lake (0.75 s), and a
    statement per fix 0.65 s more."""
    if not fixes:
        return []
    where, params = filters.named_where()
    rows = [{"n": n, "deployment": d, "since": since, "old_prefixes": list(prefixes)}
            for n, (d, since, prefixes) in enumerate(fixes)]
    with store.read() as con:
        sql = (hits_after_fix_summary_sql if summary.ready(con) else hits_after_fix_sql)(where)
        hits = dict(execute(con, sql, params | {"fixes": rows}).fetchall())
    return [int(hits.get(n, 0)) for n in range(len(fixes))]


@dataclass(frozen=True)
class SchemeChangeHits:
    """One key-scheme change and the hits that still came from its old scheme after it."""

    change: KeySchemeChange
    hits_after_fix: int

    def to_json(self) -> dict[str, Any]:
        c = self.change
        return {"deployment": c.deployment, "old_prefix": c.old_prefix, "new_prefix": c.new_prefix,
                "last_old_key": rfc3339_ms(c.old_last), "first_new_key": rfc3339_ms(c.ts),
                "hits_after_fix": self.hits_after_fix, "sentence": c.sentence}


@dataclass(frozen=True)
class FixStatus:
    """A deployment whose key changed scheme: when its fix (the latest change) began serving, and the hits
    from keys of any older scheme since."""

    deployment: str
    fixed_at: datetime  # the first key of the latest scheme
    new_prefix: str
    old_prefixes: tuple[str, ...]
    hits_after_fix: int

    @property
    def holding(self) -> bool:
        return self.hits_after_fix == 0

    @property
    def sentence(self) -> str:
        who = self.deployment or "(none)"
        if self.holding:
            return f"{who}: fix deployed at {fmt_time(self.fixed_at)}; 0 hits from old-scheme keys since."
        return (f"{who}: {plural(self.hits_after_fix, 'hit')} from old-scheme keys after the fix: "
                f"rollout incomplete (fix deployed at {fmt_time(self.fixed_at)}).")


def scheme_change_hits(store: Store, filters: Filters = NO_FILTERS,
                       changes: list[KeySchemeChange] | None = None) -> list[SchemeChangeHits]:
    """Each key-scheme change with the hits from its old scheme after its first new key."""
    changes = key_scheme_changes(store, filters) if changes is None else changes
    hits = _hits_after(store, filters, [(c.deployment, c.ts, [c.old_prefix]) for c in changes])
    return [SchemeChangeHits(c, n) for c, n in zip(changes, hits, strict=True)]


def fix_status(store: Store, filters: Filters = NO_FILTERS,
               changes: list[KeySchemeChange] | None = None) -> list[FixStatus]:
    """Per deployment whose key changed scheme, ordered by when its fix began: is it holding?

    The change is found in the whole log of the selected deployments and models (a time range that begins
    after the fix still knows it); the hits after it are counted in the selection. A fix after the
    selection's end is not listed: the selection can say nothing about it."""
    if changes is None:
        changes = key_scheme_changes(store, replace(filters, start=None, end=None))
    changes = [c for c in changes if filters.end is None or c.ts <= filters.end]
    latest: dict[str, KeySchemeChange] = {}
    olds: dict[str, list[str]] = {}
    for c in sorted(changes, key=lambda c: c.ts):
        latest[c.deployment] = c
        olds.setdefault(c.deployment, []).append(c.old_prefix)
    old = {d: tuple(dict.fromkeys(p for p in olds[d] if p != fix.new_prefix)) for d, fix in latest.items()}
    hits = _hits_after(store, filters, [(d, fix.ts, list(old[d])) for d, fix in latest.items()])
    out = [FixStatus(d, fix.ts, fix.new_prefix, old[d], n) for (d, fix), n in zip(latest.items(), hits, strict=True)]
    return sorted(out, key=lambda s: (s.fixed_at, s.deployment))


def fix_stats(store: Store, filters: Filters = NO_FILTERS) -> dict[str, Any]:
    """What `specdec stats --json` adds: `key_scheme_changes` (each with its own hits_after_fix) and, per
    deployment whose key changed, `hits_after_fix` since its latest change: each as the Overview shows it for
    `filters` (the changes within its time range; each fix found in the whole log, as fix_status does)."""
    changes = key_scheme_changes(store, filters)
    whole = changes if filters.start is None and filters.end is None else None
    return {"key_scheme_changes": [c.to_json() for c in scheme_change_hits(store, filters, changes)],
            "hits_after_fix": {s.deployment: s.hits_after_fix for s in fix_status(store, filters, whole)}}

