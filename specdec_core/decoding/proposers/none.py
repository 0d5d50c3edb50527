"""No speculation: the target decodes alone."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NoProposer:
    kind: str = "none"
    draft_tokens: int | None = None

    @property
    def counts_acceptance(self) -> bool:
        return False

    def generation_args(self) -> dict[str, Any]:
        return {}

    def generate_kwargs(self, loader: Any, target: Any) -> dict[str, Any]:
        return {}
