"""The speculative decoder on transformers + torch: the engine, one proposer per file, the model registry."""

from specdec_core.decoding.engine import SpecDecoder, TokenScores
from specdec_core.decoding.registry import ModelLoader, Registry, RegistryError, UnknownModelError

__all__ = ["ModelLoader", "Registry", "RegistryError", "SpecDecoder", "TokenScores", "UnknownModelError"]
