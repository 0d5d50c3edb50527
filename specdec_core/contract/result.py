"""What a decoder returns for one request: shared by the engine, the service and replay."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


class DecodeError(ValueError):
    """A request a decoder can't run as asked (a prompt past its model's context); the message says why in one line."""


@dataclass(frozen=True)
class DecodeResult:
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    output_tokens: int | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    # Tokens the target accepted at each verification step, in order.
    accepted_per_step: tuple[int, ...] = ()
    latency_ms: float | None = None
    # torch/transformers versions, device, dtype...: what a replay must match to be comparable.
    environment: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "token_ids", tuple(self.token_ids))
        object.__setattr__(self, "accepted_per_step", tuple(self.accepted_per_step))
        if self.output_tokens is None:
            object.__setattr__(self, "output_tokens", len(self.token_ids))

    def to_json(self) -> dict[str, Any]:
        """The JSON form stored in a cache entry (never pickle)."""
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "output_tokens": self.output_tokens,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_step": list(self.accepted_per_step),
            "latency_ms": self.latency_ms,
            "environment": dict(self.environment),
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> DecodeResult:
        return cls(
            text=obj["text"],
            token_ids=tuple(obj.get("token_ids") or ()),
            finish_reason=obj.get("finish_reason"),
            output_tokens=obj.get("output_tokens"),
            draft_tokens=obj.get("draft_tokens"),
            accepted_tokens=obj.get("accepted_tokens"),
            accepted_per_step=tuple(obj.get("accepted_per_step") or ()),
            latency_ms=obj.get("latency_ms"),
            environment=dict(obj.get("environment") or {}),
        )
