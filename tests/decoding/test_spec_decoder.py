"""The speculative decoder on the tiny demo family: real transformers code, small models."""

from __future__ import annotations

import math

import pytest

from specdec_core.contract.identity import DecodeRequest, fingerprint
from specdec_core.decoding.engine import DEFAULT_DRAFT_TOKENS, SpecDecoder, TokenScores, request_seed
from specdec_core.decoding.registry import ModelSpec, Registry, TokenizerSpec, UnknownModelError

PROMPTS = [
    "The cache key",
    "A speculative decoder",
    "Once upon a time",
    "Replay runs the request",
    "hello there, what is new",
    "The draft proposes a few tokens",
]


def req(**overrides) -> DecodeRequest:
    fields = dict(target_model="tiny-target", tokenizer_version="tiny-tok-v1", max_tokens=20, prompt="The cache key")
    fields.update(overrides)
    return DecodeRequest(**fields)


def test_same_request_twice_gives_the_same_tokens(engine):
    for r in (req(), req(temperature=1.0, seed=7, draft_model="tiny-draft-a", num_speculative_tokens=3)):
        first, second = engine.generate(r), engine.generate(r)
        assert first.token_ids == second.token_ids
        assert first.text == second.text
        assert first.accepted_per_step == second.accepted_per_step


def test_greedy_speculation_returns_the_plain_greedy_output(engine):
    compared = 0
    for prompt in PROMPTS:
        plain = engine.generate(req(prompt=prompt, max_tokens=24))
        assert plain.token_ids, prompt
        for draft in ("tiny-draft-a", "tiny-draft-b", "ngram-2"):
            for n in (1, 4):
                spec = engine.generate(req(prompt=prompt, max_tokens=24, draft_model=draft, num_speculative_tokens=n))
                assert spec.token_ids == plain.token_ids, (prompt, draft, n)
                assert spec.text == plain.text
                compared += 1
    assert compared == len(PROMPTS) * 6


def test_seeded_sampling_with_another_draft_model_gives_another_sample(engine):
    differing = []
    for prompt in PROMPTS:
        common = dict(prompt=prompt, temperature=1.0, seed=11, max_tokens=16, num_speculative_tokens=4)
        a = engine.generate(req(draft_model="tiny-draft-a", **common))
        b = engine.generate(req(draft_model="tiny-draft-b", **common))
        assert engine.generate(req(draft_model="tiny-draft-a", **common)).token_ids == a.token_ids
        if a.token_ids != b.token_ids:
            differing.append(prompt)
    assert differing, "the draft model never changed a seeded sample"


def test_the_seed_decides_the_sample(engine):
    samples = {engine.generate(req(prompt="hello there", temperature=1.5, seed=s, max_tokens=12)).token_ids for s in range(6)}
    assert len(samples) > 1


def test_a_request_without_seed_is_seeded_from_its_fingerprint(engine):
    r = req(prompt="hello there", temperature=1.5, max_tokens=12)
    assert request_seed(r) == int(fingerprint(r)[:16], 16)
    first = engine.generate(r)
    assert engine.generate(r).token_ids == first.token_ids
    assert first.environment["seed"] == request_seed(r)


def test_max_tokens_caps_the_output_and_reports_length(engine):
    for draft in (None, "tiny-draft-a", "ngram-3"):
        result = engine.generate(req(prompt="Once upon a time", max_tokens=4, draft_model=draft))
        assert result.output_tokens == 4 == len(result.token_ids)
        assert result.finish_reason == "length"


def test_a_stop_sequence_cuts_the_output_before_it(engine):
    full = engine.generate(req(max_tokens=30))
    assert "field" in full.text
    for draft in (None, "tiny-draft-b"):
        stopped = engine.generate(req(max_tokens=30, stop=("field", "zzz"), draft_model=draft))
        assert stopped.finish_reason == "stop"
        assert "field" not in stopped.text
        assert full.text.startswith(stopped.text)
        assert stopped.text == full.text[: full.text.index("field")]
        assert stopped.output_tokens == len(stopped.token_ids) < full.output_tokens
        assert len(engine.decode(req(), stopped.token_ids)) >= len(stopped.text)


def test_an_eos_token_ends_the_output_with_stop(engine):
    result = engine.generate(req(max_tokens=60))
    assert result.finish_reason == "stop"
    assert result.output_tokens < 60
    assert "<|endoftext|>" not in result.text
    assert result.output_tokens == len(result.token_ids)


def test_acceptance_counts_add_up(engine):
    for draft, n in (("tiny-draft-a", 3), ("tiny-draft-b", 5), ("ngram-2", None)):
        r = req(prompt="The draft proposes a few tokens and the target verifies them. The draft proposes",
                draft_model=draft, num_speculative_tokens=n, max_tokens=30)
        result = engine.generate(r)
        length = n or DEFAULT_DRAFT_TOKENS
        assert result.accepted_per_step, draft
        assert 0 <= result.accepted_tokens <= result.draft_tokens
        assert sum(result.accepted_per_step) == result.accepted_tokens
        assert all(0 <= a <= length for a in result.accepted_per_step)
        # constant schedule: no step proposes more than the draft length
        assert result.draft_tokens <= length * len(result.accepted_per_step)
        assert result.output_tokens == len(result.token_ids)


def test_no_speculation_reports_no_draft_counts(engine):
    for draft in (None, "none"):
        result = engine.generate(req(draft_model=draft))
        assert result.draft_tokens is None and result.accepted_tokens is None
        assert result.accepted_per_step == ()
        assert result.environment["speculation"] == "none"


def test_ngram_drafting_accepts_tokens_from_a_repetitive_prompt(engine):
    prompt = "one, two, three, four, five. one, two, three, four, five. one, two, three"
    result = engine.generate(req(prompt=prompt, draft_model="ngram-3", num_speculative_tokens=4, max_tokens=24))
    assert result.environment["speculation"] == "ngram"
    assert result.accepted_tokens > 0
    assert result.token_ids == engine.generate(req(prompt=prompt, max_tokens=24)).token_ids


def test_a_replay_does_not_depend_on_earlier_calls(engine):
    r = req(prompt="A speculative decoder", draft_model="tiny-draft-a", num_speculative_tokens=2, max_tokens=24)
    first = engine.generate(r)
    engine.generate(req(prompt="Once upon a time", draft_model="tiny-draft-a", num_speculative_tokens=6))
    engine.generate(req(prompt="hello", draft_model="tiny-draft-a", temperature=1.0, seed=3))
    again = engine.generate(r)
    assert (again.token_ids, again.accepted_per_step, again.draft_tokens) == (
        first.token_ids, first.accepted_per_step, first.draft_tokens)


def test_loaded_models_are_reused_between_requests(engine):
    engine.generate(req(draft_model="tiny-draft-a"))
    loads = engine.load_count
    for prompt in PROMPTS[:3]:
        engine.generate(req(prompt=prompt, draft_model="tiny-draft-a"))
        engine.score(req(prompt=prompt), [1, 2, 3])
    assert engine.load_count == loads


def test_tokenizer_versions_differ_only_for_prompts_their_preprocessing_changes(engine):
    same = "the cache key"
    differs = "The  Cache\u00a0Key"
    assert engine.prompt_ids(req(prompt=same)) == engine.prompt_ids(req(prompt=same, tokenizer_version="tiny-tok-v2"))
    assert engine.prompt_ids(req(prompt=differs)) != engine.prompt_ids(
        req(prompt=differs, tokenizer_version="tiny-tok-v2"))
    assert engine.prompt_ids(req(prompt=differs, tokenizer_version="tiny-tok-v2")) == engine.prompt_ids(
        req(prompt="the cache key"))


def test_environment_names_versions_device_and_models(engine):
    env = engine.generate(req(draft_model="tiny-draft-b", num_speculative_tokens=2)).environment
    assert {"torch", "transformers", "device", "dtype", "sklearn"} <= env.keys()
    assert env["device"] == "cpu" and env["dtype"] == "float32"
    assert env["target_model"] == "tiny-target" and env["draft_model"] == "tiny-draft-b"
    assert env["speculation"] == "draft" and env["num_speculative_tokens"] == 2
    assert env["tokenizer_version"] == "tiny-tok-v1"
    assert env["cpu_threads"] == 1  # small models decode single-threaded


def test_score_of_the_greedy_output_is_all_argmax(engine):
    r = req(max_tokens=12)
    result = engine.generate(r)
    scores = engine.score(r, result.token_ids)
    assert isinstance(scores, TokenScores)
    assert len(scores) == len(result.token_ids)
    assert scores.argmax_ids == result.token_ids
    assert set(scores.ranks) == {1}
    assert all(lp == 0.0 for lp in scores.logprobs)
    assert all(lp <= 0.0 for lp in scores.raw_logprobs)
    assert all(m >= 0.0 for m in scores.margins)
    assert scores.first_non_argmax() is None


def test_score_flags_a_token_the_target_would_not_pick(engine):
    r = req(max_tokens=8)
    tokens = list(engine.generate(r).token_ids)
    scores = engine.score(r, tokens)
    swapped = tokens[:]
    swapped[3] = next(t for t in range(10, 500) if t != scores.argmax_ids[3])
    bad = engine.score(r, swapped)
    assert bad.first_non_argmax() == 3
    assert bad.ranks[3] > 1
    assert bad.logprobs[3] == -math.inf  # a greedy request could never have produced it
    assert bad.raw_logprobs[3] < scores.raw_logprobs[3]

    sampled = engine.score(req(max_tokens=8, temperature=0.8), swapped)
    assert math.isfinite(sampled.logprobs[3])
    top1 = engine.score(req(max_tokens=8, temperature=0.8, top_k=1), swapped)
    assert top1.logprobs[3] == -math.inf and top1.logprobs[0] == 0.0
    assert 3 in top1.impossible_positions()


def test_encode_output_round_trips_text(engine):
    text = " must include every field that changes the output."
    ids = engine.encode_output(req(), text)
    assert ids and engine.decode(req(), ids) == text
    assert engine.score(req(), ids).prompt_tokens == len(engine.prompt_ids(req()))


def test_a_redacted_prompt_cannot_be_decoded(engine):
    r = DecodeRequest(target_model="tiny-target", tokenizer_version="tiny-tok-v1", max_tokens=4, prompt_hash="a" * 64)
    with pytest.raises(ValueError, match="prompt_hash"):
        engine.generate(r)


def test_unknown_names_raise_listing_what_the_registry_knows(engine):
    with pytest.raises(UnknownModelError) as err:
        engine.generate(req(draft_model="tiny-draft-z"))
    assert err.value.name == "tiny-draft-z" and err.value.kind == "draft model"
    assert "tiny-draft-a" in str(err.value) and "ngram-N" in str(err.value)
    with pytest.raises(UnknownModelError) as err:
        engine.generate(req(tokenizer_version="tiny-tok-v9"))
    assert err.value.kind == "tokenizer" and "tiny-tok-v1, tiny-tok-v2" in str(err.value)


def test_a_chat_template_tokenizer_version_wraps_the_prompt(tiny_registry):
    base = tiny_registry.tokenizer("tiny-tok-v1")
    chat = TokenizerSpec("tiny-tok-chat", path=base.path, chat_template=True)
    registry = Registry(tiny_registry.models, {**tiny_registry.tokenizers, chat.name: chat})
    engine = SpecDecoder(registry, device="cpu")
    plain = engine.prompt_ids(req())
    wrapped = engine.prompt_ids(req(tokenizer_version="tiny-tok-chat"))
    tok = engine.loader.tokenizer("tiny-tok-chat")
    assert tok.decode(wrapped) == "<|im_start|>user\nThe cache key<|im_end|>\n<|im_start|>assistant\n"
    assert wrapped != plain


def test_a_draft_with_another_vocabulary_is_refused(tiny_registry, tmp_path):
    from transformers import LlamaConfig, LlamaForCausalLM

    odd = LlamaForCausalLM(LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, num_key_value_heads=2))
    odd.save_pretrained(str(tmp_path / "odd"))
    registry = Registry({**tiny_registry.models, "odd": ModelSpec("odd", path=tmp_path / "odd")},
                        tiny_registry.tokenizers)
    with pytest.raises(ValueError, match="odd has a 100-token vocabulary"):
        SpecDecoder(registry, device="cpu").generate(req(draft_model="odd"))
