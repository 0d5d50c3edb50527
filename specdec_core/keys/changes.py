"""Semantic changes of a request's fields: each must change a correct key.

The auditor changes one field at a time; a change the key function accepts that leaves
the key unchanged is a field the key misses.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from specdec_core.keys.render import fmt


@dataclass(frozen=True)
class Change:
    """One semantic change of a field. `path` is what changed (`stop[0]`, `meta.trace`),
    `alternatives` are candidate new values of the whole top-level field. The change counts
    as covered when any alternative the key function accepts changes the key; there are
    several only where the value's type is unknown (null, an empty list)."""

    path: str
    description: str
    alternatives: tuple[Any, ...]


# Candidates for a value of unknown type: the key function rejects those of the wrong type.
ANY_TYPE: tuple[Any, ...] = (1, "x", ["x"], 0.5, True, {"x": 1})


def _scalar_changes(value: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """(description, alternatives) for a leaf value; each is a clearly semantic change."""
    if value is None:
        return [("null -> a value", ANY_TYPE)]
    if isinstance(value, bool):
        return [(f"{fmt(value)} -> {fmt(not value)}", (not value,))]
    if isinstance(value, int):
        news: list[Any] = [value + 1, value * 2]
    elif isinstance(value, float):
        # Far above the 6-decimal rounding a correct key may apply.
        news = [round(value + 0.1, 9), round(value - 0.1, 9), value * 2, value / 2]
    elif isinstance(value, str):
        news = [value + "-x", "x-" + value] if value else ["x"]
    else:
        return []
    out: list[tuple[str, tuple[Any, ...]]] = []
    seen: list[Any] = []
    for new in news:
        if new != value and new not in seen:
            seen.append(new)
            out.append((f"{fmt(value)} -> {fmt(new)}", (new,)))
    return out


def _new_element(items: list[Any]) -> tuple[Any, ...]:
    """Candidates for an element to append: new (a list may be a set), of the last element's type."""
    last = items[-1]
    if isinstance(last, str):
        candidate, n = last + "-x", 0
        while candidate in items:
            n += 1
            candidate = f"{last}-x{n}"
        return (candidate,)
    if isinstance(last, (int, float)) and not isinstance(last, bool):
        return (max(x for x in items if isinstance(x, (int, float))) + 1,)
    if isinstance(last, dict):
        changed = next(changes(last, "_"), None)
        return (changed.alternatives[0],) if changed else ({"x": 1},)
    return ANY_TYPE


def changes(value: Any, path: str) -> Iterator[Change]:
    """Every semantic change of `value` found at `path`; alternatives are new values of `value`."""
    if isinstance(value, dict):
        if not value:
            yield Change(path, '{} -> {"x": 1}', ({"x": 1},))
        for key in value:
            for sub in changes(value[key], f"{path}.{key}"):
                yield Change(
                    sub.path, sub.description, tuple({**value, key: alt} for alt in sub.alternatives)
                )
    elif isinstance(value, list):
        if not value:
            yield Change(path, "[] -> one element", tuple([alt] for alt in ANY_TYPE))
            return
        new = _new_element(value)
        what = f"appending {fmt(new[0])}" if len(new) == 1 else "appending an element"
        yield Change(f"{path}[+]", what, tuple(value + [e] for e in new))
        for index in sorted({0, len(value) - 1}):
            for sub in changes(value[index], f"{path}[{index}]"):
                yield Change(
                    sub.path,
                    sub.description,
                    tuple(value[:index] + [alt] + value[index + 1 :] for alt in sub.alternatives),
                )
    else:
        for description, alternatives in _scalar_changes(value):
            yield Change(path, description, alternatives)


def is_ignored(path: str, ignore: Iterable[str]) -> bool:
    return any(path == ig or path.startswith((ig + ".", ig + "[")) for ig in ignore)
