"""The request's tokenizer version on this machine: the prompt as the model is fed it, outputs to and from tokens.

Both decoders need it: the in-process one to decode, the engine's to send token ids and count an answer's
tokens the way the request's tokenizer does. Neither reaches into the other for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.loader import ModelLoader
from specdec_core.decoding.registry import Registry, RegistryError


class Tokenizers:
    """The registry's tokenizer versions, loaded through `loader` (shared with the models it keeps)."""

    def __init__(self, registry: Registry, loader: ModelLoader) -> None:
        self.registry, self.loader = registry, loader

    def available(self, name: str) -> bool:
        """Whether tokenizer version `name` is in the registry and its files are here."""
        return self.registry.knows(name, "tokenizer") and self.registry.is_available(name)

    def get(self, name: str) -> Any:
        return self.loader.tokenizer(name)

    def prompt_text(self, req: DecodeRequest) -> str:
        """The prompt as the tokenizer version feeds it: preprocessed, then its chat template where it has one."""
        if req.prompt is None:
            raise ValueError("prompt: the log holds only prompt_hash, so this request can't be decoded")
        spec = self.registry.tokenizer(req.tokenizer_version)
        text = spec.preprocess(req.prompt)
        if not spec.chat_template:
            return text
        tok = self.get(req.tokenizer_version)
        if not getattr(tok, "chat_template", None):
            raise RegistryError(f"tokenizer {spec.name}: chat_template = true but its tokenizer has no chat template")
        return tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=False)

    def prompt_ids(self, req: DecodeRequest) -> list[int]:
        """The prompt's token ids as the request's tokenizer version feeds them to the model."""
        text = self.prompt_text(req)
        tok = self.get(req.tokenizer_version)
        # A rendered chat template already holds the special tokens.
        ids = tok.encode(text, add_special_tokens=not self.registry.tokenizer(req.tokenizer_version).chat_template)
        if not ids:  # an empty prompt still needs one position to predict from
            start = tok.bos_token_id if tok.bos_token_id is not None else tok.eos_token_id
            ids = [int(start)]
        return list(ids)

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        """Token ids of an output text (a production output) under the request's tokenizer."""
        return list(self.get(req.tokenizer_version).encode(text, add_special_tokens=False))

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        return self.get(req.tokenizer_version).decode(list(token_ids), skip_special_tokens=True)
