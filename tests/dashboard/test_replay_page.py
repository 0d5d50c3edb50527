"""The Replay page with the real specdec_core.replay.run and SpecDecoder on the tiny demo models."""

from __future__ import annotations

from pathlib import Path

import pytest
from apptest import metrics_of, open_app, texts, ui
from dashboard_data import build_foreign_db
from helpers import free_port

import specdec_core.replay.run as replay_module
from specdec_core.decoding.registry import EngineSpec, ModelSpec, Registry
from specdec_core.decoding.router import DecoderRouter
from specdec_core.replay import jobs


@pytest.fixture(scope="module")
def foreign(tmp_path_factory, engine) -> tuple[Path, dict]:
    return build_foreign_db(tmp_path_factory.mktemp("foreign"), engine)


def test_replaying_a_contaminated_hit_proves_its_foreign_source(monkeypatch, foreign, engine):
    foreign_db, outputs = foreign
    monkeypatch.setattr(replay_module, "default_decoder", lambda: engine)
    at = open_app(monkeypatch, foreign_db, "replay", request_id="h1")
    [button] = [b for b in at.main.button if b.label == "Replay with the full identity"]
    button.click().run()
    jobs.wait_all(300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = metrics_of(at.main)
    assert shown["Classification"] == "foreign"
    assert shown["Similarity to this request's replay"] != "–"
    production, replayed, source = texts(at, "code")[:3]
    assert (production, replayed, source) == (outputs[24].text, outputs[6].text, outputs[24].text)
    [history] = [d.value for d in at.dataframe if "replay_id" in d.value]
    assert list(history.request_id) == ["h1"], "the replay is stored and listed in the history"

    # Its permanent page, opened as a copied link is (a new session): the same three outputs and the diff
    # against the source's replay, read back.
    at = open_app(monkeypatch, foreign_db, "replay", replay_id=history.replay_id[0])
    assert metrics_of(at.main)["Classification"] == "foreign"
    assert texts(at, "code")[-3:] == [outputs[24].text, outputs[6].text, outputs[24].text]
    assert any("production equals the replay of the source request m1 exactly" in m.replace("\\", "")
               for m in texts(at, "markdown"))

    at.switch_page("pages/overview.py").run()
    flags = [m for m in texts(at, "markdown") if "Offline replay does not match production" in m]
    assert flags == [":red[**Yes**] · **Offline replay does not match production**"]

    at.switch_page("pages/export.py").run()
    assert metrics_of(at.main)["replay_mismatch"] == "1"
    replays = at.dataframe[-1].value
    assert list(replays.classification) == ["foreign"] and list(replays.source_request_id) == ["m1"]


def test_a_dead_engine_is_one_line_saying_what_it_cost(monkeypatch, foreign, tiny_registry):
    """Nothing listens at the engine's port: the batch says so once, with how many requests went unreplayed."""
    foreign_db, _ = foreign
    spec = EngineSpec("staging", f"http://127.0.0.1:{free_port()}/v1", timeout_s=5.0)
    models = {**tiny_registry.models, "tiny-target": ModelSpec("tiny-target", engine="staging", served_name="big")}
    decoder = DecoderRouter.for_registry(Registry(models, tiny_registry.tokenizers, engines={"staging": spec}), device="cpu")
    monkeypatch.setattr(replay_module, "default_decoder", lambda: decoder)
    at = open_app(monkeypatch, foreign_db, "replay")
    at.session_state[ui.REPLAY_START_KEY] = ["m1", "h1"]  # as Mismatches queues a batch
    at.run()
    jobs.wait_all(60)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    shown = [e.value.replace("\\", "") for e in at.main.error]
    assert shown == ["engine staging failed: unreachable: Connection refused (2 requests not replayed)"]


def test_the_first_pages_run_lets_the_model_preload_start(monkeypatch, foreign):
    """app.py's preload waits for ui.PAGE_RAN, which the end of a page's run sets: a first view of the
    dashboard is drawn before torch's import and the weights take the interpreter."""
    db, _ = foreign
    ui.PAGE_RAN.clear()
    at = open_app(monkeypatch, db)
    assert not at.exception and ui.PAGE_RAN.is_set()


@pytest.mark.parametrize("setting, preloads, warned", [("", True, False), ("0", False, False), ("off", False, False),
                                                       ("maybe", True, True)])
def test_specdec_preload_turns_the_dashboards_model_preload_off_and_a_bad_value_is_one_line(
        monkeypatch, foreign, setting, preloads, warned):
    db, _ = foreign
    monkeypatch.setenv(jobs.PRELOAD_ENV, setting)
    at = open_app(monkeypatch, db)
    assert isinstance(at.session_state[ui.PRELOAD_KEY], jobs.Preload) is preloads
    if not preloads:
        assert at.session_state[ui.PRELOAD_KEY] is None
    said = [w.value for w in at.warning if "SPECDEC_PRELOAD" in w.value]
    assert said == (["$SPECDEC_PRELOAD: expected 0 or 1, got 'maybe'; the models are preloaded"] if warned else [])
