"""Ingest of 1M generated log rows beside DuckDB's bare read_json of the same file (the floor).

Targets: within 2x of the floor; peak memory of our ingest under 2 GB.
Each side runs in its own process so peak memory (max RSS) is measured per side.

    .venv/bin/python bench/bench_ingest.py [--rows 1000000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, ROOT, run_child  # noqa: E402

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


def run_side(code: str, log: Path, db: Path) -> tuple[float, float]:
    db.unlink(missing_ok=True)
    seconds, peak_mb, _ = run_child(code, str(log), str(db))
    return seconds, peak_mb


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
    base_s, base_mb = run_side(BASELINE, log, OUT / "bench-floor.duckdb")
    ours_s, ours_mb = run_side(OURS, log, OUT / "bench-ingest.duckdb")
    print(f"\n{'':28}{'seconds':>10}{'peak MB':>10}")
    print(f"{'floor: read_json -> table':28}{base_s:>10.1f}{base_mb:>10.0f}")
    print(f"{'ours: specdec ingest':28}{ours_s:>10.1f}{ours_mb:>10.0f}")
    print(f"\nours / floor: {ours_s / base_s:.2f}x (target <= 2x)   peak memory: {ours_mb:.0f} MB (target < 2048)")
    print("ours also validates every field, quarantines, dedupes, fingerprints and finds each hit's source.")


if __name__ == "__main__":
    main()
