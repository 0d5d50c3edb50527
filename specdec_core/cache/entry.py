"""Result caches whose entries carry the identity of the request that produced them.

A read is *guarded*: the identity stored with an entry must equal the identity
of the request reading it, or the entry is treated as a miss. A cache key that
is narrower than the identity (the bug class this project triages) then costs
hit rate instead of silently returning another request's output.

Both caches store the same JSON text, so the guard and the serialisation are
one piece of code and the in-process cache cannot hide a serialisation bug
that Redis would expose. Values are JSON, never pickle: a cache shared between
services must not be a code-execution channel.

Inside an entry's result, `token_ids` and `accepted_per_step` are stored as
base64 of little-endian int32 arrays rather than JSON lists: encoding and
parsing a few hundred JSON integers cost more than the Redis round trip
itself. A reader also accepts plain lists.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import sys
import threading
import time
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from specdec_core.contract.identity import canonicalize_identity, differing_fields, fingerprint_of_identity
from specdec_core.contract.result import DecodeResult
from specdec_core.keys.schemes import KEY_SCHEMA_VERSION

logger = logging.getLogger(__name__)

ReadStatus = Literal["hit", "miss", "fingerprint_mismatch", "corrupt", "error"]
STAT_NAMES: tuple[str, ...] = ("hits", "misses", "fingerprint_mismatches", "corrupt", "errors")


class CacheError(RuntimeError):
    """A cache operation whose failure the caller must know about (namespace invalidation)."""


@dataclass(frozen=True)
class CacheRead:
    """The outcome of one cache read.

    `result` is set only when `status` is "hit". `cached_identity` is the identity
    object stored with the entry, as stored: set on "hit" (None for an entry that
    has none, read unguarded) and on "fingerprint_mismatch".
    """

    result: DecodeResult | None
    status: ReadStatus
    cached_identity: dict[str, Any] | None = None

    @property
    def hit(self) -> bool:
        return self.status == "hit"


class CacheStats:
    """Thread-safe counters; read them as attributes or with `as_dict()`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(STAT_NAMES, 0)

    def incr(self, name: str) -> None:
        with self._lock:
            self._counts[name] += 1

    def as_dict(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def __getattr__(self, name: str) -> int:
        counts = self.__dict__.get("_counts")
        if counts is None or name not in counts:
            raise AttributeError(name)
        return counts[name]

    def __repr__(self) -> str:
        return f"CacheStats({self.as_dict()})"


@runtime_checkable
class Cache(Protocol):
    """What the decode service needs from a cache.

    `get` with `expected_identity=None` is an unguarded read: whatever is stored
    under the key is returned. Only the simulator asks for that, to reproduce the
    bug; everything else passes `request.identity(req)`.
    """

    stats: CacheStats

    def get(self, key: str, expected_identity: Mapping[str, Any] | None) -> CacheRead: ...

    def set(
        self, key: str, result: DecodeResult, identity: Mapping[str, Any], ttl_s: float | None = None
    ) -> None: ...

    def delete_namespace(self, namespace: str) -> int: ...


# --- the entry format and the guard, shared by every cache ------------------------------------


_ENTRY_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
# Same output as request.canonical_json, without building an encoder per call.
_CANONICAL_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True)
_INT32 = next(code for code in "ilh" if array(code).itemsize == 4)
_PACKED_FIELDS = ("token_ids", "accepted_per_step")


def _utc_now_rfc3339() -> str:
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def _pack_ints(values: Sequence[int]) -> str | list[int]:
    try:
        packed = array(_INT32, values)
    except (OverflowError, TypeError):
        return list(values)  # out of int32 range: keep the plain list
    if sys.byteorder != "little":
        packed.byteswap()
    return base64.b64encode(packed.tobytes()).decode("ascii")


def _unpack_ints(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    unpacked = array(_INT32)
    unpacked.frombytes(base64.b64decode(value, validate=True))
    if sys.byteorder != "little":
        unpacked.byteswap()
    return unpacked  # DecodeResult makes it a tuple


def encode_entry(result: DecodeResult, identity: Mapping[str, Any]) -> str:
    """The JSON text stored under a key: the result with the identity that produced it.

    The identity is serialised once, canonically, and that text both feeds the
    fingerprint and goes into the entry: each piece below is a JSON value on its own.
    """
    identity_json = _CANONICAL_ENCODER.encode(identity)
    fingerprint = hashlib.sha256(identity_json.encode("utf-8")).hexdigest()
    result_json = result.to_json()
    for name in _PACKED_FIELDS:
        result_json[name] = _pack_ints(result_json[name])
    return (
        f'{{"identity":{identity_json},"fingerprint":"{fingerprint}",'
        f'"result":{_ENTRY_ENCODER.encode(result_json)},"schema":{_ENTRY_ENCODER.encode(KEY_SCHEMA_VERSION)},'
        f'"written_at":"{_utc_now_rfc3339()}"}}'
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_count(value: Any) -> bool:
    return value is None or (_is_int(value) and value >= 0)


def _is_number(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


# Every field of a stored DecodeResult and what its JSON value must be: a value of the wrong
# type would be served as a hit (a null text, keys of an object taken as token ids).
_RESULT_FIELD_CHECKS: dict[str, tuple[str, Any]] = {
    "text": ("a string", lambda v: isinstance(v, str)),
    "finish_reason": ("a string or null", lambda v: v is None or isinstance(v, str)),
    "output_tokens": ("a count or null", _is_count),
    "draft_tokens": ("a count or null", _is_count),
    "accepted_tokens": ("a count or null", _is_count),
    "latency_ms": ("a number or null", _is_number),
    "environment": ("an object or null", lambda v: v is None or isinstance(v, dict)),
}


def _ints_of(name: str, value: Any) -> Any:
    """A packed or plain list of ints, unpacked; ValueError naming the field for anything else."""
    if value is None:
        return ()
    if isinstance(value, str):
        try:
            return _unpack_ints(value)
        except ValueError as exc:
            raise ValueError(f"result.{name} is not base64 of int32s ({exc})") from None
    if not isinstance(value, list) or not all(_is_int(v) for v in value):
        raise ValueError(f"result.{name} must be a list of integers, got {_preview(value)}")
    return value


def _preview(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _result_from_entry(result_json: Any) -> DecodeResult:
    if not isinstance(result_json, dict):
        raise ValueError("result is not an object")
    if "text" not in result_json:
        raise ValueError("result has no text")
    for name, (expected, check) in _RESULT_FIELD_CHECKS.items():
        value = result_json.get(name)
        if not check(value):
            raise ValueError(f"result.{name} must be {expected}, got {_preview(value)}")
    result_json = dict(result_json)
    for name in _PACKED_FIELDS:
        result_json[name] = _ints_of(name, result_json.get(name))
    return DecodeResult.from_json(result_json)


def _check_ttl(ttl_s: float | None) -> None:
    if ttl_s is not None and not ttl_s > 0:
        raise ValueError(f"ttl_s: expected a number of seconds > 0 or None (no expiry), got {ttl_s!r}")


def _corrupt(stats: CacheStats, key: str, what: str, exc: Exception) -> CacheRead:
    """A value we cannot trust is a miss: counted, logged, and the caller decodes and overwrites it."""
    stats.incr("corrupt")
    logger.warning(
        "cache entry %s %s (%s); treating it as a miss",
        key,
        what,
        exc,
        extra={"event": "cache_corrupt_entry", "cache_key": key, "reason": str(exc)},
    )
    return CacheRead(None, "corrupt")


def decode_entry(
    raw: str | bytes | None, key: str, expected_identity: Mapping[str, Any] | None, stats: CacheStats
) -> CacheRead:
    """Turn a stored value into a CacheRead, applying the guard and counting the outcome."""
    if raw is None:
        stats.incr("misses")
        return CacheRead(None, "miss")
    try:
        entry = json.loads(raw)
        if not isinstance(entry, dict) or entry.get("schema") != KEY_SCHEMA_VERSION:
            raise ValueError(f"not a {KEY_SCHEMA_VERSION} cache entry")
        result = _result_from_entry(entry["result"])
        stored = entry.get("identity")
        if stored is not None and not isinstance(stored, dict):
            raise ValueError("identity is not an object")
        if stored is None and expected_identity is not None:
            raise ValueError("entry has no identity to check")
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        return _corrupt(stats, key, "is unreadable", exc)

    if expected_identity is None or stored == expected_identity:
        stats.incr("hits")
        return CacheRead(result, "hit", stored)

    # Not byte-equal: the writer may have spelled an equivalence differently
    # (an older writer, another language). Compare canonical forms before crying wolf.
    try:
        stored_canonical = canonicalize_identity(stored)
    except ValueError as exc:
        return _corrupt(stats, key, "has an invalid identity", exc)
    if stored_canonical == expected_identity:
        stats.incr("hits")
        return CacheRead(result, "hit", stored)

    stats.incr("fingerprint_mismatches")
    expected_fp = fingerprint_of_identity(expected_identity)
    stored_fp = fingerprint_of_identity(stored_canonical)
    fields = differing_fields(expected_identity, stored_canonical)
    logger.warning(
        "cache key %s holds the output of another request (differs in %s); "
        "treating it as a miss. The cache key is narrower than the request identity.",
        key,
        ", ".join(fields) or "greedy/sampling fields",
        extra={
            "event": "cache_fingerprint_mismatch",
            "cache_key": key,
            "expected_fingerprint": expected_fp,
            "stored_fingerprint": stored_fp,
            "differing_fields": fields,
        },
    )
    return CacheRead(None, "fingerprint_mismatch", stored)
