"""Ingest of 1M generated log rows beside DuckDB's bare read_json of the same file (the floor).

Targets: within 2x of the floor; peak memory of our ingest under 2 GB.
Each side runs in its own process so peak memory (max RSS) is measured per side.

    .venv/bin/python bench/bench_ingest.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parent.parent

BASELINE = """
import duckdb, sys
con = duckdb.connect(sys.argv[2])
con.execute("SET enable_progress_bar = false")
con.execute("CREATE TABLE t AS SELECT * FROM read_json(?)", [sys.argv[1]])
con.close()
"""

OURS = """
import sys, time
from specdec_core.store.ingest import ingest
from specdec_core.store.connection import Store
phases, last = [], [time.perf_counter(), "opening the store"]
def progress(step, total, what):
    now = time.perf_counter()
    phases.append((last[1].split(" ")[0], now - last[0]))
    last[:] = [now, what]
r = ingest(Store(sys.argv[2]), [sys.argv[1]], progress=progress)
assert r.accepted + r.duplicates + r.quarantined == r.read, r
print("ours by phase: " + ", ".join(f"{what} {s:.1f} s" for what, s in phases[1:]), file=sys.stderr)
"""


def run_child(code: str, log: Path, db: Path) -> tuple[float, float]:
    """(seconds, peak MB) of one side, in a fresh process."""
    db.unlink(missing_ok=True)
    # GNU time reports the child's own peak RSS; a child forked from this (large) process would
    # inherit this process's high-water mark instead.
    peak_file = db.with_suffix(".peak")
    started = time.perf_counter()
    subprocess.run(["/usr/bin/time", "-f", "%M", "-o", str(peak_file), sys.executable, "-c", code, str(log),
                    str(db)], check=True, cwd=ROOT)
    seconds = time.perf_counter() - started
    return seconds, int(peak_file.read_text().split()[-1]) / 1024


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from specdec_core.demo.synthetic import make_synthetic_log

    OUT.mkdir(exist_ok=True)
    log = OUT / f"synthetic-{args.rows}.jsonl"
    if not log.exists():
        t = time.perf_counter()
        make_synthetic_log(log, args.rows)
        print(f"generated {args.rows:,} rows ({log.stat().st_size / 1e6:.0f} MB) in {time.perf_counter() - t:.1f} s")
    base_s, base_mb = run_child(BASELINE, log, OUT / "bench-floor.duckdb")
    ours_s, ours_mb = run_child(OURS, log, OUT / "bench-ingest.duckdb")
    print(f"\n{'':28}{'seconds':>10}{'peak MB':>10}")
    print(f"{'floor: read_json -> table':28}{base_s:>10.1f}{base_mb:>10.0f}")
    print(f"{'ours: specdec ingest':28}{ours_s:>10.1f}{ours_mb:>10.0f}")
    print(f"\nours / floor: {ours_s / base_s:.2f}x (target <= 2x)   peak memory: {ours_mb:.0f} MB (target < 2048)")
    print("ours also validates every field, quarantines, dedupes, fingerprints and finds each hit's source.")


if __name__ == "__main__":
    main()
