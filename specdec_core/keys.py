"""Cache keys: the correct one, and the narrow schemes seen in production incidents.

The narrow schemes exist so the simulator and the tests can reproduce the bug
class on purpose; nothing in the service uses them unless asked by name.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import lru_cache
from typing import Any

from .request import DecodeRequest, fingerprint, sha256_hex

# Bump to invalidate every entry written under an older identity definition.
SCHEMA_VERSION = "v1"
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
    return f"{namespace_prefix(namespace)}{SCHEMA_VERSION}:{fingerprint(req)}"


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


# The key-coverage audit lives in its own module; it imports this one lazily.
from .audit import KeyAudit, audit_key_function, dict_key_adapter  # noqa: E402, F401
