"""The span writer (spans.py) and the OTel reader (formats/otel.py) share the contract's one attribute table:
every field written as an attribute is read back as itself, a field added to the contract included."""

from __future__ import annotations

import contextlib

from helpers import rec

from specdec_core.contract import fields
from specdec_core.contract.span_attributes import SPAN_ATTRIBUTES, SPAN_TIMED_FIELDS
from specdec_core.formats.otel import span_record
from specdec_core.spans import span_attributes


def any_value(v: object) -> dict:
    """A value as OTLP JSON's AnyValue, as a collector's file exporter writes it."""
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, list):
        return {"arrayValue": {"values": [any_value(x) for x in v]}}
    return {"stringValue": v}


def round_trip(record: dict, contract: str = "as shipped") -> dict:
    """One span whose attributes are what spans.py writes for `record`, read back by otel.py."""
    extended = fields.extended(fields.Field("lora_adapter", "str", identity=True))
    with extended if contract == "extended" else contextlib.nullcontext():
        attrs = [{"key": k, "value": any_value(v)} for k, v in span_attributes(record).items()]
        span = {"spanId": "00f067aa0ba902b7", "startTimeUnixNano": "1772359200000000000",
                "endTimeUnixNano": "1772359200120000000", "attributes": attrs}
        return {"attributes": sorted(a["key"] for a in attrs), "read": span_record(span, {})}


def test_every_contract_field_but_the_span_times_has_one_attribute() -> None:
    assert set(SPAN_ATTRIBUTES) == {f.name for f in fields.FIELDS} - SPAN_TIMED_FIELDS
    assert len(set(SPAN_ATTRIBUTES.values())) == len(SPAN_ATTRIBUTES)
    assert SPAN_ATTRIBUTES["max_tokens"] == "gen_ai.request.max_tokens"
    assert SPAN_ATTRIBUTES["cache_key"] == "specdec.cache_key"


def test_what_the_writer_writes_the_reader_reads_back_as_the_same_record() -> None:
    record = rec("r-7", stop=["\n", "END"], seed=3, top_k=40, top_p=0.9, temperature=0.7, cache_hit=True,
                 cached_fingerprint={"prompt": "Summarise the incident.", "max_tokens": 64},
                 ts="2026-03-01T10:00:00Z", latency_ms=120.0, prompt_hash="a" * 64, consumer="acme",
                 experiment="arm-a")
    out = round_trip(record)
    assert set(out["attributes"]) == {"gen_ai.operation.name"} | set(SPAN_ATTRIBUTES.values())
    assert out["read"] == {**{k: v for k, v in record.items() if v is not None}, "ts": "2026-03-01T10:00:00.000000Z"}


def test_a_field_added_to_the_contract_travels_through_a_span() -> None:
    out = round_trip(rec("r-8", lora_adapter="support-v2"), contract="extended")
    assert "specdec.lora_adapter" in out["attributes"]
    assert out["read"]["lora_adapter"] == "support-v2"


def test_a_stop_string_is_written_as_a_list_of_one() -> None:
    """A string is a list of one (log-schema.md): its span holds ["END"], not the string's characters."""
    assert span_attributes(rec("r-9", stop="END"))["gen_ai.request.stop_sequences"] == ["END"]
    assert round_trip(rec("r-9", stop="END", temperature=0.7))["read"]["stop"] == ["END"]
