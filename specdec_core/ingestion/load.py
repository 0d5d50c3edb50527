"""Load request logs into the store: validate in SQL, quarantine what breaks the contract, never lose a line.

Read = accepted + duplicates + quarantined, for every ingest. The identity and
fingerprint of each row are computed once here, over the distinct identity tuples,
from the library's own text for each field value (ingestion/identities.py), so the store
and the library cannot disagree.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from specdec_core import formats
from specdec_core.contract import fields as contract
from specdec_core.derived.hit_sources import judge_hits
from specdec_core.derived.incremental import BATCH_COPY_ROWS, update_derived
from specdec_core.derived.migrate import migrate_connection
from specdec_core.derived.summaries import build_summaries
from specdec_core.derived.verdicts import record_first_verdicts
from specdec_core.formats import object_store
from specdec_core.formats.files import (
    JSON_DOCUMENT_SUFFIXES,
    JSONL_SUFFIXES,
    PARQUET_SUFFIXES,
    LogReadError,
    refuse_wide_text,
    resolve_paths,
)
from specdec_core.formats.jsonl import first_line, foreign_inputs
from specdec_core.ingestion.identities import compute_identities, id_hash_sql
from specdec_core.ingestion.relations import BatchRelations
from specdec_core.ingestion.staging import NO_LINES, IngestLimits, Lines, set_aside, stage_file
from specdec_core.ingestion.validation import (
    MARKERS_SQL,
    NO_SHAPES,
    SOURCE_LINK_SQL,
    UNKNOWN_SQL,
    extra_shapes,
    extra_sql,
    field_index,
    field_text,
    field_type,
    layout_sql,
    other_values_sql,
    paths_literal,
    reason_sql,
    repeated_field_sql,
    text_in_texts,
    texts_type,
    typed_columns_sql,
    usual_layout_sql,
    values_sql,
)
from specdec_core.store.connection import WRITER_MEMORY_LIMIT_NATIVE, Store
from specdec_core.store.sql import deployment_label, deployment_partition, literal, scalar, sql_list


@dataclass(frozen=True)
class IngestResult:
    """read = accepted + duplicates + quarantined + skipped (entries of another format that are no requests)."""

    read: int
    accepted: int
    duplicates: int
    quarantined: int
    files: int
    ingest_id: int
    skipped: int = 0
    formats: tuple[tuple[str, str], ...] = ()  # (file, the format it was read as)

    @property
    def all_quarantined(self) -> bool:
        """Records were read and every one broke the contract: a failed load, not a small one."""
        return self.quarantined > 0 and self.accepted == 0 and self.duplicates == 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["formats"] = dict(self.formats)
        return out


# (steps done, steps total, what is under way): reading then checking each file, then the four
# steps over the whole batch, so a single large file still moves the bar.
ProgressCallback = Callable[[int, int, str], None]
_BATCH_STEPS = ("fingerprinting identities", "writing requests", "finding each hit's source", "summarising")


# A batch whose files are smaller than this is written on one DuckDB thread: its statements are tiny, most of
# the work is planning them and (on a lake) the catalog's queries, and a second thread only adds handing work
# over: a small lake batch on two threads took twice the CPU of one (figures: docs/benchmarks.md).
ONE_THREAD_BELOW = 1 << 20



def _content_columns() -> tuple[str, ...]:
    return (*contract.FIELD_NAMES, "extra", "unknown_fields", "source_link")


def _content_hash_sql(alias: str, prompt_hash: str) -> str:
    """A digest of a stored row's content; computed alike for new rows and loaded ones, only where ids repeat."""
    cols = [prompt_hash if c == "prompt_hash" else f"{alias}.{c}" for c in _content_columns()]
    return "md5(concat_ws(chr(31), " + ", ".join(f"coalesce(to_json({c})::VARCHAR, '~')" for c in cols) + "))"


def _validate(con: duckdb.DuckDBPyConnection, lines: Lines, source_file: str, checked: str, create: bool = False
              ) -> int:
    """Check every record of a file in one pass into `checked`: its typed columns, or why it is rejected.

    Blank lines are not records. Returns how many records the file holds.
    """
    shapes = extra_shapes(con, lines.sql, lines.count) if lines.count else NO_SHAPES
    paths, texts, extra = paths_literal(), texts_type(shapes), extra_sql(shapes)
    select = f"""
        WITH staging AS (
            SELECT seq, {literal(source_file)}::VARCHAR AS source_file, source_line, raw FROM ({lines.sql})
            WHERE raw IS NOT NULL AND (raw[1] = '{{' OR NOT regexp_full_match(raw, '\\s*'))
        ),
        -- A line that opens with '{{' is parsed once for its keys: NULL when it is not valid JSON. Only
        -- other lines (rare) pay for a validity check and a second parse.
        p AS (SELECT *, CASE WHEN raw[1] = '{{' THEN TRY(json_keys(raw)) END AS object_keys FROM staging),
        q AS (SELECT *, root IS NOT NULL AS valid FROM (
                SELECT *, CASE WHEN object_keys IS NOT NULL THEN 'OBJECT' WHEN raw[1] = '{{' THEN NULL
                               ELSE json_type(CASE WHEN json_valid(raw) THEN raw END) END AS root
                FROM p)),
        -- JSON functions are evaluated on every row of a vector: give the broken ones an empty object.
        o AS (SELECT *, CASE WHEN root = 'OBJECT' THEN raw ELSE '{{}}' END AS obj FROM q),
        -- Each field's text as json_extract_string gives it, in a struct: a field is taken from it at no cost,
        -- where indexing a list copies (and a list of texts cost 15% more of the check).
        lists AS (SELECT *, json_type(obj, {paths}) AS t, from_json(obj, {texts}) AS s FROM o),
        -- One column per field: list indexing inside every later expression would repeat the work.
        fields AS (SELECT seq, source_file, source_line, raw, valid, root, obj,
                          list_count(t) AS n_known,
                          coalesce(object_keys, json_keys(obj)) AS keys,
                          {", ".join(f"t[{i}] AS {field_type(n)}, {text_in_texts('s', n)} AS {field_text(n)}"
                                     for n, i in field_index().items())}
                          {other_values_sql(shapes, 's')}
                   FROM lists),
        counted AS (SELECT *, {usual_layout_sql(shapes.usual)} AS usual_layout FROM (
                        SELECT *, len(keys) AS n_keys, {MARKERS_SQL} AS n_markers FROM fields)),
        laid AS (SELECT *, {layout_sql(shapes)} AS layout FROM counted),
        vals AS (SELECT *, {values_sql()}, {UNKNOWN_SQL}, {SOURCE_LINK_SQL},
                        {repeated_field_sql()} AS repeated_field FROM laid),
        -- The raw text stays in the file's table: rejected rows are joined back to it by seq.
        verdict AS (
            SELECT seq, source_file, source_line, {extra} AS extra, unknown_fields, source_link,
                   {", ".join(f"f_{n}" for n in contract.FIELD_NAMES)},
                   {reason_sql()} AS reason,
                   CASE WHEN {field_type('request_id')} = 'VARCHAR' THEN {field_text('request_id')} END AS raw_request_id
            FROM vals
        ),
        typed_rows AS (
            SELECT seq, source_file, source_line, reason, raw_request_id, {typed_columns_sql()} FROM verdict
        )
        SELECT *, {id_hash_sql()} AS id_hash FROM typed_rows
    """
    if create:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {checked} AS {select}")
        return 0
    return con.execute(f"INSERT INTO {checked} {select}").fetchall()[0][0]


# `checked`'s columns as DDL, once per contract in a process: planning the check is costly.
_checked_columns: dict[contract.Contract, list[str]] = {}


def _create_work_tables(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> None:
    # Validating no lines creates `checked` with the column types the SQL produces (the first time; then
    # from those types); the rows that pass are `typed`.
    columns = _checked_columns.get(contract.current())
    if columns:
        con.execute(f"CREATE OR REPLACE TEMP TABLE {rel.checked} ({', '.join(columns)})")
    else:
        _validate(con, NO_LINES, "", rel.checked, create=True)
        _checked_columns[contract.current()] = [f'"{name}" {kind}' for name, kind, *_
                                                in con.execute(f"DESCRIBE {rel.checked}").fetchall()]
    con.execute(f"CREATE OR REPLACE TEMP VIEW {rel.typed} AS SELECT * FROM {rel.checked} WHERE reason IS NULL")


def _drop_work_tables(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> None:
    for view in rel.views():
        con.execute(f"DROP VIEW IF EXISTS {view}")
    for table in rel.tables():
        con.execute(f"DROP TABLE IF EXISTS temp.{table}")


def _raws_view(con: duckdb.DuckDBPyConnection, staged: list[Lines], raws: str) -> None:
    """`raws` (seq, raw, origin): the text of every staged line, to quote rejected records exactly; for
    another log format, where the record's input is on its line (quoted instead, see _quote_inputs)."""
    parts = [f"SELECT {s.first_seq} + {s.row_index} AS seq, raw, {s.origin_sql} AS origin FROM {s.table}"
             for s in staged]
    con.execute(f"CREATE OR REPLACE TEMP VIEW {raws} AS " + " UNION ALL ".join(
        parts or ["SELECT NULL::BIGINT AS seq, NULL::VARCHAR AS raw, NULL::INTEGER AS origin LIMIT 0"]))


def _quote_inputs(con: duckdb.DuckDBPyConnection, inputs: dict[str, tuple[Path, Any, int]], rel: BatchRelations
                  ) -> None:
    """Rejected records of another log format are quoted as their input (the span with its resource, the
    payload line), not as the contract record made from it: read again from the file, for these alone.

    `inputs`: source_file -> (the file read, the format's line reader, its lines before this part).
    """
    rows = con.execute(f"SELECT b.seq, b.source_file, b.source_line, r.origin FROM {rel.bad} b "
                       f"JOIN {rel.raws} r USING (seq) WHERE r.origin IS NOT NULL").fetchall()
    if not rows:
        return
    wanted: dict[str, dict[int, list[int]]] = {}
    for _, source_file, line, origin in rows:  # lines of the file read (a followed part starts at 1)
        wanted.setdefault(source_file, {}).setdefault(line - inputs[source_file][2], []).append(origin)
    found = {f: foreign_inputs(inputs[f][0], f, inputs[f][1], lines) for f, lines in wanted.items()}
    con.register("quotes_arrow", pa.table({
        "seq": pa.array([r[0] for r in rows], pa.int64()),
        "quote": pa.array([found[f][(line - inputs[f][2], origin)] for _, f, line, origin in rows], pa.string()),
    }))
    con.execute(f"UPDATE {rel.bad} b SET raw = q.quote, raw_hash = md5(q.quote) FROM quotes_arrow q WHERE b.seq = q.seq")
    con.unregister("quotes_arrow")


def _classify(con: duckdb.DuckDBPyConnection, join: str, rel: BatchRelations) -> None:
    """`outcome`: that of the rows whose request_id repeats, in this batch or against the store; the first one wins.

    `join`: the condition that joins `typed t` to `idmap m`."""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {rel.contested} AS
        SELECT request_id FROM {rel.typed} GROUP BY request_id HAVING count(*) > 1
        UNION SELECT DISTINCT t.request_id FROM {rel.typed} t JOIN requests r USING (request_id)
    """)
    if not scalar(con, f"SELECT count(*) FROM {rel.contested}"):  # every id is new: nothing to tell apart
        con.execute(f"CREATE OR REPLACE TEMP TABLE {rel.outcome} AS SELECT seq, NULL::VARCHAR AS outcome "
                    f"FROM {rel.typed} LIMIT 0")
        return
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {rel.outcome} AS
        WITH ok AS (
            SELECT t.seq, t.request_id, t.source_file, t.source_line,
                   {_content_hash_sql('t', 'm.prompt_sha')} AS content_hash
            FROM {rel.typed} t JOIN {rel.idmap} m ON {join}
            WHERE t.request_id IN (SELECT request_id FROM {rel.contested})
        ), firsts AS (
            SELECT request_id, min(seq) AS first_seq, arg_min(content_hash, seq) AS first_hash,
                   arg_min(source_file || ':' || source_line, seq) AS first_at
            FROM ok GROUP BY request_id
        ), ex AS (
            SELECT r.request_id, {_content_hash_sql('r', 'r.prompt_hash')} AS content_hash,
                   r.source_file || ':' || r.source_line AS loaded_at
            FROM requests r WHERE r.request_id IN (SELECT request_id FROM {rel.contested})
        )
        SELECT ok.seq,
          CASE
            WHEN ex.content_hash = ok.content_hash THEN 'duplicate'
            WHEN ex.content_hash IS NOT NULL THEN 'conflict: request_id ' || ok.request_id
                 || ' was loaded before from ' || ex.loaded_at || ' with different content'
            WHEN ok.seq = f.first_seq THEN 'accept'
            WHEN ok.content_hash = f.first_hash THEN 'duplicate'
            ELSE 'conflict: request_id ' || ok.request_id || ' appears earlier at ' || f.first_at
                 || ' with different content'
          END AS outcome
        FROM ok JOIN firsts f USING (request_id) LEFT JOIN ex USING (request_id)
    """)


def _commit(con: duckdb.DuckDBPyConnection, ingest_id: int, join: str, inputs: dict[str, tuple[Path, Any, int]],
            rel: BatchRelations) -> tuple[int, int]:
    """Insert the accepted rows of `typed`; quarantine the rejects of `checked` and the conflicts of `outcome`
    (into `bad`, then `bad_new`). Returns how many rows were accepted and quarantined."""
    columns = ", ".join("m.prompt_sha" if c == "prompt_hash" else f"t.{c}" for c in _content_columns())
    names = ", ".join([*_content_columns(), "fingerprint", "cached_identity_fingerprint", "source_file", "source_line",
                       "ingest_id"])
    accepted = con.execute(f"""
        INSERT INTO requests ({names})
        SELECT {columns}, m.fingerprint, cm.fingerprint, t.source_file, t.source_line, {int(ingest_id)}
        FROM {rel.typed} t
        JOIN {rel.idmap} m ON {join}
        LEFT JOIN {rel.outcome} o USING (seq)
        LEFT JOIN {rel.cachedmap} cm ON cm.text = t.cached_fingerprint::VARCHAR
        WHERE coalesce(o.outcome, 'accept') = 'accept'
    """).fetchall()[0][0]
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {rel.bad} AS
        WITH b AS (
            SELECT seq, source_file, source_line, raw_request_id AS request_id, reason
            FROM {rel.checked} WHERE reason IS NOT NULL
            UNION ALL
            SELECT t.seq, t.source_file, t.source_line, t.request_id, o.outcome
            FROM {rel.typed} t JOIN {rel.outcome} o USING (seq) WHERE o.outcome LIKE 'conflict:%'
        )
        SELECT b.*, r.raw, md5(r.raw) AS raw_hash FROM b JOIN {rel.raws} r USING (seq)
    """)
    _quote_inputs(con, inputs, rel)
    _keep_new_rejects(con, rel)
    con.execute(f"""
        INSERT INTO quarantine
        SELECT {int(ingest_id)}, source_file, source_line, request_id, reason, raw, raw_hash FROM {rel.bad_new}
    """)
    quarantined = scalar(con, f"SELECT count(*) FROM {rel.bad_new}")
    return accepted, quarantined


def _keep_new_rejects(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> None:
    """`bad_new`: the rejects of `bad` not quarantined before, by content (text and line number), not by path.

    The same file uploaded again, or copied elsewhere, arrives under another path each time; it is
    the same evidence and is quarantined once, as a duplicate the second time.
    """
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {rel.bad_new} AS
        SELECT * FROM {rel.bad} WHERE seq IN (
            SELECT min(b.seq) FROM {rel.bad} b
            WHERE NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.source_line = b.source_line AND q.raw_hash = b.raw_hash)
            GROUP BY b.source_line, b.raw_hash)
    """)


def ingest(
    store: Store,
    paths: list[str],
    progress: ProgressCallback | None = None,
    limits: IngestLimits | None = None,
    log_format: str = "auto",
    mapping: formats.Mapping | None = None,
    parts: Mapping[Path, tuple[str, int]] | None = None,
    before_commit: Callable[[duckdb.DuckDBPyConnection, int], None] | None = None,
) -> IngestResult:
    """Validate and load log files; all of them become visible at once, or none on error.

    `limits`: what one record may cost (default: `IngestLimits.from_env()`).
    `log_format`: "auto" (decided per file from its first record) or one of formats.FORMATS;
    `mapping` (formats.load_mapping) reads every file through a mapping file instead.
    `parts`: files that hold a part of another file (a followed log's new lines): resolved path ->
    (that file's name, the number of its lines before this part), which the rows record instead.
    `before_commit(con, ingest_id)`: more writes that must land with this batch or not at all.
    """
    if any(object_store.is_s3(p) for p in paths):  # fetched through httpfs, rows recorded under their URLs
        with object_store.fetched(paths) as (local, names):
            return ingest(store, local, progress, limits, log_format, mapping, {**names, **(parts or {})},
                          before_commit)
    parts = parts or {}
    limits = limits or IngestLimits.from_env()
    files = resolve_paths(paths)  # raises LogReadError before anything is written
    chosen = [(f, file_format(f, log_format, mapping)) for f in files]
    # What each file is called in the ingest's record and result: itself, or the log a part came from.
    shown = [parts[f.resolve()][0] if f.resolve() in parts else str(f) for f in files]

    small = sum(f.stat().st_size for f in files) < ONE_THREAD_BELOW

    def load(con: duckdb.DuckDBPyConnection) -> IngestResult:
        if small:
            con.execute("SET threads = 1")  # the instance's own (a kept lake writer's: until its next write)
        migrate_connection(con)  # an older store's derived tables first, so this batch is judged alike
        ingest_id = scalar(con, "SELECT coalesce(max(ingest_id), 0) + 1 FROM ingests")
        stored_before = scalar(con, "SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)") > 0
        rel = BatchRelations()
        _create_work_tables(con, rel)
        # DuckDB's own reader leaves it more memory; a Python reader lowers it again (staging._python_reads).
        con.execute(f"SET memory_limit = '{WRITER_MEMORY_LIMIT_NATIVE}'")
        read = 0
        staged: list[Lines] = []
        inputs: dict[str, tuple[Path, Any, int]] = {}  # files of another format: to quote their rejects
        total = 2 * len(files) + len(_BATCH_STEPS)
        step = iter(range(total + 1))

        def say(what: str) -> None:
            if progress:
                progress(next(step), total, what)

        for n, (f, fmt) in enumerate(chosen):
            say(f"reading {f.name}")
            name, line_offset = parts.get(f.resolve(), (str(f.resolve()), 0))
            first_seq = staged[-1].first_seq + staged[-1].count if staged else 0
            reader = None if fmt == "contract" else formats.line_reader(fmt, mapping)
            if reader is not None:
                inputs[name] = (f, reader, line_offset)
            staged.append(stage_file(con, f, f"lines_{n}", first_seq, limits, reader, line_offset))
            # From here each row carries its seq and line: the checks, the writes and the summaries run
            # in whatever order DuckDB's threads take, which is faster (figures: docs/benchmarks.md).
            con.execute("SET preserve_insertion_order = false")
            say(f"checking {f.name}")
            rest, n_aside = set_aside(con, staged[-1], name, limits, rel.checked)
            read += n_aside + _validate(con, rest, name, rel.checked) + staged[-1].skipped
        skipped = sum(s.skipped for s in staged)
        _raws_view(con, staged, rel.raws)
        backfilled = _backfill_cache_keys(con, rel)
        say(_BATCH_STEPS[0])
        join = compute_identities(con, rel)
        _classify(con, join, rel)
        say(_BATCH_STEPS[1])
        accepted, quarantined = _commit(con, ingest_id, join, inputs, rel)
        # The rejects are quoted: the lines' text, as large as the files, would only crowd the judging.
        con.execute(f"DROP VIEW {rel.raws}")
        for lines in staged:
            con.execute(f"DROP TABLE {lines.table}")
        say(_BATCH_STEPS[2])
        if accepted and not stored_before:
            judge_hits(con)
            say(_BATCH_STEPS[3])
            build_summaries(con)
            record_first_verdicts(con, ingest_id)
        else:
            if accepted or backfilled:  # only what the batch may have changed: its cost follows the batch
                update_derived(con, ingest_id, rel.backfilled,  # with the first verdicts among what it judged
                               copy_rows=store.lake is not None and accepted <= BATCH_COPY_ROWS)
            say(_BATCH_STEPS[3])
        duplicates = read - accepted - quarantined - skipped
        con.execute(f"INSERT INTO ingests VALUES ({int(ingest_id)}, now(), {sql_list(shown, 'VARCHAR')}, "
                    f"{int(read)}, {int(accepted)}, {int(duplicates)}, {int(quarantined)})")
        if before_commit is not None:
            before_commit(con, ingest_id)
        _drop_work_tables(con, rel)
        con.execute("SET preserve_insertion_order = true")  # as it was: a lake's writer serves the next write too
        say("done")
        return IngestResult(read, accepted, duplicates, quarantined, len(files), ingest_id, skipped,
                            tuple(zip(shown, (fmt for _, fmt in chosen), strict=True)))

    # On a shared store another machine may commit first: the batch is then read and judged again on the
    # state it left, so the result equals loading the two one after the other.
    return store.transact(load)


def file_format(path: Path, log_format: str, mapping: formats.Mapping | None) -> str:
    """The format a file is read as: the mapping's, the one asked for, or (auto) what its first record shows.

    CSV and Parquet files hold contract records only.
    """
    if log_format not in ("auto", *formats.FORMATS, formats.LIVE_FORMAT):
        raise ValueError(f"--format: unknown format {log_format!r}; expected auto, {', '.join(formats.FORMATS)}")
    jsonl = path.name.lower().endswith(JSONL_SUFFIXES + JSON_DOCUMENT_SUFFIXES)
    if not path.name.lower().endswith(PARQUET_SUFFIXES):
        refuse_wide_text(path)
    if mapping is not None or log_format not in ("auto", "contract"):
        if not jsonl:
            raise LogReadError(f"{path}: only JSON Lines files can be read as {'a mapping' if mapping else log_format}")
        return "map" if mapping is not None else log_format
    if log_format == "contract" or not jsonl:
        return "contract"
    return formats.detect(first_line(path) or "")


def _backfill_cache_keys(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> int:
    """A miss whose log has no cache key (LiteLLM logs none on a miss) takes the key of the hits it sourced.

    Whichever arrives first: the batch's misses (in `checked`) take it from stored hits, stored misses from the
    batch's hits (those are kept in `backfilled`, as they now are: their keys' hits are judged again,
    derived/incremental.py). Of several hits naming one miss, the earliest (then the first logged) gives the
    key. Returns how many stored misses got a key.
    """
    valid_hits = "reason IS NULL AND cache_hit AND source_link IS NOT NULL AND cache_key IS NOT NULL"
    keyless = f"SELECT request_id FROM {rel.checked} WHERE reason IS NULL AND NOT cache_hit AND cache_key IS NULL"
    # The stored hits are read only for a batch with keyless misses: the search scans every stored hit's link
    # (0.17 s of a follow's write at 20M rows), to find nothing in a log that keys its misses.
    stored_hits = "" if not scalar(con, f"SELECT count(*) FROM ({keyless} LIMIT 1)") else f"""
            UNION ALL
            SELECT source_link, cache_key, ts, source_file, source_line FROM requests
            WHERE cache_hit AND source_link IS NOT NULL AND cache_key IS NOT NULL AND source_link IN ({keyless})"""
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {rel.links} AS
        SELECT source_link, arg_min(cache_key, (ts, source_file, source_line)) AS key FROM (
            SELECT source_link, cache_key, ts, source_file, source_line FROM {rel.checked} WHERE {valid_hits}{stored_hits}
        ) GROUP BY 1
    """)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {rel.backfilled} AS SELECT c.request_id, c.ts, {deployment_partition('c')} "
                f"AS dep, {deployment_label('c')} AS deployment, h.key AS cache_key, c.cache_hit, c.fingerprint, "
                "c.source_file, c.source_line FROM requests c "
                f"JOIN {rel.links} h ON c.request_id = h.source_link WHERE c.cache_key IS NULL")
    if not scalar(con, f"SELECT count(*) FROM {rel.links}"):
        return 0
    for table in (rel.checked, "requests"):
        reject = "c.reason IS NULL AND " if table == rel.checked else ""
        con.execute(f"""
            UPDATE {table} c SET cache_key = h.key,
                   unknown_fields = nullif(list_filter(c.unknown_fields, lambda x: x <> 'cache_key'), [])
            FROM {rel.links} h
            WHERE {reject}c.request_id = h.source_link AND c.cache_key IS NULL
        """)
    return scalar(con, f"SELECT count(*) FROM {rel.backfilled}")
