"""A read-through cached decode service that writes one log record per request.

It is the production shape the project triages, in both versions: with a
narrow key scheme and `guard=False` it reproduces the bug (another request's
output comes back as a hit); with the full key, or with the guard on, it doesn't.
The simulator runs workloads through it, so its log records are the contract's
format exactly (../shared/log-schema.md).
"""

from __future__ import annotations

import io
import json
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any, Protocol

from specdec_core.cache import Cache, CacheRead
from specdec_core.contract.identity import DecodeRequest, identity
from specdec_core.contract.result import DecodeResult
from specdec_core.keys.schemes import DEFAULT_NAMESPACE, namespace_prefix
from specdec_core.keys.schemes import key_scheme as _key_scheme
from specdec_core.monitoring.service_metrics import DEFAULT_REGISTRY, service_metrics
from specdec_core.spans import default_tracer, emit_span, epoch_ns
from specdec_core.text import ascii_digits

logger = logging.getLogger(__name__)

LogSink = str | os.PathLike[str] | io.TextIOBase | Callable[[dict[str, Any]], None]
COUNTER_NAMES: tuple[str, ...] = (
    "requests",
    "hits",
    "misses",
    "fingerprint_mismatches",
    "corrupt",
    "cache_errors",
    "errors",
)


# Why a read was not a hit, beyond the plain miss.
_MISS_COUNTERS: dict[str, tuple[str, ...]] = {
    "fingerprint_mismatch": ("fingerprint_mismatches",),
    "corrupt": ("corrupt",),
    "error": ("cache_errors",),
}


class Engine(Protocol):
    def generate(self, request: DecodeRequest) -> DecodeResult: ...


def rfc3339_utc(epoch_s: float) -> str:
    """`2024-05-01T12:00:00.123Z`: UTC with milliseconds, as the contract's `ts`."""
    moment = datetime.fromtimestamp(epoch_s, tz=timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


def bumped_namespace(namespace: str) -> str:
    """The next generation of a namespace: `prod` -> `prod-2`, `prod-2` -> `prod-3`."""
    base, dash, generation = namespace.rpartition("-")
    if dash and base and ascii_digits(generation):
        return f"{base}-{int(generation) + 1}"
    return f"{namespace}-2"


class _JsonLinesWriter:
    """Serialises records to one JSON line each; a lock keeps concurrent lines whole."""

    def __init__(self, sink: LogSink) -> None:
        self._lock = threading.Lock()
        self._owned: Any = None
        if hasattr(sink, "write"):
            stream: Any = sink
        elif isinstance(sink, (str, os.PathLike)):
            self._owned = stream = open(sink, "a", encoding="utf-8")
        elif callable(sink):
            self._emit: Callable[[dict[str, Any]], None] = sink
            return
        else:
            raise TypeError(
                f"log_sink: expected a path, a text stream or a callable, got {type(sink).__name__}"
            )

        def emit(record: dict[str, Any]) -> None:
            line = json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n"
            with self._lock:
                stream.write(line)
                stream.flush()

        self._emit = emit

    def write(self, record: dict[str, Any]) -> None:
        self._emit(record)

    def close(self) -> None:
        if self._owned is not None:
            self._owned.close()
            self._owned = None


class DecodeService:
    """Read-through cache around any engine with `generate(DecodeRequest) -> DecodeResult`.

    - `key_scheme`: "full" (correct), or "prompt_only"/"model_prompt" to reproduce the bug.
    - `guard`: compare the identity stored with a cached entry to the request's
      before using it. Off only to reproduce a buggy production service.
    - `log_sink`: a path (appended to), a text stream, or a callable taking each record.
    - `deployment`: logged in every record's `deployment` field.
    - `redact_prompts`: log `prompt_hash` only, never the prompt.
    - `tracer`: an OpenTelemetry tracer, or "global" for opentelemetry-api's global one: each request
      is also one GenAI span with the log record's fields (see spans.py). None (default): no spans.
    - `metrics_registry`: where the counters below and a decode latency histogram are exposed as Prometheus
      metrics when prometheus_client is installed (monitoring/service_metrics.py): a CollectorRegistry,
      "default" (prometheus_client's global REGISTRY) or None (none).

    On a hit, `draft_tokens` and `accepted_tokens` are logged as null: no draft
    ran for this request, and counting the cached run's tokens again would
    inflate acceptance statistics.
    """

    def __init__(
        self,
        cache: Cache,
        engine: Engine,
        key_scheme: str = "full",
        namespace: str = DEFAULT_NAMESPACE,
        log_sink: LogSink | None = None,
        deployment: str | None = None,
        ttl_s: float | None = None,
        redact_prompts: bool = False,
        clock: Callable[[], float] = time.time,
        *,
        guard: bool = True,
        tracer: Any = None,
        metrics_registry: Any = DEFAULT_REGISTRY,
    ) -> None:
        if ttl_s is not None and not ttl_s > 0:
            raise ValueError(f"ttl_s: expected a number of seconds > 0 or None (no expiry), got {ttl_s!r}")
        self.cache = cache
        self.engine = engine
        self.key_scheme = key_scheme
        self._key = _key_scheme(key_scheme)
        self.namespace = namespace
        self.deployment = deployment
        self.ttl_s = ttl_s
        self.redact_prompts = redact_prompts
        self.guard = guard
        self._clock = clock
        self._log = _JsonLinesWriter(log_sink) if log_sink is not None else None
        self._tracer = default_tracer() if tracer == "global" else tracer
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(COUNTER_NAMES, 0)
        self._metrics = service_metrics(metrics_registry, deployment)
        namespace_prefix(namespace)  # a bad namespace fails here, not on the first request

    def _count(self, *names: str) -> None:
        with self._lock:  # one acquisition, so a snapshot never sees half a request
            for name in names:
                self._counts[name] += 1
        if self._metrics is not None:
            self._metrics.count(*names)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)

    def cache_key(self, req: DecodeRequest) -> str:
        return self._key(req, self.namespace)

    def invalidate(self, namespace: str | None = None) -> str:
        """Move to a new namespace and return the old one: from the next request on, every key is under the
        new namespace, so no entry written before (under an old, narrower key) is ever read again.

        `namespace` None bumps the current one's generation (`prod` -> `prod-2` -> `prod-3`). The old entries
        stay in the cache until they expire or are purged: `cache.delete_namespace(old)`, or
        `specdec cache purge --namespace specdec:OLD: --redis URL` (docs/remediation.md). Every process that
        shares the cache must move too (a deploy), or it keeps reading and writing the old namespace.
        """
        new = namespace if namespace is not None else bumped_namespace(self.namespace)
        namespace_prefix(new)  # a bad name fails here, before the switch
        if new == self.namespace:
            raise ValueError(f"namespace: {new!r} is the current namespace; invalidating needs a new one")
        with self._lock:
            old, self.namespace = self.namespace, new
        logger.info("cache namespace %s -> %s", old, new, extra={"event": "namespace_invalidated",
                                                                "old_namespace": old, "namespace": new})
        return old

    def decode(self, req: DecodeRequest | Mapping[str, Any], request_id: str | None = None, *,
               consumer: str | None = None, experiment: str | None = None) -> DecodeResult:
        """Decode `req` through the cache; `consumer` (who receives the output) and `experiment` (its arm) are
        only logged: they never reach the key or the identity."""
        started = time.perf_counter()
        arrived = self._clock()
        if not isinstance(req, DecodeRequest):
            req = DecodeRequest.from_record(req)
        request_id = request_id or str(uuid.uuid4())
        ident = identity(req)
        key = self._key(req, self.namespace)

        read = self.cache.get(key, ident if self.guard else None)
        hit = read.status == "hit" and read.result is not None
        if hit:
            self._count("requests", "hits")
            result = read.result
        else:
            self._count("requests", "misses", *_MISS_COUNTERS.get(read.status, ()))
            try:
                result = self.engine.generate(req)
            except Exception:
                self._count("errors")
                logger.exception(
                    "engine failed on request %s (key %s)",
                    request_id,
                    key,
                    extra={"event": "engine_error", "request_id": request_id, "cache_key": key},
                )
                raise
            self.cache.set(key, result, ident, self.ttl_s)

        if self._log is not None or self._tracer is not None:
            latency_ms = (time.perf_counter() - started) * 1000.0
            record = self._record(req, request_id, arrived, key, read, result, latency_ms)
            record.update(consumer=consumer, experiment=experiment)
            if self._log is not None:
                self._log.write(record)
            if self._tracer is not None:
                # The span spans exactly the logged ts and latency, so both read back as the same record.
                start_ns = epoch_ns(record["ts"])
                emit_span(self._tracer, record, start_ns, start_ns + round(record["latency_ms"] * 1_000_000))
        if self._metrics is not None:
            self._metrics.observe(time.perf_counter() - started, hit)
        return result

    def _record(
        self,
        req: DecodeRequest,
        request_id: str,
        arrived: float,
        key: str,
        read: CacheRead,
        result: DecodeResult,
        latency_ms: float,
    ) -> dict[str, Any]:
        hit = read.status == "hit"
        record: dict[str, Any] = {"request_id": request_id, "ts": rfc3339_utc(arrived)}
        fields = req.to_record()
        if self.redact_prompts:
            fields.pop("prompt", None)
        record.update(fields)
        record.update(
            {
                "deployment": self.deployment,
                "cache_key": key,
                "cache_hit": hit,
                "cached_fingerprint": read.cached_identity if hit else None,
                "output_text": result.text,
                "output_tokens": result.output_tokens,
                "finish_reason": result.finish_reason,
                "latency_ms": round(latency_ms, 3),
                "draft_tokens": None if hit else result.draft_tokens,
                "accepted_tokens": None if hit else result.accepted_tokens,
            }
        )
        return record

    def close(self) -> None:
        if self._log is not None:
            self._log.close()

    def __enter__(self) -> DecodeService:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
