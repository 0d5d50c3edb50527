"""What the benchmarks share: timing one side in a fresh process, with that process's own peak memory."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parent.parent


def run_child(code: str, *args: str, cwd: Path = ROOT, env: dict[str, str] | None = None) -> tuple[float, float, str]:
    """(seconds, peak MB, stdout) of `python -c code args...` in a fresh process.

    GNU time reports the child's own peak RSS; a child forked from this (large) process would
    inherit this process's high-water mark instead. `cwd` comes first on the child's module path.
    """
    OUT.mkdir(exist_ok=True)
    peak = OUT / "child.peak"
    started = time.perf_counter()
    done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(peak), sys.executable, "-c", code, *args],
                          check=True, cwd=cwd, env=env, capture_output=True, text=True)
    if done.stderr.strip():
        print(done.stderr.strip(), file=sys.stderr)
    return time.perf_counter() - started, int(peak.read_text().split()[-1]) / 1024, done.stdout.strip()


def median_seconds(fn, runs: int = 3) -> float:
    """The median wall time of `runs` calls of fn()."""
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)
