"""How draft tokens are proposed: one proposer per file behind one interface (vLLM's spec_decode layout).

The engine asks `proposer_for(request)` and hands the proposer's settings to transformers'
`generate`; the request alone decides which proposer runs.
"""

from __future__ import annotations

from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.proposers.base import DEFAULT_DRAFT_TOKENS, Proposer
from specdec_core.decoding.proposers.draft_model import DraftModelProposer
from specdec_core.decoding.proposers.ngram import NgramProposer, ngram_size
from specdec_core.decoding.proposers.none import NoProposer


def proposer_for(req: DecodeRequest) -> Proposer:
    """The proposer a request names: none, n-gram prompt lookup (`ngram-N`) or a draft model."""
    draft = req.speculation
    if draft is None or req.num_speculative_tokens == 0:
        return NoProposer()
    length = req.num_speculative_tokens or DEFAULT_DRAFT_TOKENS
    size = ngram_size(draft)
    if size is not None:
        return NgramProposer(length, size)
    return DraftModelProposer(length, draft)


__all__ = ["DEFAULT_DRAFT_TOKENS", "DraftModelProposer", "NgramProposer", "NoProposer", "Proposer", "ngram_size",
           "proposer_for"]
