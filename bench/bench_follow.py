"""Lag of `specdec ingest --follow` under sustained traffic: what the dashboard's Live view shows.

A writer appends 5,000 lines a second to a log (each stamped with the time it is written: live traffic,
with ten unknown fields, duplicate timestamps and a hostile line now and then), `specdec ingest --follow`
loads it, and a reader asks the store every half second what the dashboard's Live toggle asks
(`freshness`: the newest request's time) and how far that lags behind now. Run into an empty store and
into one that already holds 1M rows, in the same run, for a DuckDB file and a DuckLake store. Target: the
lag stays at most 5 s.

    .venv/bin/python bench/bench_follow.py [--seconds 60] [--rate 5000] [--sizes 0,1000000] [--kinds file,lake]
                                           [--base STORE]

`--base STORE` follows into a copy of that store (a file, e.g. bench_scale.py's 20M one) instead of one of
`--sizes` rows.
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_append import base_store, live_lines, store_name  # noqa: E402
from common import HOSTILE, OUT, ROOT  # noqa: E402


def _templates() -> list[dict]:
    records = []
    for line in live_lines(20_000).read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and str(record.get("request_id", "")).startswith("live-"):
            records.append(record)
    return records


def write_traffic(log: Path, rate: int, seconds: float, stop: threading.Event, written: list[int]) -> None:
    """Append `rate` lines a second in ten slices a second, each line stamped with the time it is written."""
    templates = _templates()
    n, started = 0, time.monotonic()
    with open(log, "a", encoding="utf-8") as fh:
        while not stop.is_set() and time.monotonic() - started < seconds:
            due = int((time.monotonic() - started) * rate) + rate // 10
            now = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
            lines = []
            while n < due:
                record = dict(templates[n % len(templates)], request_id=f"follow-{n}", ts=now)
                lines.append(json.dumps(record))
                if n % 1000 == 999:
                    lines.append(HOSTILE[n // 1000 % len(HOSTILE)])
                n += 1
            fh.write("\n".join(lines) + "\n")
            fh.flush()
            time.sleep(0.1)
    written.append(n)


def run(size: int, rate: int, seconds: float, kind: str = "file", base: Path | None = None) -> dict:
    """Follow the live log into a copy of `base` (bench_append's store of `size` rows when None)."""
    from specdec_core.analysis import freshness
    from specdec_core.store import Store
    from specdec_core.store.connection import StoreError

    work, log = OUT / f"follow-work.{kind}", OUT / "follow-live.jsonl"
    shutil.rmtree(work, ignore_errors=True)
    for leftover in (work, log, Path(str(work) + ".lock")):
        leftover.unlink(missing_ok=True)
    if size:
        (shutil.copyfile if kind == "file" else shutil.copytree)(base or base_store(size, kind), work)
    db = store_name(work, kind)
    log.touch()
    follower = subprocess.Popen([sys.executable, "-m", "specdec_core", "ingest", "--follow", str(log), "--db", str(db),
                                 "--every", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stop, written = threading.Event(), []
    time.sleep(3)  # the follower's start (imports, first poll), as an on-call engineer would start it first
    writer = threading.Thread(target=write_traffic, args=(log, rate, seconds, stop, written))
    started, started_at = time.monotonic(), datetime.now(timezone.utc)
    writer.start()
    lags = []
    while writer.is_alive():
        time.sleep(0.5)
        try:
            fresh = freshness(Store(db))
        except StoreError:
            continue
        if fresh.lag_seconds is not None and time.monotonic() - started > 5:
            # Before its first batch lands the newest row is the base store's (hours or days old): the lag is
            # then the time since the first line was written.
            loading = fresh.newest is not None and fresh.newest >= started_at
            lags.append(fresh.lag_seconds if loading else (datetime.now(timezone.utc) - started_at).total_seconds())
    writer.join()
    # Then it catches up: every line written is loaded.
    deadline = time.monotonic() + 60
    expected = written[0] + size
    while time.monotonic() < deadline:
        time.sleep(0.5)
        try:
            if freshness(Store(db)).requests >= expected:
                break
        except StoreError:
            pass
    follower.send_signal(signal.SIGINT)
    output = follower.communicate(timeout=60)[0]
    loaded = freshness(Store(db)).requests - size
    (OUT / f"follow-{kind}-{size}.out").write_text(output)
    return {"lags": lags, "written": written[0], "loaded": loaded,
            "tail": output.strip().splitlines()[-1] if output.strip() else ""}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--rate", type=int, default=5000)
    parser.add_argument("--sizes", default="0,1000000")
    parser.add_argument("--kinds", default="file,lake", help="kinds of store: file, lake, or both")
    parser.add_argument("--base", type=Path, help="follow into a copy of this store file instead")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    runs = [(k, int(s)) for k in args.kinds.split(",") for s in args.sizes.split(",")]
    if args.base:
        from specdec_core.analysis import freshness
        from specdec_core.store import Store

        runs = [("file", freshness(Store(args.base)).requests)]
    OUT.mkdir(exist_ok=True)
    print(f"{'kind':>5}{'store':>12}{'lines':>9}{'loaded':>9}{'lag p50':>9}{'p95':>7}{'max':>7}  (seconds; {args.rate:,} lines/s "
          f"for {args.seconds:.0f} s)")
    for kind, size in runs:
        r = run(size, args.rate, args.seconds, kind, base=args.base)
        lags = sorted(r["lags"])
        p95 = lags[int(0.95 * (len(lags) - 1))] if lags else float("nan")
        print(f"{kind:>5}{size:>12,}{r['written']:>9,}{r['loaded']:>9,}{statistics.median(lags) if lags else float('nan'):>9.1f}"
              f"{p95:>7.1f}{max(lags, default=float('nan')):>7.1f}   last status: {r['tail']}")
    print(f"\ntarget: lag at most 5 s at {args.rate:,} lines/s")


if __name__ == "__main__":
    main()
