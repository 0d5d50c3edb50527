"""The order the suite's modules go out to the workers in: the longest first, from the times a run recorded
(tests/durations.json), so the workers finish together; a module with no recorded time yet goes first."""

from __future__ import annotations

import json
from pathlib import Path

DURATIONS = Path(__file__).with_name("durations.json")


def recorded_durations(path: Path = DURATIONS) -> dict[str, float]:
    """Seconds per module (its node id, `tests/x/test_y.py`), as last recorded; none when the file is missing."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def longest_first(modules: list[str], durations: dict[str, float]) -> list[str]:
    """Modules without a recorded time first (in their usual order), then the others by time, longest first."""
    unknown = [m for m in modules if m not in durations]
    known = sorted((m for m in modules if m in durations), key=lambda m: -durations[m])
    return unknown + known


def write_durations(seconds: dict[str, float], path: Path = DURATIONS) -> None:
    """Record this run's modules over the file's, keeping the modules this run didn't run."""
    durations = {**recorded_durations(path), **{module: round(s, 1) for module, s in seconds.items()}}
    path.write_text(json.dumps(dict(sorted(durations.items())), indent=1) + "\n", encoding="utf-8")
