"""Logging gaps: identity fields a log leaves unknown (or never sets) on its cache hits.

Contamination through a field that is unknown on a hit cannot be seen (it is never compared), so
triage says which fields those are and on how many hits: the fix is to log them.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec_core.analysis.query import HITS, NO_FILTERS, Filters, df
from specdec_core.contract import fields as contract
from specdec_core.derived import summaries as summary
from specdec_core.store.connection import Store


@dataclass(frozen=True)
class LoggingGap:
    field: str
    hits: int  # hits in the selection
    unknown_hits: int  # hits on which the log marks the field unknown
    never_set: bool  # null on every request of the selection: never logged, or never used

    @property
    def sentence(self) -> str:
        if self.unknown_hits:
            return (f"{self.field} unknown on {self.unknown_hits:,} of {self.hits:,} hits: contamination through "
                    "it cannot be seen here; log it")
        return f"{self.field} is never set in this log: if requests do vary in it, log it"


def _gaps_sql(where: str) -> str:
    counts = ",\n".join(
        f"count(*) FILTER (WHERE r.cache_hit AND list_contains(r.unknown_fields, '{name}')) AS \"unknown:{name}\", "
        f"count(r.{name}) = 0 AND count(*) FILTER (WHERE list_contains(r.unknown_fields, '{name}')) = 0 "
        f"AS \"never:{name}\""
        for name in summary.gap_fields())
    return (f"SELECT count(*) AS requests, count(*) FILTER (WHERE r.cache_hit) AS hits,\n{counts}\n"
            f"FROM requests r WHERE {where}")


def _gaps_minute_sql(source: str) -> str:
    """The same counts from the minute summary's per-field columns (summaries.GAP_MEASURES)."""
    counts = ",\n".join(
        f"coalesce(sum(c.unknown_{name}) FILTER (WHERE c.cache_hit), 0) AS \"unknown:{name}\", "
        f"coalesce(sum(c.set_{name}), 0) = 0 AND coalesce(sum(c.unknown_{name}), 0) = 0 AS \"never:{name}\""
        for name in summary.gap_fields())
    return f"SELECT coalesce(sum(c.requests), 0) AS requests, {HITS} AS hits,\n{counts}\nFROM {source} c"


# Fields whose null is a real value the contract defines (no draft, no seed, no stop): never set is no gap.
_NULL_IS_A_VALUE = frozenset({"draft_model", "num_speculative_tokens", "seed", "stop", "top_k"})


def logging_gaps(store: Store, filters: Filters = NO_FILTERS) -> list[LoggingGap]:
    """Identity fields unknown on some hits, then required ones never set, in the contract's order; none for a
    selection without requests (every field is "never set" there, which says nothing of the log)."""
    # A field a program added to the contract after the summary's columns were chosen is counted over the rows.
    minute = _gaps_minute_sql if set(summary.gap_fields()) <= set(summary.GAP_FIELDS) else None
    row = df(store, _gaps_sql, filters, minute=minute).iloc[0]
    if not int(row["requests"]):
        return []
    hits = int(row["hits"])
    gaps = []
    for name in contract.IDENTITY_FIELDS:
        if f"unknown:{name}" not in row:
            continue
        unknown = int(row[f"unknown:{name}"])
        never = bool(row[f"never:{name}"]) and name not in _NULL_IS_A_VALUE
        if unknown or never:
            gaps.append(LoggingGap(name, hits, unknown, never and not unknown))
    return gaps
