"""What the target thought of each output token (teacher forcing): the evidence replay classifies with."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from specdec_core.contract.identity import DecodeRequest
from specdec_core.extras import require

if TYPE_CHECKING:  # the scores themselves need no torch: an engine's replay fills them from its logprobs
    import torch


@dataclass(frozen=True)
class TokenScores:
    """The target model's view of a given output, position by position (teacher forcing).

    `logprobs` are under the request's sampling (temperature, then top-k, then top-p, as
    transformers applies them; for a greedy request 0 for the argmax and -inf otherwise),
    `raw_logprobs` under the plain softmax. `ranks` are 1 for the argmax; `margins` are the
    top-1 minus top-2 raw logits, small where a different environment could flip the choice.
    """

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    raw_logprobs: tuple[float, ...]
    ranks: tuple[int, ...]
    margins: tuple[float, ...]
    # The top raw logit at each position: a margin is small relative to it in half precision.
    top_logits: tuple[float, ...]
    argmax_ids: tuple[int, ...]
    prompt_tokens: int

    def __len__(self) -> int:
        return len(self.token_ids)

    def first_non_argmax(self) -> int | None:
        """Index of the first token the target would not have picked greedily."""
        return next((i for i, r in enumerate(self.ranks) if r != 1), None)

    def impossible_positions(self) -> list[int]:
        """Positions whose token the request's sampling could not have produced."""
        return [i for i, lp in enumerate(self.logprobs) if lp == -math.inf]


def sampling_logits(logits: torch.Tensor, req: DecodeRequest) -> torch.Tensor:
    """Logits as transformers' sampling sees them: temperature, then top-k, then top-p."""
    warpers = require("replay", "transformers.generation.logits_process")
    TopKLogitsWarper, TopPLogitsWarper = warpers.TopKLogitsWarper, warpers.TopPLogitsWarper

    scores = logits / float(req.temperature)
    if req.top_k:
        scores = TopKLogitsWarper(top_k=req.top_k)(None, scores)
    if req.top_p < 1.0:
        scores = TopPLogitsWarper(top_p=float(req.top_p))(None, scores)
    return scores
