"""DecodeService's own counters as Prometheus metrics, when prometheus_client is installed (a no-op otherwise).

The guard's fingerprint mismatches are the earliest signal of a narrow key: the service sees them before any
log is read. Each registry gets its metric families once; every service on it adds its deployment's series.
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

DEFAULT_REGISTRY = "default"  # prometheus_client's global REGISTRY

# DecodeService's counter name -> (metric name, help).
COUNTERS: dict[str, tuple[str, str]] = {
    "hits": ("specdec_cache_hits", "Requests answered from the cache."),
    "misses": ("specdec_cache_misses", "Requests decoded by the engine (a miss, or a cached entry refused)."),
    "fingerprint_mismatches": ("specdec_cache_fingerprint_mismatches",
                               "Cached entries refused because they were stored for another request identity: "
                               "the cache key is narrower than the identity."),
    "corrupt": ("specdec_cache_corrupt_entries", "Cached entries refused because they could not be read."),
    "cache_errors": ("specdec_cache_errors", "Cache reads that failed (treated as misses)."),
    "errors": ("specdec_engine_errors", "Requests whose decoding failed."),
}
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

_families: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class ServiceMetrics:
    """One service's series: counters by DecodeService's counter names, and its decode latency."""

    def __init__(self, families: dict[str, Any], deployment: str) -> None:
        self._counters = {name: families[name].labels(deployment=deployment) for name in COUNTERS}
        self._latency = {hit: families["latency"].labels(deployment=deployment, cache_hit=hit)
                         for hit in ("true", "false")}

    def count(self, *names: str) -> None:
        for name in names:
            counter = self._counters.get(name)
            if counter is not None:
                counter.inc()

    def observe(self, seconds: float, hit: bool) -> None:
        self._latency["true" if hit else "false"].observe(seconds)


def service_metrics(registry: Any, deployment: str | None) -> ServiceMetrics | None:
    """The service's metrics on `registry` (DEFAULT_REGISTRY: the global one; None: none), or None without
    prometheus_client."""
    if registry is None:
        return None
    try:
        import prometheus_client
    except ImportError:
        return None
    registry = prometheus_client.REGISTRY if registry == DEFAULT_REGISTRY else registry
    with _lock:
        families = _families.get(registry)
        if families is None:
            families = {name: prometheus_client.Counter(metric, doc, ["deployment"], registry=registry)
                        for name, (metric, doc) in COUNTERS.items()}
            families["latency"] = prometheus_client.Histogram(
                "specdec_decode_latency_seconds", "Time DecodeService.decode took, cache read to result.",
                ["deployment", "cache_hit"], buckets=LATENCY_BUCKETS, registry=registry)
            _families[registry] = families
    return ServiceMetrics(families, deployment or "")
