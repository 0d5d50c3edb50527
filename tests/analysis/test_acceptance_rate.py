"""One acceptance rate: the per-combination SQL and a single request's figure agree, and nothing proposed is no rate."""

from __future__ import annotations

import pytest
from helpers import rec, write_jsonl

from specdec_core import analysis
from specdec_core.ingestion.load import ingest


def test_acceptance_rate_of_one_request() -> None:
    assert analysis.acceptance_rate(6, 8) == 0.75
    assert analysis.acceptance_rate(0, 8) == 0.0
    assert analysis.acceptance_rate(3, 0) is None  # nothing proposed: no rate, not 0 and not a crash
    assert analysis.acceptance_rate(None, 8) is None
    assert analysis.acceptance_rate(5, None) is None


def test_the_sql_rate_per_combination_is_the_rate_of_its_sums(store, tmp_path) -> None:
    log = write_jsonl(tmp_path / "log.jsonl", [
        rec("a1", prompt="one", draft_model="d-a", draft_tokens=8, accepted_tokens=6, cache_key="k1"),
        rec("a2", prompt="two", draft_model="d-a", draft_tokens=12, accepted_tokens=3, cache_key="k2"),
        rec("b1", prompt="three", draft_model="d-b", draft_tokens=10, accepted_tokens=9, cache_key="k3"),
    ])
    ingest(store, [log])
    frame = analysis.acceptance_by_combination(store).set_index("draft_model")
    assert frame.loc["d-a", "acceptance_rate"] == pytest.approx(analysis.acceptance_rate(6 + 3, 8 + 12))
    assert frame.loc["d-b", "acceptance_rate"] == pytest.approx(analysis.acceptance_rate(9, 10))
    assert frame.loc["d-a", "acceptance_rate"] == pytest.approx(0.45)
