"""The speculative decoder on transformers + torch: the engine, one proposer per file, the model registry."""

from specdec_core.decoding.engine import SpecDecoder
from specdec_core.decoding.loader import ModelLoader
from specdec_core.decoding.registry import Registry, RegistryError, UnknownModelError
from specdec_core.decoding.scoring import TokenScores

__all__ = ["ModelLoader", "Registry", "RegistryError", "SpecDecoder", "TokenScores", "UnknownModelError"]
