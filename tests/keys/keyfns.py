"""Key functions the auditor is tried on, at module level so a fresh interpreter loads them, in a module of
their own so that it loads only them: each audit starts three interpreters, which took 0.9 s each to import
the test module (pytest, hypothesis, the library) for functions that need hashlib and json."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def correct_key(params: dict[str, Any]) -> str:
    return _digest(params)


def ignores_max_tokens(params: dict[str, Any]) -> str:
    return _digest({k: v for k, v in params.items() if k != "max_tokens"})


def ignores_temperature_decimals(params: dict[str, Any]) -> str:
    return _digest({**params, "temperature": int(params["temperature"])})


def ignores_stop(params: dict[str, Any]) -> str:
    return _digest({k: v for k, v in params.items() if k != "stop"})


def first_stop_only(params: dict[str, Any]) -> str:
    return _digest({**params, "stop": (params["stop"] or [None])[0]})


def ignores_nested_tags(params: dict[str, Any]) -> str:
    options = {k: v for k, v in params["options"].items() if k != "tags"}
    return _digest({**params, "options": options})


def ignores_prompt(params: dict[str, Any]) -> str:
    return _digest({k: v for k, v in params.items() if k != "prompt"})


def ignores_stream(params: dict[str, Any]) -> str:
    return _digest({k: v for k, v in params.items() if k != "stream"})


def ignores_seed(params: dict[str, Any]) -> str:
    return _digest({k: v for k, v in params.items() if k != "seed"})


def order_dependent_at_depth_2(params: dict[str, Any]) -> str:
    # Sorts the top level, but serialises nested objects in their given order.
    return hashlib.sha256(
        "|".join(f"{k}={json.dumps(params[k])}" for k in sorted(params)).encode()
    ).hexdigest()


def python_hash_key(params: dict[str, Any]) -> str:
    return f"{hash(json.dumps(params, sort_keys=True)) & 0xFFFFFFFFFFFFFFFF:016x}"


_MEMO: dict[str, str] = {}


def memoized_on_prompt(params: dict[str, Any]) -> str:
    # Remembers the first request per prompt: later variants reuse its key.
    return _MEMO.setdefault(params["prompt"], _digest(params))


_CALLS = [0]


def counting_key(params: dict[str, Any]) -> str:
    _CALLS[0] += 1
    return f"{_digest(params)}:{_CALLS[0]}"


def mutating_key(params: dict[str, Any]) -> str:
    params.pop("request_id", None)
    return _digest(params)


def returns_a_list(params: dict[str, Any]) -> list[str]:
    return [_digest(params)]


def raises_on_everything(params: dict[str, Any]) -> str:
    raise RuntimeError("no key for you")
