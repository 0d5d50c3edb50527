"""Since when, is it over, and what changed: the contamination's bounds per deployment, read against the
log's own bounds, and the deployments whose cache key changed scheme (the fix, as the data shows it)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from itertools import pairwise

import pandas as pd

from specdec_core.analysis.contamination import contamination_window
from specdec_core.analysis.query import NO_FILTERS, Filters, df
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label

# A contamination is over when the clean stretch after its last hit is both this long and this many times
# its usual gap between contaminated hits: a quiet minute inside a busy incident is no end.
CLEAN_AT_LEAST = timedelta(minutes=5)
CLEAN_GAPS = 10
# A deployment's key scheme is counted only with this many requests under it: a stray key is no scheme.
SCHEME_MIN_REQUESTS = 10
# Old-shape keys may trail the new shape by this much (in-flight requests) and still count as stopped.
SCHEME_OVERLAP = timedelta(minutes=5)


def rfc3339_ms(ts: datetime) -> str:
    """UTC with milliseconds (`2026-03-01T10:02:00.000Z`), as the key scheme changes and the purge plan write
    times; a time without a zone is UTC."""
    moment = ts if ts.tzinfo is not None else ts.replace(tzinfo=timezone.utc)
    return moment.astimezone(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def fmt_time(ts: datetime) -> str:
    """The one timestamp format of what the analysis says in words (the dashboard's own)."""
    return ts.strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_span(span: timedelta) -> str:
    """A duration in words: '2 h 07 min', '12 min', '40 s'."""
    seconds = int(span.total_seconds())
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min" if minutes else f"{secs} s"


def plural(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


@dataclass(frozen=True)
class ContaminationStatus:
    """One deployment's contaminated hits, and where they stand in what was logged of it."""

    deployment: str
    contaminated_hits: int
    first_contaminated: datetime
    last_contaminated: datetime
    logs_begin: datetime  # the deployment's first request in the selection
    logs_end: datetime  # and its last
    range_starts_at_filter: bool  # the selection has a start of its own: it, not the log, begins there
    fixed_at: datetime | None = None  # a fix of its key (fix_status) holding since then, if it has one

    @property
    def usual_gap(self) -> timedelta:
        """The mean time between contaminated hits (a minute when there is only one)."""
        if self.contaminated_hits < 2:
            return timedelta(minutes=1)
        return (self.last_contaminated - self.first_contaminated) / (self.contaminated_hits - 1)

    @property
    def under_way_at_start(self) -> bool:
        """The first hit comes sooner after the logs begin than the hits usually come: nothing says the
        contamination started then rather than before."""
        return self.first_contaminated - self.logs_begin <= self.usual_gap

    @property
    def clean_for(self) -> timedelta:
        return self.logs_end - self.last_contaminated

    @property
    def fixed_after_last(self) -> bool:
        """A key fix that holds (no hit from an old-scheme key since) began after the last contaminated hit."""
        return self.fixed_at is not None and self.fixed_at >= self.last_contaminated

    @property
    def clean_long_enough(self) -> bool:
        return self.clean_for >= max(CLEAN_AT_LEAST, CLEAN_GAPS * self.usual_gap)

    @property
    def over(self) -> bool:
        """A long clean stretch after the last hit, or a holding fix after it: the page that says the fix holds
        does not also say the contamination goes on."""
        return self.clean_long_enough or self.fixed_after_last

    @property
    def sentence(self) -> str:
        what = plural(self.contaminated_hits, "contaminated hit")
        if self.under_way_at_start:
            begin = "this time range begins" if self.range_starts_at_filter else "the logs begin"
            since = (f"already under way when {begin} ({fmt_time(self.logs_begin)}; the first logged at "
                     f"{fmt_time(self.first_contaminated)})")
        else:
            since = f"since {fmt_time(self.first_contaminated)}"
        if self.clean_long_enough:
            end = f"none since {fmt_time(self.last_contaminated)}: {fmt_span(self.clean_for)} clean"
        elif self.fixed_after_last:
            end = (f"none since {fmt_time(self.last_contaminated)}: {fmt_span(self.clean_for)} clean, and the key "
                   f"fix deployed at {fmt_time(self.fixed_at)} holds")
        elif self.clean_for == timedelta(0):
            end = f"still going: the newest request ({fmt_time(self.last_contaminated)}) is one"
        elif self.clean_for < timedelta(seconds=1):  # a clean request came after it, in the same second
            end = f"still going: the last at {fmt_time(self.last_contaminated)}, under a second before the newest request"
        else:
            end = (f"still going: the last at {fmt_time(self.last_contaminated)}, "
                   f"{fmt_span(self.clean_for)} before the newest request")
        return f"{what}, {since}; {end}."


def logged_span_sql(where: str) -> str:
    return f"""
SELECT {deployment_label()} AS deployment, min(r.ts) AS logs_begin, max(r.ts) AS logs_end
FROM requests r WHERE {where} GROUP BY ALL
"""


def logged_span_minute_sql(source: str) -> str:
    return f"""
SELECT c.deployment, min(c.first_ts) AS logs_begin, max(c.last_ts) AS logs_end FROM {source} c GROUP BY ALL
"""


def contamination_status(store: Store, filters: Filters = NO_FILTERS) -> list[ContaminationStatus]:
    """Per deployment with contaminated hits, ordered by its first: since when, and whether it is over (a holding
    key fix, as the same selection's fix_status says, counts)."""
    from specdec_core.analysis.fix_status import fix_status  # it reads this module's key schemes

    window = contamination_window(store, filters)
    if window.empty:
        return []
    fixed = {f.deployment: f.fixed_at for f in fix_status(store, filters) if f.holding}
    spans = df(store, logged_span_sql, filters, minute=logged_span_minute_sql).set_index("deployment")
    out = []
    for w in window.itertuples():
        span = spans.loc[w.deployment]
        out.append(ContaminationStatus(
            deployment=w.deployment, contaminated_hits=int(w.contaminated_hits),
            first_contaminated=pd.Timestamp(w.first_contaminated).to_pydatetime(),
            last_contaminated=pd.Timestamp(w.last_contaminated).to_pydatetime(),
            logs_begin=pd.Timestamp(span.logs_begin).to_pydatetime(),
            logs_end=pd.Timestamp(span.logs_end).to_pydatetime(),
            range_starts_at_filter=filters.start is not None, fixed_at=fixed.get(w.deployment),
        ))
    return sorted(out, key=lambda s: (s.first_contaminated, s.deployment))


# --- key-scheme changes ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class KeySchemeChange:
    """A deployment's cache keys changed shape: keys of the old prefix stop, keys of the new one start."""

    deployment: str
    ts: datetime  # the first key of the new shape
    old_prefix: str
    new_prefix: str
    old_last: datetime  # the last key of the old shape

    @property
    def label(self) -> str:
        """Short, for a chart: the prefixes are in `sentence`."""
        return f"{self.deployment or '(none)'}: key scheme changed"

    @property
    def sentence(self) -> str:
        return (f"{self.deployment or '(none)'}: keys changed from {self.old_prefix}:... (the last at "
                f"{fmt_time(self.old_last)}) to {self.new_prefix}:... from {fmt_time(self.ts)}.")


def key_shape(key: str) -> str:
    """SQL: the shape of the key `key` (a column): all but its last ':'-separated part."""
    return f"left({key}, length({key}) - strpos(reverse({key}), ':'))"


def key_shapes_sql(where: str) -> str:
    """A key's shape is all but its last ':'-separated part (the digest): `edge-b-v1:model_prompt:9f2c...`
    has the shape `edge-b-v1:model_prompt`. Keys without a ':' have no shape to compare."""
    return f"""
WITH keys AS (  -- each distinct key once: the shape is cut from a few thousand strings, not every request's
    SELECT {deployment_label()} AS deployment, r.cache_key, count(*) AS requests, min(r.ts) AS first_ts,
           max(r.ts) AS last_ts
    FROM requests r WHERE {where} AND contains(r.cache_key, ':') GROUP BY ALL
)
SELECT deployment, {key_shape("cache_key")} AS prefix,
       sum(requests) AS requests, min(first_ts) AS first_ts, max(last_ts) AS last_ts
FROM keys GROUP BY ALL ORDER BY deployment, first_ts
"""


def key_shapes_whole_sql(dims: str) -> str:
    """Without a time range: from summary_keys, which holds each key's requests and first and last use already."""
    return f"""
WITH keys AS (
    SELECT c.deployment, c.cache_key, sum(c.requests) AS requests, min(c.first_seen) AS first_ts,
           max(c.last_seen) AS last_ts
    FROM summary_keys c WHERE {dims} AND contains(c.cache_key, ':') GROUP BY ALL
)
SELECT deployment, {key_shape("cache_key")} AS prefix,
       sum(requests) AS requests, min(first_ts) AS first_ts, max(last_ts) AS last_ts
FROM keys GROUP BY ALL ORDER BY deployment, first_ts
"""


def key_scheme_changes(store: Store, filters: Filters = NO_FILTERS) -> list[KeySchemeChange]:
    """Each deployment's key-scheme changes: a new shape whose keys begin as the previous shape's stop.

    In a time range: those its own requests show, and those of the whole log that begin inside it. A change
    near the range's end has too few requests of the new shape inside it to count as a scheme, yet its fix
    is the one fix_status finds in the whole log and reports for the range."""
    changes = _scheme_changes(store, filters)
    if filters.start is None and filters.end is None:
        return changes
    seen = {(c.deployment, c.new_prefix) for c in changes}
    changes += [c for c in _scheme_changes(store, replace(filters, start=None, end=None))
                if (c.deployment, c.new_prefix) not in seen and (filters.start is None or c.ts >= filters.start)
                and (filters.end is None or c.ts <= filters.end)]
    return sorted(changes, key=lambda c: (c.ts, c.deployment))


def _scheme_changes(store: Store, filters: Filters) -> list[KeySchemeChange]:
    shapes = df(store, key_shapes_sql, filters, whole=key_shapes_whole_sql)
    shapes = shapes[shapes.requests >= SCHEME_MIN_REQUESTS]
    changes = []
    for deployment, rows in shapes.groupby("deployment", sort=True):
        ordered = list(rows.sort_values("first_ts").itertuples())
        for old, new in pairwise(ordered):
            old_last = pd.Timestamp(old.last_ts).to_pydatetime()
            started = pd.Timestamp(new.first_ts).to_pydatetime()
            if old_last <= started + SCHEME_OVERLAP:
                changes.append(KeySchemeChange(str(deployment), started, old.prefix, new.prefix, old_last))
    return sorted(changes, key=lambda c: (c.ts, c.deployment))
