"""The mismatch report: one CSV row per (flagged request, kind), columns as the contract names them."""

from __future__ import annotations

import csv
import io
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, BinaryIO

import pandas as pd

from specdec_core.analysis import NO_FILTERS, Filters
from specdec_core.analysis.query import CHOSEN_CONTAMINATED, CHOSEN_ROWS, chosen_rows, execute
from specdec_core.contract.names import REPORT_KINDS
from specdec_core.derived import summaries as summary
from specdec_core.store.connection import Store

KINDS = REPORT_KINDS
COLUMNS = (
    "request_id", "ts", "kind", "cache_key", "source_request_id", "differing_fields",
    "target_model", "draft_model", "temperature", "max_tokens", "tokenizer_version",
    # Beyond the contract's minimum: what an on-call engineer filters on next.
    "deployment", "output_tokens", "classification", "detail",
    # The request's latest stored replay, and its page where the dashboard's address is configured.
    "replay_id", "replay_link",
)

# Milliseconds, as most logs write them; microseconds where the log had them, so the report's ts is exact.
_RFC3339 = ("CASE WHEN microsecond(r.ts) % 1000 = 0 THEN strftime(r.ts, '%Y-%m-%dT%H:%M:%S.%gZ') "
            "ELSE strftime(r.ts, '%Y-%m-%dT%H:%M:%S.%fZ') END")
_COMMON = (f"r.request_id, {_RFC3339} AS ts, {{kind}} AS kind, r.cache_key, {{source}} AS source_request_id, "
           "{differing} AS differing_fields, r.target_model, r.draft_model, r.temperature, r.max_tokens, "
           "r.tokenizer_version, r.deployment, r.output_tokens, {classification} AS classification, "
           "{detail} AS detail, {replay} AS replay_id, r.ts AS sort_ts, r.unknown_fields")
# The latest replay of each request; replayed_at ties broken by id, so a report reads the same twice.
_LATEST_REPLAY = ("(SELECT DISTINCT ON (request_id) * FROM replays "
                  "ORDER BY request_id, replayed_at DESC, replay_id DESC)")

_CONTAMINATED_HIT_COLUMNS = _COMMON.format(
    kind="'contaminated_hit'", source="h.source_request_id", differing="h.differing_fields", classification="NULL",
    detail="CASE WHEN h.fingerprint_mismatch THEN 'cached_fingerprint differs from the request identity' END",
    replay="p.replay_id",
)
_LENGTH_VIOLATION_COLUMNS = _COMMON.format(
    # The contract defines source_request_id for contaminated hits; the Mismatches page shows it here.
    kind="'length_violation'", source="NULL", differing="NULL", classification="NULL",
    detail="'output_tokens ' || r.output_tokens || ' > max_tokens ' || r.max_tokens", replay="p.replay_id",
)
_REPLAY_MISMATCH_COLUMNS = _COMMON.format(
    kind="'replay_mismatch'", source="p.source_request_id", differing="h.differing_fields",
    classification="p.classification",
    detail="'similarity ' || round(p.similarity, 3) || ', first divergent token ' "
           "|| coalesce(p.first_divergent_token::VARCHAR, '-')", replay="p.replay_id",
)


def contaminated_hit_sql(where: str, hits: str = "hit_sources") -> str:
    """`hits`: the verdicts read, hit_sources or a relation with its columns (the chosen rows' contaminated
    hits from their summary, which a range of time finds without reading every stored verdict)."""
    return (f"SELECT {_CONTAMINATED_HIT_COLUMNS} FROM requests r JOIN {hits} h USING (request_id) "
            f"LEFT JOIN {_LATEST_REPLAY} p USING (request_id) "
            f"WHERE {where} AND h.contaminated")


def length_violation_sql(where: str) -> str:
    return (f"SELECT {_LENGTH_VIOLATION_COLUMNS} FROM requests r LEFT JOIN {_LATEST_REPLAY} p USING (request_id) "
            f"WHERE {where} AND r.output_tokens > r.max_tokens")


# The verdicts of the replayed requests only: joined whole, every stored verdict would be read to find a few.
_REPLAYED_VERDICTS = ("(SELECT request_id, differing_fields FROM hit_sources "
                      "WHERE request_id IN (SELECT request_id FROM replays))")


def replay_mismatch_sql(where: str) -> str:
    """The latest replay of each request decides; `match` and `near_tie` are not mismatches of the cache."""
    return (f"SELECT {_REPLAY_MISMATCH_COLUMNS} "
            f"FROM {_LATEST_REPLAY} p "
            f"JOIN requests r USING (request_id) LEFT JOIN {_REPLAYED_VERDICTS} h USING (request_id) "
            f"WHERE {where} AND p.classification NOT IN ('match', 'near_tie')")


# The contaminated hits among the chosen rows (query.CHOSEN_ROWS), as hit_sources' verdicts.
_CHOSEN_HITS = ("(SELECT request_id, source_request_id, differing_fields, fingerprint_mismatch, TRUE AS contaminated "
                f"FROM {CHOSEN_CONTAMINATED})")


MISMATCH_REPORT_SQL: dict[str, Callable[[str], str]] = {
    "contaminated_hit": contaminated_hit_sql, "length_violation": length_violation_sql,
    "replay_mismatch": replay_mismatch_sql,
}


def _parts(filters: Filters, kinds: Iterable[str], chosen: bool = False) -> tuple[list[tuple[str, str]], dict[str, Any]]:
    """(kind, SQL) of each chosen kind, in the report's order, and the filters' parameters (by name); `chosen`:
    of the rows query.CHOSEN_ROWS picks only, each contaminated hit's verdict read from its summary."""
    kinds = list(kinds)
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"report kind {', '.join(unknown)} is unknown; known: {', '.join(KINDS)}")
    where, params = filters.named_where()
    if chosen:
        where = f"{where} AND {CHOSEN_ROWS}"
    sql = {**MISMATCH_REPORT_SQL, **({"contaminated_hit": lambda w: contaminated_hit_sql(w, _CHOSEN_HITS)}
                                     if chosen else {})}
    return [(k, sql[k](where)) for k in KINDS if k in kinds], params


def _first_ids_sql(filters: Filters, kinds: list[str]) -> str:
    """The requests of the report's first `$limit` rows, their first and last time: the first contaminated hits
    and violations from their summaries, the replays' few as they are."""
    where, _ = filters.named_where()
    hits_where, _ = filters.named_where("c")
    first = {
        "contaminated_hit": f"SELECT c.request_id, c.ts AS sort_ts, 'contaminated_hit' AS kind "
                            f"FROM summary_contaminated c WHERE {hits_where}",
        "length_violation": f"SELECT c.request_id, c.ts AS sort_ts, 'length_violation' AS kind "
                            f"FROM summary_violations c WHERE {hits_where}",
        "replay_mismatch": f"SELECT request_id, sort_ts, kind FROM ({replay_mismatch_sql(where)})",
    }
    union = " UNION ALL ".join(f"({first[k]} ORDER BY sort_ts, request_id LIMIT $limit)" for k in KINDS if k in kinds)
    return (f"SELECT list(request_id), min(sort_ts), max(sort_ts) FROM "
            f"(SELECT * FROM ({union}) ORDER BY sort_ts, request_id, kind LIMIT $limit)")


def replay_page_url(external_url: str, replay_id: str) -> str:
    """The dashboard's page of one stored replay, at the address people reach the dashboard by."""
    return f"{external_url.rstrip('/')}/replay?replay_id={replay_id}"


def mismatch_report(store: Store, filters: Filters = NO_FILTERS, kinds: Iterable[str] = KINDS,
                    limit: int | None = None, external_url: str | None = None, unknown: bool = False
                    ) -> pd.DataFrame:
    """Every flagged (request, kind) in time order, as the report's rows (the first `limit` of them).

    `unknown`: with each row's `unknown_fields` last (the fields its log left unknown, which a table on screen
    says are unknown; the CSV leaves them empty).

    `replay_link` is the replay's page under `external_url` (`[dashboard] external_url`, see
    `configured_external_url`); without one it is empty: a relative link means nothing in a spreadsheet.
    """
    kinds = list(kinds)
    parts, params = _parts(filters, kinds)
    columns = [*COLUMNS, *(["unknown_fields"] if unknown else [])]
    if not parts:
        return pd.DataFrame(columns=columns)
    with store.read() as con:
        if limit is not None and summary.ready(con):
            # The first rows' requests first, from narrow columns; only those are joined with their verdicts,
            # replays and texts.
            chosen = chosen_rows(con, _first_ids_sql(filters, kinds), params | {"limit": limit})
            parts, params = _parts(filters, kinds, chosen=True)
            params |= chosen
        sql = (" UNION ALL ".join(f"({p})" for _, p in parts)
               + " ORDER BY sort_ts, request_id, kind" + ("" if limit is None else " LIMIT $limit"))
        frame = execute(con, sql, params | {"limit": limit}).df()
    frame["replay_link"] = [replay_page_url(external_url, r) if external_url and isinstance(r, str) else None
                            for r in frame.replay_id]
    return frame[columns]


def configured_external_url() -> str | None:
    """`[dashboard] external_url` of the config file, read the same way by `specdec report` and the dashboard's
    export, so that both write the same links. Raises ConfigError, whose text is one line."""
    from specdec_core.config import dashboard_settings

    return dashboard_settings().external_url


def report_counts(store: Store, filters: Filters = NO_FILTERS, kinds: Iterable[str] = KINDS) -> dict[str, int]:
    """How many rows of each chosen kind the report holds, without building it."""
    parts, params = _parts(filters, kinds)
    if not parts:
        return {}
    with store.read() as con:
        counts = [f"SELECT '{k}' AS kind, count(*) AS n FROM ({p})" for k, p in parts]
        if summary.ready(con):
            # The contaminated hits in their summary, the violations in the minute summary's (exact under any
            # filter: the minutes a time range cuts through are counted from the rows).
            hits_where, _ = filters.named_where("c")
            minutes, minute_params = summary.named_minute_source(filters, filters.named_where())
            by_summary = {
                "contaminated_hit": f"SELECT 'contaminated_hit', count(*) FROM summary_contaminated c WHERE {hits_where}",
                "length_violation": f"SELECT 'length_violation', coalesce(sum(c.violations), 0)::BIGINT FROM {minutes} c",
            }
            counts = [by_summary.get(k, sql) for (k, _), sql in zip(parts, counts, strict=True)]
            params |= minute_params
        return dict(execute(con, " UNION ALL ".join(counts), params).fetchall())


# A spreadsheet reads a cell starting with one of these as a formula (OWASP, "CSV Injection").
FORMULA_TRIGGERS = ("=", "+", "-", "@", "\t", "\r")


def _text_columns(frame: pd.DataFrame) -> list[str]:
    # Decided per column: a negative number in a numeric column starts with '-' once written, and must
    # stay a number; only columns that hold text (log values such as request_id) can carry a formula.
    return [c for c in frame.columns if not (pd.api.types.is_numeric_dtype(frame[c])
                                             or pd.api.types.is_datetime64_any_dtype(frame[c]))]


def _flagged(values: pd.Series) -> tuple[pd.Series, pd.Series]:
    """(cells a spreadsheet would run as a formula, cells holding a carriage return) of one text column."""
    def formula(v: object) -> bool:
        return isinstance(v, str) and v.startswith(FORMULA_TRIGGERS)

    def carriage_return(v: object) -> bool:
        return isinstance(v, str) and "\r" in v

    try:  # most text columns repeat a few values (models, kinds, keys): look at each distinct one once
        distinct = pd.unique(values)
    except TypeError:  # cells that can't be hashed (lists): look at every cell
        return values.map(formula).astype(bool), values.map(carriage_return).astype(bool)
    bad_formula = [v for v in distinct if formula(v)]
    bad_cr = [v for v in distinct if carriage_return(v)]
    none = pd.Series(False, index=values.index)
    return (values.isin(bad_formula) if bad_formula else none), (values.isin(bad_cr) if bad_cr else none)


def report_csv(frame: pd.DataFrame, *, raw: bool = False) -> bytes:
    """The report as CSV bytes (UTF-8, header row), identical for the CLI and the dashboard; missing is empty.

    Text cells that a spreadsheet would run as a formula get a leading `'`; `raw=True` keeps the exact text.
    """
    cells = frame.astype(object).where(frame.notna(), "")
    carriage_return = pd.Series(False, index=cells.index)
    for column in _text_columns(frame):
        values = cells[column]
        formula, has_cr = _flagged(values)
        carriage_return |= has_cr
        if formula.any() and not raw:
            cells.loc[formula, column] = "'" + values[formula]
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(frame.columns)
    if not carriage_return.any():
        writer.writerows(cells.itertuples(index=False, name=None))
        return buf.getvalue().encode("utf-8")
    # csv quotes a field only for the characters of its line terminator: with "\n" a bare CR stays
    # unquoted, and readers take it for the end of the row. Such rows are quoted as for "\r\n".
    quoting_cr = csv.writer(row_buf := io.StringIO(), lineterminator="\r\n")
    for row, has_cr in zip(cells.itertuples(index=False, name=None), carriage_return, strict=True):
        if has_cr:
            row_buf.seek(0)
            row_buf.truncate()
            quoting_cr.writerow(row)
            buf.write(row_buf.getvalue()[:-2] + "\n")
        else:
            writer.writerow(row)
    return buf.getvalue().encode("utf-8")


def write_report(store: Store, out: str | Path | BinaryIO, filters: Filters = NO_FILTERS,
                 kinds: Iterable[str] = KINDS, *, raw: bool = False, external_url: str | None = None) -> int:
    """Write the mismatch report CSV (formulas neutralised unless `raw`) to a file, or into a binary stream
    (`sys.stdout.buffer`); return the number of rows."""
    frame = mismatch_report(store, filters, kinds, external_url=external_url)
    write_bytes(out, report_csv(frame, raw=raw))
    return len(frame)


def write_bytes(out: str | Path | BinaryIO, data: bytes) -> None:
    """A CSV's bytes into a file, or into a stream (`sys.stdout.buffer`; a terminal's, cli.common.out_target)."""
    if isinstance(out, (str, Path)):
        Path(out).write_bytes(data)
    else:
        out.write(data)
        out.flush()
