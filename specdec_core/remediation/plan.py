"""The purge plan: which cache keys to remove from production, and why, from the contamination the store holds.

One entry per (deployment, cache key) that served a contaminated hit (`contaminated`) or that several
identities shared without a contaminated hit seen yet (`collision`). A key with one identity and no
contaminated hit is never in a plan: it served only its own identity."""

from __future__ import annotations

import json
import os
import re
import shlex
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from specdec_core.analysis.query import NO_FILTERS, Filters, df
from specdec_core.analysis.status import rfc3339_ms
from specdec_core.contract.names import DEFAULT_KEY_TEMPLATE
from specdec_core.derived.aliases import resolved_keys, resolved_request_keys, resolved_rows
from specdec_core.derived.summaries import key_hash
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label

REASONS = ("contaminated", "collision")
_PLACEHOLDER = re.compile(r"\{(cache_key|deployment)\}")


class PlanError(ValueError):
    """A plan that can't be made or read: one line saying what and where."""


@dataclass(frozen=True)
class PlanEntry:
    deployment: str
    cache_key: str
    redis_key: str
    reason: str  # "contaminated" | "collision"
    identities: int
    contaminated_hits: int
    first_contaminated: datetime | None  # None for a collision: no contaminated hit was seen
    last_seen: datetime

    def to_json(self) -> dict[str, Any]:
        return {"deployment": self.deployment, "cache_key": self.cache_key, "redis_key": self.redis_key,
                "reason": self.reason, "identities": self.identities, "contaminated_hits": self.contaminated_hits,
                "first_contaminated": rfc3339(self.first_contaminated), "last_seen": rfc3339(self.last_seen)}


@dataclass(frozen=True)
class PlanCounts:
    keys: int
    contaminated: int
    collision: int

    def to_json(self) -> dict[str, int]:
        return {"keys": self.keys, "contaminated": self.contaminated, "collision": self.collision}


def rfc3339(ts: datetime | None) -> str | None:
    return None if ts is None else rfc3339_ms(ts)


def check_key_template(template: str) -> str:
    """The template itself, or PlanError: it must place the logged key once. Other braces are literal (a
    Cluster hash tag such as `{tenant}` is part of many real keys)."""
    if template.count("{cache_key}") != 1:
        raise PlanError(f"--key-template {template!r}: must hold {{cache_key}} exactly once "
                        "(and may hold {deployment})")
    return template


def redis_key(template: str, deployment: str, cache_key: str) -> str:
    """The key in the cache for a logged key: the template with its two placeholders filled, in one pass
    (a logged key that itself holds the text `{deployment}` stays as it is)."""
    values = {"cache_key": cache_key, "deployment": deployment}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


# Every key of the selection that served a contaminated hit or more than one identity; contamination itself
# was judged over the whole log at ingest (hit_sources), the filters choose which requests count.
def plan_sql(where: str) -> str:
    return f"""
WITH k AS (
    SELECT {deployment_label()} AS deployment, r.cache_key,
           count(DISTINCT r.fingerprint) AS identities,
           count(*) FILTER (WHERE h.contaminated) AS contaminated_hits,
           min(r.ts) FILTER (WHERE h.contaminated) AS first_contaminated,
           min(r.ts) AS first_seen, max(r.ts) AS last_seen
    FROM {resolved_rows()} r LEFT JOIN hit_sources h USING (request_id)
    WHERE r.cache_key IS NOT NULL AND {where}
    GROUP BY ALL
)
SELECT * FROM k WHERE contaminated_hits > 0 OR identities > 1
ORDER BY first_contaminated NULLS LAST, first_seen, deployment, cache_key
"""


def plan_whole_sql(dims: str) -> str:
    """The same keys without a time range, from the summaries: the contaminated hits' keys (summary_contaminated)
    and the keys more than one identity used (summary_shared_keys, which holds every key that could), then
    those keys' rows of summary_keys for their identities and first and last use."""
    return f"""
WITH hits AS (
    SELECT c.deployment, c.cache_key, count(*) AS contaminated_hits, min(c.ts) AS first_contaminated
    FROM summary_contaminated c WHERE {dims} AND c.cache_key IS NOT NULL GROUP BY ALL
), shared AS (
    SELECT c.deployment, c.cache_key FROM {resolved_keys('summary_shared_keys')} c
    WHERE {dims} AND c.cache_key IS NOT NULL GROUP BY ALL HAVING count(DISTINCT c.fingerprint) > 1
), listed AS (
    SELECT deployment, cache_key FROM hits UNION SELECT deployment, cache_key FROM shared
), k AS (
    SELECT c.deployment, c.cache_key, count(DISTINCT c.fingerprint) AS identities,
           min(c.first_seen) AS first_seen, max(c.last_seen) AS last_seen
    FROM {resolved_keys()} c SEMI JOIN listed USING (deployment, cache_key) WHERE {dims} GROUP BY ALL
)
SELECT k.deployment, k.cache_key, k.identities, coalesce(hits.contaminated_hits, 0) AS contaminated_hits,
       hits.first_contaminated, k.first_seen, k.last_seen
FROM k LEFT JOIN hits USING (deployment, cache_key)
ORDER BY first_contaminated NULLS LAST, first_seen, deployment, cache_key
"""


def plan_ranged_sql(where: str) -> str:
    """The same keys with a time range (`where`: the filters over the summaries, `c`), from the time-ordered
    summaries: each key's identities and first and last use from summary_request_keys (their 64-bit hashes,
    named again from summary_keys), its contaminated hits from summary_contaminated. The rows' join with
    hit_sources took 1.9-2.4 s at 20M rows for two hours of them."""
    return f"""
WITH used AS (
    SELECT c.deployment, c.key_hash, count(DISTINCT c.identity_hash) AS identities,
           min(c.ts) AS first_seen, max(c.ts) AS last_seen
    FROM {resolved_request_keys()} c WHERE {where} GROUP BY ALL
), hits AS (
    SELECT c.deployment, c.cache_key, count(*) AS contaminated_hits, min(c.ts) AS first_contaminated
    FROM summary_contaminated c WHERE {where} AND c.cache_key IS NOT NULL GROUP BY ALL
), named AS (
    SELECT DISTINCT c.deployment, c.cache_key, {key_hash("c.deployment", "c.cache_key")} AS key_hash
    FROM summary_keys c WHERE c.cache_key IS NOT NULL
), k AS (SELECT n.deployment, n.cache_key, u.identities, u.first_seen, u.last_seen FROM used u JOIN named n
         USING (deployment, key_hash))
SELECT k.deployment, k.cache_key, k.identities, coalesce(hits.contaminated_hits, 0) AS contaminated_hits,
       hits.first_contaminated, k.first_seen, k.last_seen
FROM k LEFT JOIN hits USING (deployment, cache_key)
WHERE hits.contaminated_hits > 0 OR k.identities > 1
ORDER BY first_contaminated NULLS LAST, first_seen, deployment, cache_key
"""


def _instant(value: Any) -> datetime | None:
    if value is None or value is pd.NaT or (not isinstance(value, str) and pd.isna(value)):
        return None
    moment = pd.Timestamp(value).to_pydatetime()
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=timezone.utc)


def purge_plan(store: Store, filters: Filters = NO_FILTERS,
               key_template: str = DEFAULT_KEY_TEMPLATE) -> list[PlanEntry]:
    """The keys to remove, in order of their first contaminated hit (collisions last, by first use)."""
    check_key_template(key_template)
    rows = df(store, plan_sql, filters, whole=plan_whole_sql, summarized=plan_ranged_sql)
    entries = []
    for row in rows.itertuples(index=False):
        hits = int(row.contaminated_hits)
        entries.append(PlanEntry(
            deployment=str(row.deployment), cache_key=str(row.cache_key),
            redis_key=redis_key(key_template, str(row.deployment), str(row.cache_key)),
            reason="contaminated" if hits else "collision", identities=int(row.identities),
            contaminated_hits=hits, first_contaminated=_instant(row.first_contaminated) if hits else None,
            last_seen=_instant(row.last_seen)))
    return entries


def plan_counts(entries: Iterable[PlanEntry]) -> PlanCounts:
    entries = list(entries)
    contaminated = sum(1 for e in entries if e.reason == "contaminated")
    return PlanCounts(keys=len(entries), contaminated=contaminated, collision=len(entries) - contaminated)


def plan_jsonl(entries: Iterable[PlanEntry]) -> str:
    """The plan file's text: one JSON object a line."""
    return "".join(json.dumps(e.to_json(), ensure_ascii=False) + "\n" for e in entries)


def write_plan(entries: Iterable[PlanEntry], path: str | os.PathLike[str]) -> int:
    """Write the plan next to its final name and rename it there: a reader never sees half a plan."""
    target = Path(path)
    text = plan_jsonl(entries)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return text.count("\n")


def read_plan_keys(path: str | os.PathLike[str]) -> list[str]:
    """The `redis_key`s of a plan file, each once, in the plan's order. A line that is not a JSON object with
    a text `redis_key` is a PlanError naming the file and line, raised before anything is touched."""
    keys: dict[str, None] = {}
    for number, line in _lines(path):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
        except ValueError as exc:
            raise PlanError(f"{path}:{number}: not JSON ({exc.args[0].split(':')[0]})") from None
        if not isinstance(entry, dict):
            raise PlanError(f"{path}:{number}: expected a JSON object, got {type(entry).__name__}")
        key = entry.get("redis_key")
        if not isinstance(key, str) or not key:
            raise PlanError(f"{path}:{number}: no redis_key (a non-empty string) in this line")
        keys.setdefault(key, None)
    return list(keys)


def _lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, str]]:
    try:
        with open(path, encoding="utf-8") as fh:
            yield from enumerate(fh, start=1)
    except UnicodeDecodeError as exc:
        raise PlanError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    except OSError as exc:
        raise PlanError(f"{path}: cannot read the plan: {exc.strerror or exc}") from None


PLACEHOLDER_REDIS_URL = "redis://HOST:6379/0"


def purge_command(plan_file: str, *, redis_url: str = PLACEHOLDER_REDIS_URL, dry_run: bool = False,
                  backup: str | None = None, db: str | None = None) -> str:
    """The `specdec cache purge` command line for a plan file, quoted for a POSIX shell."""
    words = ["specdec", "cache", "purge", "--plan", plan_file, "--redis", redis_url]
    if dry_run:
        words.append("--dry-run")
    if backup:
        words += ["--backup", backup]
    if db:
        words += ["--db", db]
    return " ".join(shlex.quote(w) for w in words)
