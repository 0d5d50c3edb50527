"""What the benchmarks share: timing one side in a fresh process, with that process's own peak memory; the
hostile lines and unknown fields their logs carry."""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parent.parent

# Lines every benchmark log ends with: each is quarantined, none stops an ingest.
HOSTILE = [
    '{"request_id": "bad-1", "ts": "2026-11-20T08:00:00Z", "temperature": "hot"',
    '{"request_id": "bad-2", "ts": "2026-11-20T08:00:00Z", "max_tokens": 99999999999999999999999999999}',
    '[1, 2, 3]',
    '{"request_id": "bad-3", "ts": "not a time", "output_text": null}',
]

# Ten fields we don't know, of mixed types, as services add them (trace ids, versions, user data).
UNKNOWN_FIELDS = """
    md5(request_id) AS trace_id, left(md5(request_id || 's'), 16) AS span_id, '4.2.' || (seq % 7) AS service_version,
    'u-' || (seq % 9973) AS user_id, ['us-east-1', 'eu-west-1', 'ap-south-1'][1 + seq % 3] AS region,
    seq % 3 AS retries, seq % 2 = 0 AS sampled, (seq % 1000) / 1e5 AS cost_usd,
    ['ab-test', 'v' || (seq % 5)] AS tags,
    {'team': 'search', 'experiment': {'arm': seq % 2, 'note': '{"looks": "like json"}'}} AS metadata
"""


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
