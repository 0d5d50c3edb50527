"""Annotations on time charts: deploys and fixes a user names (a file, or lines typed in the sidebar),
and the first and last contaminated hit the store finds per deployment."""

from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from datetime import datetime, timezone

from specdec_core.analysis.contamination import contamination_window
from specdec_core.analysis.query import NO_FILTERS, Filters, selection_time
from specdec_core.analysis.status import KeySchemeChange, key_scheme_changes
from specdec_core.store.connection import Store
from specdec_core.text import ascii_digits


@dataclass(frozen=True)
class Annotation:
    ts: datetime
    label: str
    deployment: str | None = None  # None: every deployment
    # note (a user's), or detected: contamination_start, contamination_end, key_scheme_change
    kind: str = "note"


def _time(text: str) -> datetime:
    value = text.strip()
    if ascii_digits(value):  # epoch milliseconds, as the log contract allows
        return datetime.fromtimestamp(int(value) / 1000, tz=timezone.utc)
    return selection_time(value)


def _one(ts: object, deployment: object, label: object, where: str) -> Annotation:
    if ts is None or not str(ts).strip():
        raise ValueError(f"{where}: no time")
    try:
        when = _time(str(ts))
    except ValueError:
        raise ValueError(f"{where}: {str(ts)[:40]!r} is no time (write 2026-03-01T10:05:00Z)") from None
    text = str(label or "").strip()
    if not text:
        raise ValueError(f"{where}: no label")
    name = str(deployment).strip() if deployment is not None else ""
    return Annotation(when, text[:80], name or None)


def parse_annotations(text: str) -> tuple[list[Annotation], list[str]]:
    """Annotations from text: JSON (a list of {ts, deployment, label}) or lines `time, deployment, label`
    (a header line naming ts is skipped; an empty deployment means all). Returns them and one error per
    line that could not be read."""
    found: list[Annotation] = []
    errors: list[str] = []
    stripped = text.strip()
    if stripped.startswith("["):
        try:
            items = json.loads(stripped)
        except json.JSONDecodeError as exc:
            return [], [f"not JSON: {exc}"]
        for n, item in enumerate(items, 1):
            try:
                if not isinstance(item, dict):
                    raise ValueError(f"item {n}: an object with ts, deployment, label")
                found.append(_one(item.get("ts"), item.get("deployment"), item.get("label"), f"item {n}"))
            except ValueError as exc:
                errors.append(str(exc))
        return found, errors
    for n, cells in enumerate(csv.reader(io.StringIO(text), skipinitialspace=True), 1):
        if not cells or not any(c.strip() for c in cells) or cells[0].lstrip().startswith("#"):
            continue
        if n == 1 and cells[0].strip().lower() in ("ts", "time"):
            continue
        try:
            if len(cells) < 3:
                raise ValueError(f"line {n}: time, deployment, label")
            found.append(_one(cells[0], cells[1], ",".join(cells[2:]), f"line {n}"))
        except ValueError as exc:
            errors.append(str(exc))
    return found, errors


def contamination_annotations(store: Store, filters: Filters = NO_FILTERS) -> list[Annotation]:
    """The first and last contaminated hit of each deployment, as annotations."""
    out: list[Annotation] = []
    for w in contamination_window(store, filters).itertuples():
        name = w.deployment or "(none)"
        out.append(Annotation(w.first_contaminated.to_pydatetime(), f"{name}: first contaminated hit",
                              w.deployment, "contamination_start"))
        if w.last_contaminated != w.first_contaminated:
            out.append(Annotation(w.last_contaminated.to_pydatetime(), f"{name}: last contaminated hit",
                                  w.deployment, "contamination_end"))
    return out


def scheme_change_annotations(changes: list[KeySchemeChange]) -> list[Annotation]:
    """Key-scheme changes (a fix or a deploy, as the keys show it) as annotations."""
    return [Annotation(c.ts, c.label, c.deployment, "key_scheme_change") for c in changes]


def key_scheme_annotations(store: Store, filters: Filters = NO_FILTERS) -> list[Annotation]:
    """Each deployment's key-scheme changes, as annotations."""
    return scheme_change_annotations(key_scheme_changes(store, filters))


def detected_annotations(store: Store, filters: Filters = NO_FILTERS) -> list[Annotation]:
    """What the data marks on its own: the contamination's first and last hits, and key-scheme changes."""
    return sorted(contamination_annotations(store, filters) + key_scheme_annotations(store, filters),
                  key=lambda a: a.ts)


def annotations_for(annotations: list[Annotation], deployment: str | None) -> list[Annotation]:
    """Those that belong on a chart of one deployment (None: a chart of all of them)."""
    return [a for a in annotations if deployment is None or a.deployment in (None, deployment)]
