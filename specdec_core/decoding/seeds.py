"""The sampling seed a replay uses, shared by the in-process decoder and the engine client (no torch here)."""

from __future__ import annotations

from specdec_core.contract.identity import DecodeRequest, fingerprint


def request_seed(req: DecodeRequest) -> int:
    """The sampling seed: the request's own, else one derived from its fingerprint."""
    seed = req.seed if req.seed is not None else int(fingerprint(req)[:16], 16)
    return seed % 2**64
