"""One OpenTelemetry GenAI span per decoded request, with the contract's fields as attributes.

A service built on this library can send its request log through an OpenTelemetry collector;
`specdec ingest --format otel` reads the Collector's file export back into the same records as
the JSON Lines log (../shared/log-schema.md, "--format otel"). opentelemetry-api is optional:
without it, or with no SDK configured, the spans cost nothing.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any

from specdec_core.contract.span_attributes import (
    AS_JSON_TEXT,
    AS_LIST,
    AS_ONE_ELEMENT_LIST,
    span_attribute_table,
)
from specdec_core.extras import MissingExtra, require

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


def epoch_ns(rfc3339: str) -> int:
    """Epoch nanoseconds of an RFC 3339 UTC time, exactly (no float on the way)."""
    moment = datetime.fromisoformat(rfc3339.replace("Z", "+00:00"))
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


def default_tracer() -> Any | None:
    """The global tracer when opentelemetry-api is installed, else None."""
    try:
        trace = require("otel", "opentelemetry.trace")
    except MissingExtra:
        return None
    return trace.get_tracer("specdec_core")


def span_attributes(record: dict[str, Any]) -> dict[str, Any]:
    """A log record as GenAI span attributes; a null value is left out (OpenTelemetry has no null)."""
    attrs: dict[str, Any] = {"gen_ai.operation.name": "text_completion"}
    for field, name in span_attribute_table().items():
        value = record.get(field)
        if value is None:
            continue
        if field in AS_LIST:
            value = [value] if isinstance(value, str) else list(value)  # a string is a list of one
        elif field in AS_ONE_ELEMENT_LIST:
            value = [value]
        elif field in AS_JSON_TEXT:
            value = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        attrs[name] = value
    return attrs


def emit_span(tracer: Any, record: dict[str, Any], start_ns: int, end_ns: int) -> None:
    """Record one finished request as a span from `start_ns` to `end_ns` (epoch nanoseconds)."""
    span = tracer.start_span(f"text_completion {record['target_model']}", start_time=start_ns,
                             attributes=span_attributes(record))
    span.end(end_time=end_ns)
