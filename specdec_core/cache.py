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
import functools
import hashlib
import json
import logging
import sys
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from .keys import SCHEMA_VERSION, namespace_prefix
from .request import canonicalize_identity, differing_fields, fingerprint_of_identity
from .result import DecodeResult

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
        f'"result":{_ENTRY_ENCODER.encode(result_json)},"schema":{_ENTRY_ENCODER.encode(SCHEMA_VERSION)},'
        f'"written_at":"{_utc_now_rfc3339()}"}}'
    )


def _result_from_entry(result_json: Any) -> DecodeResult:
    if not isinstance(result_json, dict):
        raise ValueError("result is not an object")
    result_json = dict(result_json)
    for name in _PACKED_FIELDS:
        result_json[name] = _unpack_ints(result_json.get(name))
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
        if not isinstance(entry, dict) or entry.get("schema") != SCHEMA_VERSION:
            raise ValueError(f"not a {SCHEMA_VERSION} cache entry")
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


# --- in-process cache -------------------------------------------------------------------------


class MemoryCache:
    """Thread-safe LRU with per-entry TTL: the embedded default when no Redis is configured."""

    def __init__(self, max_entries: int = 10_000, *, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries: expected >= 1, got {max_entries}")
        self.max_entries = max_entries
        self.stats = CacheStats()
        self._clock = clock
        self._lock = threading.Lock()
        # key -> (expires_at or None, JSON text)
        self._entries: OrderedDict[str, tuple[float | None, str]] = OrderedDict()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def _live(self, key: str, now: float) -> str | None:
        item = self._entries.get(key)
        if item is None:
            return None
        expires_at, text = item
        if expires_at is not None and expires_at <= now:
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        return text

    def get(self, key: str, expected_identity: Mapping[str, Any] | None) -> CacheRead:
        with self._lock:
            raw = self._live(key, self._clock())
        return decode_entry(raw, key, expected_identity, self.stats)

    def get_raw(self, key: str) -> str | None:
        """The stored JSON text, for inspection and tests."""
        with self._lock:
            return self._live(key, self._clock())

    def set_raw(self, key: str, value: str, ttl_s: float | None = None) -> None:
        """Store text as is (tests plant foreign or damaged values with this)."""
        _check_ttl(ttl_s)
        with self._lock:
            expires_at = None if ttl_s is None else self._clock() + ttl_s
            self._entries[key] = (expires_at, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)

    def set(
        self, key: str, result: DecodeResult, identity: Mapping[str, Any], ttl_s: float | None = None
    ) -> None:
        self.set_raw(key, encode_entry(result, identity), ttl_s)

    def delete_namespace(self, namespace: str) -> int:
        prefix = namespace_prefix(namespace)
        with self._lock:
            now = self._clock()
            doomed = [k for k in self._entries if k.startswith(prefix)]
            live = 0
            for k in doomed:
                expires_at, _ = self._entries.pop(k)
                if expires_at is None or expires_at > now:
                    live += 1
        return live

    def close(self) -> None:
        pass


# --- Redis ------------------------------------------------------------------------------------


@functools.cache
def _redis_failures() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(what a cache call catches, what of it means Redis is unreachable); redis imports lazily."""
    from redis import exceptions as rx

    unreachable = (
        rx.ConnectionError,
        rx.TimeoutError,
        rx.RedisClusterException,
        rx.ClusterDownError,
        OSError,
    )
    return (rx.RedisError, *unreachable), unreachable


def _escape_glob(text: str) -> str:
    return "".join("\\" + c if c in "\\*?[]" else c for c in text)


def _split_cluster_url(url: str) -> tuple[str, bool]:
    """Strip our cluster markers (`redis+cluster://`, `?cluster=true`) from a URL redis-py can read."""
    parts = urlsplit(url)
    scheme = parts.scheme
    cluster = False
    if scheme.endswith("+cluster"):
        scheme = scheme[: -len("+cluster")]
        cluster = True
    query = []
    for name, value in parse_qsl(parts.query, keep_blank_values=True):
        if name == "cluster":
            cluster = cluster or value.lower() in ("1", "true", "yes", "on")
        else:
            query.append((name, value))
    return urlunsplit((scheme, parts.netloc, parts.path, urlencode(query), parts.fragment)), cluster


class RedisCache:
    """A guarded cache on Redis (or Redis Cluster).

    Availability beats freshness here: a Redis that is down, slow or returns
    errors makes reads misses and writes no-ops, counted in `stats.errors` and
    logged, never raised, so decoding keeps working without the cache. After a
    connection failure Redis is not asked again for `retry_after_s` seconds, so
    an outage costs each request nothing instead of a socket timeout.

    `url_or_client` is a URL (`redis://`, `rediss://`, `unix://`, plus
    `redis+cluster://` or `?cluster=true` for a cluster) or a ready redis-py client
    (its own timeouts and retries then apply).
    """

    def __init__(
        self,
        url_or_client: Any,
        *,
        socket_timeout: float = 0.5,
        socket_connect_timeout: float | None = None,
        retries: int = 1,
        retry_after_s: float = 1.0,
        scan_count: int = 1000,
    ) -> None:
        self.stats = CacheStats()
        self.retry_after_s = retry_after_s
        self.scan_count = scan_count
        self._client_lock = threading.Lock()
        self._unavailable_until = 0.0
        if isinstance(url_or_client, str):
            self.url = url_or_client
            redis_url, self.is_cluster = _split_cluster_url(url_or_client)
            self._client: Any = None
            self._make_client = lambda: _client_from_url(
                redis_url,
                cluster=self.is_cluster,
                socket_timeout=socket_timeout,
                socket_connect_timeout=socket_connect_timeout or socket_timeout,
                retries=retries,
            )
        else:
            import redis.cluster

            self.url = None
            self.is_cluster = isinstance(url_or_client, redis.cluster.RedisCluster)
            self._client = url_or_client
            self._make_client = lambda: url_or_client

    @property
    def client(self) -> Any:
        """The redis-py client, made on first use: a cluster client connects when built."""
        if self._client is None:
            with self._client_lock:
                if self._client is None:
                    self._client = self._make_client()
        return self._client

    def _available(self) -> bool:
        return time.monotonic() >= self._unavailable_until

    def _failed(self, op: str, key: str, exc: BaseException) -> None:
        self.stats.incr("errors")
        unreachable = isinstance(exc, _redis_failures()[1])
        if unreachable:
            self._unavailable_until = time.monotonic() + self.retry_after_s
        logger.warning(
            "redis %s of %s failed (%s: %s); decoding without the cache%s",
            op,
            key,
            type(exc).__name__,
            exc,
            f" for the next {self.retry_after_s:g}s" if unreachable else "",
            extra={"event": "cache_error", "cache_key": key, "operation": op, "error": repr(exc)},
        )

    def get(self, key: str, expected_identity: Mapping[str, Any] | None) -> CacheRead:
        if not self._available():
            self.stats.incr("errors")
            return CacheRead(None, "error")
        try:
            raw = self.client.get(key)
        except _redis_failures()[0] as exc:
            self._failed("GET", key, exc)
            return CacheRead(None, "error")
        return decode_entry(raw, key, expected_identity, self.stats)

    def set_raw(self, key: str, value: str | bytes, ttl_s: float | None = None) -> None:
        """Store a value as is; errors propagate (tests and tools only)."""
        _check_ttl(ttl_s)
        self.client.set(key, value, px=None if ttl_s is None else max(1, round(ttl_s * 1000)))

    def set(
        self, key: str, result: DecodeResult, identity: Mapping[str, Any], ttl_s: float | None = None
    ) -> None:
        _check_ttl(ttl_s)
        if not self._available():
            self.stats.incr("errors")
            return
        value = encode_entry(result, identity)
        try:
            self.client.set(key, value, px=None if ttl_s is None else max(1, round(ttl_s * 1000)))
        except _redis_failures()[0] as exc:
            self._failed("SET", key, exc)

    def delete_namespace(self, namespace: str) -> int:
        """Delete every key of `namespace` with SCAN + UNLINK in batches (never KEYS).

        Raises CacheError when Redis can't be reached: an invalidation that did
        not happen must not look like one that did.
        """
        pattern = _escape_glob(namespace_prefix(namespace)) + "*"
        deleted = 0
        batch: list[Any] = []
        try:
            for key in self.client.scan_iter(match=pattern, count=self.scan_count):
                batch.append(key)
                if len(batch) >= self.scan_count:
                    deleted += self.client.unlink(*batch)
                    batch.clear()
            if batch:
                deleted += self.client.unlink(*batch)
        except _redis_failures()[0] as exc:
            self._failed("SCAN/UNLINK", pattern, exc)
            raise CacheError(
                f"could not delete namespace {namespace!r} from Redis ({type(exc).__name__}: {exc}); "
                f"{deleted} keys were deleted before the failure, run it again when Redis is reachable"
            ) from exc
        return deleted

    def close(self) -> None:
        if self._client is not None:
            self._client.close()


def _client_from_url(
    url: str, *, cluster: bool, socket_timeout: float, socket_connect_timeout: float, retries: int
) -> Any:
    import redis
    import redis.cluster
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    # redis-py's default retries with backoff for seconds; a cache must fail fast instead.
    options = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
        "retry": Retry(NoBackoff(), retries),
    }
    if cluster:
        return redis.cluster.RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


def open_cache(url: str | None, **options: Any) -> Cache:
    """A cache from a URL: None or `memory://` (optionally `?max_entries=N`) for the
    in-process cache, `redis://`, `rediss://`, `unix://` (with `+cluster` or `?cluster=true`
    for a cluster) for Redis. `options` go to the cache's constructor."""
    if url is None or url.startswith("memory://"):
        params = dict(parse_qsl(urlsplit(url).query)) if url else {}
        if "max_entries" in params:
            options.setdefault("max_entries", int(params["max_entries"]))
        return MemoryCache(**options)
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix", "redis+cluster", "rediss+cluster"):
        return RedisCache(url, **options)
    raise ValueError(
        f"cache URL {url!r} has an unknown scheme; use memory://, redis://, rediss://, unix:// "
        "or redis+cluster://"
    )


__all__ = [
    "Cache",
    "CacheError",
    "CacheRead",
    "CacheStats",
    "MemoryCache",
    "RedisCache",
    "decode_entry",
    "encode_entry",
    "open_cache",
]
