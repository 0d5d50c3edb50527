"""Copies of a request that are the same request: a correct key gives each the same key.

They differ only in what the values cannot see: dict order at every depth, and which
equal strings are one object. A request built in code shares its string constants; one
decoded from JSON does not (except dict keys, which the decoder memoizes); a key that
pickles or marshals its argument sees that difference.
"""

from __future__ import annotations

import json
from typing import Any


def reordered(value: Any) -> Any:
    """Every dict's keys in reverse order, at every depth (inside lists too)."""
    if isinstance(value, dict):
        return {k: reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [reordered(v) for v in value]
    return value


def has_reorderable(value: Any) -> bool:
    if isinstance(value, dict):
        return len(value) > 1 or any(has_reorderable(v) for v in value.values())
    if isinstance(value, list):
        return any(has_reorderable(v) for v in value)
    return False


def json_round_trip(value: Any) -> Any | None:
    """The request as a service decoding it from JSON sees it, or None where JSON would change
    its values (tuples, non-str dict keys, NaN): that copy would be another request."""
    try:
        decoded = json.loads(json.dumps(value))
    except (TypeError, ValueError):
        return None
    return decoded if decoded == value else None


def _map_strings(value: Any, fresh: Any) -> Any:
    if isinstance(value, str):
        return fresh(value)
    if isinstance(value, dict):
        return {fresh(k) if isinstance(k, str) else k: _map_strings(v, fresh) for k, v in value.items()}
    if isinstance(value, list):
        return [_map_strings(v, fresh) for v in value]
    return value


def shared_strings(value: Any) -> Any:
    """A copy in which equal strings, keys and values alike, are one object."""
    seen: dict[str, str] = {}
    return _map_strings(value, lambda s: seen.setdefault(s, s))


def _new_object(text: str) -> str:
    # Slicing and concatenating builds a new object; CPython keeps "" and 1-character strings unique.
    return text[:1] + text[1:] if len(text) > 1 else text


def distinct_strings(value: Any) -> Any:
    """A copy in which every string of two or more characters is an object of its own."""
    return _map_strings(value, _new_object)
