"""An engine that is slow, hostile or misconfigured: what replay and `models list` do with it.

Real local servers throughout (engine_servers.py): one that writes a byte at a time or cuts the connection,
the fault server, and a stand-in llama-server that reports the settings it applied and its token counts.
"""

from __future__ import annotations

import json
import math
import time

import pytest
from engine_servers import FaultServer, LlamaServer, RawServer
from helpers import bare_env, rec, run_cli, write_jsonl

from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.engine_client import (
    CLOSED,
    HTTP,
    MALFORMED,
    NO_KEY,
    PROBE_TIMEOUT_S,
    TIMEOUT,
    EngineClient,
    EngineError,
    probe,
)
from specdec_core.decoding.registry import EngineSpec, ModelSpec, Registry
from specdec_core.decoding.router import DecoderRouter
from specdec_core.ingestion.load import ingest
from specdec_core.replay import jobs
from specdec_core.replay.diff import MAX_DIFF_WORDS, diff_outputs
from specdec_core.replay.run import ReplayResult, _replay_row, replay, replay_many
from specdec_core.store.connection import Store

PROMPT = "speculative decoding drafts tokens"
# A request of a model whose tokenizer is not on this machine: it goes to the chat endpoint as messages.
REMOTE = dict(prompt=PROMPT, target_model="remote-70b", draft_model=None, num_speculative_tokens=None,
              temperature=0.0, max_tokens=12, tokenizer_version="remote-tok")
TINY = dict(prompt=PROMPT, target_model="tiny-target", draft_model=None, num_speculative_tokens=None,
            temperature=0.0, max_tokens=12, tokenizer_version="tiny-tok-v1")
KEY_ENV = "SPECDEC_TRUST_KEY"
ESCAPES = "\x1b[2J\x1b]0;pwned\x07\x1b]8;;http://evil.example/\x1b\\click\x1b]8;;\x1b\\\rr9: match"


def spec(url: str, **kw: object) -> EngineSpec:
    return EngineSpec("e", url, **{"timeout_s": 1.0, "max_concurrency": 1, **kw})


def remote_registry(url: str, served: str = "served-x", **kw: object) -> Registry:
    return Registry({"remote-70b": ModelSpec("remote-70b", engine="e", served_name=served)}, {},
                    engines={"e": spec(url, **{"timeout_s": 5.0, **kw})})


def tiny_on(tiny: Registry, url: str, served: str) -> Registry:
    models = {**tiny.models, "tiny-target": ModelSpec("tiny-target", engine="e", served_name=served)}
    return Registry(models, tiny.tokenizers, engines={"e": spec(url, timeout_s=30.0)})


def store_of(tmp_path, records, name="s") -> Store:
    store = Store(tmp_path / f"{name}.duckdb")
    assert ingest(store, [str(write_jsonl(tmp_path / f"{name}.jsonl", records))]).accepted == len(records)
    return store


def stored(store: Store) -> int:
    with store.read() as con:
        return con.execute("SELECT count(*) FROM replays").fetchone()[0]


def config_toml(path, engines: dict[str, str], models: dict[str, str | None], key_env: str | None = None):
    lines = []
    for name, url in engines.items():
        lines += [f"[engines.{name}]", f'url = "{url}"', "timeout_s = 5"]
        if key_env:
            lines.append(f'api_key_env = "{key_env}"')
    for model, engine_and_name in models.items():
        engine, _, served = (engine_and_name or "").partition(":")
        lines += [f"[models.{model}]", f'engine = "{engine}"'] + ([f'served_name = "{served}"'] if served else [])
    path.write_text("\n".join(lines) + "\n")
    return path


def cli_env(config, **extra: str) -> dict[str, str]:
    return bare_env(SPECDEC_CONFIG=str(config), **extra)


@pytest.fixture(scope="module")
def raw():
    with RawServer() as server:
        yield server


@pytest.fixture(scope="module")
def faults():
    with FaultServer() as server:
        yield server


@pytest.fixture(scope="module")
def tok(tiny_registry):
    from specdec_core.decoding.loader import ModelLoader

    return ModelLoader(tiny_registry, device="cpu").tokenizer("tiny-tok-v1")


@pytest.fixture(scope="module")
def llama(tok):
    text = " the draft proposes and the target verifies"
    long_text = "word " * 200_000
    with LlamaServer(text, "models/target-f32.gguf", lambda t: tok.encode(t, add_special_tokens=False),
                     long_text) as server:
        yield server


# --- issue 51, item 2: timeout_s bounds the whole call ------------------------------------------------------------


@pytest.mark.parametrize("script", ["slow-headers", "slow-body", "slow-chunked"])
def test_a_server_sending_a_byte_at_a_time_is_cut_at_timeout_s(raw, script):
    client = EngineClient(spec(f"{raw.url}/{script}/v1"))
    started = time.monotonic()
    with pytest.raises(EngineError) as err:
        client.call("POST", "/completions", {"prompt": "x"}, retries=0)
    took = time.monotonic() - started
    assert err.value.kind == TIMEOUT and "no answer within timeout_s = 1 s" in str(err.value), str(err.value)
    assert took < 1.6, took  # the server trickles for 8 s


def test_the_models_list_probe_ends_within_its_own_two_seconds(raw):
    started = time.monotonic()
    answer = probe(spec(f"{raw.url}/slow-body/v1", timeout_s=60.0))
    assert time.monotonic() - started < PROBE_TIMEOUT_S + 0.6
    assert not answer.answers and "timeout_s = 2 s" in answer.said


# --- issue 51, item 8: redirects, cut connections, nesting, 429 ----------------------------------------------------


def test_a_redirect_with_a_json_body_is_not_the_answer(raw):
    with pytest.raises(EngineError) as err:
        EngineClient(spec(f"{raw.url}/redirect/v1")).call("POST", "/completions", {"prompt": "x"})
    assert err.value.kind == HTTP and err.value.status == 302
    assert "HTTP 302" in err.value.detail and "redirects are not followed" in err.value.detail


@pytest.mark.parametrize("script", ["cut", "cut-chunked"])
def test_a_connection_cut_mid_answer_says_connection_closed(raw, script):
    with pytest.raises(EngineError) as err:
        EngineClient(spec(f"{raw.url}/{script}/v1")).call("POST", "/completions", {"prompt": "x"})
    assert err.value.kind == CLOSED and "connection closed" in err.value.detail, err.value.detail
    assert "JSON" not in err.value.detail


def test_a_deeply_nested_answer_is_malformed_in_one_line_also_for_models_list(raw):
    with pytest.raises(EngineError) as err:
        EngineClient(spec(f"{raw.url}/nested/v1")).call("POST", "/completions", {"prompt": "x"})
    assert err.value.kind == MALFORMED and "nested more than" in err.value.detail
    answer = probe(spec(f"{raw.url}/nested/v1"))
    assert not answer.answers and "nested more than" in answer.said and "\n" not in answer.said


def test_an_engine_still_rate_limiting_after_its_retries_is_dead_for_the_batch(tmp_path, faults):
    store = store_of(tmp_path, [rec(f"r{i}", **dict(REMOTE, prompt=f"{PROMPT} {i}"), cache_key=f"k{i}")
                                for i in range(6)])
    decoder = DecoderRouter.for_registry(remote_registry(f"{faults.url}/429-always/v1"), device="cpu")
    failures: list[str] = []
    assert replay_many(store, [f"r{i}" for i in range(6)], decoder, failures=failures) == []
    [line] = failures
    assert "HTTP 429 after retries" in line and "on 1 of 1 replays sent" in line and "5 more not sent" in line
    assert stored(store) == 0


# --- issue 51, item 1: a key a header can't carry ------------------------------------------------------------------


@pytest.mark.parametrize("key", ["sk-SECRET\n", "sk-SECRET€", " sk-SECRET", "sk-SE\rCRET"])
def test_a_key_no_header_can_carry_is_one_line_naming_the_variable_never_the_value(tmp_path, faults, monkeypatch,
                                                                                    key):
    monkeypatch.setenv(KEY_ENV, key)
    client = EngineClient(spec(f"{faults.url}/ok/v1", api_key_env=KEY_ENV))
    with pytest.raises(EngineError) as err:
        client.call("POST", "/completions", {"prompt": "x"})
    message = str(err.value)
    assert err.value.kind == NO_KEY and KEY_ENV in message
    assert "\n" not in message and "CRET" not in message
    # A dashboard job stores and shows that sentence, and nothing else.
    store = store_of(tmp_path, [rec("r0", **REMOTE)])
    decoder = DecoderRouter.for_registry(remote_registry(f"{faults.url}/ok/v1", api_key_env=KEY_ENV), device="cpu")
    job = jobs.start_job(store, ["r0"], lambda: decoder)
    assert job.wait(30) and not job.results and not job.errors
    [failure] = job.engine_failures
    assert KEY_ENV in failure.summary() and "CRET" not in failure.summary() + failure.line()
    assert stored(store) == 0


def test_the_cli_says_a_bad_key_in_one_line_in_replay_and_models_list(tmp_path, faults, raw):
    config = config_toml(tmp_path / "specdec.toml", {"e": f"{faults.url}/ok/v1"}, {"remote-70b": "e:served-x"},
                         key_env=KEY_ENV)
    store = store_of(tmp_path, [rec("r0", **REMOTE)])
    env = cli_env(config, **{KEY_ENV: "sk-SECRET\n"})
    done = run_cli("replay", "--db", str(store.path), "--request-id", "r0", env=env, timeout=120)
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1 and KEY_ENV in done.stderr and "Traceback" not in done.stderr
    assert "SECRET" not in done.stdout + done.stderr
    done = run_cli("models", "list", "--config", str(config), env=dict(env, **{KEY_ENV: "sk-SECRET€"}), timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "SECRET" not in done.stdout + done.stderr
    [line] = [line for line in done.stdout.splitlines() if line.startswith("engine\te\t")]
    assert "\tdown\t" in line and KEY_ENV in line


# --- issue 51, item 5: nothing a log or an engine says drives the terminal -------------------------------------


def test_replay_output_escapes_terminal_control_sequences(tmp_path):
    with FaultServer(text=ESCAPES) as evil:
        config = config_toml(tmp_path / "specdec.toml", {"e": f"{evil.url}/ok/v1"}, {"remote-70b": "e:served-x"})
        store = store_of(tmp_path, [rec("r0", **REMOTE, output_text="fine\x1b[31m red\rr0: match\n\x1b]0;t\x07")])
        done = run_cli("replay", "--db", str(store.path), "--request-id", "r0", env=cli_env(config), timeout=120)
    assert done.returncode == 0, done.stderr
    for raw_char in ("\x1b", "\x07", "\r"):
        assert raw_char not in done.stdout
    assert "\\x1b[2J" in done.stdout and "\\r" in done.stdout and "r0: unavailable" in done.stdout


# --- issue 51, item 6: impossible scores are a malformed answer -------------------------------------------------


@pytest.mark.parametrize("bad", ["nan", "inf", "huge", "positive", "rank0", "rank-huge"])
def test_an_impossible_log_probability_or_rank_is_malformed_and_stores_nothing(tmp_path, tiny_registry, llama, bad):
    store = store_of(tmp_path, [rec("t", **TINY, output_text=" something production said", output_tokens=4)])
    decoder = DecoderRouter.for_registry(tiny_on(tiny_registry, f"{llama.url}/logprobs-{bad}/v1", "models/target-f32.gguf"),
                          device="cpu")
    with pytest.raises(EngineError) as err:
        replay(store, "t", decoder)
    assert err.value.kind == MALFORMED and "\n" not in str(err.value)
    assert stored(store) == 0


def test_json_output_and_stored_evidence_are_strict_json_whatever_a_score_is():
    result = ReplayResult("x", "diverged", "m", {"margin_at_divergence": math.inf, "scores": [math.nan, -1.5]})
    text = json.dumps(result.to_json(), allow_nan=False)
    assert json.loads(text)["evidence"] == {"margin_at_divergence": None, "scores": [None, -1.5]}
    row = _replay_row(result)
    assert "Infinity" not in row["evidence"] and "NaN" not in row["evidence"]


# --- issue 51, item 7: an answer longer than max_tokens ------------------------------------------------------------


def test_an_answer_past_max_tokens_is_cut_to_it_and_flagged(tiny_registry, llama):
    decoder = DecoderRouter.for_registry(tiny_on(tiny_registry, f"{llama.url}/long/v1", "models/target-f32.gguf"), device="cpu")
    started = time.monotonic()
    out = decoder.generate(DecodeRequest(**TINY))
    assert time.monotonic() - started < 5
    assert len(out.token_ids) == 12 and out.output_tokens == 12 and len(out.text) < 200
    ignored = out.environment["engine_evidence"]["parameters_ignored"]
    assert ignored.startswith("max_tokens=12 (the server returned 200000 tokens")


def test_an_answer_past_max_tokens_that_cant_be_counted_here_is_refused(tmp_path, llama):
    store = store_of(tmp_path, [rec("r0", **REMOTE)])
    decoder = DecoderRouter.for_registry(remote_registry(f"{llama.url}/long/v1", served="models/target-f32.gguf"), device="cpu")
    with pytest.raises(EngineError) as err:
        replay(store, "r0", decoder)
    assert err.value.kind == MALFORMED and "ignored max_tokens" in err.value.detail
    assert stored(store) == 0


def test_the_diff_of_huge_outputs_compares_a_bounded_number_of_words():
    production = "a b " * 60_000
    other = "b a " * 60_000
    started = time.monotonic()
    diff = diff_outputs(production, [1] * 10, other, [2] * 10, 32)
    assert time.monotonic() - started < 3
    assert "not compared" in diff.word_ops[-1].production and len(diff.word_ops[-1].production) < 500
    assert sum(len(op.production.split()) for op in diff.word_ops[:-1]) <= MAX_DIFF_WORDS


# --- issue 58: what llama-server showed ---------------------------------------------------------------------------


def test_every_sampling_field_is_sent_with_its_off_value_and_the_applied_settings_agree(tiny_registry, llama):
    decoder = DecoderRouter.for_registry(tiny_on(tiny_registry, f"{llama.url}/ok/v1", "models/target-f32.gguf"), device="cpu")
    sampled = DecodeRequest(**dict(TINY, temperature=0.7, top_p=0.95, seed=7))
    out = decoder.generate(sampled)
    sent = llama.seen[-1]
    assert sent["top_k"] == -1 and sent["min_p"] == 0.0 and sent["top_p"] == 0.95 and sent["seed"] == 7
    assert sent["repeat_penalty"] == sent["repetition_penalty"] == 1.0
    assert sent["presence_penalty"] == sent["frequency_penalty"] == 0.0 and sent["typical_p"] == 1.0
    assert "parameters_ignored" not in out.environment["engine_evidence"]
    decoder.generate(DecodeRequest(**TINY))
    greedy = llama.seen[-1]
    assert greedy["temperature"] == 0.0 and greedy["top_k"] == -1 and greedy["top_p"] == 1.0
    assert greedy["min_p"] == 0.0 and "seed" not in greedy


def test_settings_the_server_applied_otherwise_are_parameters_ignored(tiny_registry, llama):
    decoder = DecoderRouter.for_registry(tiny_on(tiny_registry, f"{llama.url}/stubborn/v1", "models/target-f32.gguf"),
                          device="cpu")
    out = decoder.generate(DecodeRequest(**dict(TINY, temperature=0.7, top_p=0.95, seed=7)))
    ignored = out.environment["engine_evidence"]["parameters_ignored"]
    assert "top_k=-1 (the server applied 40)" in ignored and "min_p=0.0 (the server applied 0.05)" in ignored


def test_the_servers_token_ids_are_the_replays_tokens_and_the_evidence_says_so(tiny_registry, llama, tok):
    decoder = DecoderRouter.for_registry(tiny_on(tiny_registry, f"{llama.url}/ok/v1", "models/target-f32.gguf"), device="cpu")
    out = decoder.generate(DecodeRequest(**TINY))
    assert list(out.token_ids) == tok.encode(llama.text, add_special_tokens=False)
    assert "the server's own token ids" in out.environment["engine_evidence"]["output_length"]
    # Without ids the text is re-tokenized here, and a server count that disagrees is said beside it.
    counted = DecoderRouter.for_registry(tiny_on(tiny_registry, f"{llama.url}/count-9/v1", "models/target-f32.gguf"), device="cpu")
    out = counted.generate(DecodeRequest(**TINY))
    how = out.environment["engine_evidence"]["output_length"]
    here = len(tok.encode(llama.text, add_special_tokens=False))
    assert here != 9 and how.startswith(f"{here} tokens, the text re-tokenized here")
    assert "(the server counted 9, usage.completion_tokens)" in how


def _across_max_tokens(tmp_path, own: int, source: int, produced: int, finish: str = "length") -> Store:
    text = " production's own words, served from the cache"
    return store_of(tmp_path, [
        rec("src", **dict(REMOTE, max_tokens=source), ts="2026-03-01T10:00:00Z", cache_key="k", output_text=text,
            output_tokens=produced, finish_reason=finish),
        rec("hit", **dict(REMOTE, max_tokens=own), ts="2026-03-01T10:01:00Z", cache_key="k", cache_hit=True,
            output_text=text, output_tokens=produced, finish_reason=finish),
    ], name=f"across-{own}-{source}")


def test_on_the_chat_path_the_length_rule_counts_the_servers_tokens_not_bytes(tmp_path, llama):
    # Production stopped at the source's 32; this request's own replay stops there too (the server counts 32
    # tokens, in far more bytes): the source's max_tokens explains nothing.
    store = _across_max_tokens(tmp_path, own=48, source=32, produced=32)
    decoder = DecoderRouter.for_registry(remote_registry(f"{llama.url}/count-32/v1", served="models/target-f32.gguf"),
                          device="cpu")
    result = replay(store, "hit", decoder)
    assert result.classification != "foreign", result.message
    assert "usage.completion_tokens" in result.evidence["engine"]["output_length"]
    assert len(result.replay_text.encode()) > 32


def test_production_longer_than_its_own_max_tokens_is_foreign_when_the_sources_allows_it(tmp_path, faults):
    store = _across_max_tokens(tmp_path, own=32, source=48, produced=38, finish="stop")
    decoder = DecoderRouter.for_registry(remote_registry(f"{faults.url}/ok/v1"), device="cpu")
    result = replay(store, "hit", decoder)
    assert result.classification == "foreign", result.message
    assert "38 tokens, more than this request's max_tokens 32 allows" in result.message
    assert result.source_request_id == "src"


def test_models_list_flags_a_served_name_the_engine_does_not_serve(tmp_path, faults, raw):
    config = config_toml(tmp_path / "specdec.toml", {"e": f"{faults.url}/ok/v1", "deep": f"{raw.url}/nested/v1"},
                         {"smollm2-135m": "e", "right": "e:served-x", "nested": "deep"})
    done = run_cli("models", "list", "--config", str(config), env=cli_env(config), timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    rows = {line.split("\t")[1]: line.split("\t") for line in done.stdout.splitlines() if line.startswith("model\t")}
    assert rows["smollm2-135m"][2] == "engine-unserved"
    assert 'set served_name = "served-x" in [models.smollm2-135m]' in rows["smollm2-135m"][3]
    assert rows["right"][2] == "engine" and rows["nested"][2] == "engine-down"
