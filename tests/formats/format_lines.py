"""One line of each other log shape, from the committed fixtures, with fields changed: for the format tests."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"

MAP = FIXTURES / "mapping" / "custom_map.toml"


def otel_line(request_id: str = "otel-1", attrs: dict | None = None, **span_fields) -> str:
    """The fixture's first request alone: its chat span with these fields and attributes replaced."""
    request = json.loads((FIXTURES / "otel_spans.jsonl").read_text(encoding="utf-8").splitlines()[0])
    scope = request["resourceSpans"][0]["scopeSpans"][0]
    span = next(s for s in scope["spans"] if s["name"].startswith("chat"))
    scope["spans"] = [span]
    span.update(span_fields)
    attrs = {"specdec.request_id": {"stringValue": request_id}, **(attrs or {})}
    span["attributes"] = [a for a in span["attributes"] if a["key"] not in attrs] + [
        {"key": key, "value": value} for key, value in attrs.items()]
    return json.dumps(request)


def litellm_line(n: int = 0, **fields) -> str:
    payload = json.loads((FIXTURES / "litellm_payloads.jsonl").read_text(encoding="utf-8").splitlines()[n])
    return json.dumps({**payload, **fields})


def mapped_line(**fields) -> str:
    obj = json.loads((FIXTURES / "mapping" / "custom.jsonl").read_text(encoding="utf-8").splitlines()[0])
    return json.dumps({**obj, **fields})
