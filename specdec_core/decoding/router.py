"""The decoder replay calls: each request goes to the engine its target model is on, else to this process.

The registry says where a model replays (`[models.NAME] engine = ...`); the router holds the one in-process
decoder and one `EngineDecoder` per engine, made on first use and kept, so what an engine taught a decoder
(fields it refuses, whether it scores) holds for every later replay through this router.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from specdec_core.contract.identity import DecodeRequest
from specdec_core.contract.result import DecodeResult
from specdec_core.decoding.openai_engine import EngineDecoder
from specdec_core.decoding.protocol import Decoder
from specdec_core.decoding.registry import Registry
from specdec_core.decoding.scoring import TokenScores
from specdec_core.decoding.tokenizers import Tokenizers

if TYPE_CHECKING:  # the router itself needs no torch; the in-process decoder does
    from specdec_core.decoding.engine import SpecDecoder


class DecoderRouter:
    """A `Decoder` over the registry of `local`: engine models go to their engine, the rest to `local`."""

    def __init__(self, local: SpecDecoder) -> None:
        self.local = local
        self.registry = local.registry
        self._engines: dict[str, EngineDecoder] = {}
        self._lock = threading.Lock()

    @classmethod
    def for_registry(cls, registry: Registry | None = None, device: str = "auto", **options: Any) -> DecoderRouter:
        """A router over a new SpecDecoder on `registry` (the configured one by default); options go to SpecDecoder."""
        from specdec_core.decoding.engine import SpecDecoder

        return cls(SpecDecoder(registry, device, **options))

    def __repr__(self) -> str:
        return f"DecoderRouter({self.registry!r})"

    def engine_for(self, req: DecodeRequest) -> EngineDecoder | None:
        """The decoder of the engine the request's target model is on; None for a model decoded in this process."""
        spec = self.registry.engine_of(req.target_model)
        if spec is None:
            return None
        with self._lock:
            if spec.name not in self._engines:
                self._engines[spec.name] = EngineDecoder(spec, self.registry, self.local.tokenizers)
            return self._engines[spec.name]

    def decoder_for(self, req: DecodeRequest) -> Decoder:
        remote = self.engine_for(req)
        return self.local if remote is None else remote

    def generate(self, req: DecodeRequest) -> DecodeResult:
        # An engine call runs outside the in-process decoder's lock: the engine calls of a batch go side by side.
        return self.decoder_for(req).generate(req)

    def score(self, req: DecodeRequest, output_token_ids: Sequence[int]) -> TokenScores:
        return self.decoder_for(req).score(req, output_token_ids)

    def can_score(self, req: DecodeRequest) -> bool:
        return self.decoder_for(req).can_score(req)

    def fits(self, req: DecodeRequest, output_tokens: int = 0) -> None:
        self.decoder_for(req).fits(req, output_tokens)

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        return self.decoder_for(req).encode_output(req, text)

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        return self.decoder_for(req).decode(req, token_ids)

    def environment(self, req: DecodeRequest) -> dict[str, Any]:
        return self.decoder_for(req).environment(req)


@runtime_checkable
class Routing(Protocol):
    """A decoder that sends some requests to an engine (a router, or a decoder wrapping one)."""

    def engine_for(self, req: DecodeRequest) -> EngineDecoder | None: ...


_ROUTERS: weakref.WeakKeyDictionary[Any, DecoderRouter] = weakref.WeakKeyDictionary()
_ROUTERS_LOCK = threading.Lock()


def routed(decoder: Decoder) -> Decoder:
    """The decoder replay calls for `decoder`: a SpecDecoder given alone goes behind its one router.

    One router per SpecDecoder, so the engines' decoders, and what they learnt, last as long as it does.
    Anything else (a router, a decoder of a test) is used as it is.
    """
    if isinstance(decoder, DecoderRouter) or not isinstance(getattr(decoder, "tokenizers", None), Tokenizers):
        return decoder
    with _ROUTERS_LOCK:
        router = _ROUTERS.get(decoder)
        if router is None:
            router = _ROUTERS[decoder] = DecoderRouter(decoder)  # type: ignore[arg-type]
        return router
