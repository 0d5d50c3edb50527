"""How the key auditor shows values and keys in one line of a finding."""

from __future__ import annotations

import json
from typing import Any

LIMIT = 60
# Characters shown on each side of the first difference between two keys.
CONTEXT = 12


def clip(text: str, limit: int = LIMIT) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def as_text(value: Any) -> str:
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)


def fmt(value: Any, limit: int = LIMIT) -> str:
    return clip(as_text(value), limit)


def _first_difference(a: Any, b: Any) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def _around(text: Any, at: int) -> str:
    window = text[max(0, at - CONTEXT) : at + CONTEXT + 1]
    if isinstance(window, bytes):
        window = window.decode("utf-8", "backslashreplace")
    shown = repr(window)[1:-1] if isinstance(window, str) else str(window)
    return ("…" if at > CONTEXT else "") + shown + ("…" if at + CONTEXT + 1 < len(text) else "")


def two_keys(a: Any, b: Any, *, shown_as_is: bool = False) -> tuple[str, str, str]:
    """(a, b, where) for a finding: both keys clipped, and where they first differ when clipping
    could hide it (" (they differ at position N: …ctx vs …ctx)"), else "". `shown_as_is`: a and b
    are already texts to show (a key's canonical text), not keys to render."""
    text_a, text_b = (a, b) if shown_as_is else (as_text(a), as_text(b))
    shown_a, shown_b = clip(text_a), clip(text_b)
    if shown_a == text_a and shown_b == text_b:
        return shown_a, shown_b, ""
    # Index into the keys themselves when they are text, so the position means something to the reader.
    same_kind = isinstance(a, str) and isinstance(b, str) or isinstance(a, bytes) and isinstance(b, bytes)
    left, right = (a, b) if same_kind else (text_a, text_b)
    at = _first_difference(left, right)
    where = f" (they differ at position {at + 1}: {_around(left, at)} vs {_around(right, at)})"
    return shown_a, shown_b, where
