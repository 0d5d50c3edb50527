"""One request as its own page shows it: the logged record and, for a contaminated hit, the request whose
cached output it was served, the identity fields that differ, and whether the output fits the request."""

from __future__ import annotations

from dataclasses import dataclass

from specdec_core.analysis.requests import RequestRecord, request_record
from specdec_core.contract import fields as contract
from specdec_core.store.connection import Store


@dataclass(frozen=True)
class LengthCheck:
    """Whether the output is one this request could have returned: no more tokens than its max_tokens."""

    output_tokens: int | None
    max_tokens: int | None
    max_tokens_unknown: bool = False  # the log marks it unknown (a LiteLLM hit), not absent

    @property
    def known(self) -> bool:
        return self.output_tokens is not None and self.max_tokens is not None

    @property
    def fits(self) -> bool | None:
        return None if not self.known else self.output_tokens <= self.max_tokens

    @property
    def sentence(self) -> str:
        if self.max_tokens_unknown:
            return ("Not checked: the log leaves this request's max_tokens unknown (LiteLLM logs no sampling "
                    "parameters on a cache hit).")
        if not self.known:
            return "Not checked: the log has no output_tokens or no max_tokens for this request."
        if self.fits:
            return f"{self.output_tokens} output tokens within max_tokens {self.max_tokens}."
        return (f"{self.output_tokens} output tokens, more than its max_tokens of {self.max_tokens}: this output "
                "was produced for another request.")


@dataclass(frozen=True)
class RequestDetail:
    record: RequestRecord
    source: RequestRecord | None  # the request whose cached output a contaminated hit was served
    differing: tuple[str, ...]  # identity fields (the contract's order) whose values differ from the source's
    length: LengthCheck

    @property
    def contaminated(self) -> bool:
        return bool(self.record.contaminated)


def request_detail(store: Store, request_id: str) -> RequestDetail | None:
    """A request, its source where its hit was contaminated, and its length check; None if not logged."""
    record = request_record(store, request_id)
    if record is None:
        return None
    source = None
    if record.contaminated and record.source_request_id:
        source = request_record(store, record.source_request_id)
    differing = stored_differences(record) if source is not None else ()
    length = LengthCheck(record.fields.get("output_tokens"), record.fields.get("max_tokens"),
                         "max_tokens" in record.unknown_fields)
    return RequestDetail(record=record, source=source, differing=differing, length=length)


def stored_differences(record: RequestRecord) -> tuple[str, ...]:
    """The identity fields the store found different from the source's (in their canonical forms, as every
    page and the report name them), in the contract's order."""
    named = set(filter(None, (record.differing_fields or "").split(";")))
    return tuple(name for name in contract.IDENTITY_FIELDS if name in named) + tuple(sorted(
        named - set(contract.IDENTITY_FIELDS)))
