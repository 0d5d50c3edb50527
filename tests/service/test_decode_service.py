"""DecodeService: the article's reproduction, the guard, and the log records it writes."""

from __future__ import annotations

import hashlib
import io
import json
import re
import threading
import uuid

import pytest
from helpers import DeterministicEngine

from specdec_core.cache import MemoryCache
from specdec_core.contract.identity import DecodeRequest, identity
from specdec_core.keys.schemes import cache_key
from specdec_core.service import DecodeService, rfc3339_utc

PROMPT = "Write a haiku about cache invalidation."
REQ_A = DecodeRequest(
    prompt=PROMPT,
    target_model="llama-3-8b",
    draft_model="llama-3-1b",
    num_speculative_tokens=4,
    temperature=0.8,
    seed=11,
    max_tokens=48,
    stop=("\n\n",),
    tokenizer_version="hf-4.44",
)
# Same prompt, other draft model and temperature: the pair a prompt-only key mixes up.
REQ_B = DecodeRequest(
    prompt=PROMPT,
    target_model="llama-3-8b",
    draft_model="eagle-head",
    num_speculative_tokens=4,
    temperature=0.0,
    max_tokens=8,
    tokenizer_version="hf-4.44",
)


def own_output(req: DecodeRequest) -> str:
    return DeterministicEngine().generate(req).text


def service_with_log(**kwargs) -> tuple[DecodeService, list[dict]]:
    records: list[dict] = []
    kwargs.setdefault("cache", MemoryCache())
    kwargs.setdefault("engine", DeterministicEngine())
    return DecodeService(log_sink=records.append, **kwargs), records


# --- the reproduction ------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["prompt_only", "model_prompt"])
def test_narrow_key_without_guard_serves_request_a_output_to_request_b(scheme):
    service, records = service_with_log(key_scheme=scheme, guard=False)
    a = service.decode(REQ_A)
    b = service.decode(REQ_B)
    assert a.text == own_output(REQ_A)
    assert b == a  # B silently received A's output
    assert b.text != own_output(REQ_B)
    assert b.output_tokens > REQ_B.max_tokens  # symptom 4: longer than B allows
    assert len(service.engine.calls) == 1
    assert service.counters()["hits"] == 1
    assert records[1]["cache_hit"] is True
    assert records[1]["cached_fingerprint"] == identity(REQ_A)
    assert records[1]["output_text"] == own_output(REQ_A)
    assert records[0]["cache_key"] == records[1]["cache_key"]


def test_full_key_gives_each_request_its_own_output():
    service, records = service_with_log(key_scheme="full", guard=False)
    a = service.decode(REQ_A)
    b = service.decode(REQ_B)
    assert a.text == own_output(REQ_A)
    assert b.text == own_output(REQ_B)
    assert len(service.engine.calls) == 2
    assert [r["cache_hit"] for r in records] == [False, False]
    assert records[0]["cache_key"] == cache_key(REQ_A)
    assert records[1]["cache_key"] == cache_key(REQ_B)
    assert service.decode(REQ_A) == a
    assert records[2]["cache_hit"] is True
    assert records[2]["cached_fingerprint"] == identity(REQ_A)


def test_guard_catches_a_narrow_key_collision_and_decodes_request_b_itself():
    service, records = service_with_log(key_scheme="prompt_only", guard=True)
    service.decode(REQ_A)
    b = service.decode(REQ_B)
    assert b.text == own_output(REQ_B)
    assert len(service.engine.calls) == 2
    counters = service.counters()
    assert counters["fingerprint_mismatches"] == 1
    assert counters["hits"] == 0
    assert service.cache.stats.fingerprint_mismatches == 1
    assert records[1]["cache_hit"] is False
    assert records[1]["cached_fingerprint"] is None
    # B overwrote the shared entry: B now hits, A mismatches again (the key thrashes, nothing leaks).
    assert service.decode(REQ_B) == b
    assert service.decode(REQ_A).text == own_output(REQ_A)
    assert service.counters()["fingerprint_mismatches"] == 2


def test_equivalent_request_spelled_differently_hits_the_entry():
    service, records = service_with_log()
    service.decode(REQ_A)
    same = DecodeRequest.from_record(
        {**REQ_A.to_record(), "prompt": None, "stop": ["\n\n", "\n\n"], "temperature": 0.8000000001}
    )
    service.decode(same)
    assert records[1]["cache_hit"] is True
    assert len(service.engine.calls) == 1


# --- log records -----------------------------------------------------------------------------

RFC3339_MS = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")
REQUIRED = {
    "request_id": str,
    "ts": str,
    "target_model": str,
    "temperature": (int, float),
    "max_tokens": int,
    "tokenizer_version": str,
    "cache_key": str,
    "cache_hit": bool,
    "output_text": str,
    "output_tokens": int,
}
OPTIONAL = {
    "prompt": (str,),
    "prompt_hash": (str,),
    "draft_model": (str, type(None)),
    "num_speculative_tokens": (int, type(None)),
    "top_p": (int, float),
    "top_k": (int, type(None)),
    "seed": (int, type(None)),
    "stop": (list, type(None)),
    "deployment": (str, type(None)),
    "cached_fingerprint": (dict, type(None)),
    "finish_reason": (str, type(None)),
    "latency_ms": (int, float, type(None)),
    "draft_tokens": (int, type(None)),
    "accepted_tokens": (int, type(None)),
    "consumer": (str, type(None)),
    "experiment": (str, type(None)),
}


def assert_follows_the_log_contract(record: dict) -> None:
    for name, kind in REQUIRED.items():
        assert name in record, f"{name} missing"
        assert isinstance(record[name], kind), f"{name}: {record[name]!r}"
    for name, kinds in OPTIONAL.items():
        if name in record:
            assert isinstance(record[name], kinds), f"{name}: {record[name]!r}"
    assert set(record) <= set(REQUIRED) | set(OPTIONAL), set(record) - set(REQUIRED) - set(OPTIONAL)
    assert "prompt" in record or "prompt_hash" in record
    assert re.fullmatch(r"[0-9a-f]{64}", record["prompt_hash"])
    assert RFC3339_MS.match(record["ts"])
    assert record["temperature"] >= 0 and record["max_tokens"] >= 1 and record["output_tokens"] >= 0
    DecodeRequest.from_record(record)  # the identity fields read back as a valid request


def test_writes_one_contract_record_per_request():
    clock_values = iter([1_700_000_000.123, 1_700_000_001.5])
    service, records = service_with_log(
        key_scheme="prompt_only", guard=False, deployment="eu-west-canary", clock=lambda: next(clock_values)
    )
    service.decode(REQ_A, request_id="req-a")
    service.decode(REQ_B)
    assert len(records) == 2
    for record in records:
        assert_follows_the_log_contract(record)
    a, b = records
    assert a["request_id"] == "req-a"
    assert uuid.UUID(b["request_id"]).version == 4
    assert a["ts"] == "2023-11-14T22:13:20.123Z"
    assert b["ts"] == "2023-11-14T22:13:21.500Z"
    assert a["prompt"] == PROMPT
    assert a["prompt_hash"] == hashlib.sha256(PROMPT.encode()).hexdigest()
    assert a["deployment"] == "eu-west-canary"
    assert (a["draft_model"], a["temperature"], a["max_tokens"], a["stop"]) == (
        "llama-3-1b",
        0.8,
        48,
        ["\n\n"],
    )
    assert (b["draft_model"], b["temperature"], b["max_tokens"]) == ("eagle-head", 0.0, 8)
    assert a["cache_hit"] is False and a["cached_fingerprint"] is None
    assert b["cached_fingerprint"] == identity(REQ_A)
    assert a["output_tokens"] == len(DeterministicEngine().generate(REQ_A).token_ids)
    # The draft ran for A only; B's hit proposed nothing.
    assert a["draft_tokens"] == 2 * a["output_tokens"] and a["accepted_tokens"] == a["output_tokens"]
    assert b["draft_tokens"] is None and b["accepted_tokens"] is None


def test_redacted_log_holds_the_prompt_hash_but_never_the_prompt(tmp_path):
    path = tmp_path / "requests.jsonl"
    service = DecodeService(MemoryCache(), DeterministicEngine(), log_sink=path, redact_prompts=True)
    service.decode(REQ_A)
    service.decode(REQ_A)
    service.close()
    text = path.read_text(encoding="utf-8")
    assert PROMPT not in text
    assert "haiku" not in text
    records = [json.loads(line) for line in text.splitlines()]
    assert len(records) == 2
    for record in records:
        assert "prompt" not in record
        assert record["prompt_hash"] == hashlib.sha256(PROMPT.encode()).hexdigest()
        assert_follows_the_log_contract(record)


def test_path_sink_appends_and_stream_sink_gets_the_same_lines(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text('{"request_id":"earlier"}\n', encoding="utf-8")
    stream = io.StringIO()
    ids = ["r1", "r2"]
    for sink in (path, str(path), stream):
        with DecodeService(MemoryCache(), DeterministicEngine(), log_sink=sink, clock=lambda: 0.0) as service:
            for request_id in ids:
                service.decode(REQ_A, request_id=request_id)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["request_id"] for line in lines] == ["earlier", "r1", "r2", "r1", "r2"]
    assert [json.loads(line)["request_id"] for line in stream.getvalue().splitlines()] == ids


def test_latency_is_measured_around_the_whole_call():
    service, records = service_with_log(engine=DeterministicEngine(delay_s=0.05))
    service.decode(REQ_A)
    service.decode(REQ_A)
    assert records[0]["latency_ms"] >= 50
    assert records[1]["latency_ms"] < 50  # the hit skipped the engine


def test_engine_failure_is_counted_logged_and_reraised_without_caching(caplog):
    service, records = service_with_log(engine=DeterministicEngine(fail=True))
    with pytest.raises(RuntimeError, match="out of memory"):
        service.decode(REQ_A, request_id="doomed")
    assert service.counters()["errors"] == 1
    assert records == []
    assert service.cache.get(cache_key(REQ_A), identity(REQ_A)).status == "miss"
    [logged] = [r for r in caplog.records if getattr(r, "event", None) == "engine_error"]
    assert logged.request_id == "doomed"
    assert logged.exc_info is not None


def test_ttl_passes_through_to_the_cache():
    now = [0.0]
    service, records = service_with_log(cache=MemoryCache(clock=lambda: now[0]), ttl_s=30)
    service.decode(REQ_A)
    now[0] = 29.0
    service.decode(REQ_A)
    now[0] = 31.0
    service.decode(REQ_A)
    assert [r["cache_hit"] for r in records] == [False, True, False]


def test_concurrent_requests_count_and_log_every_request_once(tmp_path):
    path = tmp_path / "log.jsonl"
    service = DecodeService(MemoryCache(), DeterministicEngine(), log_sink=path)
    requests = [REQ_A, REQ_B] + [
        DecodeRequest(prompt=f"p{i}", target_model="t", tokenizer_version="v", max_tokens=4) for i in range(6)
    ]

    def worker() -> None:
        for i in range(50):
            service.decode(requests[i % len(requests)])

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    service.close()
    counters = service.counters()
    assert counters["requests"] == 400
    assert counters["hits"] + counters["misses"] == 400
    assert counters["misses"] >= len(requests)
    records = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert len(records) == 400
    assert len({r["request_id"] for r in records}) == 400
    assert sum(r["cache_hit"] for r in records) == counters["hits"]


def test_bad_namespace_or_ttl_fails_when_the_service_is_built():
    with pytest.raises(ValueError, match="namespace"):
        DecodeService(MemoryCache(), DeterministicEngine(), namespace="a:b")
    with pytest.raises(ValueError, match="ttl_s"):
        DecodeService(MemoryCache(), DeterministicEngine(), ttl_s=0)
    with pytest.raises(ValueError, match="unknown"):
        DecodeService(MemoryCache(), DeterministicEngine(), key_scheme="hash(prompt)")


def test_rfc3339_timestamps_are_utc_with_milliseconds():
    assert rfc3339_utc(0) == "1970-01-01T00:00:00.000Z"
    assert rfc3339_utc(1_700_000_000.9996) == "2023-11-14T22:13:20.999Z"
