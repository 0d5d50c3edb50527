"""A sampled request whose cache hit served another identity's output reads as a contaminated hit
(issue #44, 6), with whether this request could have produced that output too, in rounded words."""

from __future__ import annotations

import re
from datetime import datetime, timezone

from specdec_core.replay.stored import StoredReplay


def sampled(**evidence) -> StoredReplay:
    return StoredReplay(
        replay_id="r1", request_id="req-000019", replayed_at=datetime(2026, 11, 20, tzinfo=timezone.utc),
        classification="sampled", message="", production_text="a", replay_text="b", source_request_id=None,
        source_replay_text=None, similarity=0.643, first_divergent_token=3, common_prefix_tokens=3, replay_tokens=9,
        draft_tokens=None, accepted_tokens=None,
        evidence={"production_impossible_tokens": [], "production_implausible": False, **evidence})


def test_a_plausible_sample_of_a_contaminated_hit_says_contaminated_and_how_likely():
    view = sampled(production_mean_logprob=-1.0671492325487009, replay_mean_logprob=-0.2)
    said = view.served_source("req-000005")
    assert said.startswith("A contaminated hit: production served the output cached by request req-000005")
    assert "could have produced it too, by sampling" in said and "about 2.4 times less likely" in said
    assert not re.search(r"\d\.\d{5,}", said)


def test_an_implausible_one_says_it_could_hardly_have_produced_it():
    view = sampled(production_mean_logprob=-6.0, replay_mean_logprob=-1.0, production_implausible=True)
    assert "could hardly have produced it: each token is about 148 times less likely" in view.served_source("s")


def test_no_source_or_another_verdict_adds_nothing():
    assert sampled(production_mean_logprob=-1.0, replay_mean_logprob=-1.0).served_source(None) is None
    foreign = sampled()
    assert StoredReplay(**{**foreign.__dict__, "classification": "foreign"}).served_source("s") is None
