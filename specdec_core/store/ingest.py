"""Load request logs into the store: validate in SQL, quarantine what breaks the contract, never lose a line.

Read = accepted + duplicates + quarantined, for every ingest. The identity and
fingerprint of each row are computed once here, by `request.identity` itself over
the distinct identity tuples, so the store and the library cannot disagree.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import duckdb
import pyarrow as pa

from specdec_core.contract import fields as contract
from specdec_core.contract.identity import (
    DecodeRequest,
    canonical_json,
    canonicalize_identity,
    identity_json,
    sha256_hex,
)
from specdec_core.store.connection import Store, scalar
from specdec_core.store.hit_sources import judge_hits
from specdec_core.store.migrate import migrate_connection
from specdec_core.store.readers import JSONL_SUFFIXES, duckdb_literal_path, read_file, resolve_paths
from specdec_core.store.summaries import build_summaries
from specdec_core.store.validation import (
    _INDEX,
    EXTRA_SQL,
    FIELD_NAMES,
    REPEATED_FIELD,
    field_text,
    field_type,
    paths_literal,
    reason_sql,
    typed_columns_sql,
    values_sql,
)


@dataclass(frozen=True)
class IngestResult:
    read: int
    accepted: int
    duplicates: int
    quarantined: int
    files: int
    ingest_id: int

    def to_json(self) -> dict[str, int]:
        return asdict(self)


@dataclass(frozen=True)
class IngestLimits:
    """What one record may cost; a record past either limit is quarantined with why, and the rest loads.

    Without them one record can take the whole ingest down: checking a 40 MB line runs DuckDB out
    of memory, as does one with thousands of fields. 16 MiB and 1,000 fields sit far above any
    real request log line and far below what the checks need 1 GB for.
    """

    max_record_bytes: int = 16 * 1024 * 1024
    max_fields: int = 1000

    @classmethod
    def from_env(cls) -> IngestLimits:
        """The defaults, or $SPECDEC_MAX_RECORD_BYTES and $SPECDEC_MAX_FIELDS where set."""
        values = {}
        for field, var in (("max_record_bytes", "SPECDEC_MAX_RECORD_BYTES"), ("max_fields", "SPECDEC_MAX_FIELDS")):
            text = os.environ.get(var)
            if text:
                try:
                    values[field] = int(text)
                except ValueError:
                    raise ValueError(f"${var}: expected a whole number, got {text!r}") from None
                if values[field] < 1:
                    raise ValueError(f"${var}: expected a number >= 1, got {text!r}")
        return cls(**values)


def _bytes_text(n: int) -> str:
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


# (steps done, steps total, what is under way): reading then checking each file, then the four
# steps over the whole batch, so a single large file still moves the bar.
ProgressCallback = Callable[[int, int, str], None]
_BATCH_STEPS = ("fingerprinting identities", "writing requests", "finding each hit's source", "summarising")


_CONTENT_COLUMNS = (*contract.FIELD_NAMES, "extra")
_IDENTITY_INPUT = contract.IDENTITY_INPUT


def _content_hash_sql(alias: str, prompt_hash: str) -> str:
    """A digest of a stored row's content; computed alike for new rows and loaded ones, only where ids repeat."""
    cols = [prompt_hash if c == "prompt_hash" else f"{alias}.{c}" for c in _CONTENT_COLUMNS]
    return "md5(concat_ws(chr(31), " + ", ".join(f"coalesce(to_json({c})::VARCHAR, '~')" for c in cols) + "))"


# DuckDB's hash function makes the join an equi-join; the exact comparison after it rules out collisions.
_ID_HASH = f"hash({', '.join(_IDENTITY_INPUT)})"  # DuckDB's hash, within one ingest
_ID_JOIN = "t.id_hash = m.id_hash"
# Only needed when two distinct identity tuples share a hash (checked per ingest): then the exact match decides.
_ID_JOIN_EXACT = _ID_JOIN + " AND " + " AND ".join(f"t.{c} IS NOT DISTINCT FROM m.{c}" for c in _IDENTITY_INPUT)


# DuckDB reads JSON Lines as raw lines, in parallel and in file order (insertion order is kept, so a
# row's rowid is its line number - 1); the separator is a control character, so a line holding one
# fails the strict read and the file is read by the Python reader instead, which takes anything.
# So does a line past the size limit: the Python reader hands it over for quarantine.
_RAW_LINES_SQL = (
    "CREATE OR REPLACE TEMP TABLE {table} AS SELECT raw FROM read_csv(?, columns = {{'raw': 'VARCHAR'}}, "
    "delim = chr(1), quote = '', escape = '', header = false, auto_detect = false, strict_mode = true, "
    "max_line_size = {max_line_size})"
)


@dataclass(frozen=True)
class _Lines:
    """One file's lines in a temp table, listed by `sql` as (seq, source_line, raw, pre_reason)."""

    table: str
    first_seq: int
    count: int  # rows in the table, blank lines included: the seq values this file uses
    sql: str


def _lines_end_in_newlines(path: Path) -> bool:
    """Whether DuckDB's line reader would split this file where we do, at LF only.

    DuckDB takes a lone CR for the line end when the file shows no LF early on; where it has
    both, the strict read fails and the Python reader takes over, as it should.
    """
    try:
        with (gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")) as fh:
            sample = fh.read(1 << 20)
    except (OSError, EOFError, zlib.error):
        return True  # DuckDB's read fails as well, and the Python reader says what is wrong
    return b"\n" in sample or b"\r" not in sample


def _stage_file(con: duckdb.DuckDBPyConnection, path: Path, table: str, first_seq: int,
                limits: IngestLimits) -> _Lines:
    """Load a file's lines or records, as they were, into the temp table `table`."""
    name = str(path.resolve())
    if path.name.lower().endswith(JSONL_SUFFIXES) and _lines_end_in_newlines(path):
        try:
            with duckdb_literal_path(path) as literal:
                con.execute(_RAW_LINES_SQL.format(table=table, max_line_size=limits.max_record_bytes), [literal])
        except duckdb.InterruptException:
            raise
        except duckdb.Error:
            pass  # not clean UTF-8 text, a control character in a line, a huge line: the Python reader copes
        else:
            count = scalar(con, f"SELECT count(*) FROM {table}")
            return _Lines(table, first_seq, count, f"SELECT {first_seq} + rowid AS seq, rowid + 1 AS source_line, "
                                                   f"raw, NULL::VARCHAR AS pre_reason FROM {table}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (source_line BIGINT, raw VARCHAR, pre_reason VARCHAR)")
    for chunk in read_file(path, resolved_name=name):
        reasons = chunk.reasons if chunk.reasons is not None else [None] * len(chunk.raws)
        con.register("chunk_arrow", pa.table({"source_line": pa.array(chunk.line_numbers, pa.int64()),
                                              "raw": pa.array(chunk.raws, pa.string()),
                                              "pre_reason": pa.array(reasons, pa.string())}))
        con.execute(f"INSERT INTO {table} SELECT * FROM chunk_arrow")
        con.unregister("chunk_arrow")
    count = scalar(con, f"SELECT count(*) FROM {table}")
    return _Lines(table, first_seq, count,
                  f"SELECT {first_seq} + rowid AS seq, source_line, raw, pre_reason FROM {table}")


def _set_aside(con: duckdb.DuckDBPyConnection, lines: _Lines, source_file: str, limits: IngestLimits
               ) -> tuple[_Lines, int]:
    """Reject, into `checked`, the records the JSON checks must not see: too large, too wide, or already judged.

    Returns the file's lines without those, and how many there were. Only lines long enough to
    hold more fields than allowed (each takes at least 5 bytes, `"":0,`) are parsed here.
    """
    wide_from = 5 * limits.max_fields
    rows = con.execute(f"""
        SELECT seq, source_line, pre_reason, size, n_fields FROM (
            SELECT seq, source_line, pre_reason, strlen(raw) AS size,
                   CASE WHEN pre_reason IS NOT NULL OR strlen(raw) > {limits.max_record_bytes} THEN NULL
                        WHEN strlen(raw) > {wide_from} AND json_valid(raw) AND json_type(raw) = 'OBJECT'
                        THEN len(json_keys(raw)) END AS n_fields
            FROM ({lines.sql}) WHERE raw IS NOT NULL
        ) WHERE pre_reason IS NOT NULL OR size > {limits.max_record_bytes} OR n_fields > {limits.max_fields}
    """).fetchall()
    if not rows:
        return lines, 0
    limit_text = _bytes_text(limits.max_record_bytes)
    reasons = [pre or (f"record too large: {size:,} bytes (limit {limit_text})" if size > limits.max_record_bytes
                       else f"too many fields: {n_fields} (limit {limits.max_fields})")
               for _, _, pre, size, n_fields in rows]
    aside = f"{lines.table}_aside"
    con.register("aside_arrow", pa.table({"seq": pa.array([r[0] for r in rows], pa.int64()),
                                          "source_line": pa.array([r[1] for r in rows], pa.int64()),
                                          "reason": pa.array(reasons, pa.string())}))
    con.execute(f"CREATE OR REPLACE TEMP TABLE {aside} AS SELECT * FROM aside_arrow")
    con.unregister("aside_arrow")
    con.execute(f"INSERT INTO checked (seq, source_file, source_line, reason) "
                f"SELECT seq, ?, source_line, reason FROM {aside}", [source_file])
    rest = replace(lines, sql=f"SELECT * FROM ({lines.sql}) WHERE seq NOT IN (SELECT seq FROM {aside})")
    return rest, len(rows)


_NO_LINES = _Lines("", 0, 0, "SELECT NULL::BIGINT AS seq, NULL::BIGINT AS source_line, NULL::VARCHAR AS raw, "
                             "NULL::VARCHAR AS pre_reason LIMIT 0")


def _validate(con: duckdb.DuckDBPyConnection, lines: _Lines, source_file: str, create: bool = False) -> int:
    """Check every record of a file in one pass into `checked`: its typed columns, or why it is rejected.

    Blank lines are not records. Returns how many records the file holds.
    """
    paths = paths_literal()
    select = f"""
        WITH staging AS (
            SELECT seq, ?::VARCHAR AS source_file, source_line, raw FROM ({lines.sql})
            WHERE raw IS NOT NULL AND (raw[1] = '{{' OR NOT regexp_full_match(raw, '\\s*'))
        ),
        p AS (SELECT *, json_valid(raw) AS valid FROM staging),
        -- Valid JSON that opens with '{{' is an object; only other lines pay for a second parse.
        q AS (SELECT *, CASE WHEN NOT valid THEN NULL WHEN raw[1] = '{{' THEN 'OBJECT'
                             ELSE json_type(CASE WHEN valid THEN raw ELSE '{{}}' END) END AS root
              FROM p),
        -- JSON functions are evaluated on every row of a vector: give the broken ones an empty object.
        o AS (SELECT *, CASE WHEN root = 'OBJECT' THEN raw ELSE '{{}}' END AS obj FROM q),
        lists AS (SELECT *, json_type(obj, {paths}) AS t, json_extract_string(obj, {paths}) AS s FROM o),
        -- One column per field: list indexing inside every later expression would repeat the work.
        fields AS (SELECT seq, source_file, source_line, raw, valid, root, obj,
                          len(list_filter(t, lambda x: x IS NOT NULL)) AS n_known, len(json_keys(obj)) AS n_keys,
                          {", ".join(f"t[{i}] AS {field_type(n)}, s[{i}] AS {field_text(n)}" for n, i in _INDEX.items())}
                   FROM lists),
        vals AS (SELECT *, {values_sql()},
                        CASE WHEN n_keys > n_known THEN {REPEATED_FIELD} END AS repeated_field FROM fields),
        -- The raw text stays in the file's table: rejected rows are joined back to it by seq.
        verdict AS (
            SELECT seq, source_file, source_line, {EXTRA_SQL} AS extra, {", ".join(f"f_{n}" for n in FIELD_NAMES)},
                   {reason_sql()} AS reason,
                   CASE WHEN {field_type('request_id')} = 'VARCHAR' THEN {field_text('request_id')} END AS raw_request_id
            FROM vals
        ),
        typed_rows AS (
            SELECT seq, source_file, source_line, reason, raw_request_id, {typed_columns_sql()} FROM verdict
        )
        SELECT *, {_ID_HASH} AS id_hash FROM typed_rows
    """
    if create:
        con.execute(f"CREATE OR REPLACE TEMP TABLE checked AS {select}", [source_file])
        return 0
    return con.execute(f"INSERT INTO checked {select}", [source_file]).fetchall()[0][0]


def _create_work_tables(con: duckdb.DuckDBPyConnection) -> None:
    # Validating no lines creates `checked` with the column types the SQL produces; the rows that
    # pass are `typed`.
    _validate(con, _NO_LINES, "", create=True)
    con.execute("CREATE OR REPLACE TEMP VIEW typed AS SELECT * FROM checked WHERE reason IS NULL")


def _raws_view(con: duckdb.DuckDBPyConnection, staged: list[_Lines]) -> None:
    """`raws` (seq, raw): the text of every staged line, to quote rejected records exactly."""
    parts = [f"SELECT {s.first_seq} + rowid AS seq, raw FROM {s.table}" for s in staged]
    con.execute("CREATE OR REPLACE TEMP VIEW raws AS " + " UNION ALL ".join(parts or ["SELECT NULL::BIGINT AS seq, NULL::VARCHAR AS raw LIMIT 0"]))


def _compute_identities(con: duckdb.DuckDBPyConnection) -> str:
    """Fingerprint every distinct identity tuple with `request.identity` into `idmap` (or say why not).

    Returns the condition that joins `typed t` to `idmap m`.
    """
    cols = ", ".join(_IDENTITY_INPUT)
    tuples = con.execute(f"SELECT DISTINCT {cols}, id_hash FROM typed").fetchall()
    fps: list[str | None] = []
    prompt_shas: list[str | None] = []
    reasons: list[str | None] = []
    identity_rows: dict[str, str] = {}  # fingerprint -> canonical identity JSON
    for row in tuples:
        try:
            req = DecodeRequest.from_record(dict(zip(_IDENTITY_INPUT, row[:-1], strict=True)))
            text = identity_json(req)  # canonical_json(identity(req)), pinned equal by test_request
        except ValueError as exc:
            fps.append(None)
            prompt_shas.append(None)
            reasons.append(str(exc))
            continue
        fp = sha256_hex(text)
        fps.append(fp)
        prompt_shas.append(req.prompt_sha256)
        reasons.append(None)
        identity_rows[fp] = text
    columns = {c: [row[i] for row in tuples] for i, c in enumerate(_IDENTITY_INPUT)}
    columns["id_hash"] = [row[-1] for row in tuples]
    join = _ID_JOIN if len(set(columns["id_hash"])) == len(tuples) else _ID_JOIN_EXACT
    con.execute(f"CREATE OR REPLACE TEMP TABLE idmap AS SELECT {cols}, id_hash, NULL::VARCHAR AS fingerprint, "
                "NULL::VARCHAR AS prompt_sha, NULL::VARCHAR AS reject_reason FROM typed LIMIT 0")
    if tuples:
        for c in _HUGEINT_INPUT:
            columns[c] = _as_text(columns[c])
        con.register("idmap_arrow", pa.table({**{c: pa.array(v, type=_arrow_type(c))
                                                   for c, v in columns.items()},
                                                "fingerprint": fps, "prompt_sha": prompt_shas,
                                                "reject_reason": reasons}))
        typed_cols = ", ".join(f"{c}::HUGEINT" if c in _HUGEINT_INPUT else c for c in _IDENTITY_INPUT)
        con.execute(f"INSERT INTO idmap SELECT {typed_cols}, id_hash, fingerprint, prompt_sha, "
                    "reject_reason FROM idmap_arrow")
        con.unregister("idmap_arrow")
    # cached_fingerprint objects are canonicalised too, so a writer's spelling of an equivalence can't matter.
    cached = con.execute(
        "SELECT DISTINCT cached_fingerprint::VARCHAR FROM typed WHERE cached_fingerprint IS NOT NULL"
    ).fetchall()
    cached_texts, cached_fps = [], []
    for (text,) in cached:
        try:
            obj = canonicalize_identity(json.loads(text))
        except (ValueError, TypeError, KeyError):
            continue  # not an identity object we can read: the row keeps it, the guard can't use it
        canonical = canonical_json(obj)
        fp = sha256_hex(canonical)
        cached_texts.append(text)
        cached_fps.append(fp)
        identity_rows[fp] = canonical
    con.register("cachedmap_arrow", pa.table({"text": pa.array(cached_texts, pa.string()),
                                              "fingerprint": pa.array(cached_fps, pa.string())}))
    con.execute("CREATE OR REPLACE TEMP TABLE cachedmap AS SELECT * FROM cachedmap_arrow")
    con.unregister("cachedmap_arrow")
    _insert_identities(con, identity_rows)
    return join


def _arrow_type(column: str) -> pa.DataType | None:
    # HUGEINT values (seeds) go through text: Arrow has no 128-bit integer.
    if column == "id_hash":
        return pa.uint64()
    f = contract.BY_NAME[column]
    return pa.string() if f.sql_type == "HUGEINT" else pa.list_(pa.string()) if f.kind == "str_list" else None


def _as_text(values: list) -> list:
    return [None if v is None else str(v) for v in values]


_HUGEINT_INPUT = tuple(c for c in _IDENTITY_INPUT if contract.BY_NAME[c].sql_type == "HUGEINT")
_IDENTITY_FIELDS = tuple(f for f in contract.FIELDS if f.identity)


def _identity_column(f: contract.Field, objs: list[dict]) -> pa.Array | list:
    values = [o.get(f.name) for o in objs]
    if f.canonical == "string_set":
        return [json.dumps(v, ensure_ascii=False) for v in values]  # the canonical set as JSON text
    if f.sql_type == "HUGEINT":
        return pa.array(_as_text(values), pa.string())
    return values


def _insert_identities(con: duckdb.DuckDBPyConnection, rows: dict[str, str]) -> None:
    if not rows:
        return
    objs = [json.loads(text) for text in rows.values()]
    table = pa.table({
        "fingerprint": list(rows),
        "identity": list(rows.values()),
        # A greedy identity leaves the sampling-only fields out.
        "greedy": [not any(name in o for name in contract.SAMPLING_ONLY_FIELDS) for o in objs],
        **{f.name: _identity_column(f, objs) for f in _IDENTITY_FIELDS},
    })
    names = ["fingerprint", "identity", "greedy", *(f.name for f in _IDENTITY_FIELDS)]
    values = ["fingerprint", "identity::JSON", "greedy",
              *(f"{f.name}::HUGEINT" if f.sql_type == "HUGEINT" else f.name for f in _IDENTITY_FIELDS)]
    con.register("identities_arrow", table)
    con.execute(f"INSERT OR IGNORE INTO identities ({', '.join(names)}) SELECT {', '.join(values)} "
                "FROM identities_arrow")
    con.unregister("identities_arrow")


def _classify(con: duckdb.DuckDBPyConnection, join: str) -> None:
    """Outcome of the rows whose request_id repeats, in this batch or against the store; the first one wins."""
    con.execute("""
        CREATE OR REPLACE TEMP TABLE contested AS
        SELECT request_id FROM typed GROUP BY request_id HAVING count(*) > 1
        UNION SELECT DISTINCT t.request_id FROM typed t JOIN requests r USING (request_id)
    """)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE outcome AS
        WITH ok AS (
            SELECT t.seq, t.request_id, t.source_file, t.source_line,
                   {_content_hash_sql('t', 'm.prompt_sha')} AS content_hash
            FROM typed t JOIN idmap m ON {join}
            WHERE m.reject_reason IS NULL AND t.request_id IN (SELECT request_id FROM contested)
        ), firsts AS (
            SELECT request_id, min(seq) AS first_seq, arg_min(content_hash, seq) AS first_hash,
                   arg_min(source_file || ':' || source_line, seq) AS first_at
            FROM ok GROUP BY request_id
        ), ex AS (
            SELECT r.request_id, {_content_hash_sql('r', 'r.prompt_hash')} AS content_hash,
                   r.source_file || ':' || r.source_line AS loaded_at
            FROM requests r WHERE r.request_id IN (SELECT request_id FROM contested)
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


def _commit(con: duckdb.DuckDBPyConnection, ingest_id: int, join: str) -> tuple[int, int]:
    columns = ", ".join("m.prompt_sha" if c == "prompt_hash" else f"t.{c}" for c in _CONTENT_COLUMNS)
    names = ", ".join([*_CONTENT_COLUMNS, "fingerprint", "cached_identity_fingerprint", "source_file", "source_line",
                       "ingest_id"])
    accepted = con.execute(f"""
        INSERT INTO requests ({names})
        SELECT {columns}, m.fingerprint, cm.fingerprint, t.source_file, t.source_line, ?
        FROM typed t
        JOIN idmap m ON {join}
        LEFT JOIN outcome o USING (seq)
        LEFT JOIN cachedmap cm ON cm.text = t.cached_fingerprint::VARCHAR
        WHERE m.reject_reason IS NULL AND coalesce(o.outcome, 'accept') = 'accept'
    """, [ingest_id]).fetchall()[0][0]
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE bad AS
        WITH b AS (
            SELECT seq, source_file, source_line, raw_request_id AS request_id, reason
            FROM checked WHERE reason IS NOT NULL
            UNION ALL
            SELECT t.seq, t.source_file, t.source_line, t.request_id, coalesce(m.reject_reason, o.outcome)
            FROM typed t JOIN idmap m ON {join} LEFT JOIN outcome o USING (seq)
            WHERE m.reject_reason IS NOT NULL OR o.outcome LIKE 'conflict:%'
        )
        SELECT b.*, r.raw, md5(r.raw) AS raw_hash FROM b JOIN raws r USING (seq)
    """)
    _keep_new_rejects(con)
    con.execute("""
        INSERT INTO quarantine
        SELECT ?, source_file, source_line, request_id, reason, raw, raw_hash FROM bad_new
    """, [ingest_id])
    quarantined = scalar(con, "SELECT count(*) FROM bad_new")
    return accepted, quarantined


def _keep_new_rejects(con: duckdb.DuckDBPyConnection) -> None:
    """`bad_new`: the rejects of `bad` not quarantined before, by content (text and line number), not by path.

    The same file uploaded again, or copied elsewhere, arrives under another path each time; it is
    the same evidence and is quarantined once, as a duplicate the second time.
    """
    con.execute("""
        CREATE OR REPLACE TEMP TABLE bad_new AS
        SELECT b.* FROM bad b
        WHERE NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.source_line = b.source_line AND q.raw_hash = b.raw_hash)
        QUALIFY row_number() OVER (PARTITION BY b.source_line, b.raw_hash ORDER BY b.seq) = 1
    """)


def ingest(
    store: Store,
    paths: list[str],
    progress: ProgressCallback | None = None,
    limits: IngestLimits | None = None,
) -> IngestResult:
    """Validate and load log files; all of them become visible at once, or none on error.

    `limits`: what one record may cost (default: `IngestLimits.from_env()`).
    """
    limits = limits or IngestLimits.from_env()
    files = resolve_paths(paths)  # raises LogReadError before anything is written
    with store.write() as con:
        migrate_connection(con)  # an older store's derived tables first, so this batch is judged alike
        ingest_id = scalar(con, "SELECT coalesce(max(ingest_id), 0) + 1 FROM ingests")
        _create_work_tables(con)
        read = 0
        staged: list[_Lines] = []
        total = 2 * len(files) + len(_BATCH_STEPS)
        step = iter(range(total + 1))

        def say(what: str) -> None:
            if progress:
                progress(next(step), total, what)

        for n, f in enumerate(files):
            say(f"reading {f.name}")
            first_seq = staged[-1].first_seq + staged[-1].count if staged else 0
            staged.append(_stage_file(con, f, f"lines_{n}", first_seq, limits))
            say(f"checking {f.name}")
            rest, set_aside = _set_aside(con, staged[-1], str(f.resolve()), limits)
            read += set_aside + _validate(con, rest, str(f.resolve()))
        _raws_view(con, staged)
        say(_BATCH_STEPS[0])
        join = _compute_identities(con)
        _classify(con, join)
        say(_BATCH_STEPS[1])
        accepted, quarantined = _commit(con, ingest_id, join)
        say(_BATCH_STEPS[2])
        if accepted:
            judge_hits(con)
        say(_BATCH_STEPS[3])
        if accepted:
            build_summaries(con)
        duplicates = read - accepted - quarantined
        con.execute(
            "INSERT INTO ingests VALUES (?, now(), ?, ?, ?, ?, ?)",
            [ingest_id, [str(f) for f in files], read, accepted, duplicates, quarantined],
        )
    say("done")
    return IngestResult(read, accepted, duplicates, quarantined, len(files), ingest_id)
