"""Single requests: one record, the most suspicious ones, the quarantined lines."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pandas as pd

from specdec_core.analysis.query import (
    NO_FILTERS,
    Filters,
    df,
)
from specdec_core.contract import fields as contract
from specdec_core.store.connection import Store

# What the store found about a request's cache hit, beside its logged fields.
HIT_SOURCE_COLUMNS = ("source_request_id", "contaminated", "differing_fields")


@dataclass(frozen=True)
class RequestRecord:
    """One logged request: its contract fields by the contract's names, the store's own columns (fingerprint,
    source file and line...), and whether its cache hit served another identity's output, whose."""

    fields: Mapping[str, Any]
    stored: Mapping[str, Any]
    source_request_id: str | None
    contaminated: bool | None
    differing_fields: str | None

    @property
    def request_id(self) -> str:
        return self.fields["request_id"]

    @property
    def prompt(self) -> str | None:
        return self.fields["prompt"]

    @property
    def output_text(self) -> str:
        return self.fields["output_text"]

    @property
    def unknown_fields(self) -> tuple[str, ...]:
        """The fields the log marks unknown for this request (not null: a LiteLLM hit's temperature)."""
        return tuple(self.stored.get("unknown_fields") or ())

    def shown(self, name: str) -> Any:
        """A field as a page shows it: its value, or "unknown" where the log marks it so."""
        return "unknown" if name in self.unknown_fields else self.fields.get(name)

    def as_log_record(self) -> dict[str, Any]:
        """The flat record replay reads: the contract's fields, the store's columns and the hit's source."""
        return {**self.fields, **self.stored, "source_request_id": self.source_request_id,
                "contaminated": self.contaminated, "differing_fields": self.differing_fields}

    # A record reads as a log record does, by the contract's field names (the names come from its table).
    def __getitem__(self, name: str) -> Any:
        return self.as_log_record()[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.as_log_record().get(name, default)


def request_record(store: Store, request_id: str) -> RequestRecord | None:
    """One logged request, or None."""
    with store.read() as con:
        cur = con.execute(
            "SELECT r.* EXCLUDE (seed), r.seed::VARCHAR AS seed, h.source_request_id, h.contaminated, "
            "h.differing_fields FROM requests r LEFT JOIN hit_sources h USING (request_id) "
            "WHERE r.request_id = $request_id",
            {"request_id": request_id},
        )
        rows = cur.fetchall()
        if not rows:
            return None
        record = dict(zip([d[0] for d in cur.description], rows[0], strict=True))
    if record["seed"] is not None:
        record["seed"] = int(record["seed"])
    hit = {name: record.pop(name) for name in HIT_SOURCE_COLUMNS}
    logged = {name: record.pop(name) for name in contract.FIELD_NAMES if name in record}
    return RequestRecord(fields=logged, stored=record, **hit)


def suspicious_sql(where: str) -> str:
    return f"""
SELECT r.request_id, CASE WHEN h.contaminated THEN 'contaminated_hit'
                          WHEN r.output_tokens > r.max_tokens THEN 'length_violation'
                          ELSE 'collision' END AS why
FROM requests r LEFT JOIN hit_sources h USING (request_id)
WHERE {where} AND (h.contaminated OR r.output_tokens > r.max_tokens)
ORDER BY h.contaminated DESC NULLS LAST, (r.output_tokens > r.max_tokens) DESC, r.ts, r.request_id
LIMIT $limit
"""


def suspicious_requests(store: Store, n: int, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """The requests most worth replaying: contaminated hits first, then length violations."""
    return df(store, suspicious_sql, filters, {"limit": n})


QUARANTINE_SQL = """
SELECT source_file, source_line, request_id, reason, left(raw, 200) AS raw
FROM quarantine ORDER BY ingest_id, source_file, source_line LIMIT $limit
"""


def quarantined_records(store: Store, limit: int = 1000) -> pd.DataFrame:
    with store.read() as con:
        return con.execute(QUARANTINE_SQL, {"limit": limit}).df()


