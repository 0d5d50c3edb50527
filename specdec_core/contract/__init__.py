"""The request log contract: its one table of fields, a request's identity and fingerprint, the decode result."""

from typing import Any

from specdec_core.contract import fields as _fields
from specdec_core.contract.fields import Contract, Field, current, define, extended
from specdec_core.contract.identity import (
    DecodeRequest,
    canonical_json,
    canonicalize_identity,
    differing_fields,
    fingerprint,
    identity,
    identity_json,
    sha256_hex,
)
from specdec_core.contract.result import DecodeResult

__all__ = [
    "FIELDS", "IDENTITY_FIELDS", "NON_IDENTITY_FIELDS", "Contract", "Field", "current", "define", "extended",
    "DecodeRequest", "DecodeResult",
    "canonical_json", "canonicalize_identity", "differing_fields", "fingerprint", "identity", "identity_json",
    "sha256_hex",
]


def __getattr__(name: str) -> Any:
    """The field lists, from the contract as it is at this read (fields.define may have extended it)."""
    if name in ("FIELDS", "IDENTITY_FIELDS", "NON_IDENTITY_FIELDS"):
        return getattr(_fields, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
