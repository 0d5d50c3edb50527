"""The request log contract: its one table of fields, a request's identity and fingerprint, the decode result."""

from specdec_core.contract.fields import FIELDS, IDENTITY_FIELDS, NON_IDENTITY_FIELDS, Field
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
    "FIELDS", "IDENTITY_FIELDS", "NON_IDENTITY_FIELDS", "Field", "DecodeRequest", "DecodeResult",
    "canonical_json", "canonicalize_identity", "differing_fields", "fingerprint", "identity", "identity_json",
    "sha256_hex",
]
