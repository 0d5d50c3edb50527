"""``--format openinference``: OpenInference spans (Arize Phoenix), as OTLP JSON or Phoenix's span export.

OTLP JSON is read as ``--format otel`` reads it (snake_case field names accepted too); Phoenix's export
(``GET /v1/projects/{id}/spans``: ``{"data": [span, ...]}``) carries flat dotted ``attributes`` and RFC 3339
times. A span is a request when its ``openinference.span.kind`` is ``LLM``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from specdec_core.text import ascii_digits

from . import otel
from .common import (
    CONTRACT_FIELDS,
    UNKNOWN_KEY,
    FormatError,
    LineResult,
    canonical_json,
    datetime_text_to_rfc3339,
    epoch_to_rfc3339,
    load_object,
    parse_json_text,
    to_decimal,
)

WHAT = "OpenInference spans (OTLP JSON or Phoenix's span export)"
KIND = "openinference.span.kind"
REDACTED = "__REDACTED__"
# Fields no OpenInference attribute carries: without a specdec. attribute, unknown (not null).
UNKNOWN_WITHOUT_SPECDEC = ("top_k", "num_speculative_tokens")
# Required by the contract, but instrumentations log only what the caller passed: absent is unknown.
UNKNOWN_WHEN_ABSENT = ("temperature", "max_tokens", "tokenizer_version")
_SAMPLING = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")
# Contract fields read from specdec.<field> after the OpenInference attributes (the four above: before).
_SPECDEC_FIELDS = tuple(f for f in CONTRACT_FIELDS if f not in ("request_id", "prompt", "output_text", "deployment"))
_SNAKE = re.compile(r"_([a-z])")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

SpanReader = Callable[[dict, dict[str, Any]], "dict | None"]


def camel_keys(value: Any) -> Any:
    """OTLP JSON with protobuf's own field names (``resource_spans``, ``string_value``) as the Collector spells
    them; every key of OTLP JSON is a field name (attribute names are values of ``key``), so all are renamed."""
    if isinstance(value, dict):
        return {_SNAKE.sub(lambda m: m.group(1).upper(), k) if "_" in k else k: camel_keys(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [camel_keys(v) for v in value]
    return value


def flatten(attributes: Any, prefix: str = "") -> dict[str, Any]:
    """Attributes as flat dotted keys: Phoenix's export writes them flat, older versions nested (lists too)."""
    out: dict[str, Any] = {}
    items = (attributes.items() if isinstance(attributes, dict)
             else enumerate(attributes) if isinstance(attributes, list) and prefix else ())
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, dict) or (isinstance(value, list) and value and isinstance(value[0], dict)):
            out.update(flatten(value, name + "."))
        elif value is not None:
            out[name] = value
    return out


def is_request(attrs: dict[str, Any]) -> bool:
    kind = attrs.get(KIND)
    return isinstance(kind, str) and kind.upper() == "LLM"


def _indexed(attrs: dict[str, Any], prefix: str) -> list[int]:
    """The indices i of keys ``prefix.<i>...``, in order."""
    found: set[int] = set()
    start = len(prefix) + 1
    for key in attrs:
        if key.startswith(prefix + "."):
            index = key[start:].split(".", 1)[0]
            if ascii_digits(index):
                found.add(int(index))
    return sorted(found)


def _message_content(attrs: dict[str, Any], at: str) -> Any:
    if f"{at}.message.content" in attrs:
        return attrs[f"{at}.message.content"]
    parts = _indexed(attrs, f"{at}.message.contents")
    texts = [attrs[f"{at}.message.contents.{j}.message_content.text"] for j in parts
             if isinstance(attrs.get(f"{at}.message.contents.{j}.message_content.text"), str)]
    return "".join(texts) if texts else None


def _prompt(attrs: dict[str, Any]) -> Any:
    if "specdec.prompt" in attrs:
        return attrs["specdec.prompt"]
    indices = _indexed(attrs, "llm.input_messages")
    if indices:
        return canonical_json([{"role": attrs.get(f"llm.input_messages.{i}.message.role"),
                                "content": _message_content(attrs, f"llm.input_messages.{i}")} for i in indices])
    prompts = _indexed(attrs, "llm.prompts")
    if prompts:
        texts = [attrs.get(f"llm.prompts.{i}.prompt.text", attrs.get(f"llm.prompts.{i}")) for i in prompts]
        return "".join(t for t in texts if isinstance(t, str))
    value = attrs.get("input.value")
    if not isinstance(value, str) or value == REDACTED:
        return otel._MISSING  # hidden by the instrumentation: the record needs specdec.prompt_hash
    mime = attrs.get("input.mime_type")
    if isinstance(mime, str) and "json" in mime.lower():
        parsed, body = parse_json_text(value)
        if parsed and isinstance(body, dict) and "messages" in body:
            return canonical_json(body["messages"])
        return canonical_json(body) if parsed else value
    return value


def _output_text(attrs: dict[str, Any]) -> Any:
    if "specdec.output_text" in attrs:
        return attrs["specdec.output_text"]
    if _indexed(attrs, "llm.output_messages"):
        content = _message_content(attrs, "llm.output_messages.0")
        if content is not None:
            return content
    mime = attrs.get("output.mime_type")
    if "output.value" in attrs and not (isinstance(mime, str) and mime.lower() == "application/json"):
        return attrs["output.value"]
    return otel._MISSING


def _invocation_parameters(attrs: dict[str, Any]) -> dict[str, Any]:
    raw = attrs.get("llm.invocation_parameters")
    if isinstance(raw, str):
        _, raw = parse_json_text(raw)
    if isinstance(raw, dict):
        return raw
    prefix = "llm.invocation_parameters."
    return {k[len(prefix):]: v for k, v in attrs.items() if k.startswith(prefix)}  # flattened by the exporter


def _instant_ns(value: Any) -> Decimal | None:
    """Epoch nanoseconds of a span's time: a number (OTLP), or RFC 3339 text (Phoenix)."""
    number = to_decimal(value)
    if number is not None or not isinstance(value, str):
        return number
    text = datetime_text_to_rfc3339(value)
    if text is None:
        return None
    moment = datetime.fromisoformat(text[:-1] + "+00:00")
    return Decimal((moment - _EPOCH) // timedelta(microseconds=1)) * 1000


def _ts_and_latency(start: Any, end: Any) -> dict[str, Any]:
    """The start as RFC 3339 (unreadable: as it came, for validation to name) and the latency where both read."""
    out: dict[str, Any] = {}
    start_ns, end_ns = _instant_ns(start), _instant_ns(end)
    if start is not None:
        out["ts"] = (epoch_to_rfc3339(int(start_ns), "ns") if start_ns is not None else None) or start
    if start_ns is not None and end_ns is not None:
        out["latency_ms"] = float((end_ns - start_ns) / 1_000_000)
    return out


def span_record(attrs: dict[str, Any], span_id: Any, start: Any, end: Any,
                resource_attrs: dict[str, Any]) -> dict | None:
    """The contract record of one OpenInference span's flat attributes; None when it is no LLM span."""
    if not is_request(attrs):
        return None
    record: dict[str, Any] = {}
    unknown: set[str] = set()
    if "specdec.request_id" in attrs:
        record["request_id"] = attrs["specdec.request_id"]
    elif isinstance(span_id, str):
        record["request_id"] = otel.span_id_hex(span_id)
    record.update(_ts_and_latency(start, end))
    params = _invocation_parameters(attrs)
    if params.get("max_tokens") is None and "max_completion_tokens" in params:
        params = {**params, "max_tokens": params["max_completion_tokens"]}
    model = params.get("model", attrs.get("llm.model_name"))
    if model is not None:
        record["target_model"] = model
    for field in _SAMPLING:
        if field in params:
            record[field] = params[field]
    for field, value in (("prompt", _prompt(attrs)), ("output_text", _output_text(attrs))):
        if value is not otel._MISSING:
            record[field] = value
    if "llm.token_count.completion" in attrs:
        record["output_tokens"] = attrs["llm.token_count.completion"]
    if "llm.finish_reason" in attrs:
        record["finish_reason"] = attrs["llm.finish_reason"]
    consumer = attrs.get("specdec.consumer", attrs.get("user.id", otel._MISSING))
    if consumer is not otel._MISSING:
        record["consumer"] = consumer
    deployment = attrs.get("specdec.deployment", resource_attrs.get("service.name", otel._MISSING))
    if deployment is not otel._MISSING:
        record["deployment"] = deployment
    for field in _SPECDEC_FIELDS:  # specdec.<field> wins over what the instrumentation logged
        if f"specdec.{field}" in attrs:
            record[field] = attrs[f"specdec.{field}"]
    if "cached_fingerprint" in record:
        record["cached_fingerprint"] = parse_json_text(record["cached_fingerprint"])[1]
    unknown.update(f for f in UNKNOWN_WITHOUT_SPECDEC + UNKNOWN_WHEN_ABSENT if f not in record)
    if unknown:
        record[UNKNOWN_KEY] = sorted(unknown)
    return record


def otlp_span_record(span: dict, resource_attrs: dict[str, Any]) -> dict | None:
    attrs = otel._attributes(span.get("attributes"))
    return span_record(attrs, span.get("spanId"), span.get("startTimeUnixNano"), span.get("endTimeUnixNano"),
                       resource_attrs)


def otlp_any_span_record(span: dict, resource_attrs: dict[str, Any]) -> dict | None:
    """An OpenInference span by its own rules, any other span as ``--format otel`` reads it (the collector's)."""
    if any(isinstance(a, dict) and a.get("key") == KIND for a in span.get("attributes") or ()):
        return otlp_span_record(span, resource_attrs)
    return otel.span_record(span, resource_attrs)


def read_otlp(request: dict, span_reader: SpanReader) -> LineResult:
    """An ExportTraceServiceRequest's spans through `span_reader`: records, their inputs, and the rest skipped."""
    records: list[dict] = []
    origins: list[dict] = []
    skipped = 0
    for resource, resource_attrs, span in _otlp_spans(request):
        record = span_reader(span, resource_attrs)
        if record is None:
            skipped += 1
        else:
            records.append(record)
            origins.append({"resource": resource, "span": span})
    return LineResult(records=tuple(records), skipped=skipped, origin_values=tuple(origins))


def _otlp_spans(request: dict) -> Iterator[tuple[dict, dict[str, Any], dict]]:
    if not isinstance(request.get("resourceSpans"), list):
        raise FormatError(f"not {WHAT}: no resourceSpans list")
    for i, resource_spans in enumerate(request["resourceSpans"]):
        where = f"resourceSpans[{i}]"
        resource_spans = otel._object(resource_spans, where)
        resource = resource_spans.get("resource") or {}
        resource_attrs = otel._attributes(otel._object(resource, where + ".resource").get("attributes"))
        for j, scope in enumerate(otel._list(resource_spans, "scopeSpans", "instrumentationLibrarySpans",
                                             where=where)):
            scope = otel._object(scope, f"{where}.scopeSpans[{j}]")
            for k, span in enumerate(otel._list(scope, "spans", where=f"{where}.scopeSpans[{j}]")):
                yield resource, resource_attrs, otel._object(span, f"{where}.scopeSpans[{j}].spans[{k}]")


def phoenix_span_record(span: dict) -> dict | None:
    """One span of Phoenix's export: flat attributes, the kind also as ``span_kind``, RFC 3339 times."""
    attrs = flatten(span.get("attributes") or {})
    if KIND not in attrs and isinstance(span.get("span_kind"), str):
        attrs[KIND] = span["span_kind"]
    context = span.get("context") if isinstance(span.get("context"), dict) else {}
    span_id = context.get("span_id", span.get("span_id", span.get("spanId")))
    start = span.get("start_time", span.get("startTime"))
    end = span.get("end_time", span.get("endTime"))
    return span_record(attrs, span_id, start, end, {})


def _phoenix(spans: list) -> LineResult:
    records: list[dict] = []
    origins: list[Any] = []
    skipped = 0
    for n, span in enumerate(spans):
        if not isinstance(span, dict):
            raise FormatError(f"not {WHAT}: data[{n}] is not an object")
        record = phoenix_span_record(span)
        if record is None:
            skipped += 1
        else:
            records.append(record)
            origins.append(span)
    return LineResult(records=tuple(records), skipped=skipped, origin_values=tuple(origins))


def read_line(line: str) -> LineResult:
    obj = load_object(line, WHAT)
    if "resourceSpans" in obj or "resource_spans" in obj:
        return read_otlp(camel_keys(obj) if "resource_spans" in obj else obj, otlp_span_record)
    if isinstance(obj.get("data"), list):
        return _phoenix(obj["data"])
    if "attributes" in obj and ("span_id" in obj or "context" in obj):
        return _phoenix([obj])  # one span of the export per line
    raise FormatError(f"not {WHAT}: neither resourceSpans nor a Phoenix span export's data list")


def read_any_otlp_line(line: str) -> LineResult:
    """OTLP JSON holding GenAI and OpenInference spans alike: what ``specdec collect`` spools."""
    obj = load_object(line, otel.WHAT)
    return read_otlp(obj, otlp_any_span_record)
