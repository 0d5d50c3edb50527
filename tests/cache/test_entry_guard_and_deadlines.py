"""Hardening of the cache: entries validated field by field on read; Redis calls bounded by a
deadline and a circuit breaker, tested against real misbehaving TCP servers."""

from __future__ import annotations

import dataclasses
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from helpers import SAMPLE_REQUEST, SAMPLE_RESULT

from specdec_core.cache import CacheRead, CacheStats, MemoryCache, RedisCache, decode_entry
from specdec_core.contract.identity import identity
from specdec_core.contract.result import DecodeResult
from specdec_core.keys.schemes import KEY_SCHEMA_VERSION

REQ = SAMPLE_REQUEST
RESULT = dataclasses.replace(SAMPLE_RESULT, latency_ms=12.5)


def _entry(**result_fields: Any) -> str:
    """An entry with the right identity whose result has `result_fields` replaced."""
    return json.dumps(
        {"schema": KEY_SCHEMA_VERSION, "identity": identity(REQ), "result": {**RESULT.to_json(), **result_fields}}
    )


# --- 13: the whole entry is validated on read -------------------------------------------------

WRONG_TYPED = {
    "text-null": {"text": None},
    "text-number": {"text": 42},
    "text-list": {"text": ["a", "b"]},
    "token_ids-object": {"token_ids": {"a": 1}},
    "token_ids-strings": {"token_ids": ["5", "6"]},
    "token_ids-bools": {"token_ids": [True, False]},
    "token_ids-floats": {"token_ids": [5.0, 6.5]},
    "output_tokens-text": {"output_tokens": "many"},
    "output_tokens-negative": {"output_tokens": -1},
    "draft_tokens-float": {"draft_tokens": 1.5},
    "accepted_tokens-bool": {"accepted_tokens": True},
    "accepted_per_step-object": {"accepted_per_step": {"0": 4}},
    "finish_reason-number": {"finish_reason": 3},
    "latency_ms-text": {"latency_ms": "fast"},
    "environment-list": {"environment": [1, 2]},
    "environment-text": {"environment": "cuda"},
}


@pytest.mark.parametrize("fields", list(WRONG_TYPED.values()), ids=list(WRONG_TYPED))
def test_an_entry_with_a_wrong_typed_result_field_is_a_counted_logged_corrupt_miss(fields, caplog):
    cache = MemoryCache()
    cache.set_raw("k", _entry(**fields))
    with caplog.at_level(logging.WARNING, logger="specdec_core.cache"):
        read = cache.get("k", identity(REQ))
    assert read == CacheRead(None, "corrupt")
    assert cache.stats.as_dict() == {
        "hits": 0, "misses": 0, "fingerprint_mismatches": 0, "corrupt": 1, "errors": 0
    }
    record = next(r for r in caplog.records if getattr(r, "event", None) == "cache_corrupt_entry")
    assert next(iter(fields)) in record.getMessage()  # the log names the bad field


@pytest.mark.parametrize("fields", list(WRONG_TYPED.values()), ids=list(WRONG_TYPED))
def test_an_unguarded_read_of_a_wrong_typed_entry_is_corrupt_too(fields):
    stats = CacheStats()
    assert decode_entry(_entry(**fields), "k", None, stats).status == "corrupt"
    assert stats.corrupt == 1


@pytest.mark.parametrize(
    "fields",
    [
        {"finish_reason": None, "latency_ms": None, "draft_tokens": None, "accepted_tokens": None},
        {"latency_ms": 12},  # a whole number of milliseconds is still a number
        {"token_ids": [5, 6, 7], "accepted_per_step": [4, 2]},  # plain lists, as other writers store them
        {"environment": {}},
    ],
    ids=["nulls", "int-latency", "plain-lists", "empty-environment"],
)
def test_valid_entries_with_optional_values_stay_hits(fields):
    cache = MemoryCache()
    cache.set_raw("k", _entry(**fields))
    read = cache.get("k", identity(REQ))
    assert read.status == "hit"
    assert read.result == DecodeResult.from_json({**RESULT.to_json(), **fields})


# --- 14: a deadline on the whole call and a circuit breaker, against real TCP servers --------


class MisbehavingServer:
    """A TCP server on 127.0.0.1 that answers Redis's connection handshake, then misbehaves:
    `trickle` sends a GET reply one byte every `interval_s`; `slam` closes every connection at once."""

    def __init__(self, mode: str, interval_s: float = 0.3, trickle_for_s: float = 3.0) -> None:
        self.mode = mode
        self.interval_s = interval_s
        self.trickle_for_s = trickle_for_s
        self.accepted = 0
        self._stop = threading.Event()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.05)
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._serve_thread = threading.Thread(target=self._serve, daemon=True)
        self._serve_thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted += 1
            if self.mode == "slam":
                conn.close()
                continue
            thread = threading.Thread(target=self._trickle, args=(conn,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(0.05)
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                if b"HELLO" in data.upper():  # redis-py speaks RESP3: a map with the protocol
                    conn.sendall(b"%1\r\n$5\r\nproto\r\n:3\r\n")
                    continue
                if b"GET" not in data.upper():
                    commands = sum(1 for line in data.split(b"\r\n") if line.startswith(b"*"))
                    conn.sendall(b"+OK\r\n" * max(1, commands))
                    continue
                reply = b"$200\r\n" + b"x" * 200 + b"\r\n"
                ends = time.monotonic() + self.trickle_for_s
                for i in range(len(reply)):
                    if self._stop.wait(self.interval_s) or time.monotonic() > ends:
                        return  # closing ends the client's read at last
                    try:
                        conn.sendall(reply[i : i + 1])
                    except OSError:
                        return

    def close(self) -> None:
        self._stop.set()
        self._listener.close()
        self._serve_thread.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)


@pytest.fixture
def trickling() -> Iterator[MisbehavingServer]:
    server = MisbehavingServer("trickle")
    yield server
    server.close()


@pytest.fixture
def slamming() -> Iterator[MisbehavingServer]:
    server = MisbehavingServer("slam")
    yield server
    server.close()


def test_a_trickling_redis_costs_a_get_no_more_than_the_deadline(trickling):
    # Every byte arrives within the socket timeout, so only a deadline on the whole call ends it.
    cache = RedisCache(f"redis://127.0.0.1:{trickling.port}/0", socket_timeout=1.0, retries=0, deadline_s=0.3)
    try:
        started = time.monotonic()
        read = cache.get("specdec:default:v1:k", identity(REQ))
        elapsed = time.monotonic() - started
        assert read == CacheRead(None, "error")
        assert not read.hit
        assert elapsed < 0.3 + 0.25
        assert cache.stats.errors == 1

        started = time.monotonic()
        cache.set("specdec:default:v1:k", RESULT, identity(REQ))  # a write is bounded the same way
        assert time.monotonic() - started < 0.3 + 0.25
        assert cache.stats.errors == 2
    finally:
        cache.close()


def test_the_breaker_opens_after_n_failures_and_lets_one_probe_through_per_interval(slamming):
    now = [0.0]  # the breaker's clock, moved by the test
    cache = RedisCache(
        f"redis://127.0.0.1:{slamming.port}/0",
        retries=0,
        breaker_failures=3,
        breaker_interval_s=30,
        clock=lambda: now[0],
    )
    try:
        for _ in range(3 + 20):  # N failures, then k calls inside the same interval
            assert cache.get("specdec:default:v1:k", identity(REQ)).status == "error"
        assert slamming.accepted == 3  # the k calls never touched the server
        assert cache.breaker.stats()["state"] == "open"
        assert cache.breaker.stats()["short_circuits"] == 20
        assert cache.stats.errors == 23

        now[0] += 30
        # Past the interval, eight threads at once: one of them probes, the rest get a miss at once.
        barrier = threading.Barrier(8)
        statuses: list[str] = []

        def call() -> None:
            barrier.wait()
            statuses.append(cache.get("specdec:default:v1:k", identity(REQ)).status)

        threads = [threading.Thread(target=call) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=10)
        assert statuses == ["error"] * 8
        assert slamming.accepted == 4
        assert cache.breaker.stats()["probes"] == 1
        assert cache.breaker.stats()["state"] == "open"  # the probe failed: open for another interval
    finally:
        cache.close()
