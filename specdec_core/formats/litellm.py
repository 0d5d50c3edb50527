"""``--format litellm``: LiteLLM's StandardLoggingPayload, one ``json.dumps(..., default=str)`` per line."""

from __future__ import annotations

from typing import Any

from .common import (
    SOURCE_KEY,
    UNKNOWN_KEY,
    LineResult,
    canonical_json,
    datetime_text_to_rfc3339,
    epoch_to_rfc3339,
    load_object,
    parse_json_text,
    to_decimal,
)

WHAT = "a LiteLLM StandardLoggingPayload"

# LiteLLM logs ``model_parameters`` as {} on every cache hit, so these are unknown there, not defaults.
HIT_UNKNOWN_WHEN_ABSENT = ("temperature", "top_p", "top_k", "max_tokens", "seed", "stop")
# Required by the contract; a miss that does not log them ran with a provider default we cannot see.
MISS_UNKNOWN_WHEN_ABSENT = ("temperature", "max_tokens")
# Payloads of calls that generate no text are not model requests in the contract's sense.
NON_GENERATION_CALL_TYPES = ("embedding", "image", "moderation", "transcription", "speech", "rerank")


def _dict(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def _ts(start: Any) -> Any:
    """startTime: epoch seconds (float or numeric text) or, via default=str, a datetime's text."""
    if isinstance(start, str) and to_decimal(start) is None:
        return datetime_text_to_rfc3339(start) or start
    return epoch_to_rfc3339(start, "s") or start


def _response(payload: dict) -> dict:
    response = payload.get("response")
    if isinstance(response, str):
        parsed, response = parse_json_text(response)
        if not parsed:
            return {}  # str() of an object that is not JSON: nothing we can read
    return _dict(response)


def _first_choice(response: dict) -> dict:
    choices = response.get("choices")
    return _dict(choices[0]) if isinstance(choices, list) and choices else {}


def _consumer(metadata: dict, payload: dict) -> dict[str, Any]:
    """Who received the output where the client named no consumer: the key's alias, the key's end user, the
    payload's end user, the first of them that is set."""
    for value in (metadata.get("user_api_key_alias"), metadata.get("user_api_key_end_user_id"),
                  payload.get("end_user")):
        if value not in (None, ""):
            return {"consumer": value}
    return {}


def is_request(payload: dict) -> bool:
    call_type = payload.get("call_type")
    return not (isinstance(call_type, str) and any(k in call_type for k in NON_GENERATION_CALL_TYPES))


def payload_record(payload: dict) -> dict:
    """The contract record of one payload, field by field as the contract's LiteLLM table says."""
    # One line per row of that table, in its order: longer than a function should be, easier to check.
    record: dict[str, Any] = {}
    unknown: set[str] = set()
    hit = payload.get("cache_hit")
    hit = False if hit is None else hit  # LiteLLM logs null on a miss
    if "id" in payload:
        record["request_id"] = payload["id"]
    if payload.get("startTime") is not None:
        record["ts"] = _ts(payload["startTime"])
    rt = to_decimal(payload.get("response_time"))
    if rt is not None:
        record["latency_ms"] = float(rt * 1000)  # in Decimal: 0.123 s gives 123.0, not 123.00000000000001
    hidden = _dict(payload.get("hidden_params"))
    if "litellm_model_name" in hidden:
        record["target_model"] = hidden["litellm_model_name"]
    messages = payload.get("messages")
    if isinstance(messages, str):
        record["prompt"] = messages
    elif isinstance(messages, (list, dict)):
        record["prompt"] = canonical_json(messages)

    params = dict(_dict(payload.get("model_parameters")))
    if params.get("max_tokens") is None and "max_completion_tokens" in params:
        params["max_tokens"] = params["max_completion_tokens"]
    for field in HIT_UNKNOWN_WHEN_ABSENT:
        if field in params and not (field in MISS_UNKNOWN_WHEN_ABSENT and params[field] is None):
            record[field] = params[field]
        elif hit is True or field in MISS_UNKNOWN_WHEN_ABSENT:
            unknown.add(field)

    requester = _dict(_dict(payload.get("metadata")).get("requester_metadata"))
    for field in ("draft_model", "num_speculative_tokens", "tokenizer_version", "deployment"):
        if field in requester:
            record[field] = requester[field]
    for field in ("consumer", "experiment"):
        if field in requester:
            record[field] = requester[field]
    if "consumer" not in record:
        record.update(_consumer(_dict(payload.get("metadata")), payload))
    if "tokenizer_version" not in requester:
        unknown.add("tokenizer_version")

    record["cache_hit"] = hit
    if payload.get("cache_key") is not None:
        record["cache_key"] = payload["cache_key"]
    else:
        # A miss takes the key of the hits it sourced (backfill_cache_keys); until then it is unknown.
        unknown.add("cache_key")

    response = _response(payload)
    choice = _first_choice(response)
    message = _dict(choice.get("message"))
    if "content" in message:
        record["output_text"] = message["content"]
    elif "text" in choice:
        record["output_text"] = choice["text"]  # text_completion responses carry no message
    if "finish_reason" in choice:
        record["finish_reason"] = choice["finish_reason"]
    if "completion_tokens" in payload:
        record["output_tokens"] = payload["completion_tokens"]
    # A logged source link: a hit's response is the cached response, whose id is the miss's id.
    source = response.get("id")
    if hit is True and source is not None and source != payload.get("id"):
        record[SOURCE_KEY] = source
    if unknown:
        record[UNKNOWN_KEY] = sorted(unknown)
    return record


def read_line(line: str) -> LineResult:
    payload = load_object(line, WHAT)
    if not is_request(payload):
        return LineResult(records=(), skipped=1)
    return LineResult(records=(payload_record(payload),))


def backfill_cache_keys(records: list[dict]) -> None:
    """Give each miss without a key the key of the first hit whose source link names it, in place.

    LiteLLM logs ``cache_key`` as null on every miss. The ingest calls this once per batch of records
    read (all lines of a file), before validation, so a miss and its hits must be in the same batch.
    A filled miss no longer lists ``cache_key`` as unknown.
    """
    keys: dict[Any, Any] = {}
    for record in records:
        source, key = record.get(SOURCE_KEY), record.get("cache_key")
        if isinstance(source, str) and key is not None and record.get("cache_hit") is True:
            keys.setdefault(source, key)
    for record in records:
        rid = record.get("request_id")
        is_keyless_miss = record.get("cache_key") is None and record.get("cache_hit") is not True
        if is_keyless_miss and isinstance(rid, str) and rid in keys:
            record["cache_key"] = keys[rid]
            remaining = [f for f in record.get(UNKNOWN_KEY, []) if f != "cache_key"]
            if remaining:
                record[UNKNOWN_KEY] = remaining
            else:
                record.pop(UNKNOWN_KEY, None)
