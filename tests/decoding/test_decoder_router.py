"""The router in front of the two decoders: one protocol, each request to its decoder, engine decoders kept."""

from __future__ import annotations

from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.engine import SpecDecoder
from specdec_core.decoding.openai_engine import EngineDecoder
from specdec_core.decoding.protocol import Decoder
from specdec_core.decoding.registry import EngineSpec, ModelSpec, Registry
from specdec_core.decoding.router import DecoderRouter, routed

LOCAL = DecodeRequest(prompt="speculative decoding drafts tokens", target_model="tiny-target",
                      draft_model="tiny-draft-a", num_speculative_tokens=3, temperature=0.0, max_tokens=4,
                      tokenizer_version="tiny-tok-v1")


def with_remote(tiny: Registry) -> Registry:
    """The tiny registry plus a model on an engine nobody calls here (port 9 answers nothing)."""
    spec = EngineSpec("far", "http://127.0.0.1:9/v1", timeout_s=0.5, max_concurrency=2)
    models = {**tiny.models, "tiny-70b": ModelSpec("tiny-70b", engine="far", served_name="big")}
    return Registry(models, tiny.tokenizers, engines={"far": spec})


def test_each_request_goes_to_the_decoder_its_registry_entry_names(tiny_registry):
    router = DecoderRouter.for_registry(with_remote(tiny_registry), device="cpu")
    remote = DecodeRequest(
        prompt=LOCAL.prompt, target_model="tiny-70b", draft_model=None, temperature=0.0, max_tokens=4,
        tokenizer_version="tiny-tok-v1")
    assert router.decoder_for(LOCAL) is router.local
    engine = router.decoder_for(remote)
    assert isinstance(engine, EngineDecoder) and engine.spec.name == "far"
    assert router.decoder_for(remote) is engine  # made once: what it learns of the server is kept
    # the engine's decoder tokenizes with the tokenizer versions it was given, not through the local decoder
    assert engine.tokenizers is router.local.tokenizers
    assert engine.encode_output(remote, "drafts") == router.local.encode_output(LOCAL, "drafts")
    assert router.environment(remote)["engine_url"] == "http://127.0.0.1:9/v1"
    assert router.environment(LOCAL)["device"] == "cpu"
    assert not hasattr(router.registry, "engine_clients")


def test_both_decoders_and_the_router_are_decoders(tiny_registry):
    local = SpecDecoder(tiny_registry, device="cpu")
    router = DecoderRouter(local)
    spec = with_remote(tiny_registry).engines["far"]
    for decoder in (local, router, EngineDecoder(spec, tiny_registry, local.tokenizers)):
        assert isinstance(decoder, Decoder)


def test_a_spec_decoder_given_to_replay_goes_behind_one_router_for_its_life(tiny_registry):
    local = SpecDecoder(tiny_registry, device="cpu")
    first = routed(local)
    assert isinstance(first, DecoderRouter) and first.local is local
    assert routed(local) is first and routed(first) is first
