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

from specdec_core.extras import MissingExtra, require

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# Contract fields carried as specdec.* attributes (the GenAI conventions have no name for them).
_SPECDEC_FIELDS = ("request_id", "prompt", "prompt_hash", "draft_model", "num_speculative_tokens",
                   "tokenizer_version", "deployment", "cache_key", "cache_hit", "output_text", "draft_tokens",
                   "accepted_tokens")
_GEN_AI_REQUEST = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "max_tokens": "max_tokens",
                   "seed": "seed", "stop": "stop_sequences"}


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
    attrs: dict[str, Any] = {"gen_ai.operation.name": "text_completion",
                             "gen_ai.request.model": record["target_model"]}
    for field, name in _GEN_AI_REQUEST.items():
        if record.get(field) is not None:
            attrs[f"gen_ai.request.{name}"] = list(record[field]) if field == "stop" else record[field]
    attrs["gen_ai.usage.output_tokens"] = record["output_tokens"]
    if record.get("finish_reason") is not None:
        attrs["gen_ai.response.finish_reasons"] = [record["finish_reason"]]
    for field in _SPECDEC_FIELDS:
        if record.get(field) is not None:
            attrs[f"specdec.{field}"] = record[field]
    if record.get("cached_fingerprint") is not None:
        attrs["specdec.cached_fingerprint"] = json.dumps(record["cached_fingerprint"], ensure_ascii=False,
                                                         sort_keys=True, separators=(",", ":"))
    return attrs


def emit_span(tracer: Any, record: dict[str, Any], start_ns: int, end_ns: int) -> None:
    """Record one finished request as a span from `start_ns` to `end_ns` (epoch nanoseconds)."""
    span = tracer.start_span(f"text_completion {record['target_model']}", start_time=start_ns,
                             attributes=span_attributes(record))
    span.end(end_time=end_ns)
