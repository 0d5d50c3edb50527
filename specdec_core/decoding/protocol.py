"""What replay asks of a decoder, whichever runs the request: in-process (SpecDecoder) or an engine's server.

As vLLM's proposers share one interface, the two decoders share this one; replay talks to a `DecoderRouter`,
which picks the decoder of each request by the registry.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

from specdec_core.contract.identity import DecodeRequest
from specdec_core.contract.result import DecodeResult
from specdec_core.decoding.registry import Registry
from specdec_core.decoding.scoring import TokenScores


@runtime_checkable
class Decoder(Protocol):
    """Decodes a request with its full identity and scores outputs under it."""

    registry: Registry

    def generate(self, req: DecodeRequest) -> DecodeResult:
        """Decode the request as its identity says (sampling, stops, max_tokens, speculation, seed)."""
        ...

    def score(self, req: DecodeRequest, output_token_ids: Sequence[int]) -> TokenScores:
        """The target's view of each output token after the request's prompt (teacher forcing)."""
        ...

    def can_score(self, req: DecodeRequest) -> bool:
        """Whether `score` can run for this request."""
        ...

    def fits(self, req: DecodeRequest, output_tokens: int = 0) -> None:
        """Raise DecodeError unless the prompt, and `output_tokens` after it, fit the target's context."""
        ...

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        """An output text as token ids under the request's tokenizer (positions of a diff count these)."""
        ...

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        ...

    def environment(self, req: DecodeRequest) -> dict[str, Any]:
        """What a replay must match for its output to be comparable with this one."""
        ...


class TokenizerProvider(Protocol):
    """The request's tokenizer version on this machine, as an engine's decoder needs it (decoding.tokenizers)."""

    def available(self, name: str) -> bool: ...

    def get(self, name: str) -> Any: ...

    def prompt_text(self, req: DecodeRequest) -> str: ...

    def prompt_ids(self, req: DecodeRequest) -> list[int]: ...

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]: ...

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str: ...
