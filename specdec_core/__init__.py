"""specdec-triage's library: request identity, cache keys, guarded caches, the log store,
triage metrics, replay and the speculative decoder.

Heavy parts (torch, transformers, duckdb) load on first use, so `import specdec_core`
stays fast for the CLI.
"""

from __future__ import annotations

import importlib
from typing import Any

from specdec_core.contract import (
    DecodeRequest,
    DecodeResult,
    canonical_json,
    differing_fields,
    fingerprint,
    identity,
)
from specdec_core.keys import KEY_SCHEMA_VERSION, cache_key, key_scheme

# name -> module that defines it; imported when first touched. The field lists are read from the contract at
# every access, never copied here: a program that extends the contract sees its fields through this module too.
_LAZY: dict[str, str] = {
    "FIELDS": "contract",
    "IDENTITY_FIELDS": "contract",
    "Cache": "cache",
    "CacheRead": "cache",
    "MemoryCache": "cache",
    "RedisCache": "cache",
    "open_cache": "cache",
    "DecodeService": "service",
    "SpecDecoder": "decoding",
    "TokenScores": "decoding",
    "Registry": "decoding",
    "RegistryError": "decoding",
    "UnknownModelError": "decoding",
    "ReplayResult": "replay",
    "replay": "replay",
    "replay_many": "replay",
    "Store": "store",
    "StoreError": "store",
    "IngestResult": "ingestion",
    "ingest": "ingestion",
    "migrate": "derived",
    "Filters": "analysis",
    "headline": "analysis",
    "red_flags": "analysis",
    "mismatch_report": "analysis",
    "write_report": "analysis",
    "KeyAudit": "keys.audit",
    "audit_key_function": "keys.audit",
}

__all__ = [
    "KEY_SCHEMA_VERSION",
    "DecodeRequest",
    "DecodeResult",
    "cache_key",
    "canonical_json",
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
