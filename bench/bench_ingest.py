"""Ingest of 1M generated log rows beside DuckDB's bare read_json of the same file (the floor).

Targets: within 2x of the floor; peak memory of our ingest under 2 GB; and no slower than the release
before the appending store (`--release`, default 27d2936, on the DuckDB 2.0.1 it was built for, from the
side install `make install` keeps in .venv/duckdb-2.0.1): its code is taken from git into bench/out and
run in the same way, in the same run.
Each side runs in its own process so peak memory (max RSS) is measured per side.

    .venv/bin/python bench/bench_ingest.py [--rows 1000000] [--release REV]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
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
from specdec_core.ingestion.load import ingest
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


def run_side(code: str, log: Path, db: Path, cwd: Path = ROOT, env: dict[str, str] | None = None
             ) -> tuple[float, float]:
    db.unlink(missing_ok=True)
    seconds, peak_mb, _ = run_child(code, str(log), str(db), cwd=cwd, env=env)
    return seconds, peak_mb


def release_tree(rev: str) -> Path:
    """That revision's files (git archive), unpacked once under bench/out."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", rev], check=True, capture_output=True,
                         text=True).stdout.strip()
    tree = OUT / f"release-{sha}"
    if not (tree / "specdec_core").is_dir():
        archive = OUT / f"release-{sha}.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "-o", str(archive), sha, "specdec_core"], check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(tree, filter="data")
        archive.unlink()
    return tree


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--release", default="27d2936", help="the release to compare with ('' for none)")
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
    release = None
    side = ROOT / ".venv" / "duckdb-2.0.1"
    if args.release and side.is_dir():
        env = dict(os.environ, PYTHONPATH=str(side))  # its DuckDB before the venv's
        release = run_side(OURS, log, OUT / "bench-release.duckdb", cwd=release_tree(args.release), env=env)
    elif args.release:
        print(f"no {side}: run make install for the release's DuckDB 2.0.1; the release is not compared")
    print(f"\n{'':34}{'seconds':>10}{'peak MB':>10}")
    print(f"{'floor: read_json -> table':34}{base_s:>10.1f}{base_mb:>10.0f}")
    print(f"{'ours: specdec ingest':34}{ours_s:>10.1f}{ours_mb:>10.0f}")
    if release:
        print(f"{'release ' + args.release + ' (DuckDB 2.0.1)':34}{release[0]:>10.1f}{release[1]:>10.0f}")
    print(f"\nours / floor: {ours_s / base_s:.2f}x (target <= 2x)   peak memory: {ours_mb:.0f} MB (target < 2048)")
    if release:
        print(f"ours / release {args.release}: {ours_s / release[0]:.2f}x (target <= 1x: no slower)")
    print("ours also validates every field, quarantines, dedupes, fingerprints and finds each hit's source.")


if __name__ == "__main__":
    main()
