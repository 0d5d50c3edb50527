"""The decoders replay uses behind one protocol: in-process on transformers + torch, or an engine's server.

The registry is plain Python; the engine and its loader need the replay extra (torch, transformers)
and load on first use, so reading `specdec.toml` works without them.
"""

from __future__ import annotations

import importlib
from typing import Any

from specdec_core.decoding.registry import Registry, RegistryError, UnknownModelError

_LAZY: dict[str, str] = {
    "Decoder": "protocol",
    "DecoderRouter": "router",
    "SpecDecoder": "engine",
    "ModelLoader": "loader",
    "TokenScores": "scoring",
}

__all__ = ["Decoder", "DecoderRouter", "ModelLoader", "Registry", "RegistryError", "SpecDecoder", "TokenScores",
           "UnknownModelError"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec_core.decoding' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
