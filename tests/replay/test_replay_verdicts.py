"""Replay on the tiny model family: match, foreign (with its source), near_tie, unavailable, redacted."""

from __future__ import annotations

import json

import pytest
from helpers import DROP, bare_env, rec, run_cli, write_jsonl

from specdec_core.cache import MemoryCache
from specdec_core.contract.identity import DecodeRequest, sha256_hex
from specdec_core.contract.result import DecodeError
from specdec_core.decoding.engine import SpecDecoder
from specdec_core.ingestion.load import ingest
from specdec_core.replay.run import ReplayError, replay, replay_many
from specdec_core.service import DecodeService
from specdec_core.store.connection import Store

PROMPT = "speculative decoding drafts tokens"
A = dict(prompt=PROMPT, target_model="tiny-target", draft_model="tiny-draft-a", num_speculative_tokens=3,
         temperature=0.0, max_tokens=12, tokenizer_version="tiny-tok-v1")
# Same prompt, another draft model and a sampled temperature: prompt_only keys it like A.
B = dict(A, draft_model="tiny-draft-b", temperature=1.5, seed=3, max_tokens=6)


@pytest.fixture(scope="module")
def decoder(tiny_registry):
    return SpecDecoder(tiny_registry, device="cpu")


@pytest.fixture(scope="module")
def incident_store(tmp_path_factory, decoder):
    """A log written by the real service with the classic prompt-only key: B gets A's output."""
    tmp = tmp_path_factory.mktemp("replay")
    log = tmp / "service.jsonl"
    clock = iter(1772359200.0 + i for i in range(100))
    service = DecodeService(MemoryCache(), decoder, key_scheme="prompt_only", guard=False, log_sink=str(log),
                            deployment="edge", clock=lambda: next(clock))
    with service:
        service.decode(DecodeRequest(**A), request_id="a")
        service.decode(DecodeRequest(**B), request_id="b")
    store = Store(tmp / "replay.duckdb")
    assert ingest(store, [str(log)]).accepted == 2
    return store


def test_a_request_produced_by_the_decoder_replays_as_match(incident_store, decoder):
    result = replay(incident_store, "a", decoder)
    assert result.classification == "match", result.message
    assert result.diff.identical and result.diff.similarity == 1.0
    assert result.accepted_tokens is not None and result.accepted_tokens <= result.draft_tokens


def test_a_contaminated_hit_replays_as_foreign_and_names_its_source(incident_store, decoder):
    result = replay(incident_store, "b", decoder)
    assert result.classification == "foreign", result.message
    assert result.source_request_id == "a"
    assert result.evidence["source_replay_equals_production"] is True
    assert set(result.evidence["differing_fields"]) == {"draft_model", "temperature", "max_tokens"}
    assert result.source_replay_text == result.production_text != result.replay_text


def test_replaying_twice_stores_two_rows_with_the_same_result(incident_store, decoder):
    first = replay(incident_store, "a", decoder)
    second = replay(incident_store, "a", decoder)
    assert first.replay_text == second.replay_text and first.classification == second.classification
    with incident_store.read() as con:
        rows = con.execute("SELECT classification, replay_text FROM replays WHERE request_id = 'a'").fetchall()
    assert len(rows) >= 2 and len(set(rows)) == 1


def test_replay_many_reports_progress_and_loads_models_once(incident_store, decoder):
    replay_many(incident_store, ["a", "b"], decoder)  # warm: every model both requests name is loaded
    loads = decoder.load_count
    seen = []
    results = replay_many(incident_store, ["a", "b", "a"], decoder, progress=lambda n, total, r: seen.append(
        (n, total, r.classification)))
    assert [r.classification for r in results] == ["match", "foreign"]
    assert seen == [(1, 2, "match"), (2, 2, "foreign")]
    assert decoder.load_count == loads


def _greedy_with_alternative(decoder, margin_wanted: str):
    """A greedy output with one token swapped for the target's second choice, at the smallest or largest margin."""
    req = DecodeRequest(**dict(A, draft_model=None, num_speculative_tokens=None, max_tokens=16))
    out = decoder.generate(req)
    scores = decoder.score(req, out.token_ids)
    tok = decoder.loader.tokenizer(req.tokenizer_version)
    candidates = []
    for i in range(len(out.token_ids)):
        import torch

        target = decoder.loader.model(req.target_model)
        ids = torch.tensor([decoder.prompt_ids(req) + list(out.token_ids[:i])])
        with torch.inference_mode():
            logits = target(input_ids=ids).logits[0, -1]
        second = int(logits.topk(2).indices[1])
        altered = list(out.token_ids[:i]) + [second]
        text = tok.decode(altered, skip_special_tokens=True)
        if decoder.encode_output(req, text) == altered:  # the text round-trips to these tokens
            candidates.append((scores.margins[i], i, text))
    assert candidates, "no position round-trips through the tokenizer"
    return req, sorted(candidates)[0 if margin_wanted == "small" else -1]


@pytest.mark.parametrize("which", ["small", "large"])
def test_a_one_token_change_is_a_near_tie_only_where_the_margin_is_tiny(tmp_path, decoder, which):
    req, (margin, position, text) = _greedy_with_alternative(decoder, which)
    store = Store(tmp_path / "tie.duckdb")
    record = rec("t", **{k: v for k, v in req.to_record().items() if k != "prompt_hash"},
                 output_text=text, output_tokens=position + 1)
    ingest(store, [str(write_jsonl(tmp_path / "tie.jsonl", [record]))])
    # The threshold sits just above the smallest margin: a large margin must not pass for numerics.
    smallest_margin = _greedy_with_alternative(decoder, "small")[1][0]
    result = replay(store, "t", decoder, near_tie_margin=smallest_margin + 1e-4)
    assert result.evidence["first_divergent_token"] == position
    assert result.evidence["production_rank_at_divergence"] == 2
    if which == "small":
        assert result.classification == "near_tie", result.message
    else:
        assert margin > smallest_margin + 1e-4
        assert result.classification == "diverged", result.message


def test_an_unknown_model_is_unavailable_and_named(tmp_path, decoder):
    store = Store(tmp_path / "u.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "u.jsonl", [rec("u", target_model="mystery-70b",
                                                              tokenizer_version="tiny-tok-v1")]))])
    result = replay(store, "u", decoder)
    assert result.classification == "unavailable"
    assert "mystery-70b" in result.message and "specdec.toml" in result.message
    assert set(result.evidence["missing"]) == {"target_model", "draft_model"}  # llama-1b is unknown too


def test_a_redacted_prompt_says_so_and_replays_once_the_prompt_matches(tmp_path, decoder):
    store = Store(tmp_path / "r.duckdb")
    out = decoder.generate(DecodeRequest(**A))
    record = rec("r", **dict(A, prompt=DROP), prompt_hash=sha256_hex(PROMPT), output_text=out.text,
                 output_tokens=len(out.token_ids))
    ingest(store, [str(write_jsonl(tmp_path / "r.jsonl", [record]))])
    result = replay(store, "r", decoder)
    assert result.classification == "redacted" and "prompt_hash" in result.message
    with pytest.raises(ReplayError, match="hashes to"):
        replay(store, "r", decoder, prompt="not the prompt")
    assert replay(store, "r", decoder, prompt=PROMPT).classification == "match"


def test_unknown_request_id_is_a_clear_error(incident_store, decoder):
    with pytest.raises(ReplayError, match="not in"):
        replay(incident_store, "no-such-request", decoder)


def test_replay_mismatches_appear_in_the_report(incident_store, decoder):
    from specdec_core.analysis.report import mismatch_report, report_csv

    replay(incident_store, "b", decoder)
    frame = mismatch_report(incident_store, kinds=["replay_mismatch"])
    assert list(frame["request_id"]) == ["b"] and list(frame["classification"]) == ["foreign"]
    # The Export page's preview (the report's first rows, found from the summaries) holds it in its place.
    whole = mismatch_report(incident_store)
    for limit in (1, 2, len(whole)):
        assert report_csv(mismatch_report(incident_store, limit=limit)) == report_csv(whole.head(limit))
    assert "replay_mismatch" in set(mismatch_report(incident_store, limit=len(whole)).kind)


def _registry_toml(registry) -> str:
    lines = []
    for name, spec in registry.models.items():
        lines += [f"[models.{json.dumps(name)}]", f"path = {json.dumps(str(spec.path))}"]
    for name, spec in registry.tokenizers.items():
        lines += [f"[tokenizers.{json.dumps(name)}]", f"path = {json.dumps(str(spec.path))}",
                  f"chat_template = {json.dumps(spec.chat_template)}",
                  f"normalize = {json.dumps(list(spec.normalize))}"]
    return "\n".join(lines) + "\n"


def test_replay_cli_prints_classification_and_json(incident_store, tiny_registry, tmp_path):
    config = tmp_path / "specdec.toml"
    config.write_text(_registry_toml(tiny_registry))
    env = bare_env(SPECDEC_CONFIG=str(config))
    done = run_cli("replay", "--db", str(incident_store.path), "--request-id", "b", "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["classification"] == "foreign"
    done = run_cli("replay", "--db", str(incident_store.path), "--suspicious", "1", env=env)
    assert done.returncode == 0, done.stderr
    assert "b" in done.stdout and "foreign" in done.stdout


def _contaminated_across_max_tokens(tmp_path, decoder, source_draft):
    """A greedy hit served its source's output, cut at the source's max_tokens, with a near-tie in that output.

    Production's text took the target's second choice where the top two logits are closest, as another
    environment's numerics can; the source (max_tokens just long enough for that token) was a miss.
    """
    req, (margin, position, text) = _greedy_with_alternative(decoder, "small")
    source = rec("src", **{k: v for k, v in dict(req.to_record(), draft_model=source_draft, max_tokens=position + 1,
                                                 num_speculative_tokens=3 if source_draft else None).items()
                          if k != "prompt_hash"},
                 ts="2026-03-01T10:00:00Z", cache_key="k-prompt", output_text=text, output_tokens=position + 1,
                 finish_reason="length")
    hit = rec("hit", **dict(A, max_tokens=position + 9), ts="2026-03-01T10:01:00Z",
              cache_key="k-prompt", cache_hit=True, output_text=text, output_tokens=position + 1,
              finish_reason="length")
    store = Store(tmp_path / "across.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "across.jsonl", [source, hit]))])
    return store, margin, position


def test_a_greedy_hit_served_across_max_tokens_is_foreign_whatever_near_ties_its_prefix_has(tmp_path, decoder):
    store, margin, position = _contaminated_across_max_tokens(tmp_path, decoder, source_draft=None)
    result = replay(store, "hit", decoder, near_tie_margin=margin + 1e-4)
    assert result.classification == "foreign", result.message
    assert result.source_request_id == "src"
    assert result.evidence["own_near_tie_positions"] == [position]
    assert "max_tokens" in result.evidence["differing_fields"]
    assert "length_explained_by_source_max_tokens" in result.evidence
    # Without a source the same output is numerics: the near-tie decides only once the cache is cleared.
    alone = replay(store, "src", decoder, near_tie_margin=margin + 1e-4)
    assert alone.classification == "near_tie", alone.message


def test_a_length_only_the_sources_max_tokens_explains_is_foreign_when_the_source_cant_be_replayed(tmp_path, decoder):
    store, margin, position = _contaminated_across_max_tokens(tmp_path, decoder, source_draft="draft-not-here")
    result = replay(store, "hit", decoder, near_tie_margin=margin + 1e-4)
    assert result.classification == "foreign", result.message
    assert result.source_replay_text is None and "unavailable" in result.evidence["source_replay"]
    assert f"{position + 1} tokens, the source's max_tokens" in result.message


def test_a_harmless_contaminated_hit_matches_and_says_it_was_contaminated(tmp_path, decoder):
    out = decoder.generate(DecodeRequest(**A))
    served = dict(text=out.text, tokens=len(out.token_ids))
    log = [rec("m", **A, ts="2026-03-01T10:00:00Z", cache_key="k", output_text=served["text"],
               output_tokens=served["tokens"]),
           rec("h", **dict(A, draft_model="tiny-draft-b"), ts="2026-03-01T10:01:00Z", cache_key="k",
               cache_hit=True, output_text=served["text"], output_tokens=served["tokens"])]
    store = Store(tmp_path / "harmless.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "harmless.jsonl", log))])
    result = replay(store, "h", decoder)
    assert result.classification == "match", result.message
    assert result.evidence["contaminated_hit"] is True and result.evidence["harmless"] is True
    assert result.evidence["source_request_id"] == "m" and result.evidence["differing_fields"] == ["draft_model"]
    assert "lossless" in result.evidence["why_harmless"]
    assert "contaminated" in result.message and "harmless" in result.message
    clean = replay(store, "m", decoder)
    assert clean.classification == "match" and "contaminated_hit" not in clean.evidence


def test_replays_are_stored_by_column_name_whatever_the_table_order(tmp_path, decoder):
    from specdec_core.store.schema import REPLAY_COLUMNS

    out = decoder.generate(DecodeRequest(**A))
    store = Store(tmp_path / "order.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "order.jsonl", [rec("o", **A, output_text=out.text,
                                                                    output_tokens=len(out.token_ids))]))])
    with store.write() as con:  # a store whose replays table lists the same columns in another order
        con.execute("DROP TABLE replays")
        con.execute("CREATE TABLE replays (" + ", ".join(f"{n} {t}" for n, t in reversed(REPLAY_COLUMNS)) + ")")
    result = replay(store, "o", decoder)
    with store.read() as con:
        row = con.execute("SELECT replay_id, request_id, classification, replay_text, similarity "
                          "FROM replays").fetchone()
    assert row == (result.replay_id, "o", "match", out.text, 1.0)


def test_a_prompt_or_output_past_the_models_context_is_unavailable_not_decoded(tmp_path, decoder):
    # One logged record as long as the ingest allows (16 MiB) would hold the decoder for hours in one forward pass
    # that no production service ran: refused before the model sees it, and said in one line.
    long_text = " ".join(f"w{i}" for i in range(3000))
    req = DecodeRequest(**dict(A, prompt=long_text))
    prompt_tokens = len(decoder.prompt_ids(req))
    assert prompt_tokens > 512
    with pytest.raises(DecodeError, match=f"prompt: {prompt_tokens:,} tokens under tiny-tok-v1, and tiny-target "
                                          "holds 512 positions"):
        decoder.generate(req)
    short = DecodeRequest(**A)
    with pytest.raises(DecodeError, match="past the 512 positions tiny-target holds"):
        decoder.score(short, decoder.encode_output(short, long_text))

    store = Store(tmp_path / "long.duckdb")
    out = decoder.generate(short)
    records = [rec("long-prompt", **dict(A, prompt=long_text)),
               rec("long-output", **A, output_text=out.text + long_text, output_tokens=4000)]
    ingest(store, [str(write_jsonl(tmp_path / "long.jsonl", records))])
    result = replay(store, "long-prompt", decoder)
    assert result.classification == "unavailable" and "\n" not in result.message
    assert result.message.startswith(f"can't replay: prompt: {prompt_tokens:,} tokens") and not result.replay_text
    result = replay(store, "long-output", decoder)
    assert result.classification == "unavailable" and "\n" not in result.message
    assert result.message.startswith("can't compare production's output: ") and "past the 512 positions" in result.message
    assert result.replay_text == out.text  # what was decoded is kept


class _NeverEnd:
    """A logits processor that forbids every end token: the model decodes until something stops it."""

    def __init__(self, eos: list[int]) -> None:
        self.eos = eos

    def __call__(self, input_ids, scores):
        scores[:, self.eos] = -float("inf")
        return scores


def test_decoding_stops_where_the_context_ends_whatever_max_tokens_asks(tiny_registry, decoder):
    # A logged max_tokens of 10**18 decoded until cancelled; a service refuses one past its context.
    target = decoder.loader.model("tiny-target", "target model")
    tok = decoder.loader.tokenizer("tiny-tok-v1")
    never_end = SpecDecoder(tiny_registry, device="cpu", logits_processors=[_NeverEnd(decoder._eos_ids(target, tok))])
    req = DecodeRequest(**dict(A, max_tokens=600, draft_model=None, num_speculative_tokens=None))
    out = never_end.generate(req)
    assert len(out.token_ids) == 512 - len(decoder.prompt_ids(req))
    assert len(never_end.generate(DecodeRequest(**dict(A, max_tokens=40))).token_ids) == 40


def test_a_replay_jobs_progress_counts_to_where_decoding_stops(decoder):
    from specdec_core.replay.jobs import ProgressDecoder, ReplayJob

    job = ReplayJob(("x",))
    req = DecodeRequest(**dict(A, max_tokens=10**18))
    ProgressDecoder(decoder, job).generate(req)
    assert job.max_tokens == 512 - len(decoder.prompt_ids(req))  # not "of at most 1,000,000,000,000,000,000"


def test_a_request_whose_log_leaves_its_identity_unknown_is_unavailable_not_a_traceback(tmp_path, decoder):
    """A LiteLLM hit logs no temperature or max_tokens: its full identity is not in the log, so it is not replayed
    (a batch goes on); a field a replay can do without (OpenInference's top_k) is replayed as not sent, and said."""
    out = decoder.generate(DecodeRequest(**A)).text
    log = write_jsonl(tmp_path / "partial.jsonl", [
        rec("m", **A, cache_key="K", output_text=out),
        rec("h", **dict(A, draft_model="tiny-draft-b", temperature=DROP, max_tokens=DROP), cache_key="K",
            cache_hit=True, output_text=out, ts="2026-03-01T10:00:01Z", __unknown__=["max_tokens", "temperature"]),
        rec("o", **A, top_k=DROP, cache_key="K2", output_text=out, ts="2026-03-01T10:00:02Z", __unknown__=["top_k"]),
    ])
    store = Store(tmp_path / "partial.duckdb")
    assert ingest(store, [str(log)]).accepted == 3
    results = {r.request_id: r for r in replay_many(store, ["h", "o"], decoder)}
    hit = results["h"]
    assert hit.classification == "unavailable" and hit.replay_text is None
    assert "leaves max_tokens, temperature unknown" in hit.message and "replay its source m" in hit.message
    assert results["o"].classification == "match", results["o"].message
    assert results["o"].evidence["unknown_fields"] == "top_k unknown in the log: replayed as not sent"
    done = run_cli("replay", "--db", str(store.path), "--request-id", "h", env=bare_env())
    assert done.returncode == 0 and "Traceback" not in done.stderr and "unavailable" in done.stdout
