"""First render of every dashboard page on a large synthetic log, through Streamlit's AppTest.

    .venv/bin/python bench/bench_pages.py [--rows 1000000] [--rebuild]

Builds bench/out/pages-<rows>.duckdb once (specdec_core.demo.synthetic writes the log,
ingest loads it) and reuses it afterwards. Each page is timed cold (Streamlit's
data cache cleared: what the first visitor after a load waits for) and warm (the
same page again: what filters left unchanged cost). Target: cold < 2 s per page.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402
from streamlit.testing.v1 import AppTest  # noqa: E402

from specdec_core.analysis import headline, suspicious_requests  # noqa: E402
from specdec_core.demo.synthetic import make_synthetic_log  # noqa: E402
from specdec_core.ingestion.load import ingest  # noqa: E402
from specdec_core.store.connection import Store  # noqa: E402

PAGES = ("overview", "cache", "output_length", "mismatches", "impact", "keys", "replay", "search", "export",
         "request")
# A search typed on the Search page: the scan over every prompt and output it costs.
SEARCH_TEXT = "cache"
TARGET_S = 2.0


def build_db(rows: int, out: Path, rebuild: bool) -> Store:
    db = Store(out / f"pages-{rows}.duckdb")
    if db.exists and not rebuild:  # one written by an older version is brought up to date by its first read
        return db
    db.path.unlink(missing_ok=True)
    log = out / f"pages-{rows}.jsonl"
    t0 = time.perf_counter()
    make_synthetic_log(log, rows)
    t1 = time.perf_counter()
    result = ingest(db, [str(log)])
    t2 = time.perf_counter()
    log.unlink()
    print(f"generated {rows:,} rows in {t1 - t0:.1f} s; ingested in {t2 - t1:.1f} s "
          f"({result.accepted:,} accepted, {result.quarantined:,} quarantined)")
    return db


def render(page: str, request_id: str = "", time_range: tuple[str, str] | None = None) -> tuple[float, float]:
    """Seconds for the page's first render with an empty data cache, then for a rerun; `time_range`: the
    sidebar's range, as a link gives it (?start=&end=, RFC 3339)."""
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=600)
    if time_range:
        at.query_params["start"], at.query_params["end"] = time_range
    at.run()
    if page != "overview":
        at.switch_page(f"pages/{page}.py")
    if page == "search":  # the page takes its query from the address (?q=), as a link or Back gives it
        at.query_params["q"] = SEARCH_TEXT
    if page == "request":  # one request's page, as a link from a table opens it: a contaminated hit
        at.query_params["request_id"] = request_id
    st.cache_data.clear()
    t0 = time.perf_counter()
    at.run()
    t1 = time.perf_counter()
    at.run()
    t2 = time.perf_counter()
    if at.exception:
        raise RuntimeError(f"{page}: {at.exception[0].value}")
    return t1 - t0, t2 - t1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out")
    parser.add_argument("--rebuild", action="store_true", help="regenerate the database")
    parser.add_argument("--prepare-only", action="store_true", help="build the database and stop")
    args = parser.parse_args()
    db = build_db(args.rows, args.out, args.rebuild)
    if args.prepare_only:
        return
    head = headline(db)
    print(f"{db.path}: {head.requests:,} requests, {head.contaminated_hits:,} contaminated hits, "
          f"{head.key_collisions:,} key collisions")
    os.environ["SPECDEC_DB"] = str(db.path)
    request_id = str(suspicious_requests(db, 1).request_id.iloc[0])
    print(f"\n{'page':<15}{'cold (s)':>10}{'warm (s)':>10}  target < {TARGET_S:.0f} s cold")
    worst = 0.0
    for page in PAGES:
        cold, warm = render(page, request_id)
        worst = max(worst, cold)
        print(f"{page:<15}{cold:>10.2f}{warm:>10.2f}  {'ok' if cold < TARGET_S else 'SLOW'}")
    print(f"\nslowest cold render {worst:.2f} s ({'within' if worst < TARGET_S else 'over'} the target)")


if __name__ == "__main__":
    main()
