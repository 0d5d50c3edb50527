"""The guarded cache on Redis (or Redis Cluster)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from specdec_core.cache.entry import CacheError, CacheRead, CacheStats, _check_ttl, decode_entry, encode_entry  # noqa: F401
from specdec_core.contract.result import DecodeResult
from specdec_core.keys.schemes import namespace_prefix

logger = logging.getLogger(__name__)

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


