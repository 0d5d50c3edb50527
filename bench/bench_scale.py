"""Every figure a user sees, at 1M, 5M and 20M rows of an incident shaped like real ones, per kind of store.

    .venv/bin/python bench/bench_scale.py [--sizes 1000000,5000000,20000000] [--kinds file,lake]
                                          [--lake-sizes 1000000,5000000] [--lake-by-copy]
                                          [--follow-seconds 30] [--work DIR]

The log (bench/scale_log.py): the services log's records (other fields anywhere, ties, mixed `ts` types,
exact duplicates, hostile lines) over 50 deployments with the contaminated window of the demo's incident,
repeated for the larger sizes. For each size and kind of store (a DuckDB file, the default; a DuckLake with
a local SQLite catalog and its files beside it), in this order:

- `specdec ingest` of the whole log into an empty store, in a fresh process: seconds and peak memory (with
  --lake-by-copy, a lake is the file store of its size copied, as `specdec migrate --db FILE --to
  ducklake:...` copies it: the file store moving to a lake when it outgrows one machine);
- the store's size on disk;
- each `specdec stats` question (the dashboard's figures) and each `specdec impact` answer: first call
  and median of three, in this process;
- each page's first render (Streamlit's AppTest, data cache cleared, no model registry: no models loading
  beside it), in this process; then again, in turn, with a time range whose ends cut minutes (the middle
  half of the log, as the slider's steps or a box dragged on a chart leave it);
- one metrics scrape (a fresh exporter, its first scrape, then one on an unchanged store);
- `specdec report` of the whole store (CSV), in a fresh process;
- appending 20,000 live lines, in a fresh process, beside the same lines into an empty store of that kind;
- the lag of `specdec ingest --follow` at 1,000 lines/s for `--follow-seconds`.

Targets at 20M rows: pages < 2 s, questions < 0.5 s, lag < 5 s, peak memory < 8 GB. The baseline of each
figure is the same figure at the smallest size, in the same run: the last column says how much it grew
against the rows. Logs and stores go in --work (bench/out by default): 20M rows take about 16 GB of log.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_append import store_name  # noqa: E402
from common import OUT, ROOT, median_seconds, run_child  # noqa: E402

sys.path.insert(0, str(ROOT))

BASE_ROWS = 1_000_000
TARGETS = {"page": 2.0, "question": 0.5, "lag": 5.0, "peak_gb": 8.0}
INGEST = """
import sys, time
from specdec_core.store import Store
from specdec_core.ingestion import ingest
t = time.perf_counter()
r = ingest(Store(sys.argv[1]), sys.argv[2:])
print(f"{time.perf_counter() - t:.2f} {r.accepted} {r.quarantined}")
"""


def size_on_disk(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


COPY = """
import sys, time
from specdec_core.derived.migrate import copy_store
from specdec_core.store import Store
t = time.perf_counter()
n = copy_store(Store(sys.argv[1]), Store(sys.argv[2]))
print(f"{time.perf_counter() - t:.2f} {n} 0")
"""


def build(files: list[Path], path: Path, kind: str, copy_of: Path | None = None) -> dict:
    if path.exists():
        return {"ingest_s": None, "peak_mb": None}
    tmp = path.with_name(path.name + ".building")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.unlink(missing_ok=True)
    if copy_of is not None:
        tmp.mkdir()
        seconds, peak, printed = run_child(COPY, str(copy_of), store_name(tmp, kind))
    else:
        seconds, peak, printed = run_child(INGEST, store_name(tmp, kind), *map(str, files))
    shutil.move(tmp, path)
    accepted, quarantined = (int(x) for x in printed.split()[1:3])
    return {"ingest_s": seconds, "peak_mb": peak, "accepted": accepted, "quarantined": quarantined,
            "ingest_call_s": float(printed.split()[0])}


def first_and_median(fn) -> tuple[float, float]:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t, median_seconds(fn)


def questions(store) -> dict[str, tuple[float, float]]:
    from specdec_core import analysis
    from specdec_core.analysis.impact import experiment_impact, impact

    f = analysis.NO_FILTERS
    asks = {
        "headline numbers": lambda: analysis.headline(store, f),
        "hit rate by combination": lambda: analysis.hit_rate_by_combination(store, f),
        "hit rate over time": lambda: analysis.hit_rate_over_time(store, f, "5 minutes"),
        "output length by max_tokens": lambda: analysis.output_length_by_max_tokens(store, f),
        "contaminated hits": lambda: analysis.contaminated_hits(store, f),
        "mismatch rate over time": lambda: analysis.mismatch_rate_over_time(store, f, "5 minutes"),
        "key collisions": lambda: analysis.key_collisions(store, f),
        "keys per identity": lambda: analysis.key_ratio_by_deployment(store, f),
        "acceptance by combination": lambda: analysis.acceptance_by_combination(store, f),
        "latency hit vs miss": lambda: analysis.latency_hit_vs_miss(store, f),
        "red flags": lambda: analysis.red_flags(store, f),
        "impact --by consumer": lambda: impact(store, "consumer"),
        "impact --by experiment": lambda: impact(store, "experiment"),
        "impact --by deployment": lambda: impact(store, "deployment"),
        "impact --experiments": lambda: experiment_impact(store),
    }
    return {name: first_and_median(ask) for name, ask in asks.items()}


def middle_half(store) -> tuple[str, str]:
    """The middle half of the log's time span, its ends 30 s past a minute and 31 s before one."""
    from datetime import timedelta

    from specdec_core.analysis import filter_options

    options = filter_options(store)
    quarter = (options.end - options.start) / 4
    start = (options.start + quarter).replace(second=30, microsecond=0)
    end = (options.end - quarter).replace(second=29, microsecond=0) - timedelta(minutes=1)
    return start.strftime("%Y-%m-%dT%H:%M:%SZ"), end.strftime("%Y-%m-%dT%H:%M:%SZ")


def pages(store, db: str, time_range: tuple[str, str] | None = None) -> dict[str, float]:
    from bench_pages import PAGES, render

    from specdec_core.analysis import suspicious_requests

    os.environ["SPECDEC_DB"] = db
    # No registry: the dashboard would otherwise load the models the store names in the background, and the
    # first pages would share the CPU with it (bench_pages measures that); here each page's own cost is timed.
    empty = OUT / "scale-no-models.toml"
    empty.write_text("")
    os.environ["SPECDEC_CONFIG"] = str(empty)
    request_id = str(suspicious_requests(store, 1).request_id.iloc[0])
    return {page: render(page, request_id, time_range)[0] for page in PAGES}


def scrape(db: str) -> dict[str, float]:
    from specdec_core.monitoring.exporter import Listen, serve
    from specdec_core.store import Store

    server = serve(Store(db), Listen("127.0.0.1", 0))
    url = f"http://127.0.0.1:{server.port}/metrics"
    try:
        out = {}
        for name in ("scrape, first", "scrape, unchanged store"):
            t = time.perf_counter()
            with urllib.request.urlopen(url, timeout=300) as resp:
                resp.read()
            out[name] = time.perf_counter() - t
        return out
    finally:
        server.stop()


def report(db: str, work: Path) -> float:
    out = work / "scale-report.csv"
    t = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specdec_core", "report", "--db", db, "--out", str(out)], check=True,
                   cwd=ROOT, capture_output=True)
    seconds = time.perf_counter() - t
    out.unlink(missing_ok=True)
    return seconds


def append(path: Path, kind: str, work: Path) -> tuple[float, float]:
    from bench_append import live_lines, time_append

    lines = live_lines(20_000)
    return (time_append(work / "scale-none", lines, kind, repeats=1, folder=work),
            time_append(path, lines, kind, repeats=1, folder=work))


def follow_lag(path: Path, kind: str, rows: int, seconds: float) -> dict:
    from bench_follow import run

    r = run(rows, 1000, seconds, kind, base=path)
    lags = sorted(r["lags"])
    return {"lag p50": statistics.median(lags) if lags else float("nan"),
            "lag max": max(lags, default=float("nan")), "follow loaded": r["loaded"], "follow written": r["written"]}


def measure(rows: int, kind: str, files: list[Path], work: Path, follow_seconds: float, by_copy: bool = False
            ) -> dict:
    from specdec_core.store import Store

    path = work / (f"scale-{rows}.duckdb" if kind == "file" else f"scale-{rows}.lake")
    fig: dict = {"rows": rows, "kind": kind, "built": "copy" if by_copy and kind == "lake" else "ingest"}
    fig.update(build(files, path, kind, work / f"scale-{rows}.duckdb" if fig["built"] == "copy" else None))
    fig["store_mb"] = size_on_disk(path) / 2**20
    db = store_name(path, kind)
    store = Store(db)
    print(f"  {kind} {rows:,}: built ({fig.get('ingest_s')} s, {fig.get('peak_mb')} MB peak, "
          f"{fig['store_mb']:.0f} MB)", flush=True)
    fig["questions"] = questions(store)
    print(f"  {kind} {rows:,}: questions done", flush=True)
    fig["pages"] = pages(store, db)
    fig["pages_range"] = pages(store, db, middle_half(store))
    print(f"  {kind} {rows:,}: pages done", flush=True)
    fig["scrape"] = scrape(db)
    fig["report_s"] = report(db, work)
    fig["append_empty_s"], fig["append_s"] = append(path, kind, work)
    fig.update(follow_lag(path, kind, rows, follow_seconds))
    print(f"  {kind} {rows:,}: done", flush=True)
    return fig


def show(results: list[dict]) -> None:
    by = {(r["kind"], r["rows"]): r for r in results}
    for kind in dict.fromkeys(r["kind"] for r in results):
        sizes = sorted(rows for k, rows in by if k == kind)
        small = by[(kind, sizes[0])]
        print(f"\n{kind} store" + "".join(f"{f'{s:,} rows':>16}" for s in sizes) + f"{'growth/rows':>14}")

        def line(name: str, get, fmt: str = "{:.2f}", kind: str = kind, sizes: list[int] = sizes) -> None:
            values = [get(by[(kind, s)]) for s in sizes]
            cells = "".join(f"{fmt.format(v) if v is not None else '-':>16}" for v in values)
            growth = ""
            if len(sizes) > 1 and values[0] and values[-1]:
                growth = f"{(values[-1] / values[0]) / (sizes[-1] / sizes[0]):>13.2f}x"
            print(f"  {name:<30}{cells}{growth}")

        made = "copy of the file store" if small.get("built") == "copy" else "ingest"
        line(f"{made} (s)", lambda r: r.get("ingest_s"), "{:.1f}")
        line(f"{made} peak memory (MB)", lambda r: r.get("peak_mb"), "{:.0f}")
        line("store size (MB)", lambda r: r["store_mb"], "{:.0f}")
        for q in small["questions"]:
            line(f"{q} (first)", lambda r, q=q: r["questions"][q][0], "{:.3f}")
        for q in small["questions"]:
            line(f"{q} (median)", lambda r, q=q: r["questions"][q][1], "{:.3f}")
        for p in small["pages"]:
            line(f"page {p} (cold)", lambda r, p=p: r["pages"][p])
        for p in small.get("pages_range", {}):
            line(f"page {p}, time range", lambda r, p=p: r.get("pages_range", {}).get(p))
        for s in small["scrape"]:
            line(s, lambda r, s=s: r["scrape"][s], "{:.3f}")
        line("specdec report (s)", lambda r: r["report_s"], "{:.1f}")
        line("append 20k into empty (s)", lambda r: r["append_empty_s"])
        line("append 20k into store (s)", lambda r: r["append_s"])
        line("append ratio", lambda r: r["append_s"] / r["append_empty_s"])
        line("follow lag p50 (s)", lambda r: r["lag p50"], "{:.1f}")
        line("follow lag max (s)", lambda r: r["lag max"], "{:.1f}")
        largest = by[(kind, sizes[-1])]
        worst_page = max([*largest["pages"].values(), *largest.get("pages_range", {}).values()])
        worst_question = max(max(v) for v in largest["questions"].values())
        print(f"  at {sizes[-1]:,}: slowest page {worst_page:.2f} s (target < {TARGETS['page']} s), slowest question "
              f"{worst_question:.3f} s (< {TARGETS['question']} s), lag max {largest['lag max']:.1f} s "
              f"(< {TARGETS['lag']} s), ingest peak {(largest.get('peak_mb') or 0) / 1024:.1f} GB "
              f"(< {TARGETS['peak_gb']} GB)")


def main() -> None:
    from scale_log import make_scale_log

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1000000,5000000,20000000")
    parser.add_argument("--kinds", default="file,lake")
    parser.add_argument("--lake-sizes", default="1000000,5000000", help="the sizes a lake is measured at")
    parser.add_argument("--lake-by-copy", action="store_true",
                        help="make each lake by copying the file store of its size (measured first)")
    parser.add_argument("--base", type=int, default=BASE_ROWS, help="rows of one copy of the log")
    parser.add_argument("--follow-seconds", type=float, default=30)
    parser.add_argument("--work", type=Path, default=OUT)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    lake_sizes = {int(s) for s in args.lake_sizes.split(",")}
    copies = -(-max(sizes) // args.base)
    files = make_scale_log(args.work / "scale-log", copies, args.base)
    results = []
    for rows in sizes:
        chosen = files[: 4 * -(-rows // args.base)]
        for kind in args.kinds.split(","):
            if kind == "lake" and rows not in lake_sizes:
                continue
            results.append(measure(rows, kind, chosen, args.work, args.follow_seconds, args.lake_by_copy))
            (args.work / "scale-results.json").write_text(json.dumps(results, indent=1))
    show(results)


if __name__ == "__main__":
    main()
