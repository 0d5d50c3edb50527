"""Guarded result caches: the entry format and its guard on read, the in-process cache and Redis."""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qsl, urlsplit

from specdec_core.cache.entry import Cache, CacheError, CacheRead, CacheStats, decode_entry, encode_entry
from specdec_core.cache.memory import MemoryCache
from specdec_core.cache.redis import RedisCache


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
