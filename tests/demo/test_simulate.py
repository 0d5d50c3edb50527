"""The demo simulator on the tiny family: a contract-valid log whose contamination the store finds exactly."""

from __future__ import annotations

import gzip
import json
import time

import pytest

from specdec_core import analysis
from specdec_core.contract.identity import DecodeRequest, fingerprint
from specdec_core.decoding.engine import SpecDecoder
from specdec_core.demo.simulate import DEPLOYMENTS, simulate
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

DECODE_FLOOR_S = 0.02  # each real decode takes at least this, so a miss's logged latency has a known floor


class _AtLeast:
    def __init__(self, engine, seconds):
        self.engine, self.seconds = engine, seconds

    def generate(self, req):
        started = time.perf_counter()
        result = self.engine.generate(req)
        time.sleep(max(0.0, self.seconds - (time.perf_counter() - started)))
        return result


@pytest.fixture(scope="module")
def simulated(tmp_path_factory, tiny_registry):
    tmp = tmp_path_factory.mktemp("sim")
    summary = simulate(tmp / "requests.jsonl.gz", requests=300, seed=11, family="tiny",
                       engine=_AtLeast(SpecDecoder(tiny_registry, device="cpu"), DECODE_FLOOR_S))
    store = Store(tmp / "sim.duckdb")
    result = ingest(store, [summary.log_path])
    truth = [json.loads(line) for line in open(summary.truth_path, encoding="utf-8")]
    return summary, store, result, truth


def test_the_log_validates_against_the_contract(simulated):
    summary, _, result, truth = simulated
    assert (result.read, result.accepted, result.quarantined, result.duplicates) == (300, 300, 0, 0)
    assert len(truth) == 300 and summary.decoded < summary.requests  # hits were served from the cache


def test_contamination_only_in_narrow_key_deployments_and_only_before_the_fix(simulated):
    summary, _, _, truth = simulated
    narrow = {name for name, scheme, _ in DEPLOYMENTS if scheme != "full"}
    contaminated = [t for t in truth if t["contaminated"]]
    assert contaminated, "the narrow keys must have mixed identities"
    assert {t["deployment"] for t in contaminated} <= narrow
    assert not any(t["after_fix"] for t in contaminated)
    assert any(t["after_fix"] for t in truth)  # the fix happened inside the window
    assert summary.contaminated == len(contaminated) and summary.contaminated_after_fix == 0


def test_the_store_finds_exactly_the_contaminated_hits_the_simulator_served(simulated):
    _, store, _, truth = simulated
    found = analysis.contaminated_hits(store)
    expected = {t["request_id"]: t["served_by"] for t in truth if t["contaminated"]}
    assert dict(zip(found["request_id"], found["source_request_id"], strict=True)) == expected


def test_the_fix_is_visible_as_contamination_stopping(simulated):
    summary, store, _, _ = simulated
    window = analysis.contamination_window(store)
    assert set(window["deployment"]) <= {"edge-a", "edge-b"}
    assert window["last_contaminated"].max().isoformat() < summary.fix_at


def test_a_miss_answered_from_the_decode_memo_is_logged_as_slow_as_the_decode_it_stands_for(simulated):
    summary, store, _, _ = simulated
    records = [json.loads(line) for line in gzip.open(summary.log_path, "rt", encoding="utf-8")]
    misses = [r for r in records if not r["cache_hit"]]
    assert len({fingerprint(DecodeRequest.from_record(r)) for r in misses}) < len(misses), "no memo answers"
    for record in misses:
        assert record["latency_ms"] >= DECODE_FLOOR_S * 1000, record["request_id"]
    hits = sorted(r["latency_ms"] for r in records if r["cache_hit"])
    misses = sorted(r["latency_ms"] for r in records if not r["cache_hit"])
    assert misses[len(misses) // 2] > 10 * hits[len(hits) // 2]
