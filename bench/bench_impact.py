"""Each `specdec impact` answer on a large synthetic store, beside the Overview's headline on the same store.

    .venv/bin/python bench/bench_impact.py [--rows 5000000] [--db STORE] [--rebuild]

Builds bench/out/impact-<rows>.duckdb once (specdec_core.demo.synthetic writes the log: 200 consumers, two
experiment arms; ingest loads it) and reuses it. Each question is timed in this process: its first call,
then the median of three (the dashboard caches nothing between filters it has not seen). Target: each
impact answer < 0.5 s. The incident report, which reads the whole log for its appendix, is timed apart.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parent.parent
sys.path.insert(0, str(ROOT))

from common import median_seconds  # noqa: E402

from specdec_core.analysis import headline  # noqa: E402
from specdec_core.analysis.impact import experiment_impact, impact  # noqa: E402
from specdec_core.demo.synthetic import make_synthetic_log  # noqa: E402
from specdec_core.derived import migrate  # noqa: E402
from specdec_core.ingestion import ingest  # noqa: E402
from specdec_core.store import Store  # noqa: E402

TARGET_S = 0.5
START = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)


def build_store(rows: int, rebuild: bool) -> Store:
    store = Store(OUT / f"impact-{rows}.duckdb")
    if store.exists and not rebuild:
        migrate(store)  # one kept from an older version is brought up to date before anything is timed
        return store
    OUT.mkdir(exist_ok=True)
    store.path.unlink(missing_ok=True)
    log = OUT / f"impact-{rows}.jsonl"
    t0 = time.perf_counter()
    make_synthetic_log(log, rows, start=START)
    t1 = time.perf_counter()
    result = ingest(store, [str(log)])
    t2 = time.perf_counter()
    log.unlink()
    print(f"generated {rows:,} rows in {t1 - t0:.0f} s; ingested in {t2 - t1:.0f} s ({result.accepted:,} accepted)")
    return store


QUESTIONS = {
    "Overview headline": lambda s: headline(s),
    "impact --by consumer": lambda s: impact(s, "consumer"),
    "impact --by experiment": lambda s: impact(s, "experiment"),
    "impact --by deployment": lambda s: impact(s, "deployment"),
    "impact --experiments": lambda s: experiment_impact(s),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--db", help="time this store instead of building one")
    parser.add_argument("--rebuild", action="store_true")
    parser.add_argument("--report", action="store_true", help="also time the incident report (Markdown)")
    args = parser.parse_args()
    store = Store(args.db) if args.db else build_store(args.rows, args.rebuild)
    with store.read() as con:
        rows = con.execute("SELECT count(*) FROM requests").fetchall()[0][0]
        consumers = con.execute("SELECT count(*) FROM (SELECT DISTINCT consumer FROM summary_audience)").fetchall()[0][0]
        hits = con.execute("SELECT count(*) FROM summary_impact_hits").fetchall()[0][0]
    print(f"{store}: {rows:,} requests, {consumers:,} consumers, {hits:,} contaminated hits")
    print(f"{'question':<26}{'first call':>12}{'median of 3':>14}  target < {TARGET_S} s")
    met = True
    for name, ask in QUESTIONS.items():
        t = time.perf_counter()
        ask(store)
        first = time.perf_counter() - t
        median = median_seconds(lambda ask=ask: ask(store))
        ok = name.startswith("Overview") or max(first, median) < TARGET_S
        met &= ok
        print(f"{name:<26}{first:>11.3f}s{median:>13.3f}s  {'' if name.startswith('Overview') else 'met' if ok else 'NOT MET'}")
    if args.report:
        from specdec_core.remediation.report import incident_report_text

        t = time.perf_counter()
        text = incident_report_text(store, ".md")
        print(f"{'incident report (.md)':<26}{time.perf_counter() - t:>11.3f}s  ({len(text):,} characters)")
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
