"""Hand-built log records for store, metrics and report tests."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

BASE: dict[str, Any] = {
    "ts": "2026-03-01T10:00:00Z",
    "prompt": "Summarise the incident.",
    "target_model": "llama-8b",
    "draft_model": "llama-1b",
    "num_speculative_tokens": 4,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": None,
    "max_tokens": 64,
    "seed": None,
    "stop": None,
    "tokenizer_version": "tok-v1",
    "deployment": "prod",
    "cache_key": "k-1",
    "cache_hit": False,
    "cached_fingerprint": None,
    "output_text": "An output.",
    "output_tokens": 3,
    "finish_reason": "stop",
    "latency_ms": 120.0,
    "draft_tokens": 8,
    "accepted_tokens": 6,
}


def rec(request_id: str, **overrides: Any) -> dict[str, Any]:
    record = {"request_id": request_id, **BASE, **overrides}
    return {k: v for k, v in record.items() if v is not _DROP}


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


_DROP = _Drop()
DROP: Any = _DROP  # rec(..., field=DROP) leaves the field out of the record


def write_jsonl(path: Path, records: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
