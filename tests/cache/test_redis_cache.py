"""RedisCache against a real redis-server (pytest-redis starts it on a free port)."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator

import pytest
from helpers import DeterministicEngine, free_port, start_redis
from prom_stack import wait_for

from specdec_core.cache import CacheError, CacheRead, RedisCache, encode_entry, open_cache
from specdec_core.contract.identity import DecodeRequest, fingerprint, identity
from specdec_core.contract.result import DecodeResult
from specdec_core.keys.schemes import cache_key, key_scheme
from specdec_core.service import DecodeService

REQ_A = DecodeRequest(
    prompt="Why is my hit rate 97%?",
    target_model="llama-3-8b",
    draft_model="llama-3-1b",
    num_speculative_tokens=4,
    temperature=0.7,
    seed=7,
    max_tokens=64,
    tokenizer_version="hf-4.44",
)
REQ_B = DecodeRequest(
    prompt="Why is my hit rate 97%?",
    target_model="llama-3-8b",
    draft_model="eagle-head",
    num_speculative_tokens=4,
    temperature=0.2,
    seed=7,
    max_tokens=16,
    tokenizer_version="hf-4.44",
)


def _result(text: str) -> DecodeResult:
    return DecodeResult(
        text=text, token_ids=(1, 2), finish_reason="length", draft_tokens=2, accepted_tokens=1
    )


@pytest.fixture
def redis_url(redis_proc, redisdb) -> str:
    # redisdb flushes the server after each test.
    return f"redis://{redis_proc.host}:{redis_proc.port}/0"


@pytest.fixture
def cache(redis_url) -> Iterator[RedisCache]:
    c = RedisCache(redis_url, socket_timeout=2.0)
    yield c
    c.close()


def test_set_then_get_round_trips_through_redis_as_json(cache, redisdb):
    key = cache_key(REQ_A)
    cache.set(key, _result("hello"), identity(REQ_A))
    raw = redisdb.get(key)
    assert raw.startswith(b"{")  # JSON, never pickle
    entry = json.loads(raw)
    assert entry["identity"] == identity(REQ_A)
    assert entry["fingerprint"] == fingerprint(REQ_A)
    assert cache.get(key, identity(REQ_A)) == CacheRead(_result("hello"), "hit", identity(REQ_A))
    assert cache.get(cache_key(REQ_B), identity(REQ_B)).status == "miss"
    assert cache.stats.as_dict() == {
        "hits": 1,
        "misses": 1,
        "fingerprint_mismatches": 0,
        "corrupt": 0,
        "errors": 0,
    }


def test_cache_accepts_a_ready_client(redisdb):
    cache = RedisCache(redisdb)  # pytest-redis connects over the unix socket
    cache.set("specdec:default:v1:x", _result("via client"), identity(REQ_A))
    assert cache.get("specdec:default:v1:x", identity(REQ_A)).result == _result("via client")


def test_entry_expires_after_its_ttl(cache, redisdb):
    key = cache_key(REQ_A)
    cache.set(key, _result("short-lived"), identity(REQ_A), ttl_s=0.3)
    assert 0 < redisdb.pttl(key) <= 300
    assert cache.get(key, identity(REQ_A)).status == "hit"
    wait_for(lambda: redisdb.pttl(key) == -2, 5, "Redis to expire the entry", every=0.02)  # -2: no such key
    assert cache.get(key, identity(REQ_A)).status == "miss"
    cache.set(key, _result("kept"), identity(REQ_A))
    assert redisdb.pttl(key) == -1  # no TTL: no expiry


def test_delete_namespace_scans_and_unlinks_in_batches_leaving_other_namespaces(cache, redisdb):
    with redisdb.pipeline(transaction=False) as pipe:
        for i in range(5000):
            pipe.set(f"specdec:exp:v1:{i:064x}", "{}")
        for i in range(100):
            pipe.set(f"specdec:exp2:v1:{i:064x}", "{}")  # shares the text "exp"
            pipe.set(f"specdec:default:v1:{i:064x}", "{}")
        pipe.set("unrelated", "1")
        pipe.execute()
    redisdb.config_resetstat()

    assert cache.delete_namespace("exp") == 5000

    assert redisdb.dbsize() == 201
    assert redisdb.exists(f"specdec:exp2:v1:{0:064x}", f"specdec:default:v1:{99:064x}", "unrelated") == 3
    stats = redisdb.info("commandstats")
    assert "cmdstat_keys" not in stats
    assert stats["cmdstat_scan"]["calls"] > 1
    assert stats["cmdstat_unlink"]["calls"] >= 5000 // cache.scan_count
    assert cache.delete_namespace("exp") == 0


def test_guard_catches_a_planted_entry_of_another_request_and_the_service_overwrites_it(
    cache, redisdb, caplog
):
    key = key_scheme("prompt_only")(REQ_B, "default")
    cache.set(key, _result("A's answer"), identity(REQ_A))  # what a narrow key leaves behind

    read = cache.get(key, identity(REQ_B))
    assert read.status == "fingerprint_mismatch"
    assert read.cached_identity == identity(REQ_A)
    assert cache.stats.fingerprint_mismatches == 1

    engine = DeterministicEngine()
    service = DecodeService(cache, engine, key_scheme="prompt_only")
    result = service.decode(REQ_B)
    assert result.text == DeterministicEngine().generate(REQ_B).text
    assert service.counters()["fingerprint_mismatches"] == 1
    assert json.loads(redisdb.get(key))["identity"] == identity(REQ_B)
    assert service.decode(REQ_B) == result
    assert len(engine.calls) == 1
    assert service.counters()["hits"] == 1


def test_garbage_value_is_a_counted_corrupt_miss_that_the_service_repairs(cache, redisdb):
    key = cache_key(REQ_A)
    redisdb.set(key, b"\x80\x04\x95pickle-ish garbage")
    assert cache.get(key, identity(REQ_A)) == CacheRead(None, "corrupt")
    assert cache.stats.corrupt == 1

    service = DecodeService(cache, DeterministicEngine())
    service.decode(REQ_A)
    assert service.counters()["corrupt"] == 1
    assert cache.get(key, identity(REQ_A)).status == "hit"


def test_wrong_type_under_the_key_is_an_error_not_an_exception(cache, redisdb):
    key = cache_key(REQ_A)
    redisdb.hset(key, "field", "value")
    assert cache.get(key, identity(REQ_A)).status == "error"
    cache.set(key, _result("x"), identity(REQ_A))  # SET overwrites any type: no error
    assert cache.stats.errors == 1
    assert cache.get(key, identity(REQ_A)).status == "hit"  # a ResponseError does not pause the cache


# --- a dedicated server this module may kill ----------------------------------------------------


@pytest.fixture
def own_redis(tmp_path) -> Iterator[dict]:
    port = free_port()
    server = {"port": port, "proc": start_redis(port, tmp_path), "dir": tmp_path}
    yield server
    proc = server["proc"]
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.terminate()
        proc.wait(timeout=10)


class Clock:
    """The breaker's clock, moved by the test: an interval passes when the test says so, not when it sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_service_keeps_answering_when_redis_is_killed_mid_run_and_recovers(own_redis, caplog):
    clock = Clock()
    cache = RedisCache(f"redis://127.0.0.1:{own_redis['port']}/0", socket_timeout=0.5, breaker_interval_s=30,
                       clock=clock)
    engine = DeterministicEngine()
    service = DecodeService(cache, engine)
    first = service.decode(REQ_A)
    assert service.decode(REQ_A) == first
    assert service.counters()["hits"] == 1

    own_redis["proc"].kill()
    own_redis["proc"].wait(timeout=10)

    started = time.monotonic()
    for _ in range(5):
        assert service.decode(REQ_A) == first  # from the engine: nothing raised
        assert service.decode(REQ_B).text == DeterministicEngine().generate(REQ_B).text
    assert time.monotonic() - started < 3  # an outage costs no retries with backoff
    assert len(engine.calls) == 11
    assert cache.stats.errors >= 10
    assert service.counters()["cache_errors"] == 10
    assert service.counters()["errors"] == 0
    assert any(getattr(r, "event", None) == "cache_error" for r in caplog.records)

    own_redis["proc"] = start_redis(own_redis["port"], own_redis["dir"])
    assert cache.breaker.stats()["state"] == "open"
    clock.now += 30  # the pause after a failure: the next call probes the server that is back
    service.decode(REQ_A)
    assert service.decode(REQ_A) == first
    assert service.counters()["hits"] == 2
    cache.close()


def test_read_from_a_hung_redis_times_out_as_an_error(own_redis):
    cache = RedisCache(f"redis://127.0.0.1:{own_redis['port']}/0", socket_timeout=0.2, retries=0)
    cache.set("specdec:default:v1:k", _result("x"), identity(REQ_A))
    os.kill(own_redis["proc"].pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        assert cache.get("specdec:default:v1:k", identity(REQ_A)) == CacheRead(None, "error")
        cache.set("specdec:default:v1:k", _result("y"), identity(REQ_A))  # paused: skipped, not raised
        assert time.monotonic() - started < 1.5
    finally:
        os.kill(own_redis["proc"].pid, signal.SIGCONT)
    assert cache.stats.errors == 2
    cache.close()


def test_delete_namespace_on_a_dead_redis_raises_a_clear_error(own_redis):
    cache = RedisCache(f"redis://127.0.0.1:{own_redis['port']}/0", socket_timeout=0.5)
    own_redis["proc"].kill()
    own_redis["proc"].wait(timeout=10)
    with pytest.raises(CacheError, match="could not delete namespace 'exp'"):
        cache.delete_namespace("exp")


def test_unreachable_cluster_url_is_a_miss_not_an_exception():
    cache = open_cache(f"redis+cluster://127.0.0.1:{free_port()}")
    assert cache.is_cluster
    assert cache.get("specdec:default:v1:k", identity(REQ_A)) == CacheRead(None, "error")
    cache.set("specdec:default:v1:k", _result("x"), identity(REQ_A))
    assert cache.stats.errors == 2


def test_a_stopped_redis_opens_the_breaker_and_a_probe_closes_it_when_redis_is_back(own_redis):
    clock = Clock()
    cache = RedisCache(
        f"redis://127.0.0.1:{own_redis['port']}/0", retries=0, breaker_failures=3, breaker_interval_s=30, clock=clock
    )
    key = "specdec:default:v1:k"
    cache.set(key, _result("before"), identity(REQ_A))
    own_redis["proc"].kill()
    own_redis["proc"].wait(timeout=10)

    for _ in range(3 + 10):  # all inside one interval: the clock stands still
        assert cache.get(key, identity(REQ_A)) == CacheRead(None, "error")
    assert cache.breaker.stats() == {
        "state": "open", "consecutive_failures": 3, "opens": 1, "probes": 0, "short_circuits": 10
    }

    own_redis["proc"] = start_redis(own_redis["port"], own_redis["dir"])
    clock.now += 29.9
    assert cache.get(key, identity(REQ_A)).status == "error"  # still inside the interval: not asked
    assert cache.breaker.stats()["short_circuits"] == 11
    clock.now += 0.1
    assert cache.get(key, identity(REQ_A)).status == "miss"  # the probe reached the fresh server
    assert cache.breaker.stats()["state"] == "closed"
    cache.set(key, _result("after"), identity(REQ_A))
    assert cache.get(key, identity(REQ_A)).result == _result("after")
    cache.close()


def test_a_wrong_typed_entry_in_redis_is_a_corrupt_miss_that_the_service_repairs(cache, redisdb):
    key = cache_key(REQ_A)
    entry = json.loads(encode_entry(_result("ok"), identity(REQ_A)))
    entry["result"]["text"] = None
    redisdb.set(key, json.dumps(entry))
    assert cache.get(key, identity(REQ_A)) == CacheRead(None, "corrupt")
    assert cache.stats.corrupt == 1

    service = DecodeService(cache, DeterministicEngine())
    assert service.decode(REQ_A).text == DeterministicEngine().generate(REQ_A).text
    assert cache.get(key, identity(REQ_A)).status == "hit"
