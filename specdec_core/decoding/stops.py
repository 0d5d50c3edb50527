"""Where a stop sequence cuts an output: the in-process decoder and the engine client cut alike."""

from __future__ import annotations

from collections.abc import Sequence


def cut_at_stop(text: str, stops: Sequence[str] | None) -> int | None:
    hits = [i for i in (text.find(s) for s in (stops or ()) if s) if i >= 0]
    return min(hits) if hits else None
