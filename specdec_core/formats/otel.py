"""``--format otel``: OpenTelemetry GenAI spans, one OTLP JSON ExportTraceServiceRequest per line."""

from __future__ import annotations

import base64
import binascii
import re
from decimal import Decimal
from typing import Any

from specdec_core.contract import fields as contract
from specdec_core.contract.span_attributes import span_attribute_table
from specdec_core.text import ascii_digits

from .common import (
    FormatError,
    LineResult,
    canonical_json,
    epoch_to_rfc3339,
    load_object,
    number_text,
    parse_json_text,
    to_decimal,
)

WHAT = "an OTLP ExportTraceServiceRequest"
REQUEST_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})

# Fields span_record derives from more than their own attribute (a fallback, a list, JSON text).
_DERIVED = frozenset({"request_id", "prompt", "output_text", "finish_reason", "deployment", "cached_fingerprint"})


@contract.derived
def _direct(_contract: contract.Contract) -> tuple[tuple[str, str], ...]:
    """record field <- span attribute, taken as decoded: the rest of the contract's attribute table."""
    return tuple((field, attribute) for field, attribute in span_attribute_table().items() if field not in _DERIVED)


_MISSING = object()  # an attribute that is absent, or whose AnyValue is empty


def decode_any_value(value: Any) -> Any:
    """An OTLP JSON AnyValue as a plain Python value; ``_MISSING`` when it holds nothing.

    A writer that unifies record types (a DataFrame, a SQL engine) may spell the unused kinds as null: a
    kind whose value is null is absent (read with get, not by copying each value without its nulls)."""
    if not isinstance(value, dict):
        return _MISSING
    if (raw := value.get("stringValue")) is not None:
        return raw
    if (raw := value.get("boolValue")) is not None:
        return raw
    if (raw := value.get("intValue")) is not None:
        # proto3 JSON writes int64 as a string; text that is not an integer goes on to validation as is.
        return int(raw) if isinstance(raw, str) and number_text(raw, integer=True) else raw
    if (raw := value.get("doubleValue")) is not None:
        if isinstance(raw, str):
            # "NaN"/"Infinity" are legal proto3 JSON but not contract numbers: leave them for validation.
            number = to_decimal(raw)
            return float(number) if number is not None else raw
        return raw
    if (array := value.get("arrayValue")) is not None:
        array = array or {}  # an empty array is written as {}
        items = array.get("values") or [] if isinstance(array, dict) else None
        if not isinstance(items, list):
            return value  # not an array ("x"): passed on as it came, for validation to name
        return [None if (item := decode_any_value(v)) is _MISSING else item for v in items]
    if (kvlist := value.get("kvlistValue")) is not None:
        kvlist = kvlist or {}
        return _attributes(kvlist.get("values") if isinstance(kvlist, dict) else None)
    if value.get("bytesValue") is not None:
        # The contract has no bytes type: its base64 text is no model name or prompt. Passed on as it came.
        return value
    return _MISSING


def _attributes(items: Any) -> dict[str, Any]:
    """OTLP ``KeyValue`` list -> dict; keys whose value is empty are left out (absent)."""
    out: dict[str, Any] = {}
    for item in items if isinstance(items, list) else []:
        if isinstance(item, dict) and isinstance(item.get("key"), str):
            decoded = decode_any_value(item.get("value"))
            if decoded is not _MISSING:
                out[item["key"]] = decoded
    return out


def is_request(attrs: dict[str, Any]) -> bool:
    return attrs.get("gen_ai.operation.name") in REQUEST_OPERATIONS or "specdec.cache_key" in attrs


# The older GenAI names (and OpenLLMetry's), read where the current name is absent: record field -> attribute.
_OLDER_NAMES: tuple[tuple[str, str], ...] = (
    ("output_tokens", "gen_ai.usage.completion_tokens"),
    ("seed", "gen_ai.openai.request.seed"),
    ("top_k", "llm.top_k"),
    ("stop", "llm.chat.stop_sequences"),
)
_MESSAGE_EVENTS = {"gen_ai.system.message": "system", "gen_ai.user.message": "user",
                   "gen_ai.assistant.message": "assistant", "gen_ai.tool.message": "tool"}


def is_older_request(attrs: dict[str, Any], span: dict) -> bool:
    """A span of an older instrumentation: a system named, no operation, a model and an output."""
    return ("gen_ai.system" in attrs and "gen_ai.operation.name" not in attrs
            and "gen_ai.request.model" in attrs
            and _older_output(attrs, span) is not _MISSING)


def _event_bodies(span: dict) -> list[tuple[str, dict[str, Any]]]:
    """(name, body) of each span event in order; the body is the event's attributes, a JSON ``body`` or
    ``message`` attribute unpacked (instrumentations put a log event's body there when they make it a span event)."""
    out = []
    for event in span.get("events") or ():
        if not isinstance(event, dict) or not isinstance(event.get("name"), str):
            continue
        attrs = _attributes(event.get("attributes"))
        for key in ("body", "gen_ai.event.content"):
            _, body = parse_json_text(attrs.pop(key, None))
            if isinstance(body, dict):
                attrs = {**attrs, **body}
        out.append((event["name"], attrs))
    return out


def _older_prompt(attrs: dict[str, Any], span: dict) -> Any:
    indices = sorted({int(k.split(".")[2]) for k in attrs
                      if k.startswith("gen_ai.prompt.") and k.count(".") >= 3 and ascii_digits(k.split(".")[2])})
    if indices:
        return canonical_json([{"role": attrs.get(f"gen_ai.prompt.{i}.role"),
                                "content": attrs.get(f"gen_ai.prompt.{i}.content")} for i in indices])
    messages = [{"role": body.get("role", _MESSAGE_EVENTS[name]), "content": body.get("content")}
                for name, body in _event_bodies(span) if name in _MESSAGE_EVENTS]
    return canonical_json(messages) if messages else _MISSING


def _older_output(attrs: dict[str, Any], span: dict) -> Any:
    if "gen_ai.completion.0.content" in attrs:
        return attrs["gen_ai.completion.0.content"]
    for name, body in _event_bodies(span):
        if name == "gen_ai.choice":
            message = body.get("message")
            _, message = parse_json_text(message)
            if isinstance(message, dict) and "content" in message:
                return message["content"]
            if "message.content" in body:
                return body["message.content"]
    return _MISSING


def older_fields(attrs: dict[str, Any], span: dict, record: dict[str, Any]) -> None:
    """Fill, in place, the fields `record` lacks from the older GenAI names."""
    for field, key in _OLDER_NAMES:
        if field not in record and key in attrs:
            record[field] = attrs[key]
    for field, read in (("prompt", _older_prompt), ("output_text", _older_output)):
        if field not in record and (value := read(attrs, span)) is not _MISSING:
            record[field] = value


def _prompt(attrs: dict[str, Any]) -> Any:
    if "specdec.prompt" in attrs:
        return attrs["specdec.prompt"]
    if "gen_ai.input.messages" not in attrs:
        return _MISSING  # system instructions alone are not a prompt we can compare
    is_json, messages = parse_json_text(attrs["gen_ai.input.messages"])
    if "gen_ai.system_instructions" in attrs:
        _, system = parse_json_text(attrs["gen_ai.system_instructions"])
        return canonical_json({"messages": messages, "system_instructions": system})
    if is_json or not isinstance(messages, str):
        return canonical_json(messages)
    return messages  # text that is not JSON is the prompt as it is


def _output_text(attrs: dict[str, Any]) -> Any:
    if "specdec.output_text" in attrs:
        return attrs["specdec.output_text"]
    _, messages = parse_json_text(attrs.get("gen_ai.output.messages"))
    if not isinstance(messages, list) or not messages or not isinstance(messages[0], dict):
        return _MISSING
    parts = messages[0].get("parts")
    if not isinstance(parts, list):
        return _MISSING
    return "".join(
        part["content"]
        for part in parts
        if isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("content"), str)
    )


def _finish_reason(attrs: dict[str, Any]) -> Any:
    reasons = attrs.get("gen_ai.response.finish_reasons", _MISSING)
    if isinstance(reasons, list):
        return reasons[0] if reasons else _MISSING
    return reasons  # a bare string (or odd type) is passed on; validation judges it


def _nanos(value: Any) -> int | None:
    number = to_decimal(value)  # bounded: int() of '1e9999999' would build ten million digits
    return int(number) if number is not None and number == number.to_integral_value() else None


_BASE64_SPAN_ID = re.compile(r"[A-Za-z0-9+/]{11}=")


def span_id_hex(span_id: str) -> str:
    """A span id as lowercase hex. The Collector writes hex (either case); protobuf's own JSON mapping of the
    same message (json_format.MessageToJson / MessageToDict over encode_spans) writes its 8 bytes as base64,
    12 characters ending in '=', which hex (16) can never be: lowercasing those would change the id."""
    if _BASE64_SPAN_ID.fullmatch(span_id):
        try:
            return base64.b64decode(span_id, validate=True).hex()
        except (binascii.Error, ValueError):
            pass
    return span_id.lower()


def span_record(span: dict, resource_attrs: dict[str, Any]) -> dict | None:
    """The contract record of one span, or None when the span is not a model request."""
    attrs = _attributes(span.get("attributes"))
    if not (is_request(attrs) or is_older_request(attrs, span)):
        return None
    record: dict[str, Any] = {}
    if "specdec.request_id" in attrs:
        record["request_id"] = attrs["specdec.request_id"]
    elif isinstance(span.get("spanId"), str):
        record["request_id"] = span_id_hex(span["spanId"])
    start, end = span.get("startTimeUnixNano"), span.get("endTimeUnixNano")
    start_ns, end_ns = _nanos(start), _nanos(end)
    if start is not None:
        # Truncated to microseconds (DuckDB TIMESTAMPTZ keeps no more); unreadable text goes on as is.
        record["ts"] = (epoch_to_rfc3339(start_ns, "ns") if start_ns is not None else None) or start
    if start_ns is not None and end_ns is not None:
        record["latency_ms"] = float(Decimal(end_ns - start_ns) / 1_000_000)  # inf, not an error, past a double
    for field, key in _direct():
        if key in attrs:
            record[field] = attrs[key]
    derived = {
        "prompt": _prompt(attrs),
        "output_text": _output_text(attrs),
        "finish_reason": _finish_reason(attrs),
        "deployment": attrs.get("specdec.deployment", resource_attrs.get("service.name", _MISSING)),
    }
    record.update((field, value) for field, value in derived.items() if value is not _MISSING)
    consumer = attrs.get("specdec.consumer", attrs.get("user.id", attrs.get("enduser.id", _MISSING)))
    if consumer is not _MISSING:
        record["consumer"] = consumer
    if "specdec.cached_fingerprint" in attrs:
        # Text that is not JSON is passed on, so validation quarantines it rather than us hiding it.
        record["cached_fingerprint"] = parse_json_text(attrs["specdec.cached_fingerprint"])[1]
    older_fields(attrs, span, record)
    return record


def _list(container: dict, *keys: str, where: str) -> list:
    for key in keys:
        if key in container and container[key] is not None:
            if not isinstance(container[key], list):
                raise FormatError(f"not {WHAT}: {where}.{key} is not a list")
            return container[key]
    return []  # OTLP JSON leaves empty repeated fields out


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise FormatError(f"not {WHAT}: {where} is not an object")
    return value


def read_line(line: str) -> LineResult:
    request = load_object(line, WHAT)
    if not isinstance(request.get("resourceSpans"), list):
        raise FormatError(f"not {WHAT}: no resourceSpans list")
    records: list[dict] = []
    origins: list[dict] = []
    skipped = 0
    for i, resource_spans in enumerate(request["resourceSpans"]):
        where = f"resourceSpans[{i}]"
        resource_spans = _object(resource_spans, where)
        resource = resource_spans.get("resource") or {}
        resource_attrs = _attributes(_object(resource, where + ".resource").get("attributes"))
        # instrumentationLibrarySpans is the pre-1.0 OTLP name of scopeSpans.
        for j, scope in enumerate(
            _list(resource_spans, "scopeSpans", "instrumentationLibrarySpans", where=where)
        ):
            scope = _object(scope, f"{where}.scopeSpans[{j}]")
            for k, span in enumerate(_list(scope, "spans", where=f"{where}.scopeSpans[{j}]")):
                record = span_record(_object(span, f"{where}.scopeSpans[{j}].spans[{k}]"), resource_attrs)
                if record is None:
                    skipped += 1
                else:
                    records.append(record)
                    origins.append({"resource": resource, "span": span})
    return LineResult(records=tuple(records), skipped=skipped, origin_values=tuple(origins))
