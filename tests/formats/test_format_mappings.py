"""Pins the foreign-log mappings of the log contract's "Other log formats" (specdec_core.formats)."""

from __future__ import annotations

import json

import pytest

from specdec_core.formats import (
    FORMATS,
    FormatError,
    LineResult,
    MappingError,
    backfill_cache_keys,
    detect,
    line_reader,
    load_mapping,
)

# --- OTel helpers -------------------------------------------------------------------------------


def s(v: str) -> dict:
    return {"stringValue": v}


def attr(key: str, value: dict) -> dict:
    return {"key": key, "value": value}


def otlp(*spans: dict, resource: list | None = None, scope_key: str = "scopeSpans") -> str:
    rs = {
        "resource": {"attributes": resource or []},
        scope_key: [{"scope": {"name": "t"}, "spans": list(spans)}],
    }
    return json.dumps({"resourceSpans": [rs]})


def span(*attrs: dict, span_id: str = "00f067aa0ba902b7", start="1772359200123456789", end=None) -> dict:
    out = {"traceId": "4BF92F3577B34DA6A3CE929D0E0E4736", "spanId": span_id, "name": "chat m",
           "startTimeUnixNano": start, "attributes": list(attrs)}  # fmt: skip
    if end is not None:
        out["endTimeUnixNano"] = end
    return out


CHAT = attr("gen_ai.operation.name", s("chat"))
read_otel = line_reader("otel")


def one(line: str) -> dict:
    result = read_otel(line)
    assert len(result.records) == 1
    return result.records[0]


# --- OTel ---------------------------------------------------------------------------------------


def test_request_span_rule_and_skipped_counting():
    line = otlp(
        span(CHAT, span_id="01"),
        span(attr("gen_ai.operation.name", s("text_completion")), span_id="02"),
        span(attr("gen_ai.operation.name", s("generate_content")), span_id="03"),
        span(attr("specdec.cache_key", s("k1")), span_id="04"),  # no operation name, but a cache key
        span(attr("gen_ai.operation.name", s("embeddings")), span_id="05"),
        span(attr("http.method", s("GET")), span_id="06"),
    )
    result = read_otel(line)
    assert [r["request_id"] for r in result.records] == ["01", "02", "03", "04"]
    assert result.skipped == 2
    # read each time: the same line read again counts its skipped spans again
    assert read_otel(line).skipped == 2


def test_instrumentation_library_spans_key_is_accepted():
    result = read_otel(otlp(span(CHAT), scope_key="instrumentationLibrarySpans"))
    assert len(result.records) == 1


def test_any_value_decoding():
    rec = one(otlp(span(
        CHAT,
        attr("gen_ai.request.max_tokens", {"intValue": "128"}),
        attr("gen_ai.request.seed", {"intValue": 7}),
        attr("gen_ai.request.top_k", {"doubleValue": 40.0}),
        attr("gen_ai.request.temperature", {"intValue": "0"}),
        attr("gen_ai.request.top_p", {"doubleValue": "0.9"}),
        attr("specdec.cache_hit", {"boolValue": True}),
        attr("gen_ai.request.stop_sequences", {"arrayValue": {"values": [s("\n\n"), s("END")]}}),
        attr("specdec.draft_model", {"bytesValue": "AAE="}),
        attr("specdec.cached_fingerprint", {"kvlistValue": {"values": [attr("seed", {"intValue": "3"})]}}),
    )))  # fmt: skip
    assert rec["max_tokens"] == 128 and isinstance(rec["max_tokens"], int)
    assert rec["seed"] == 7
    assert rec["top_k"] == 40.0  # a whole-number double passes on; validation accepts it for an integer field
    assert rec["temperature"] == 0 and rec["top_p"] == 0.9
    assert rec["cache_hit"] is True
    assert rec["stop"] == ["\n\n", "END"]
    assert rec["draft_model"] == {"bytesValue": "AAE="}  # no text: passed on as it came, for validation to refuse
    assert rec["cached_fingerprint"] == {"seed": 3}


def test_empty_array_value_is_an_empty_list():
    rec = one(otlp(span(CHAT, attr("gen_ai.request.stop_sequences", {"arrayValue": {}}))))
    assert rec["stop"] == []


def test_uppercase_span_id_is_lowercased_and_request_id_attribute_wins():
    assert one(otlp(span(CHAT, span_id="00F067AA0BA902B7")))["request_id"] == "00f067aa0ba902b7"
    rec = one(otlp(span(CHAT, attr("specdec.request_id", s("REQ-1")), span_id="AB")))
    assert rec["request_id"] == "REQ-1"


def test_base64_span_id_as_protobufs_json_writes_it_is_read_as_hex():
    # json_format.MessageToDict(encode_spans(...)) writes the 8 id bytes as base64; the Collector, as hex.
    assert one(otlp(span(CHAT, span_id="APBnqgupArc=")))["request_id"] == "00f067aa0ba902b7"
    assert one(otlp(span(CHAT, span_id="AAAAAAAAAAE=")))["request_id"] == "0000000000000001"
    # Two base64 ids that differ only in case are two requests, not one.
    assert one(otlp(span(CHAT, span_id="AbCdEfGhIjI=")))["request_id"] != one(
        otlp(span(CHAT, span_id="aBcDeFgHiJI=")))["request_id"]
    assert one(otlp(span(CHAT, span_id="not-an-id")))["request_id"] == "not-an-id"


def test_ts_and_latency():
    rec = one(otlp(span(CHAT, start="1772359200123456789", end="1772359200623456789")))
    assert rec["ts"] == "2026-03-01T10:00:00.123456Z"  # truncated to microseconds, not rounded up
    assert rec["latency_ms"] == 500.0
    rec = one(otlp(span(CHAT, start=1772359200000000000, end=1772359200001500000)))  # numbers too
    assert rec["ts"] == "2026-03-01T10:00:00.000000Z"
    assert rec["latency_ms"] == 1.5
    assert "latency_ms" not in one(otlp(span(CHAT)))


def test_absent_attributes_are_absent_fields():
    rec = one(otlp(span(CHAT)))
    for field in ("target_model", "temperature", "prompt", "output_text", "deployment", "finish_reason"):
        assert field not in rec


MSGS = [{"role": "user", "parts": [{"type": "text", "content": "Héllo"}]}]


def test_prompt_is_canonical_json_of_input_messages():
    text = json.dumps(MSGS, indent=2, ensure_ascii=True)
    rec = one(otlp(span(CHAT, attr("gen_ai.input.messages", s(text)))))
    assert rec["prompt"] == '[{"parts":[{"content":"Héllo","type":"text"}],"role":"user"}]'


def test_prompt_with_system_instructions():
    system = [{"type": "text", "content": "Be brief."}]
    rec = one(otlp(span(
        CHAT,
        attr("gen_ai.input.messages", s(json.dumps(MSGS))),
        attr("gen_ai.system_instructions", s(json.dumps(system))),
    )))  # fmt: skip
    assert json.loads(rec["prompt"]) == {"messages": MSGS, "system_instructions": system}
    assert rec["prompt"].startswith('{"messages":[{"parts"')
    assert " " not in rec["prompt"].replace("Be brief.", "")


def test_prompt_non_json_text_and_specdec_prompt():
    rec = one(otlp(span(CHAT, attr("gen_ai.input.messages", s("just a prompt {")))))
    assert rec["prompt"] == "just a prompt {"
    rec = one(otlp(span(CHAT, attr("specdec.prompt", s("raw")), attr("gen_ai.input.messages", s("[]")))))
    assert rec["prompt"] == "raw"


def test_output_text_joins_text_parts_of_first_message_only():
    out = [
        {"role": "assistant", "finish_reason": "stop", "parts": [
            {"type": "reasoning", "content": "thinking..."},
            {"type": "text", "content": "Hel"},
            {"type": "tool_call", "name": "f"},
            {"type": "text", "content": "lo"},
        ]},
        {"role": "assistant", "parts": [{"type": "text", "content": "second choice"}]},
    ]  # fmt: skip
    rec = one(otlp(span(
        CHAT,
        attr("gen_ai.output.messages", s(json.dumps(out))),
        attr("gen_ai.response.finish_reasons", {"arrayValue": {"values": [s("length"), s("stop")]}}),
    )))  # fmt: skip
    assert rec["output_text"] == "Hello"
    assert rec["finish_reason"] == "length"
    rec = one(otlp(span(CHAT, attr("specdec.output_text", s("x")), attr("gen_ai.output.messages", s("[]")))))
    assert rec["output_text"] == "x"


def test_deployment_falls_back_to_service_name():
    resource = [attr("service.name", s("edge-a"))]
    assert one(otlp(span(CHAT), resource=resource))["deployment"] == "edge-a"
    rec = one(otlp(span(CHAT, attr("specdec.deployment", s("edge-b"))), resource=resource))
    assert rec["deployment"] == "edge-b"


def test_specdec_fields_and_cached_fingerprint_text():
    fp = {"target_model": "t", "seed": None}
    rec = one(otlp(span(
        attr("specdec.cache_key", s("k")),
        attr("specdec.tokenizer_version", s("tok-2")),
        attr("specdec.num_speculative_tokens", {"intValue": "4"}),
        attr("specdec.draft_tokens", {"intValue": "40"}),
        attr("specdec.accepted_tokens", {"intValue": "31"}),
        attr("specdec.prompt_hash", s("ab" * 32)),
        attr("specdec.cached_fingerprint", s(json.dumps(fp))),
        attr("gen_ai.request.model", s("target-1")),
        attr("gen_ai.usage.output_tokens", {"intValue": "12"}),
    )))  # fmt: skip
    assert rec["cache_key"] == "k" and rec["tokenizer_version"] == "tok-2"
    assert (rec["num_speculative_tokens"], rec["draft_tokens"], rec["accepted_tokens"]) == (4, 40, 31)
    assert rec["prompt_hash"] == "ab" * 32
    assert rec["cached_fingerprint"] == fp
    assert rec["target_model"] == "target-1" and rec["output_tokens"] == 12
    bad = one(otlp(span(CHAT, attr("specdec.cached_fingerprint", s("{not json")))))
    assert bad["cached_fingerprint"] == "{not json"  # passed on so validation quarantines it


def test_records_hold_only_contract_fields():
    from specdec_core.formats import CONTRACT_FIELDS

    rec = one(otlp(span(CHAT, attr("gen_ai.request.model", s("m")), attr("custom.x", s("y")))))
    assert set(rec) <= set(CONTRACT_FIELDS)


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ('{"resourceSpans": [{"scopeSpans": [{"spans": [{"spanId": "ab"', "truncated"),
        ("not json at all", "not valid JSON"),
        ("[1, 2]", "not an OTLP ExportTraceServiceRequest"),
        ('{"resource_spans": []}', "no resourceSpans"),
        ('{"resourceSpans": [{"scopeSpans": {}}]}', "scopeSpans is not a list"),
    ],
)
def test_otel_line_level_problems_raise_format_error(line, reason):
    with pytest.raises(FormatError, match=reason) as info:
        read_otel(line)
    assert "\n" not in str(info.value)


def test_request_span_without_required_attributes_still_yields_a_record():
    result = read_otel(otlp(span(CHAT)))
    assert (result.records, result.skipped) == ((one(otlp(span(CHAT))),), 0)
    assert len(result.origins) == 1 and '"span"' in result.origins[0]  # quoted as it came, if quarantined


# --- LiteLLM ------------------------------------------------------------------------------------

read_litellm = line_reader("litellm")


def payload(**over) -> dict:
    base = {
        "id": "chatcmpl-miss1",
        "call_type": "acompletion",
        "startTime": 1772359200.123456,
        "endTime": 1772359200.623456,
        "response_time": 0.123,
        "model": "gpt-x",
        "hidden_params": {"litellm_model_name": "openai/target-1"},
        "messages": [{"role": "user", "content": "Hi"}],
        "model_parameters": {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64, "seed": 1, "stop": ["\n"]},
        "metadata": {"requester_metadata": {"draft_model": "d", "num_speculative_tokens": 4,
                                            "tokenizer_version": "tok-1", "deployment": "edge-a"}},
        "cache_hit": None,
        "cache_key": None,
        "completion_tokens": 5,
        "response": {"id": "chatcmpl-miss1", "choices": [
            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "Hello"}}]},
    }  # fmt: skip
    base.update(over)
    return base


def lite(**over) -> dict:
    result = read_litellm(json.dumps(payload(**over), default=str))
    assert len(result.records) == 1 and result.skipped == 0
    return result.records[0]


def test_litellm_miss_mapping():
    rec = lite()
    assert rec["request_id"] == "chatcmpl-miss1"
    assert rec["ts"] == "2026-03-01T10:00:00.123456Z"
    assert rec["latency_ms"] == 123.0
    assert rec["target_model"] == "openai/target-1"  # not `model`
    assert rec["prompt"] == '[{"content":"Hi","role":"user"}]'
    assert (rec["temperature"], rec["top_p"], rec["max_tokens"], rec["seed"], rec["stop"]) == (
        0.7,
        0.9,
        64,
        1,
        ["\n"],
    )
    assert (rec["draft_model"], rec["num_speculative_tokens"], rec["tokenizer_version"], rec["deployment"]) == (
        "d", 4, "tok-1", "edge-a")  # fmt: skip
    assert rec["cache_hit"] is False  # null on a miss means false
    assert (rec["output_text"], rec["finish_reason"], rec["output_tokens"]) == ("Hello", "stop", 5)
    assert "__source_request_id__" not in rec
    assert rec["__unknown__"] == ["cache_key"]  # null on every miss until backfilled
    assert "top_k" not in rec


def test_litellm_hit_with_empty_model_parameters_is_unknown_not_null():
    rec = lite(id="chatcmpl-hit1", cache_hit=True, cache_key="k1", model_parameters={},
               metadata={"requester_metadata": {}})  # fmt: skip
    assert rec["__unknown__"] == sorted(
        ["max_tokens", "seed", "stop", "temperature", "tokenizer_version", "top_k", "top_p"]
    )
    for field in rec["__unknown__"]:
        assert field not in rec
    assert "draft_model" not in rec and "deployment" not in rec and "__unknown__" in rec
    assert rec["cache_key"] == "k1" and rec["cache_hit"] is True


def test_litellm_miss_unknowns_are_only_required_sampling_fields():
    rec = lite(model_parameters={"top_k": 5}, cache_key="k0")
    assert rec["__unknown__"] == ["max_tokens", "temperature"]
    assert rec["top_k"] == 5 and "top_p" not in rec and "seed" not in rec


def test_litellm_max_completion_tokens_fallback():
    rec = lite(model_parameters={"temperature": 0, "max_completion_tokens": 256})
    assert rec["max_tokens"] == 256
    rec = lite(model_parameters={"temperature": 0, "max_tokens": 10, "max_completion_tokens": 256})
    assert rec["max_tokens"] == 10


def test_litellm_source_link_only_when_it_differs():
    rec = lite(id="chatcmpl-hit1", cache_hit=True, cache_key="k1")
    assert rec["__source_request_id__"] == "chatcmpl-miss1"
    assert "__source_request_id__" not in lite(id="chatcmpl-miss1", cache_hit=True, cache_key="k1")
    assert "__source_request_id__" not in lite(id="chatcmpl-other", cache_hit=False)  # misses have none


def test_litellm_response_logged_as_string():
    response = json.dumps(payload()["response"])
    assert lite(response=response)["output_text"] == "Hello"
    rec = lite(response="ModelResponse(id='x', choices=[...])")  # str() of an object: unreadable
    assert "output_text" not in rec and "finish_reason" not in rec


def test_litellm_messages_string_and_start_time_forms():
    assert lite(messages="plain prompt")["prompt"] == "plain prompt"
    assert lite(startTime="2026-03-01 10:00:00.123456")["ts"] == "2026-03-01T10:00:00.123456Z"
    assert lite(startTime="2026-03-01 12:00:00.5+02:00")["ts"] == "2026-03-01T10:00:00.500000Z"
    assert lite(startTime="1772359200.123456")["ts"] == "2026-03-01T10:00:00.123456Z"
    assert lite(startTime=1772359200.999999)["ts"] == "2026-03-01T10:00:00.999999Z"


def test_backfill_cache_keys():
    miss = lite(id="m1")
    other = lite(id="m2")
    hit = lite(id="h1", cache_hit=True, cache_key="k1", response={"id": "m1", "choices": []})
    records = [miss, hit, other]
    backfill_cache_keys(records)
    assert miss["cache_key"] == "k1" and "__unknown__" not in miss
    assert "cache_key" not in other and other["__unknown__"] == ["cache_key"]
    assert hit["cache_key"] == "k1"


@pytest.mark.parametrize("line", ["42", '"text"', "null", "[]"])
def test_litellm_line_that_is_not_an_object_raises(line):
    with pytest.raises(FormatError, match="not a LiteLLM StandardLoggingPayload"):
        read_litellm(line)


def test_litellm_non_generation_call_is_skipped():
    result = read_litellm(json.dumps(payload(call_type="aembedding")))
    assert result == LineResult(records=(), skipped=1)


# --- --map --------------------------------------------------------------------------------------


def write(tmp_path, text: str, name: str = "custom_map.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


MAP = """
request_id = "id"
ts = { path = "start", unit = "s" }
temperature = "params.temperature"
output_text = "response.choices.0.message.content"
deployment = { value = "edge-a" }
stop = { value = ["END"] }
"""


def test_mapping_paths_list_index_and_constant(tmp_path):
    reader = line_reader("map", load_mapping(write(tmp_path, MAP)))
    obj = {"id": "r1", "start": 1772359200.5, "params": {"temperature": 0.2},
           "response": {"choices": [{"message": {"content": "hi"}}, {"message": {"content": "no"}}]}}  # fmt: skip
    (rec,) = reader(json.dumps(obj)).records
    assert rec == {"request_id": "r1", "ts": "2026-03-01T10:00:00.500000Z", "temperature": 0.2,
                   "output_text": "hi", "deployment": "edge-a", "stop": ["END"]}  # fmt: skip
    rec["stop"].append("mutated")
    (again,) = reader(json.dumps({"id": "r2"})).records
    assert again == {"request_id": "r2", "deployment": "edge-a", "stop": ["END"]}  # missing paths: absent


@pytest.mark.parametrize(
    ("unit", "value", "expected"),
    [
        ("s", 1772359200, "2026-03-01T10:00:00.000000Z"),
        ("ms", 1772359200123, "2026-03-01T10:00:00.123000Z"),
        ("us", "1772359200123456", "2026-03-01T10:00:00.123456Z"),
        ("ns", 1772359200123456789, "2026-03-01T10:00:00.123456Z"),
        ("rfc3339", "2026-03-01T10:00:00+01:00", "2026-03-01T10:00:00+01:00"),
        ("s", "not a time", "not a time"),  # passed on for validation to quarantine
    ],
)
def test_mapping_time_units(tmp_path, unit, value, expected):
    mapping = load_mapping(write(tmp_path, f'ts = {{ path = "t", unit = "{unit}" }}'))
    assert mapping.read_line(json.dumps({"t": value})).records[0]["ts"] == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            'ts = { path = "t", unit = "hours" }',
            "field 'ts': unit 'hours' is not one of s, ms, us, ns, rfc3339",
        ),
        ('colour = "c"', "'colour' is not a contract field"),
        ('seed = { path = "s", value = 1 }', "field 'seed': give either path or value, not both"),
        ('temperature = { path = "t", unit = "s" }', "field 'temperature': unit applies only to ts"),
        ('request_id = ""', "field 'request_id': empty path"),
        ('request_id = "a..b"', "field 'request_id': path 'a..b' has an empty segment"),
        ('top_k = { path = "k", units = "s" }', "field 'top_k': unknown key 'units'"),
        ("max_tokens = 5", "field 'max_tokens': give a path"),
        ('ts = "t"\nrequest_id = [oops', "custom_map.toml: not valid TOML"),
    ],
)
def test_bad_mapping_is_one_line_naming_file_and_field(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(MappingError) as info:
        load_mapping(path)
    message = str(info.value)
    assert message.startswith(f"{path}: ")
    assert fragment in message
    assert "\n" not in message


def test_mapping_line_that_is_not_an_object_raises(tmp_path):
    reader = line_reader("map", load_mapping(write(tmp_path, 'request_id = "id"')))
    with pytest.raises(FormatError, match="not a JSON object"):
        reader("[1]")


# --- detect / line_reader -----------------------------------------------------------------------


def test_detect_each_shape():
    assert detect(otlp(span(CHAT))) == "otel"
    assert detect(json.dumps(payload())) == "litellm"
    assert (
        detect(json.dumps({"request_id": "r", "ts": 1, "model_parameters": {}, "call_type": "x"}))
        == "contract"
    )
    assert detect('{"request_id": "r"}') == "contract"
    assert detect("not json") == "contract"
    assert detect("[1, 2]") == "contract"


def test_line_reader_rejects_contract_and_unknown_formats(tmp_path):
    assert FORMATS == ("contract", "otel", "openinference", "litellm", "langfuse")
    for bad in ("contract", "csv"):
        with pytest.raises(ValueError):
            line_reader(bad)
    with pytest.raises(ValueError):
        line_reader("map")
    with pytest.raises(ValueError):
        line_reader("otel", load_mapping(write(tmp_path, 'request_id = "id"')))


def test_an_any_value_whose_unused_kinds_are_null_reads_as_its_one_kind():
    from specdec_core.formats.otel import decode_any_value

    assert decode_any_value({"stringValue": None, "doubleValue": 0.0, "intValue": None}) == 0.0
    assert decode_any_value({"stringValue": None, "intValue": "64"}) == 64
