"""An ingest judges and summarises only what its batch touches; the result must equal a full rebuild."""

from __future__ import annotations

import gzip
import random
from pathlib import Path

from specdec_core.store import Store, ingest
from specdec_core.store.hit_sources import judge_hits
from specdec_core.store.summaries import build_summaries

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo" / "requests.jsonl.gz"

DERIVED = {
    "hit_sources": "SELECT * EXCLUDE (hit_ts) FROM hit_sources",
    "summary_minute": "SELECT minute, deployment, target_model, draft_model, temperature, cache_hit, sum(requests), "
                      "sum(contaminated), sum(first_sight), sum(violations), min(first_ts), max(last_ts), "
                      "min(first_contaminated), max(last_contaminated), sum(decoded_requests), sum(draft_tokens), "
                      "sum(accepted_tokens), sum(steps) FROM summary_minute GROUP BY ALL",
    "summary_keys": "SELECT * EXCLUDE (key_id, fp_id) FROM summary_keys",
    "summary_shared_keys": "SELECT * EXCLUDE (key_id, fp_id) FROM summary_shared_keys",
    "summary_lengths": "SELECT deployment, target_model, draft_model, max_tokens, value, sum(n) "
                       "FROM summary_lengths GROUP BY ALL",
    "summary_latency": "SELECT deployment, target_model, draft_model, cache_hit, value, sum(n) "
                       "FROM summary_latency GROUP BY ALL",
    "summary_contaminated": "SELECT * FROM summary_contaminated",
}


def derived(store: Store) -> dict[str, list]:
    with store.read() as con:
        return {name: sorted(con.execute(sql).fetchall(), key=repr) for name, sql in DERIVED.items()}


def rebuilt(store: Store) -> dict[str, list]:
    with store.write() as con:
        judge_hits(con)
        build_summaries(con)
    return derived(store)


def demo_lines() -> list[str]:
    with gzip.open(DEMO, "rt", encoding="utf-8") as fh:
        return [line for line in fh.read().splitlines() if line.strip()]


def write(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_batches_in_order_late_and_repeated_equal_a_full_rebuild(tmp_path):
    lines = demo_lines()
    store = Store(tmp_path / "inc.duckdb")
    parts = [lines[:700], lines[1300:], lines[700:1300]]  # the last file holds rows older than stored ones
    for n, part in enumerate(parts):
        ingest(store, [write(tmp_path / f"part{n}.jsonl", part)])
    shuffled = random.Random(7).sample(lines, 300)
    ingest(store, [write(tmp_path / "again.jsonl", shuffled)])  # only duplicates: nothing changes
    incremental = derived(store)
    assert incremental["hit_sources"] and incremental["summary_contaminated"], "the demo log has contamination"
    assert incremental == rebuilt(store)


def test_key_ids_stay_one_per_key_across_batches(tmp_path):
    lines = demo_lines()
    store = Store(tmp_path / "ids.duckdb")
    for n in range(4):
        ingest(store, [write(tmp_path / f"p{n}.jsonl", lines[n * 500:(n + 1) * 500])])
    with store.read() as con:
        per_key = con.execute("SELECT count(DISTINCT key_id) FROM summary_keys GROUP BY deployment, cache_key "
                              "HAVING count(DISTINCT key_id) > 1").fetchall()
        shared = con.execute("SELECT count(DISTINCT (deployment, cache_key)) FROM summary_keys GROUP BY key_id "
                             "HAVING count(DISTINCT (deployment, cache_key)) > 1").fetchall()
        per_fp = con.execute("SELECT fingerprint FROM summary_keys GROUP BY fingerprint "
                             "HAVING count(DISTINCT fp_id) > 1").fetchall()
    assert (per_key, shared, per_fp) == ([], [], [])


def test_a_late_miss_takes_over_the_hits_after_it(tmp_path):
    from helpers import rec, write_jsonl

    store = Store(tmp_path / "late.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [
        rec("m1", ts="2026-03-01T10:00:00Z", cache_hit=False, cache_key="k", temperature=0.0),
        rec("h1", ts="2026-03-01T10:05:00Z", cache_hit=True, cache_key="k", temperature=0.0),
    ]))])
    ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [
        rec("m2", ts="2026-03-01T10:03:00Z", cache_hit=False, cache_key="k", temperature=0.7),
    ]))])
    with store.read() as con:
        source = con.execute("SELECT source_request_id, contaminated FROM hit_sources WHERE request_id = 'h1'"
                             ).fetchall()
    assert source == [("m2", True)]
    assert derived(store) == rebuilt(store)
