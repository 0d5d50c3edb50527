"""N-gram drafting: prompt lookup proposes the tokens that followed the last n-gram's earlier occurrence."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

NGRAM_DRAFT = re.compile(r"^ngram-([1-9][0-9]*)$")


def ngram_size(draft_name: str | None) -> int | None:
    """N for a draft named `ngram-N` (prompt lookup, no draft model), else None."""
    match = NGRAM_DRAFT.match(draft_name or "")
    return int(match.group(1)) if match else None


@dataclass(frozen=True)
class NgramProposer:
    draft_tokens: int
    max_ngram: int
    kind: str = "ngram"

    @property
    def counts_acceptance(self) -> bool:
        return True

    def generation_args(self) -> dict[str, Any]:
        return {"prompt_lookup_num_tokens": self.draft_tokens, "max_matching_ngram_size": self.max_ngram}

    def generate_kwargs(self, loader: Any, target: Any) -> dict[str, Any]:
        return {}
