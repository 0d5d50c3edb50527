"""The interface every proposer implements."""

from __future__ import annotations

from typing import Any, Protocol

DEFAULT_DRAFT_TOKENS = 5


class Proposer(Protocol):
    kind: str  # "none", "ngram" or "draft": logged in the replay environment
    draft_tokens: int | None  # proposed per verification step; None without speculation

    @property
    def counts_acceptance(self) -> bool:
        """Whether verification steps (and so acceptance counts) exist for this proposer."""

    def generation_args(self) -> dict[str, Any]:
        """Settings for transformers' GenerationConfig."""

    def generate_kwargs(self, loader: Any, target: Any) -> dict[str, Any]:
        """Extra arguments for `generate` (the assistant model), loaded through the engine's loader."""
