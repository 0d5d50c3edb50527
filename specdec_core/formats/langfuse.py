"""``--format langfuse``: Langfuse observations of type GENERATION, one JSON object per line.

Two shapes: the blob-storage export (JSONL, snake_case columns; ``input``, ``output`` and ``model_parameters``
as JSON text, metadata values as strings) and the public API's observations (``GET /api/public/observations``,
camelCase; a ``{"data": [...]}`` document or one observation per line).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from .common import (
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

WHAT = "a Langfuse observation"
OBSERVATION_TYPES = frozenset({"GENERATION", "SPAN", "EVENT", "AGENT", "TOOL", "CHAIN", "RETRIEVER",
                               "EVALUATOR", "EMBEDDING", "GUARDRAIL"})
_INTEGER_FIELDS = frozenset({"top_k", "max_tokens", "seed", "num_speculative_tokens", "output_tokens"})
_FLOAT_FIELDS = frozenset({"temperature", "top_p"})
_SAMPLING = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")
_METADATA_FIELDS = ("consumer", "experiment", "cache_key", "cache_hit", "draft_model", "num_speculative_tokens",
                    "tokenizer_version", "cached_fingerprint")
# Required by the contract; Langfuse logs only the parameters the caller passed, so absent is unknown.
UNKNOWN_WHEN_ABSENT = ("temperature", "max_tokens", "tokenizer_version")


def looks_like(obj: dict) -> bool:
    """Whether a JSON object is a Langfuse observation (either shape)."""
    return (obj.get("type") in OBSERVATION_TYPES and ("trace_id" in obj or "traceId" in obj)
            and ("start_time" in obj or "startTime" in obj))


def _get(obj: dict, snake: str, camel: str) -> Any:
    return obj[snake] if obj.get(snake) is not None else obj.get(camel)


def _object(value: Any) -> dict:
    """An object, or JSON text of one (the blob export writes maps as text); anything else is empty."""
    if isinstance(value, str):
        _, value = parse_json_text(value)
    return value if isinstance(value, dict) else {}


def _value(field: str, value: Any) -> Any:
    """A parameter or metadata value as the contract types it: Langfuse may hold "0.7", "256", "true"."""
    if not isinstance(value, str):
        return value
    if field in _INTEGER_FIELDS or field in _FLOAT_FIELDS:
        number = to_decimal(value)
        if number is None:
            return value
        if field in _FLOAT_FIELDS:
            return float(number)
        return int(number) if number == number.to_integral_value() else value
    if field == "cache_hit" and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    if field in ("stop", "cached_fingerprint"):
        parsed, loaded = parse_json_text(value)
        return loaded if parsed and not isinstance(loaded, (int, float)) else value
    return value


def _instant(value: Any) -> tuple[Any, float | None]:
    """(RFC 3339 text or the value as it came, epoch milliseconds where readable)."""
    if isinstance(value, str) and to_decimal(value) is None:
        text = datetime_text_to_rfc3339(value)
        if text is None:
            return value, None
        return text, datetime.fromisoformat(text[:-1] + "+00:00").timestamp() * 1000
    number = to_decimal(value)
    if number is None:
        return value, None
    return epoch_to_rfc3339(str(number), "ms") or value, float(number)


def _json_or_text(value: Any) -> Any:
    """A blob export's JSON text as the value it holds; text that is not JSON is a string as it is."""
    parsed, loaded = parse_json_text(value)
    return loaded if parsed else value


def observation_record(obs: dict) -> dict | None:
    """The contract record of one observation; None when it is not a GENERATION."""
    if obs.get("type") != "GENERATION":
        return None
    record: dict[str, Any] = {}
    if "id" in obs:
        record["request_id"] = obs["id"]
    start, end = _get(obs, "start_time", "startTime"), _get(obs, "end_time", "endTime")
    if start is not None:
        record["ts"], start_ms = _instant(start)
        end_ms = _instant(end)[1] if end is not None else None
        if start_ms is not None and end_ms is not None:
            record["latency_ms"] = round(end_ms - start_ms, 3)
    model = _get(obs, "provided_model_name", "model")
    if model is not None:
        record["target_model"] = model
    params = _object(_get(obs, "model_parameters", "modelParameters"))
    if params.get("max_tokens") is None and params.get("max_completion_tokens") is not None:
        params = {**params, "max_tokens": params["max_completion_tokens"]}
    for field in _SAMPLING:
        if params.get(field) is not None:
            record[field] = _value(field, params[field])
    if "input" in obs and obs["input"] is not None:
        value = _json_or_text(obs["input"]) if "start_time" in obs else obs["input"]
        record["prompt"] = value if isinstance(value, str) else canonical_json(value)
    if "output" in obs and obs["output"] is not None:
        value = _json_or_text(obs["output"]) if "start_time" in obs else obs["output"]
        if isinstance(value, dict) and "content" in value:
            value = value["content"]
        record["output_text"] = value if isinstance(value, str) else canonical_json(value)
    usage = _object(_get(obs, "usage_details", "usageDetails"))
    if usage.get("output") is not None:
        record["output_tokens"] = _value("output_tokens", usage["output"])
    elif obs.get("completionTokens") is not None:
        record["output_tokens"] = obs["completionTokens"]
    metadata = _object(obs.get("metadata"))
    deployment = metadata.get("deployment", obs.get("environment"))
    if deployment is not None:
        record["deployment"] = deployment
    for field in _METADATA_FIELDS:
        if field in metadata:
            record[field] = _value(field, metadata[field])
    unknown = sorted(f for f in UNKNOWN_WHEN_ABSENT if f not in record)
    if unknown:
        record[UNKNOWN_KEY] = unknown
    return record


def read_line(line: str) -> LineResult:
    obj = load_object(line, WHAT)
    observations = obj["data"] if isinstance(obj.get("data"), list) and "type" not in obj else [obj]
    records: list[dict] = []
    origins: list[Any] = []
    skipped = 0
    for n, obs in enumerate(observations):
        if not isinstance(obs, dict):
            raise FormatError(f"not {WHAT}: data[{n}] is not an object")
        if "type" not in obs:
            raise FormatError(f"not {WHAT}: no type")
        record = observation_record(obs)
        if record is None:
            skipped += 1
        else:
            records.append(record)
            origins.append(obs)
    return LineResult(records=tuple(records), skipped=skipped, origin_values=tuple(origins))
