"""The guarded cache on Redis (or Redis Cluster)."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any, Literal
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from specdec_core.cache.entry import CacheError, CacheRead, CacheStats, _check_ttl, decode_entry, encode_entry  # noqa: F401
from specdec_core.contract.result import DecodeResult
from specdec_core.extras import require
from specdec_core.keys.schemes import namespace_prefix

logger = logging.getLogger(__name__)

@functools.cache
def _redis_failures() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(what a cache call catches, what of it means Redis is unreachable); redis imports lazily."""
    rx = require("redis", "redis.exceptions")

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


class DeadlineExceeded(TimeoutError):
    """A Redis call that had no answer within the cache's deadline (the socket may still trickle)."""


BreakerTicket = Literal["call", "probe"]


class CircuitBreaker:
    """Stops asking a Redis that keeps failing.

    Closed, calls go through. After `failures` consecutive failures it opens: calls are
    refused at once, without touching Redis. Once per `interval_s` one call goes through
    as a probe; its success closes the breaker, its failure keeps it open another interval.
    A dead Redis then costs one probe per interval instead of a timeout per request per thread.
    """

    def __init__(
        self, failures: int = 3, interval_s: float = 5.0, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if failures < 1:
            raise ValueError(f"breaker_failures: expected >= 1, got {failures}")
        if not interval_s > 0:
            raise ValueError(f"breaker_interval_s: expected seconds > 0, got {interval_s!r}")
        self.failures = failures
        self.interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._consecutive = 0
        self._open_until: float | None = None  # None while closed
        self._probing = False
        self._counts = {"opens": 0, "probes": 0, "short_circuits": 0}

    def allow(self) -> BreakerTicket | None:
        """How a call may proceed ("call" or "probe"), or None: refused, answer a miss now."""
        with self._lock:
            if self._open_until is None:
                return "call"
            if not self._probing and self._clock() >= self._open_until:
                self._probing = True
                self._counts["probes"] += 1
                return "probe"
            self._counts["short_circuits"] += 1
            return None

    def succeeded(self, ticket: BreakerTicket) -> None:
        with self._lock:
            self._consecutive = 0
            self._open_until = None
            if ticket == "probe":
                self._probing = False

    def failed(self, ticket: BreakerTicket) -> bool:
        """Record a failure; True when the breaker is open after it."""
        with self._lock:
            self._consecutive += 1
            if ticket == "probe":
                self._probing = False
                self._open_until = self._clock() + self.interval_s
            elif self._open_until is None and self._consecutive >= self.failures:
                self._counts["opens"] += 1
                self._open_until = self._clock() + self.interval_s
            return self._open_until is not None

    def stats(self) -> dict[str, Any]:
        with self._lock:
            state = "closed" if self._open_until is None else "half_open" if self._probing else "open"
            return {"state": state, "consecutive_failures": self._consecutive, **self._counts}


_FAILED = object()  # what a failed call returns: a GET's None is a legitimate miss


class RedisCache:
    """A guarded cache on Redis (or Redis Cluster).

    Availability beats freshness here: a Redis that is down, slow or returns
    errors makes reads misses and writes no-ops, counted in `stats.errors` and
    logged, never raised, so decoding keeps working without the cache.

    Every read and write has a deadline on the whole call (`deadline_s`), not per
    socket read: a Redis that trickles a byte just inside the socket timeout would
    otherwise hold a request forever. The call runs on a small worker pool and the
    caller waits no longer than the deadline. Unreachable or late calls feed a
    `CircuitBreaker` (`breaker_failures`, `breaker_interval_s`), so an outage costs
    one probe per interval (measured on `clock`). Errors Redis itself answers (a wrong type) prove it is up.

    `url_or_client` is a URL (`redis://`, `rediss://`, `unix://`, plus
    `redis+cluster://` or `?cluster=true` for a cluster) or a ready redis-py client
    (its own timeouts and retries then apply, within the deadline).
    """

    def __init__(
        self,
        url_or_client: Any,
        *,
        socket_timeout: float = 0.5,
        socket_connect_timeout: float | None = None,
        retries: int = 1,
        deadline_s: float = 0.5,
        breaker_failures: int = 3,
        breaker_interval_s: float = 5.0,
        max_workers: int = 8,
        scan_count: int = 1000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s: expected seconds > 0, got {deadline_s!r}")
        # Here, not on first use: a missing extra must not pass for an unreachable server (a miss).
        require("redis", "redis")
        self.stats = CacheStats()
        self.deadline_s = deadline_s
        self.breaker = CircuitBreaker(breaker_failures, breaker_interval_s, clock=clock)
        self.scan_count = scan_count
        self._max_workers = max_workers
        self._workers: ThreadPoolExecutor | None = None
        self._client_lock = threading.Lock()
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
            self.url = None
            self.is_cluster = isinstance(url_or_client, require("redis", "redis.cluster").RedisCluster)
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

    def _pool(self) -> ThreadPoolExecutor:
        with self._client_lock:
            if self._workers is None:
                self._workers = ThreadPoolExecutor(self._max_workers, thread_name_prefix="specdec-redis")
            return self._workers

    def _call(self, op: str, key: str, command: Callable[[Any], Any]) -> Any:
        """`command(client)` within the deadline and through the breaker; _FAILED if it failed."""
        ticket = self.breaker.allow()
        if ticket is None:
            self.stats.incr("errors")
            return _FAILED
        # The client is made inside the call: building a cluster client connects, and that is bounded too.
        future = self._pool().submit(lambda: command(self.client))
        done, _ = wait([future], timeout=self.deadline_s)
        if not done:
            future.cancel()
            self._failed(op, key, DeadlineExceeded(f"no answer within {self.deadline_s:g}s"), ticket)
            return _FAILED
        try:
            value = future.result()
        except _redis_failures()[0] as exc:
            self._failed(op, key, exc, ticket)
            return _FAILED
        self.breaker.succeeded(ticket)
        return value

    def _failed(self, op: str, key: str, exc: BaseException, ticket: BreakerTicket | None) -> None:
        self.stats.incr("errors")
        unreachable = isinstance(exc, (DeadlineExceeded, *_redis_failures()[1]))
        opened = False
        if ticket is not None:
            if unreachable:
                opened = self.breaker.failed(ticket)
            else:
                self.breaker.succeeded(ticket)
        logger.warning(
            "redis %s of %s failed (%s: %s); decoding without the cache%s",
            op,
            key,
            type(exc).__name__,
            exc,
            f" for the next {self.breaker.interval_s:g}s" if opened else "",
            extra={"event": "cache_error", "cache_key": key, "operation": op, "error": repr(exc)},
        )

    def get(self, key: str, expected_identity: Mapping[str, Any] | None) -> CacheRead:
        raw = self._call("GET", key, lambda client: client.get(key))
        if raw is _FAILED:
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
        value = encode_entry(result, identity)
        px = None if ttl_s is None else max(1, round(ttl_s * 1000))
        self._call("SET", key, lambda client: client.set(key, value, px=px))

    def delete_namespace(self, namespace: str) -> int:
        """Delete every key of `namespace` with SCAN + UNLINK in batches (never KEYS).

        Raises CacheError when Redis can't be reached: an invalidation that did
        not happen must not look like one that did. An operator runs this on purpose, so it
        neither waits for the breaker nor stops at the per-request deadline.
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
            self._failed("SCAN/UNLINK", pattern, exc, None)
            raise CacheError(
                f"could not delete namespace {namespace!r} from Redis ({type(exc).__name__}: {exc}); "
                f"{deleted} keys were deleted before the failure, run it again when Redis is reachable"
            ) from exc
        return deleted

    def close(self) -> None:
        with self._client_lock:
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.shutdown(wait=False, cancel_futures=True)
        if self._client is not None:
            self._client.close()


def _client_from_url(
    url: str, *, cluster: bool, socket_timeout: float, socket_connect_timeout: float, retries: int
) -> Any:
    redis = require("redis", "redis")
    cluster_module = require("redis", "redis.cluster")
    NoBackoff = require("redis", "redis.backoff").NoBackoff
    Retry = require("redis", "redis.retry").Retry

    # redis-py's default retries with backoff for seconds; a cache must fail fast instead.
    options = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": socket_connect_timeout,
        "retry": Retry(NoBackoff(), retries),
    }
    if cluster:
        return cluster_module.RedisCluster.from_url(url, **options)
    return redis.Redis.from_url(url, **options)


