"""Cache keys: the correct one, and the narrow schemes seen in production incidents.

The narrow schemes exist so the simulator and the tests can reproduce the bug
class on purpose; nothing in the service uses them unless asked by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from specdec_core.contract.identity import DecodeRequest, fingerprint, sha256_hex

# The cache keys' and entries' version: bump to invalidate every entry written under an older identity definition.
KEY_SCHEMA_VERSION = "v1"
DEFAULT_NAMESPACE = "default"
KEY_PREFIX = "specdec"

KeyFunction = Callable[[DecodeRequest, str], str]


@lru_cache(maxsize=256)  # checked once per namespace, not once per key
def namespace_prefix(namespace: str = DEFAULT_NAMESPACE) -> str:
    """Every key of a namespace starts with this; `delete_namespace` matches on it."""
    if not namespace or any(c in namespace for c in ":*?[]\n"):
        raise ValueError(f"namespace: {namespace!r} must be non-empty without ':', '*', '?', '[', ']'")
    return f"{KEY_PREFIX}:{namespace}:"


def cache_key(req: DecodeRequest | Mapping[str, Any], namespace: str = DEFAULT_NAMESPACE) -> str:
    """The correct key: namespace, schema version and the full identity's fingerprint."""
    return f"{namespace_prefix(namespace)}{KEY_SCHEMA_VERSION}:{fingerprint(req)}"


def _prompt(req: DecodeRequest) -> str:
    return req.prompt if req.prompt is not None else req.prompt_sha256


def prompt_only_key(req: DecodeRequest, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The classic bug: Python's built-in hash of the prompt. Narrow, and different in every process."""
    return f"{namespace_prefix(namespace)}prompt_only:{hash(_prompt(req)) & 0xFFFFFFFFFFFFFFFF:016x}"


def model_prompt_key(req: DecodeRequest, namespace: str = DEFAULT_NAMESPACE) -> str:
    """Stable, but ignores draft model, sampling, max_tokens, stop and tokenizer."""
    return f"{namespace_prefix(namespace)}model_prompt:{sha256_hex(req.target_model + chr(0) + _prompt(req))}"


def full_key(req: DecodeRequest, namespace: str = DEFAULT_NAMESPACE) -> str:
    return cache_key(req, namespace)


KEY_SCHEMES: dict[str, KeyFunction] = {
    "prompt_only": prompt_only_key,
    "model_prompt": model_prompt_key,
    "full": full_key,
}


def key_scheme(name: str) -> KeyFunction:
    try:
        return KEY_SCHEMES[name]
    except KeyError:
        raise ValueError(f"key scheme {name!r} is unknown; known: {', '.join(sorted(KEY_SCHEMES))}") from None


# --- our own keys as functions of one log record, for the generic auditor -------------------------------------------------


@dataclass(frozen=True)
class RecordKey:
    """A log record (dict) -> the key that `keys.key_scheme(scheme)` gives its request.

    A module-level class so the `process` check can load it in a fresh interpreter.
    """

    scheme: str = "full"
    namespace: str = "default"

    def __call__(self, record: dict[str, Any]) -> str:
        return key_scheme(self.scheme)(DecodeRequest.from_record(record), self.namespace)


def dict_key_adapter(scheme_name: str = "full", namespace: str = "default") -> RecordKey:
    """Our key scheme `scheme_name` as a function of one log record, for `audit_key_function`."""
    key_scheme(scheme_name)  # an unknown name fails here, naming the known ones
    return RecordKey(scheme_name, namespace)


# A sampled request with every identity field set: on a greedy one, seed/top_p/top_k rightly don't count.
EXAMPLE_REQUEST: dict[str, Any] = {
    "request_id": "example-1",
    "prompt": "Summarise the incident in one sentence.",
    "target_model": "smollm2-135m",
    "draft_model": "smollm2-135m-draft-l4",
    "num_speculative_tokens": 4,
    "temperature": 0.7,
    "top_p": 0.95,
    "top_k": 40,
    "max_tokens": 64,
    "seed": 7,
    "stop": ["\n\n"],
    "tokenizer_version": "tok-v1",
}
