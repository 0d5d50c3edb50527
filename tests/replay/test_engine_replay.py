"""Replay through an OpenAI-compatible engine: a real `transformers serve` on the tiny target, and a server that
injects faults (500, a malformed body, a hang past the timeout, a wrong model name, 429 with Retry-After)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest
from engine_servers import FaultServer, transformers_serve
from helpers import free_port, rec, run_cli, write_jsonl

from specdec_core.cache import MemoryCache
from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.engine import SpecDecoder
from specdec_core.decoding.engine_client import EngineError
from specdec_core.decoding.registry import EngineSpec, ModelSpec, Registry
from specdec_core.decoding.router import DecoderRouter
from specdec_core.ingestion.load import ingest
from specdec_core.replay import jobs
from specdec_core.replay.run import replay, replay_many
from specdec_core.service import DecodeService
from specdec_core.store.connection import Store

PROMPT = "speculative decoding drafts tokens"
A = dict(prompt=PROMPT, target_model="tiny-target", draft_model="tiny-draft-a", num_speculative_tokens=3,
         temperature=0.0, max_tokens=12, tokenizer_version="tiny-tok-v1")
B = dict(A, draft_model="tiny-draft-b", temperature=1.5, seed=3, max_tokens=6)


def on_engine(tiny: Registry, url: str, served: str, **engine: object) -> Registry:
    """The tiny registry with tiny-target replayed on the engine at `url` (tokenizers stay local)."""
    spec = EngineSpec("serve", url, **{"timeout_s": 30.0, "max_concurrency": 4, **engine})
    models = {**tiny.models, "tiny-target": ModelSpec("tiny-target", engine="serve", served_name=served)}
    return Registry(models, tiny.tokenizers, engines={"serve": spec})


@pytest.fixture(scope="module")
def local(tiny_registry):
    return SpecDecoder(tiny_registry, device="cpu")


@pytest.fixture(scope="module")
def served(tiny_registry):
    """(URL, served model name) of one `transformers serve` for the module: it takes seconds to start."""
    path = tiny_registry.models["tiny-target"].path
    with transformers_serve(path) as url:
        yield url, str(path)


@pytest.fixture(scope="module")
def remote(tiny_registry, served):
    return DecoderRouter.for_registry(on_engine(tiny_registry, *served), device="cpu")


@pytest.fixture(scope="module")
def incident(tmp_path_factory, local):
    """A log of the real service with a prompt-only key: b (sampled, another draft) got a's output."""
    tmp = tmp_path_factory.mktemp("engine-replay")
    clock = iter(1772359200.0 + i for i in range(100))
    service = DecodeService(MemoryCache(), local, key_scheme="prompt_only", guard=False,
                            log_sink=str(tmp / "service.jsonl"), deployment="edge", clock=lambda: next(clock))
    with service:
        service.decode(DecodeRequest(**A), request_id="a")
        service.decode(DecodeRequest(**B), request_id="b")
    return tmp / "service.jsonl"


def fresh_store(tmp_path, log) -> Store:
    store = Store(tmp_path / "s.duckdb")
    assert ingest(store, [str(log)]).accepted >= 1
    return store


def stored(store: Store) -> int:
    with store.read() as con:
        return con.execute("SELECT count(*) FROM replays").fetchone()[0]


def test_verdicts_through_transformers_serve_equal_the_in_process_ones(tmp_path, incident, local, remote):
    store = fresh_store(tmp_path, incident)
    for request_id, verdict in (("a", "match"), ("b", "foreign")):
        here, there = replay(store, request_id, local), replay(store, request_id, remote)
        assert here.classification == there.classification == verdict, there.message
    assert there.source_replay_text == there.production_text == here.source_replay_text
    engine = there.evidence["engine"]
    assert engine["name"] == "serve" and engine["model"] == remote.registry.models["tiny-target"].served_name
    assert "tiny-draft-b" in engine["speculation"] and "can't be set per request" in engine["speculation"]
    assert "log-probabilities" in there.evidence["not_available"]
    assert there.environment["engine"] == "serve" and "engine_evidence" not in there.environment
    assert stored(store) == 4


def test_a_greedy_difference_without_logprobs_is_undecided_and_says_why(tmp_path, remote):
    log = write_jsonl(tmp_path / "d.jsonl", [rec("d", **{**A, "draft_model": None, "num_speculative_tokens": None},
                                                 output_text=" something production said", output_tokens=4)])
    result = replay(fresh_store(tmp_path, log), "d", remote)
    assert result.classification == "unavailable", result.message
    assert "near-tie" in result.message and "log-probabilities" in result.evidence["not_available"]
    assert result.replay_text and result.evidence["first_divergent_token"] == 0


def test_what_the_server_cannot_take_is_done_here_or_said(remote, tiny_registry, faults):
    # transformers serve leaves a stop sequence in its text: cut here, and said; top_k goes in its
    # generation_config (a top-level top_k it refuses).
    out = remote.generate(DecodeRequest(**dict(A, stop=["the"])))
    assert "the" not in out.text and "stop_applied_here" in out.environment["engine_evidence"]
    sampled = remote.generate(DecodeRequest(**dict(B, top_k=5)))
    assert "parameters_refused" not in sampled.environment["engine_evidence"]
    assert sampled.environment["parameters_sent"]["seed"] == 3
    # A server that refuses the seed gets the request without it, and the evidence says so.
    refusing = DecoderRouter.for_registry(on_engine(tiny_registry, f"{faults.url}/no-seed/v1", "served-x"), device="cpu")
    out = refusing.generate(DecodeRequest(**B))
    assert out.environment["engine_evidence"]["parameters_refused"] == "seed=3"
    assert "seed" not in faults.seen[-1][2]


def test_a_batch_replays_side_by_side_with_progress(tmp_path, incident, remote):
    store = fresh_store(tmp_path, incident)
    seen: list[tuple[int, int, str]] = []
    results = replay_many(store, ["a", "b"], remote, progress=lambda n, total, r: seen.append((n, total, r.request_id)))
    assert [r.classification for r in results] == ["match", "foreign"]
    assert sorted(s[2] for s in seen) == ["a", "b"] and [s[:2] for s in seen] == [(1, 2), (2, 2)]
    job = jobs.start_job(store, ["a", "b"], lambda: remote)
    assert job.wait(60) and not job.errors and len(job.results) == 2
    assert stored(store) == 4


def test_preloading_loads_the_local_models_and_none_on_an_engine(tiny_registry):
    decoder = DecoderRouter.for_registry(on_engine(tiny_registry, "http://127.0.0.1:9/v1", "x"), device="cpu")
    state = jobs.preload_models(lambda: decoder)
    deadline = time.monotonic() + 60
    while not state.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert state.stage == "ready", state.error
    assert sorted(state.loaded) == ["tiny-draft-a", "tiny-draft-b"]  # tiny-target is on the engine


def test_preloading_loads_only_the_models_the_stores_requests_name(tiny_registry):
    decoder = SpecDecoder(tiny_registry, device="cpu")
    names = {"some": ("tiny-draft-b", "llama-8b"), "none": ("llama-8b", "none")}
    states = {k: jobs.preload_models(lambda: decoder, wanted=lambda v=v: v) for k, v in names.items()}
    deadline = time.monotonic() + 60
    while not all(s.finished for s in states.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert states["some"].stage == "ready" and states["some"].loaded == ["tiny-draft-b"], states["some"]
    assert states["none"].loaded == [] and "no request names a model" in states["none"].stage, states["none"]


def test_a_preload_after_an_event_loads_nothing_until_it_is_set(tiny_registry):
    """The dashboard's preload starts after its first page has run (ui.PAGE_RAN): until then it asks the store
    for nothing and loads nothing, for as long as a preload started at once takes to load everything."""
    decoder = SpecDecoder(tiny_registry, device="cpu")
    asked: list[str] = []
    page_ran = threading.Event()
    waiting = jobs.preload_models(lambda: decoder, wanted=lambda: asked.append("asked") or ("tiny-draft-a",),
                                  after=page_ran)
    at_once = jobs.preload_models(lambda: decoder, wanted=lambda: ("tiny-draft-a",))
    deadline = time.monotonic() + 60
    while not at_once.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert at_once.loaded == ["tiny-draft-a"], at_once
    assert (waiting.finished, waiting.stage, waiting.loaded, asked) == (False, "starting", [], [])
    page_ran.set()
    while not waiting.finished and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (waiting.stage, waiting.loaded, asked) == ("ready", ["tiny-draft-a"], ["asked"]), waiting


def test_a_dashboard_on_a_store_naming_no_local_model_never_imports_torch(tmp_path, tiny_registry):
    """The default decoder is built only when the registry has a model the store names: a fresh process
    preloading for a store of other models ends with torch unimported; naming the tiny draft loads it."""
    config = tmp_path / "specdec.toml"
    config.write_text(f'[models.tiny-draft-b]\npath = "{tiny_registry.models["tiny-draft-b"].path}"\n')
    script = ("import sys, time\nfrom specdec_core.replay import jobs\n"
              "s = jobs.preload_models(wanted=lambda: sys.argv[1:])\n"
              "while not s.finished: time.sleep(0.02)\n"
              "print(s.stage, s.loaded, 'torch' in sys.modules, s.error)\n")
    runs = {names: subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True,
                                  timeout=120, env={**os.environ, "SPECDEC_CONFIG": str(config)})
            for names in (("llama-8b", "none"), ("tiny-draft-b",))}
    other, named = (runs[k].stdout.strip() for k in runs)
    assert other == f"{jobs.NOTHING_NAMED} [] False None", runs[("llama-8b", "none")].stderr[-2000:]
    assert named == "ready ['tiny-draft-b'] True None", runs[("tiny-draft-b",)].stderr[-2000:]


def test_models_list_shows_where_models_replay_and_which_engines_answer(tmp_path, tiny_registry, served):
    url, name = served
    config = tmp_path / "specdec.toml"
    config.write_text(f'[engines.up]\nurl = "{url}"\n[engines.down]\nurl = "http://127.0.0.1:{free_port()}/v1"\n'
                      f'[models.big]\nengine = "up"\nserved_name = "{name}"\n[models.gone]\nengine = "down"\n'
                      f'[models.tiny-target]\npath = "{tiny_registry.models["tiny-target"].path}"\n')
    done = run_cli("models", "list", "--config", str(config), timeout=60)
    assert done.returncode == 0, done.stderr
    lines = {tuple(line.split("\t")[:3]) for line in done.stdout.splitlines()}
    assert {("model", "big", "engine"), ("model", "gone", "engine-down"), ("model", "tiny-target", "ready"),
            ("engine", "up", "answers"), ("engine", "down", "down")} <= lines
    assert name in done.stdout


# --- faults ------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def faults():
    with FaultServer() as server:
        yield server


@pytest.fixture
def batch(tmp_path):
    """Three greedy requests on tiny-target: a batch to send to a faulty engine."""
    log = write_jsonl(tmp_path / "f.jsonl", [rec(f"f{i}", **dict(A, prompt=f"{PROMPT} {i}"), cache_key=f"k{i}",
                                                 output_text="a fixed answer", output_tokens=3) for i in range(3)])
    return fresh_store(tmp_path, log)


@pytest.mark.parametrize("fault, says", [
    ("500", "HTTP 500: CUDA error: device-side assert\\x07"),
    ("malformed", "is not JSON"),
    ("hang", "no answer within timeout_s = 0.5 s"),
    ("wrong-model", "the answer is from 'someone-else'"),
    ("429-always", "HTTP 429 after retries: slow down"),
])
def test_a_faulty_engine_gives_one_clear_line_and_stores_nothing(tiny_registry, faults, batch, fault, says):
    decoder = DecoderRouter.for_registry(on_engine(tiny_registry, f"{faults.url}/{fault}/v1", "served-x", timeout_s=0.5,
                                    max_concurrency=1 if fault == "hang" else 3), device="cpu")
    failures: list[str] = []
    results = replay_many(batch, ["f0", "f1", "f2"], decoder, failures=failures)
    assert results == [] and stored(batch) == 0
    assert len(failures) == 1, failures
    assert says in failures[0] and "engine serve" in failures[0] and "\n" not in failures[0]
    if fault == "hang":  # dead after the first: the rest are not sent
        assert "on 1 of 1 replays sent" in failures[0] and "2 more not sent" in failures[0]
    else:  # all three go out at once, unless the first failed before the rest were sent (a busy machine)
        sent = int(re.search(r"on (\d) of \1 replays sent", failures[0]).group(1))
        assert sent == 3 or f"{3 - sent} more not sent to a dead engine" in failures[0], failures


def test_a_429_with_retry_after_is_waited_out_and_then_replays(tiny_registry, faults, batch):
    decoder = DecoderRouter.for_registry(on_engine(tiny_registry, f"{faults.url}/429-once/v1", "served-x"), device="cpu")
    started = time.monotonic()
    result = replay(batch, "f0", decoder)
    assert time.monotonic() - started >= 1.0  # Retry-After: 1
    assert result.classification == "match" and result.evidence["engine"]["system_fingerprint"] == "fp-test"
    assert stored(batch) == 1


@pytest.mark.parametrize("fault, reason", [
    ("500", "HTTP 500: CUDA error: device-side assert\\x07"),
    ("hang", "no answer within timeout_s = 0.5 s"),  # dead after the first call: the other two are not sent
])
def test_a_failed_engine_in_a_job_is_one_sentence_of_what_it_cost(tiny_registry, faults, batch, fault, reason):
    decoder = DecoderRouter.for_registry(on_engine(tiny_registry, f"{faults.url}/{fault}/v1", "served-x", timeout_s=0.5,
                                    max_concurrency=1), device="cpu")
    job = jobs.start_job(batch, ["f0", "f1", "f2"], lambda: decoder)
    assert job.wait(30)
    assert not job.results and not job.errors and job.done == job.total == 3 and not job.cancelled
    [failure] = job.engine_failures
    assert failure.summary() == f"engine serve failed: {reason} (3 requests not replayed)"
    assert stored(batch) == 0


def test_the_api_key_is_sent_from_the_environment_and_never_shown(tiny_registry, faults, batch, monkeypatch):
    monkeypatch.setenv("SPECDEC_TEST_KEY", "sk-secret-123")
    decoder = DecoderRouter.for_registry(on_engine(tiny_registry, f"{faults.url}/ok/v1", "served-x",
                                    api_key_env="SPECDEC_TEST_KEY"), device="cpu")
    result = replay(batch, "f1", decoder)
    assert faults.seen[-1][1]["Authorization"] == "Bearer sk-secret-123"
    assert "sk-secret" not in repr(result.to_json())
    monkeypatch.delenv("SPECDEC_TEST_KEY")
    with pytest.raises(EngineError, match="SPECDEC_TEST_KEY .* is not set"):
        replay(batch, "f2", decoder)


# --- an engine that returns prompt log-probabilities (vLLM's shape) -------------------------------------------------


def _one_token_swapped(local, which: str):
    """A greedy output with the token of the smallest (or largest) top-two margin swapped for the second choice."""
    import torch

    req = DecodeRequest(**dict(A, draft_model=None, num_speculative_tokens=None, max_tokens=16))
    out = local.generate(req)
    scores = local.score(req, out.token_ids)
    tok = local.loader.tokenizer(req.tokenizer_version)
    target = local.loader.model(req.target_model)
    with torch.inference_mode():
        logits = target(input_ids=torch.tensor([local.prompt_ids(req) + list(out.token_ids)])).logits[0]
    candidates = []
    for i in range(len(out.token_ids)):
        second = int(logits[len(local.prompt_ids(req)) - 1 + i].topk(2).indices[1])
        altered = list(out.token_ids[:i]) + [second]
        text = tok.decode(altered, skip_special_tokens=True)
        if local.encode_output(req, text) == altered:  # the text round-trips to these tokens
            candidates.append((scores.margins[i], i, text))
    return req, sorted(candidates)[0 if which == "small" else -1], sorted(candidates)[0][0]


@pytest.mark.parametrize("which, verdict", [("small", "near_tie"), ("large", "diverged")])
def test_with_prompt_logprobs_near_ties_are_told_from_divergence_as_in_process(tmp_path, tiny_registry, local,
                                                                              which, verdict):
    from engine_servers import LogprobServer

    req, (margin, position, text), smallest = _one_token_swapped(local, which)
    log = write_jsonl(tmp_path / "t.jsonl", [rec("t", **{k: v for k, v in req.to_record().items() if k != "prompt_hash"},
                                                 output_text=text, output_tokens=position + 1)])
    store = fresh_store(tmp_path, log)
    model, tok = local.loader.model("tiny-target"), local.loader.tokenizer("tiny-tok-v1")
    with LogprobServer(model, tok, "tiny-70b-served") as server:
        remote = DecoderRouter.for_registry(on_engine(tiny_registry, server.url, "tiny-70b-served"), device="cpu")
        there = replay(store, "t", remote, near_tie_margin=smallest + 1e-4)
        asked = [b for b in server.seen if b.get("prompt_logprobs")]
    here = replay(store, "t", local, near_tie_margin=smallest + 1e-4)
    assert here.classification == there.classification == verdict, there.message
    assert there.evidence["first_divergent_token"] == here.evidence["first_divergent_token"] == position
    assert there.evidence["production_rank_at_divergence"] == 2
    assert there.evidence["margin_at_divergence"] == pytest.approx(here.evidence["margin_at_divergence"], abs=1e-3)
    assert "not_available" not in there.evidence and asked
    assert there.evidence["engine"]["system_fingerprint"] == "vllm-shaped"
