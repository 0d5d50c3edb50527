"""The in-process cache: the embedded default when no Redis is configured."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from specdec_core.cache.entry import CacheRead, CacheStats, _check_ttl, decode_entry, encode_entry  # noqa: F401
from specdec_core.contract.result import DecodeResult
from specdec_core.keys.schemes import namespace_prefix


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


