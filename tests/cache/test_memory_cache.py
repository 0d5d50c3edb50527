"""The in-process cache: LRU, TTL, namespaces, and the fingerprint guard shared with Redis."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import re
import threading

import pytest
from helpers import SAMPLE_REQUEST, SAMPLE_RESULT

from specdec_core.cache import (
    Cache,
    CacheRead,
    MemoryCache,
    RedisCache,
    decode_entry,
    encode_entry,
    open_cache,
)
from specdec_core.contract.identity import DecodeRequest, fingerprint, identity
from specdec_core.keys.schemes import KEY_SCHEMA_VERSION, cache_key

REQ_A = SAMPLE_REQUEST
REQ_B = DecodeRequest(
    prompt="Explain speculative decoding.",
    target_model="llama-3-8b",
    draft_model="eagle-head",
    num_speculative_tokens=4,
    temperature=0.0,
    max_tokens=16,
    tokenizer_version="hf-4.44",
)
RESULT_A = SAMPLE_RESULT


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_memory_cache_satisfies_the_cache_protocol():
    assert isinstance(MemoryCache(), Cache)
    assert isinstance(RedisCache("redis://127.0.0.1:1/0"), Cache)


def test_set_then_get_returns_the_result_and_its_stored_identity():
    cache = MemoryCache()
    key = cache_key(REQ_A)
    cache.set(key, RESULT_A, identity(REQ_A))
    read = cache.get(key, identity(REQ_A))
    assert read == CacheRead(RESULT_A, "hit", identity(REQ_A))
    assert read.hit
    assert cache.stats.as_dict() == {
        "hits": 1,
        "misses": 0,
        "fingerprint_mismatches": 0,
        "corrupt": 0,
        "errors": 0,
    }


def test_absent_key_is_a_counted_miss():
    cache = MemoryCache()
    read = cache.get(cache_key(REQ_A), identity(REQ_A))
    assert read == CacheRead(None, "miss")
    assert cache.stats.misses == 1


def test_memory_cache_stores_the_same_json_entry_as_redis():
    cache = MemoryCache()
    key = cache_key(REQ_A)
    cache.set(key, RESULT_A, identity(REQ_A))
    entry = json.loads(cache.get_raw(key))
    assert set(entry) == {"identity", "fingerprint", "result", "schema", "written_at"}
    assert entry["identity"] == identity(REQ_A)
    assert entry["fingerprint"] == fingerprint(REQ_A)
    assert entry["schema"] == KEY_SCHEMA_VERSION
    assert entry["result"]["text"] == RESULT_A.text
    # int lists as base64 of little-endian int32: 5, 6, 7
    assert base64.b64decode(entry["result"]["token_ids"]) == bytes([5, 0, 0, 0, 6, 0, 0, 0, 7, 0, 0, 0])
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", entry["written_at"])


@pytest.mark.parametrize(
    "token_ids",
    [(), (0,), (2**31 - 1, 0, 151_935), (-1, 2**31 - 1), (2**31, 1), (2**70,)],
    ids=["empty", "one", "vocab-sized", "negative", "past-int32", "huge"],
)
def test_entry_round_trips_any_token_ids(token_ids):
    cache = MemoryCache()
    result = dataclasses.replace(RESULT_A, token_ids=token_ids, accepted_per_step=token_ids[:2])
    cache.set("k", result, identity(REQ_A))
    assert cache.get("k", identity(REQ_A)).result == result


def test_entry_with_plain_int_lists_is_read_too():
    cache = MemoryCache()
    entry = json.loads(encode_entry(RESULT_A, identity(REQ_A)))
    entry["result"] = RESULT_A.to_json()
    cache.set_raw("k", json.dumps(entry))
    assert cache.get("k", identity(REQ_A)).result == RESULT_A


def test_entry_expires_after_its_ttl():
    clock = FakeClock()
    cache = MemoryCache(clock=clock)
    key = cache_key(REQ_A)
    cache.set(key, RESULT_A, identity(REQ_A), ttl_s=10)
    cache.set("specdec:default:forever", RESULT_A, identity(REQ_A))
    clock.now += 9.9
    assert cache.get(key, identity(REQ_A)).status == "hit"
    clock.now += 0.2
    assert cache.get(key, identity(REQ_A)).status == "miss"
    assert cache.get("specdec:default:forever", identity(REQ_A)).status == "hit"
    assert len(cache) == 1


@pytest.mark.parametrize("ttl_s", [0, -1.0])
def test_non_positive_ttl_is_rejected(ttl_s):
    with pytest.raises(ValueError, match="ttl_s"):
        MemoryCache().set("k", RESULT_A, identity(REQ_A), ttl_s=ttl_s)


def test_least_recently_used_entry_is_evicted_first():
    cache = MemoryCache(max_entries=2)
    for key in ("k1", "k2"):
        cache.set(key, RESULT_A, identity(REQ_A))
    assert cache.get("k1", identity(REQ_A)).hit  # k1 is now the most recent
    cache.set("k3", RESULT_A, identity(REQ_A))
    assert cache.get("k2", identity(REQ_A)).status == "miss"
    assert cache.get("k1", identity(REQ_A)).hit
    assert cache.get("k3", identity(REQ_A)).hit
    assert len(cache) == 2


def test_guard_turns_another_requests_entry_into_a_counted_mismatch(caplog):
    cache = MemoryCache()
    key = "specdec:default:prompt_only:0001"  # a narrow key both requests share
    cache.set(key, RESULT_A, identity(REQ_A))
    with caplog.at_level(logging.WARNING, logger="specdec_core.cache"):
        read = cache.get(key, identity(REQ_B))
    assert read.status == "fingerprint_mismatch"
    assert read.result is None
    assert read.cached_identity == identity(REQ_A)
    assert cache.stats.fingerprint_mismatches == 1
    assert cache.stats.hits == 0
    [record] = [r for r in caplog.records if getattr(r, "event", None) == "cache_fingerprint_mismatch"]
    assert record.levelno == logging.WARNING
    assert record.cache_key == key
    assert record.expected_fingerprint == fingerprint(REQ_B)
    assert record.stored_fingerprint == fingerprint(REQ_A)
    # temperature differs and B is greedy: sampling fields are left out, not reported
    assert record.differing_fields == ["draft_model", "max_tokens", "temperature"]


def test_guard_accepts_a_stored_identity_spelled_differently_but_equivalent():
    cache = MemoryCache()
    spelled = dict(identity(REQ_A), draft_model="llama-3-1b", top_k=0, stop=None, temperature=0.7000000001)
    assert spelled != identity(REQ_A)
    cache.set("k", RESULT_A, spelled)
    read = cache.get("k", identity(REQ_A))
    assert read.status == "hit"
    assert read.result == RESULT_A


def test_unguarded_read_returns_whatever_is_stored_under_the_key():
    cache = MemoryCache()
    cache.set("k", RESULT_A, identity(REQ_A))
    read = cache.get("k", None)
    assert read == CacheRead(RESULT_A, "hit", identity(REQ_A))
    assert cache.stats.fingerprint_mismatches == 0


@pytest.mark.parametrize(
    "raw",
    [
        "not json {",
        b"\x80\x81 binary",
        "[" * 100_000,
        "[1, 2, 3]",
        json.dumps({"text": "an old-schema value: a bare result", "token_ids": []}),
        json.dumps({"schema": "v0", "identity": {}, "result": RESULT_A.to_json()}),
        json.dumps({"schema": KEY_SCHEMA_VERSION, "result": RESULT_A.to_json()}),  # no identity
        json.dumps({"schema": KEY_SCHEMA_VERSION, "identity": {"prompt": "x"}, "result": RESULT_A.to_json()}),
        json.dumps({"schema": KEY_SCHEMA_VERSION, "identity": identity(REQ_A), "result": {"no_text": 1}}),
        json.dumps(
            {
                "schema": KEY_SCHEMA_VERSION,
                "identity": identity(REQ_A),
                "result": dict(RESULT_A.to_json(), token_ids="AQI"),
            }
        ),
    ],
    ids=[
        "bad-json",
        "not-utf8",
        "too-deep",
        "not-an-object",
        "old-schema",
        "other-schema",
        "no-identity",
        "bad-identity",
        "bad-result",
        "bad-packed-ids",
    ],
)
def test_unreadable_value_is_a_counted_corrupt_miss(raw, caplog):
    cache = MemoryCache()
    cache.set_raw("k", raw)
    with caplog.at_level(logging.WARNING, logger="specdec_core.cache"):
        read = cache.get("k", identity(REQ_A))
    assert read == CacheRead(None, "corrupt")
    assert cache.stats.corrupt == 1
    assert cache.stats.hits == 0
    assert any(getattr(r, "event", None) == "cache_corrupt_entry" for r in caplog.records)


def test_unguarded_read_of_an_entry_without_identity_is_a_hit_with_no_cached_identity():
    cache = MemoryCache()
    cache.set_raw("k", json.dumps({"schema": KEY_SCHEMA_VERSION, "result": RESULT_A.to_json()}))
    assert cache.get("k", None) == CacheRead(RESULT_A, "hit", None)


def test_encoded_entry_decodes_to_the_same_result():
    from specdec_core.cache import CacheStats

    stats = CacheStats()
    read = decode_entry(encode_entry(RESULT_A, identity(REQ_A)), "k", identity(REQ_A), stats)
    assert read.result == RESULT_A
    assert stats.hits == 1


def test_delete_namespace_removes_its_keys_and_leaves_others():
    cache = MemoryCache(max_entries=20_000)
    for i in range(5000):
        cache.set_raw(f"specdec:exp:v1:{i:064x}", "{}")
    for i in range(50):
        cache.set_raw(f"specdec:exp2:v1:{i:064x}", "{}")  # a namespace sharing the prefix "exp"
        cache.set_raw(f"specdec:default:v1:{i:064x}", "{}")
    assert cache.delete_namespace("exp") == 5000
    assert len(cache) == 100
    assert cache.get_raw(f"specdec:exp2:v1:{0:064x}") == "{}"
    assert cache.delete_namespace("exp") == 0


def test_delete_namespace_does_not_count_expired_entries():
    clock = FakeClock()
    cache = MemoryCache(clock=clock)
    cache.set_raw("specdec:exp:v1:a", "{}", ttl_s=1)
    cache.set_raw("specdec:exp:v1:b", "{}")
    clock.now += 2
    assert cache.delete_namespace("exp") == 1
    assert len(cache) == 0


def test_concurrent_readers_and_writers_keep_the_lru_consistent():
    cache = MemoryCache(max_entries=50)
    errors: list[BaseException] = []

    def worker(n: int) -> None:
        try:
            for i in range(300):
                key = f"specdec:default:v1:{(n * 7 + i) % 120}"
                cache.set(key, RESULT_A, identity(REQ_A))
                read = cache.get(key, identity(REQ_A))
                assert read.status in ("hit", "miss")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert len(cache) == 50
    stats = cache.stats.as_dict()
    assert stats["hits"] + stats["misses"] == 8 * 300


def test_open_cache_picks_the_cache_from_the_url():
    assert isinstance(open_cache(None), MemoryCache)
    assert open_cache("memory://?max_entries=7").max_entries == 7
    redis_cache = open_cache("redis://127.0.0.1:1/0")
    assert isinstance(redis_cache, RedisCache)
    assert not redis_cache.is_cluster
    assert open_cache("redis+cluster://127.0.0.1:1").is_cluster
    assert open_cache("redis://127.0.0.1:1/0?cluster=true").is_cluster
    assert not open_cache("redis://127.0.0.1:1/0?cluster=false").is_cluster
    with pytest.raises(ValueError, match="unknown scheme"):
        open_cache("memcached://localhost:11211")
