"""Monitoring: alert latency end to end, scrape cost on a large store, exporter memory with many deployments.

1. Alert latency: a contaminated hit appended to a followed log -> the alert at an Alertmanager webhook, over
   real Prometheus and Alertmanager (tests/prom_stack.py), p50 and max over --trials (goal: under 20 s with
   5 s scrape, evaluation and group_wait intervals).
2. Scrape cost: one read of the figures and one HTTP scrape of a --rows store (goal: under 0.5 s), beside the
   dashboard's Overview questions on the same store.
3. Exporter memory: peak RSS of a process that serves and scrapes a store whose log names --deployments
   distinct deployments, beside the same process answering the Overview's headline without the exporter.
4. Long label values: issue 51's log (50 deployments x 15 target models x 15 draft models, each name 10,000
   characters, one record each: 3,375 records); the scrape's size and time and the exporter's peak RSS, for
   one scrape and for three at once (goal: a few MB, well under a second).

    .venv/bin/python bench/bench_monitoring.py [--rows 5000000] [--trials 5] [--interval 5s] [--skip-latency]
        [--store DIR]

--store DIR keeps the stores (and the synthetic log) in DIR instead of bench/out and reuses them from run to run:
a 5M-row store takes 10-17 minutes to build on a shared 2-core machine. A reused store that an older specdec
wrote is brought up to date by `migrate` first (its time is printed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

OUT = Path(__file__).resolve().parent / "out"
ROOT = OUT.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from common import median_seconds, run_child  # noqa: E402

from specdec_core import analysis  # noqa: E402
from specdec_core.demo.synthetic import make_synthetic_log  # noqa: E402
from specdec_core.derived import migrate  # noqa: E402
from specdec_core.ingestion import ingest  # noqa: E402
from specdec_core.monitoring.exporter import Listen, StoreCollector, serve  # noqa: E402
from specdec_core.monitoring.figures import read_figures  # noqa: E402
from specdec_core.monitoring.rules import rules_yaml  # noqa: E402
from specdec_core.store import Store  # noqa: E402


def record(request_id: str, deployment: str, key: str, max_tokens: int, hit: bool) -> dict:
    ts = datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    return {"request_id": request_id, "ts": ts, "prompt": f"prompt {key}", "target_model": "llama-8b",
            "draft_model": "llama-1b", "num_speculative_tokens": 4, "temperature": 0.0, "max_tokens": max_tokens,
            "tokenizer_version": "tok-v1", "deployment": deployment, "cache_key": key, "cache_hit": hit,
            "output_text": "An output.", "output_tokens": 3, "draft_tokens": None if hit else 8,
            "accepted_tokens": None if hit else 6}


def alert_latency(trials: int, interval: str) -> None:
    from prom_stack import alerting_stack, wait_for

    print(f"alert latency: {trials} trials, scrape = evaluation = group_wait = {interval}, follower polls every 1 s")
    work = OUT / f"alerting-{int(time.time())}"
    with alerting_stack(work, rules_yaml(), scrape=interval, evaluate=interval, group_wait=interval,
                        follow_every=1.0) as stack:
        deployments = [f"trial-{n}" for n in range(trials)]
        # Each trial's deployment serves correctly first, so its series exist at 0 before its first bad hit.
        stack.append([record(f"{d}-warm", d, f"{d}-w", 64, False) for d in deployments])
        wait_for(lambda: len(stack.query("specdec_contaminated_hits_total == 0")) >= trials, 120, "warm series")
        latencies = []
        for d in deployments:
            stack.append([record(f"{d}-miss", d, f"{d}-k", 64, False)])
            time.sleep(2)  # the miss in its own batch, as a service's traffic arrives
            started = time.monotonic()
            stack.append([record(f"{d}-hit", d, f"{d}-k", 16, True)])
            arrived = wait_for(lambda d=d: [t for t, a in stack.hook.alerts()
                                            if a["labels"].get("deployment") == d], 120, f"{d}'s alert")
            latencies.append(arrived[0] - started)
            print(f"  {d}: {latencies[-1]:.1f} s")
    print(f"alert latency: p50 {statistics.median(latencies):.1f} s, max {max(latencies):.1f} s "
          f"(goal < 20 s: {'met' if max(latencies) < 20 else 'NOT met'})\n")


def up_to_date(store: Store) -> None:
    t = time.perf_counter()
    if migrate(store):
        print(f"migrated {store} in {time.perf_counter() - t:.0f} s")


def scrape_cost(rows: int, where: Path) -> None:
    db = where / f"monitoring-{rows}.duckdb"
    store = Store(db)
    if not store.exists:
        log = where / f"synthetic-{rows}.jsonl"
        t = time.perf_counter()
        if not log.exists():
            make_synthetic_log(log, rows)
        ingest(store, [str(log)])
        print(f"built a {rows:,}-row store in {time.perf_counter() - t:.0f} s")
    up_to_date(store)
    with store.read() as con:
        stored, contaminated, minutes, first = con.execute(
            "SELECT (SELECT count(*) FROM requests), (SELECT count(*) FROM contaminated_first_verdicts), "
            "(SELECT count(*) FROM summary_minute), (SELECT count(*) FROM summary_first_verdicts)").fetchall()[0]
    print(f"store: {stored:,} requests, {contaminated:,} first verdicts; read instead: {minutes:,} minute rows, "
          f"{first:,} first-verdict count rows")
    read = median_seconds(lambda: read_figures(store))
    server = serve(store, Listen("127.0.0.1", 0))
    url = f"http://127.0.0.1:{server.port}/metrics"

    def scrape() -> int:
        with urllib.request.urlopen(url, timeout=60) as resp:
            return len(resp.read())

    t = time.perf_counter()
    size = scrape()
    first = time.perf_counter() - t
    # An exporter restart: a fresh process whose first scrape reads the store with nothing kept from before.
    _, restart_peak, out = run_child(SERVE_AND_SCRAPE, str(db), "50")
    restart = float(out.split()[1])
    again = median_seconds(scrape)
    # A follower's batch: the store changed, so the next scrape reads the figures again.
    batch = OUT / "monitoring-batch.jsonl"
    batch.write_text("".join(json.dumps(record(f"batch-{time.time_ns()}-{n}", "bench", f"b{n}", 64, False)) + "\n"
                             for n in range(100)))
    ingest(store, [str(batch)])
    t = time.perf_counter()
    scrape()
    after_batch = time.perf_counter() - t
    server.stop()
    print(f"scrape cost on {rows:,} rows (goal: one scrape < 0.5 s)")
    print(f"  {'read of the figures (no cache)':40}{read:>8.3f} s")
    print(f"  {'HTTP scrape, first after start':40}{first:>8.3f} s  ({size:,} bytes) {'met' if first < 0.5 else 'NOT met'}")
    print(f"  {'HTTP scrape, fresh exporter process':40}{restart:>8.3f} s  ({restart_peak:.0f} MB peak) "
          f"{'met' if restart < 0.5 else 'NOT met'}")
    print(f"  {'HTTP scrape, after a 100-row batch':40}{after_batch:>8.3f} s  {'met' if after_batch < 0.5 else 'NOT met'}")
    print(f"  {'HTTP scrape, store unchanged':40}{again:>8.3f} s")
    print("  beside the dashboard's Overview questions on the same store:")
    for name, fn in (("headline numbers", lambda: analysis.headline(store)),
                     ("hit rate by combination", lambda: analysis.hit_rate_by_combination(store)),
                     ("keys per identity", lambda: analysis.key_ratio_by_deployment(store)),
                     ("acceptance by combination", lambda: analysis.acceptance_by_combination(store)),
                     ("red flags", lambda: analysis.red_flags(store))):
        print(f"  {name:40}{median_seconds(fn):>8.3f} s")
    print()


# Prints the response's size and how long the scrape took: a restarted exporter's first scrape.
SERVE_AND_SCRAPE = """
import sys, time, urllib.request
from specdec_core.store import Store  # noqa: E402
from specdec_core.monitoring.exporter import Listen, serve
server = serve(Store(sys.argv[1]), Listen("127.0.0.1", 0), int(sys.argv[2]))
started = time.perf_counter()
with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=120) as r:
    print(len(r.read()), time.perf_counter() - started)
server.stop()
"""
HEADLINE_ONLY = """
import sys
import prometheus_client
from specdec_core.analysis import headline
from specdec_core.store import Store  # noqa: E402
print(headline(Store(sys.argv[1])).requests)
"""


def exporter_memory(deployments: int, where: Path) -> None:
    db = where / f"monitoring-deployments-{deployments}.duckdb"
    store = Store(db)
    if store.exists:
        up_to_date(store)
    else:
        log = where / f"deployments-{deployments}.jsonl"
        with open(log, "w") as fh:
            for n in range(deployments * 5):
                d = f"deployment-{n % deployments}"
                fh.write(json.dumps(record(f"r{n}", d, f"{d}-k{n % 3}", 64, n >= deployments)) + "\n")
        ingest(store, [str(log)])
    print(f"exporter memory with {deployments:,} distinct deployments ({deployments * 5:,} rows)")
    seconds, peak, _ = run_child(HEADLINE_ONLY, str(db))
    print(f"  {'baseline: headline() in a fresh process':48}{peak:>8.0f} MB peak{seconds:>8.2f} s")
    for top in (50, deployments):
        seconds, peak, out = run_child(SERVE_AND_SCRAPE, str(db), str(top))
        print(f"  {f'exporter + one scrape, --top {top}':48}{peak:>8.0f} MB peak{seconds:>8.2f} s  "
              f"({int(out.split()[0]):,} bytes)")
    collector = StoreCollector(store)
    print(f"  series at --top 50: {sum(len(m.samples) for m in collector.collect()):,}\n")
    collector.close()


# Serves the store, scrapes it with N clients at once; prints the largest answer and the slowest scrape.
SERVE_AND_SCRAPE_CONCURRENT = """
import sys, time, urllib.request
from concurrent.futures import ThreadPoolExecutor
from specdec_core.store import Store  # noqa: E402
from specdec_core.monitoring.exporter import Listen, serve
server = serve(Store(sys.argv[1]), Listen("127.0.0.1", 0), 50)
def one(_):
    started = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=600) as r:
        return len(r.read()), time.perf_counter() - started
with ThreadPoolExecutor(int(sys.argv[2])) as pool:
    done = list(pool.map(one, range(int(sys.argv[2]))))
print(max(d[0] for d in done), max(d[1] for d in done))
server.stop()
"""


RECORDS_51 = 3_375


def long_labels(where: Path) -> None:
    db = where / "monitoring-long-labels.duckdb"
    store = Store(db)
    if not store.exists:
        log = where / "long-labels.jsonl"
        with open(log, "w") as fh:
            for n in range(RECORDS_51):
                # Every record a new set, over all 50 deployments, 15 targets and 15 drafts (n < 3,375 follows
                # from (deployment, target, n // 750), and 751 = 1 mod 15 keeps the drafts apart).
                d, t, m = n % 50, (n // 50) % 15, (n // 750 + n) % 15
                names = {"deployment": f"d{d}-" + "x" * 9_996, "target_model": f"t{t}-" + "y" * 9_996,
                         "draft_model": f"m{m}-" + "z" * 9_996}
                fh.write(json.dumps({**record(f"r{n}", names["deployment"], f"k{n}", 64, False), **names}) + "\n")
        ingest(store, [str(log)])
        print(f"built the long-label store: {RECORDS_51:,} records, log {log.stat().st_size / 1e6:.0f} MB")
    print("long label values (50 x 15 x 15 names of 10,000 characters; goal: a few MB, well under a second)")
    for clients in (1, 3):
        seconds, peak, out = run_child(SERVE_AND_SCRAPE_CONCURRENT, str(db), str(clients))
        size, scrape_s = out.split()
        print(f"  {f'{clients} scrape(s) at once':24}{int(size) / 1e6:>10.2f} MB answer{float(scrape_s):>9.2f} s "
              f"scrape{peak:>9.0f} MB exporter peak  ({seconds:.1f} s in all)")
    print()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=5_000_000)
    parser.add_argument("--trials", type=int, default=5)
    parser.add_argument("--interval", default="5s")
    parser.add_argument("--deployments", type=int, default=10_000)
    parser.add_argument("--skip-latency", action="store_true")
    parser.add_argument("--skip-scrape", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    parser.add_argument("--skip-long-labels", action="store_true")
    parser.add_argument("--store", type=Path, default=OUT, help="where the stores are built once and reused")
    args = parser.parse_args()
    OUT.mkdir(exist_ok=True)
    args.store.mkdir(parents=True, exist_ok=True)
    if not args.skip_latency:
        alert_latency(args.trials, args.interval)
    if not args.skip_scrape:
        scrape_cost(args.rows, args.store)
    if not args.skip_memory:
        exporter_memory(args.deployments, args.store)
    if not args.skip_long_labels:
        long_labels(args.store)


if __name__ == "__main__":
    main()
