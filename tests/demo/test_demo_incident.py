"""The committed demo incident, replayed on the real smollm2 demo models on this machine."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from specdec_core import analysis
from specdec_core.decoding.engine import SpecDecoder
from specdec_core.decoding.registry import Registry
from specdec_core.demo.models import fetch, registry_dict
from specdec_core.ingestion.load import ingest
from specdec_core.replay.run import replay
from specdec_core.store.connection import Store

ROOT = Path(__file__).resolve().parents[2]
DEMO_LOG = ROOT / "data" / "demo" / "requests.jsonl.gz"
DEMO_TRUTH = ROOT / "data" / "demo" / "requests.truth.json"
MODELS = ROOT / "data" / "models"

pytestmark = pytest.mark.demo_model


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    fetch("smollm2", MODELS)  # idempotent: a no-op once data/models holds the family
    decoder = SpecDecoder(Registry.from_dict(registry_dict(MODELS, families=("smollm2",)), base_dir=MODELS),
                          device="cpu")
    store = Store(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    result = ingest(store, [str(DEMO_LOG)])
    truth = {t["request_id"]: t for t in map(json.loads, DEMO_TRUTH.read_text(encoding="utf-8").splitlines())}
    return store, decoder, result, truth


def test_the_committed_demo_loads_whole_and_its_contamination_is_the_ground_truth(demo):
    store, _, result, truth = demo
    assert result.accepted == result.read == len(truth) and result.quarantined == 0
    found = analysis.contaminated_hits(store)
    expected = {rid: t["served_by"] for rid, t in truth.items() if t["contaminated"]}
    assert dict(zip(found["request_id"], found["source_request_id"], strict=True)) == expected


def _sample(store, truth, *, contaminated: bool, n: int) -> list[str]:
    """Greedy requests with n-gram or no speculation, the shortest first (quick to replay), spread over
    deployments."""
    with store.read() as con:
        rows = con.execute(
            "SELECT request_id, deployment FROM requests WHERE temperature = 0 "
            "AND coalesce(draft_model, 'none') IN ('none', 'ngram-3') ORDER BY max_tokens, ts").fetchall()
    picked, seen = [], set()
    for request_id, deployment in rows:
        if truth[request_id]["contaminated"] == contaminated and (deployment not in seen or len(seen) >= 3):
            picked.append(request_id)
            seen.add(deployment)
        if len(picked) == n:
            break
    return picked


def test_uncontaminated_demo_requests_replay_as_match_or_near_tie(demo):
    store, decoder, _, truth = demo
    results = [replay(store, rid, decoder) for rid in _sample(store, truth, contaminated=False, n=4)]
    assert len(results) == 4
    assert {r.classification for r in results} <= {"match", "near_tie"}, [(r.request_id, r.message) for r in results]


def test_a_contaminated_demo_hit_replays_as_foreign_with_its_source(demo):
    store, decoder, _, truth = demo
    [rid] = _sample(store, truth, contaminated=True, n=1)
    result = replay(store, rid, decoder)
    assert result.classification == "foreign", result.message
    assert result.source_request_id == truth[rid]["served_by"]


def test_the_committed_demo_misses_are_slower_than_its_hits():
    records = [json.loads(line) for line in gzip.open(DEMO_LOG, "rt", encoding="utf-8")]
    hits = sorted(r["latency_ms"] for r in records if r["cache_hit"])
    misses = sorted(r["latency_ms"] for r in records if not r["cache_hit"])
    assert misses[len(misses) // 2] > 100 * hits[len(hits) // 2]
