"""An OTLP export's body as one OTLP JSON line, as the Collector's file exporter writes it (hex ids, camelCase):
what `specdec collect` spools. Protobuf bodies are parsed by the OpenTelemetry proto package's message."""

from __future__ import annotations

import base64
import json
import math
import zlib
from typing import Any

from specdec_core.extras import require
from specdec_core.formats.openinference import camel_keys


class BadExport(ValueError):
    """An export that can't be read: answered 400 (gRPC INVALID_ARGUMENT), nothing spooled."""


def trace_service() -> Any:
    return require("collect", "opentelemetry.proto.collector.trace.v1.trace_service_pb2")


def _any_value(value: Any) -> dict:
    """An AnyValue message as OTLP JSON (int64 as text, bytes as base64, NaN and infinities as text)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return {"stringValue": value.string_value}
    if kind == "int_value":
        return {"intValue": str(value.int_value)}
    if kind == "double_value":
        number = value.double_value
        return {"doubleValue": number if math.isfinite(number) else
                ("NaN" if number != number else "Infinity" if number > 0 else "-Infinity")}
    if kind == "bool_value":
        return {"boolValue": value.bool_value}
    if kind == "array_value":
        return {"arrayValue": {"values": [_any_value(v) for v in value.array_value.values]}}
    if kind == "kvlist_value":
        return {"kvlistValue": {"values": _key_values(value.kvlist_value.values)}}
    if kind == "bytes_value":
        return {"bytesValue": base64.b64encode(value.bytes_value).decode()}
    return {}


def _key_values(items: Any) -> list[dict]:
    return [{"key": kv.key, "value": _any_value(kv.value)} for kv in items]


def _span(span: Any) -> dict:
    out: dict[str, Any] = {"traceId": span.trace_id.hex(), "spanId": span.span_id.hex(), "name": span.name,
                           "kind": span.kind, "startTimeUnixNano": str(span.start_time_unix_nano),
                           "endTimeUnixNano": str(span.end_time_unix_nano),
                           "attributes": _key_values(span.attributes)}
    if span.parent_span_id:
        out["parentSpanId"] = span.parent_span_id.hex()
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.events:
        out["events"] = [{"timeUnixNano": str(e.time_unix_nano), "name": e.name,
                          "attributes": _key_values(e.attributes)} for e in span.events]
    if span.links:
        out["links"] = [{"traceId": link.trace_id.hex(), "spanId": link.span_id.hex(),
                         "attributes": _key_values(link.attributes)} for link in span.links]
    if span.HasField("status"):
        out["status"] = {"code": span.status.code, "message": span.status.message}
    return out


def message_line(message: Any) -> tuple[bytes, int]:
    """An ExportTraceServiceRequest message as one OTLP JSON line, as the Collector's file exporter writes it
    (hex ids, camelCase), and how many spans it holds. Walked field by field: protobuf's generic JSON mapping
    took five times as long, the most of what an export costs here."""
    spans = 0
    resource_spans = []
    for rs in message.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans += len(ss.spans)
            scopes.append({"scope": {"name": ss.scope.name, "version": ss.scope.version,
                                     "attributes": _key_values(ss.scope.attributes)},
                           "spans": [_span(span) for span in ss.spans]})
        resource_spans.append({"resource": {"attributes": _key_values(rs.resource.attributes)},
                               "scopeSpans": scopes})
    if not spans:
        return b"", 0
    return json.dumps({"resourceSpans": resource_spans}, ensure_ascii=False, separators=(",", ":")).encode() + b"\n", \
        spans


def protobuf_line(body: bytes) -> tuple[bytes, int]:
    message = trace_service().ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError, whatever the backend names it
        raise BadExport(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    return message_line(message)


def json_line(body: bytes) -> tuple[bytes, int]:
    """OTLP/HTTP JSON: hex ids and camelCase, as it came (its spans read by the otel and OpenInference readers)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        raise BadExport("not JSON") from None
    if isinstance(request, dict) and "resource_spans" in request:
        request = camel_keys(request)  # protobuf's JSON parsers take its field names as written in the .proto too
    if not isinstance(request, dict) or not isinstance(request.get("resourceSpans", []), list):
        raise BadExport("not an OTLP ExportTraceServiceRequest: no resourceSpans list")
    spans = 0
    for rs in request.get("resourceSpans") or ():
        for scope in (rs.get("scopeSpans") or ()) if isinstance(rs, dict) else ():
            spans += len(scope.get("spans") or ()) if isinstance(scope, dict) else 0
    if not spans:
        return b"", 0
    return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode() + b"\n", spans


def gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body, never more than `limit` bytes of it: a small body can inflate to gigabytes."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise BadExport("Content-Encoding gzip, but the body is not gzip") from None
    if len(out) > limit:
        raise TooLarge()
    return out


class TooLarge(Exception):
    """A body past --max-body-bytes (413, gRPC RESOURCE_EXHAUSTED)."""
