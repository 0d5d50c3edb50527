"""Loads the models and tokenizers a registry names, keeping the most recently used ones in memory."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from specdec_core.decoding.registry import ModelSpec, Registry, RegistryError
from specdec_core.extras import require

# transformers builds a model on torch's meta device by patching torch for the whole process while it loads:
# two loaders at once (the dashboard's background preload and a replay's) left one with meta tensors
# ("Cannot copy out of meta tensor"). One load at a time in a process; each loader's own lock is per loader.
_FROM_PRETRAINED = threading.Lock()


class ModelLoader:
    """Loads models and tokenizers by logical name and keeps the most recent ones (bounded LRU).

    `load_count` counts model loads from disk, so a caller can show that repeated
    requests reuse the loaded weights.
    """

    def __init__(self, registry: Registry, device: str = "cpu", dtype: Any = None, capacity: int = 4) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: must be >= 1, got {capacity}")
        self.registry = registry
        self.device = device
        self.dtype = dtype
        self.capacity = capacity
        self.load_count = 0
        self.tokenizer_load_count = 0
        self._models: OrderedDict[str, Any] = OrderedDict()
        self._tokenizers: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._lock = threading.RLock()

    def model(self, name: str, kind: str = "model") -> Any:
        with self._lock:
            if name in self._models:
                self._models.move_to_end(name)
                return self._models[name]
            spec = self.registry.model(name, kind)
            model = self._load_model(spec)
            self._models[name] = model
            self.load_count += 1
            while len(self._models) > self.capacity:
                self._models.popitem(last=False)
            return model

    def _load_model(self, spec: ModelSpec) -> Any:
        AutoModelForCausalLM = require("replay", "transformers").AutoModelForCausalLM

        where, kwargs = spec.from_pretrained_args()
        try:
            with _FROM_PRETRAINED:
                model = AutoModelForCausalLM.from_pretrained(where, dtype=self.dtype, **kwargs)
        except OSError as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise RegistryError(f"{spec.name}: can't load weights from {spec.source}: {first}") from e
        return model.to(self.device).eval()

    def tokenizer(self, name: str) -> Any:
        """The tokenizer behind a tokenizer version; versions sharing files share one object."""
        with self._lock:
            where, kwargs = self.registry.tokenizer_source(name)
            key = (where, repr(sorted(kwargs.items())))
            if key in self._tokenizers:
                self._tokenizers.move_to_end(key)
                return self._tokenizers[key]
            AutoTokenizer = require("replay", "transformers").AutoTokenizer

            try:
                tok = AutoTokenizer.from_pretrained(where, **kwargs)
            except OSError as e:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise RegistryError(f"tokenizer {name}: can't load from {where}: {first}") from e
            self._tokenizers[key] = tok
            self.tokenizer_load_count += 1
            while len(self._tokenizers) > 4 * self.capacity:
                self._tokenizers.popitem(last=False)
            return tok

    def loaded(self) -> list[str]:
        with self._lock:
            return list(self._models)
