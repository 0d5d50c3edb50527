"""specdec-triage's library: request identity, cache keys, guarded caches, the log store,
triage metrics, replay and the speculative decoder.

Heavy parts (torch, transformers, duckdb) load on first use, so `import specdec_core`
stays fast for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

from .keys import SCHEMA_VERSION, cache_key, key_scheme
from .request import DecodeRequest, differing_fields, fingerprint, identity
from .result import DecodeResult

# name -> module that defines it; imported when first touched.
_LAZY: dict[str, str] = {
    "Cache": "cache",
    "CacheRead": "cache",
    "MemoryCache": "cache",
    "RedisCache": "cache",
    "open_cache": "cache",
    "DecodeService": "service",
    "SpecDecoder": "engine",
    "TokenScores": "engine",
    "Registry": "models",
    "RegistryError": "models",
    "UnknownModelError": "models",
    "ReplayResult": "replay",
    "replay_many": "replay",
    "Store": "store",
    "IngestResult": "ingest",
    "Filters": "metrics",
    "mismatch_report": "report",
    "write_report": "report",
    "KeyAudit": "audit",
    "audit_key_function": "audit",
}

__all__ = [
    "SCHEMA_VERSION",
    "DecodeRequest",
    "DecodeResult",
    "cache_key",
    "differing_fields",
    "fingerprint",
    "identity",
    "key_scheme",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'specdec_core' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
