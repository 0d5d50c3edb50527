"""The mismatch report: one CSV row per (flagged request, kind), columns as the contract names them."""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from specdec_core.analysis.metrics import NO_FILTERS, Filters
from specdec_core.store.connection import Store

KINDS = ("contaminated_hit", "length_violation", "replay_mismatch")
COLUMNS = (
    "request_id", "ts", "kind", "cache_key", "source_request_id", "differing_fields",
    "target_model", "draft_model", "temperature", "max_tokens", "tokenizer_version",
    # Beyond the contract's minimum: what an on-call engineer filters on next.
    "deployment", "output_tokens", "classification", "detail",
)

# Milliseconds, as most logs write them; microseconds where the log had them, so the report's ts is exact.
_RFC3339 = ("CASE WHEN microsecond(r.ts) % 1000 = 0 THEN strftime(r.ts, '%Y-%m-%dT%H:%M:%S.%gZ') "
            "ELSE strftime(r.ts, '%Y-%m-%dT%H:%M:%S.%fZ') END")
_COMMON = (f"r.request_id, {_RFC3339} AS ts, {{kind}} AS kind, r.cache_key, {{source}} AS source_request_id, "
           "{differing} AS differing_fields, r.target_model, r.draft_model, r.temperature, r.max_tokens, "
           "r.tokenizer_version, r.deployment, r.output_tokens, {classification} AS classification, "
           "{detail} AS detail, r.ts AS sort_ts")

MISMATCH_REPORT_SQL = {
    "contaminated_hit": "SELECT " + _COMMON.format(
        kind="'contaminated_hit'", source="h.source_request_id", differing="h.differing_fields",
        classification="NULL",
        detail="CASE WHEN h.fingerprint_mismatch THEN 'cached_fingerprint differs from the request identity' "
               "END",
    ) + " FROM requests r JOIN hit_sources h USING (request_id) WHERE {where} AND h.contaminated",
    "length_violation": "SELECT " + _COMMON.format(
        # The contract defines source_request_id for contaminated hits; the Mismatches page shows it here.
        kind="'length_violation'", source="NULL", differing="NULL", classification="NULL",
        detail="'output_tokens ' || r.output_tokens || ' > max_tokens ' || r.max_tokens",
    ) + " FROM requests r LEFT JOIN hit_sources h USING (request_id) WHERE {where} "
        "AND r.output_tokens > r.max_tokens",
    # The latest replay of each request decides; `match` and `near_tie` are not mismatches of the cache.
    "replay_mismatch": "SELECT " + _COMMON.format(
        kind="'replay_mismatch'", source="p.source_request_id", differing="h.differing_fields",
        classification="p.classification",
        detail="'similarity ' || round(p.similarity, 3) || ', first divergent token ' "
               "|| coalesce(p.first_divergent_token::VARCHAR, '-')",
    ) + " FROM (SELECT DISTINCT ON (request_id) * FROM replays ORDER BY request_id, replayed_at DESC) p "
        "JOIN requests r USING (request_id) LEFT JOIN hit_sources h USING (request_id) "
        "WHERE {where} AND p.classification NOT IN ('match', 'near_tie')",
}


def _parts(filters: Filters, kinds: Iterable[str]) -> tuple[list[tuple[str, str]], list]:
    """(kind, SQL) of each chosen kind, in the report's order, and the filters' parameters for one part."""
    kinds = list(kinds)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"report kind {', '.join(unknown)} is unknown; known: {', '.join(KINDS)}")
    where, params = filters.where()
    return [(k, MISMATCH_REPORT_SQL[k].replace("{where}", where)) for k in KINDS if k in kinds], params


def mismatch_report(store: Store, filters: Filters = NO_FILTERS,
                    kinds: Iterable[str] = KINDS, limit: int | None = None) -> pd.DataFrame:
    """Every flagged (request, kind) in time order, as the report's rows (the first `limit` of them)."""
    parts, params = _parts(filters, kinds)
    if not parts:
        return pd.DataFrame(columns=list(COLUMNS))
    sql = (" UNION ALL ".join(f"({p})" for _, p in parts)
           + " ORDER BY sort_ts, request_id, kind" + ("" if limit is None else " LIMIT ?"))
    with store.read() as con:
        frame = con.execute(sql, params * len(parts) + ([] if limit is None else [limit])).df()
    return frame[list(COLUMNS)]


def report_counts(store: Store, filters: Filters = NO_FILTERS, kinds: Iterable[str] = KINDS) -> dict[str, int]:
    """How many rows of each chosen kind the report holds, without building it."""
    parts, params = _parts(filters, kinds)
    if not parts:
        return {}
    sql = " UNION ALL ".join(f"SELECT '{k}' AS kind, count(*) AS n FROM ({p})" for k, p in parts)
    with store.read() as con:
        return dict(con.execute(sql, params * len(parts)).fetchall())


def report_csv(frame: pd.DataFrame) -> bytes:
    """The report as CSV bytes (UTF-8, header row), identical for the CLI and the dashboard; missing is empty."""
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(frame.columns)
    writer.writerows(frame.astype(object).where(frame.notna(), "").itertuples(index=False, name=None))
    return buf.getvalue().encode("utf-8")


def write_report(store: Store, out: str | Path, filters: Filters = NO_FILTERS,
                 kinds: Iterable[str] = KINDS) -> int:
    """Write the mismatch report CSV; return the number of rows."""
    frame = mismatch_report(store, filters, kinds)
    Path(out).write_bytes(report_csv(frame))
    return len(frame)
