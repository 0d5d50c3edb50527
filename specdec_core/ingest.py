"""Load request logs into the store: validate in SQL, quarantine what breaks the contract, never lose a line.

Read = accepted + duplicates + quarantined, for every ingest. The identity and
fingerprint of each row are computed once here, by `request.identity` itself over
the distinct identity tuples, so the store and the library cannot disagree.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from .contamination import judge_hits
from .readers import JSONL_SUFFIXES, read_file, resolve_paths
from .request import DecodeRequest, canonical_json, canonicalize_identity, identity_json, sha256_hex
from .store import Store, scalar
from .summary import build_summaries

# (name, kind, required). Kinds: str, nonempty_str, int, int>=0, int>=1, num, num>=0, top_p,
# bool, ts, str_list, object, hex64.
FIELDS: tuple[tuple[str, str, bool], ...] = (
    ("request_id", "nonempty_str", True),
    ("ts", "ts", True),
    ("prompt", "str", False),
    ("prompt_hash", "hex64", False),
    ("target_model", "nonempty_str", True),
    ("draft_model", "str", False),
    ("num_speculative_tokens", "int>=0", False),
    ("temperature", "num>=0", True),
    ("top_p", "top_p", False),
    ("top_k", "int>=0", False),
    ("max_tokens", "int>=1", True),
    ("seed", "int", False),
    ("stop", "str_list", False),
    ("tokenizer_version", "str", True),
    ("deployment", "str", False),
    ("cache_key", "str", True),
    ("cache_hit", "bool", True),
    ("cached_fingerprint", "object", False),
    ("output_text", "str", True),
    ("output_tokens", "int>=0", True),
    ("finish_reason", "str", False),
    ("latency_ms", "num", False),  # the contract sets no range: a skewed clock can log a negative one
    ("draft_tokens", "int>=0", False),
    ("accepted_tokens", "int>=0", False),
)
FIELD_NAMES = tuple(f for f, _, _ in FIELDS)
_INDEX = {name: i + 1 for i, name in enumerate(FIELD_NAMES)}  # DuckDB lists are 1-based

_EXPECTED = {
    "str": "a string", "nonempty_str": "a non-empty string", "hex64": "64 hex characters",
    "int": "an integer", "int>=0": "an integer >= 0", "int>=1": "an integer >= 1",
    "num": "a number", "num>=0": "a number >= 0", "top_p": "a number in (0, 1]", "bool": "a boolean",
    "ts": "an RFC 3339 string or integer epoch milliseconds, in the years 1 to 9999", "str_list": "a list of strings",
    "object": "a JSON object",
}


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


# (steps done, steps total, what is under way): reading then checking each file, then the four
# steps over the whole batch, so a single large file still moves the bar.
ProgressCallback = Callable[[int, int, str], None]
_BATCH_STEPS = ("fingerprinting identities", "writing requests", "finding each hit's source", "summarising")


def _t(name: str) -> str:
    return f"t_{name}"  # the field's JSON type, NULL when absent


def _s(name: str) -> str:
    return f"s_{name}"  # the field as text: strings unquoted, anything else as JSON


_RFC3339_RE = (r"\s*[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
               r"([Zz]|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)?\s*")
_EPOCH_MS_MIN, _EPOCH_MS_MAX = -62135596800000, 253402300799999  # 0001-01-01 to 9999-12-31, UTC
_BIGINT_MAX = 2**63 - 1
_BIGINT_KINDS = ("int>=0", "int>=1")  # stored as BIGINT; `int` (the seed) is HUGEINT


def _value_sql(name: str, kind: str) -> str:
    """The field's typed value, or NULL when it is absent, null or of the wrong JSON type."""
    t, s = _t(name), _s(name)
    integral = (f"CASE WHEN {t} IN ('BIGINT', 'UBIGINT') THEN try_cast({s} AS HUGEINT) "
                # Digits beyond 64 bits come as a DOUBLE holding their exact text: read the text.
                f"WHEN {t} = 'DOUBLE' AND regexp_full_match({s}, '-?[0-9]+') THEN try_cast({s} AS HUGEINT) "
                # An integral double (64.0) is accepted: CSV and some writers produce them.
                f"WHEN {t} = 'DOUBLE' AND try_cast({s} AS DOUBLE) = floor(try_cast({s} AS DOUBLE)) "
                f"THEN try_cast(try_cast({s} AS DOUBLE) AS HUGEINT) END")
    if kind in ("str", "nonempty_str", "hex64"):
        return f"CASE WHEN {t} = 'VARCHAR' THEN {s} END"
    if kind == "bool":
        return f"CASE WHEN {t} = 'BOOLEAN' THEN try_cast({s} AS BOOLEAN) END"
    # A writer that could only store text (a Parquet string column) may hold these two as JSON text,
    # as CSV does: text that is itself a JSON object or array counts as one.
    text_json = f"CASE WHEN {t} = 'VARCHAR' AND json_valid({s}) THEN {s} ELSE 'null' END"
    if kind == "object":
        return (f"CASE WHEN {t} = 'OBJECT' THEN {s} "
                f"WHEN {t} = 'VARCHAR' AND json_type({text_json}) = 'OBJECT' THEN {s} END")
    if kind == "str_list":
        array = (f"CASE WHEN {t} = 'ARRAY' THEN {s} WHEN {t} = 'VARCHAR' AND json_type({text_json}) = 'ARRAY' "
                 f"THEN {s} ELSE '[]' END")
        return (f"CASE WHEN ({t} = 'ARRAY' OR ({t} = 'VARCHAR' AND json_type({text_json}) = 'ARRAY')) "
                f"AND len(list_filter(json_type({array}, '$[*]'), lambda x: x <> 'VARCHAR')) = 0 "
                f"THEN json_extract_string({array}, '$[*]') END")
    if kind.startswith("int"):
        return integral
    if kind in ("num", "num>=0", "top_p"):
        return f"CASE WHEN {t} IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN try_cast({s} AS DOUBLE) END"
    if kind == "ts":
        # The text must look like an RFC 3339 date-time before DuckDB's cast, which also takes a bare
        # date, 'epoch' and 'infinity'. No offset is read as UTC. Epoch milliseconds are bounded to
        # the years an RFC 3339 string can name, so a wild integer is rejected, not an error.
        return (f"CASE WHEN {t} = 'VARCHAR' THEN CASE WHEN regexp_full_match({s}, '{_RFC3339_RE}') "
                f"THEN try_cast(upper({s}) AS TIMESTAMPTZ) END "
                f"WHEN ({integral}) BETWEEN {_EPOCH_MS_MIN} AND {_EPOCH_MS_MAX} "
                f"THEN try_cast(epoch_ms(try_cast(({integral}) AS BIGINT)) AS TIMESTAMPTZ) END")
    raise AssertionError(kind)


def _valid_sql(name: str, kind: str) -> str:
    """True when the field's typed value `f_<name>` is acceptable."""
    v = f"f_{name}"
    extra = {
        "nonempty_str": f" AND length({v}) > 0",
        "hex64": f" AND regexp_full_match({v}, '[0-9a-fA-F]{{64}}')",
        "int>=0": f" AND {v} >= 0 AND {v} <= {_BIGINT_MAX}",
        "int>=1": f" AND {v} >= 1 AND {v} <= {_BIGINT_MAX}",
        "num": f" AND isfinite({v})",
        "num>=0": f" AND isfinite({v}) AND {v} >= 0",
        "top_p": f" AND isfinite({v}) AND {v} > 0 AND {v} <= 1",
    }.get(kind, "")
    return f"({v} IS NOT NULL{extra})"


def _values_sql() -> str:
    return ",\n".join(f"{_value_sql(name, kind)} AS f_{name}" for name, kind, _ in FIELDS)


# The first contract field that a record names twice (only records with more keys than known fields
# present can have one, so only they pay for the look).
_REPEATED_FIELD = ("list_filter(json_keys(obj), lambda k, i: list_position(json_keys(obj), k) < i "
                   "AND k IN (" + ", ".join(f"'{n}'" for n in FIELD_NAMES) + "))[1]")


def _reason_sql() -> str:
    """The first rule a record breaks, as a one-line reason; NULL when it breaks none."""
    branches = [
        "WHEN NOT valid THEN 'bad JSON: the line is not valid JSON'",
        "WHEN root <> 'OBJECT' THEN 'not a JSON object: got ' || lower(root)",
        "WHEN json_exists(obj, '$.__csv_error__') THEN 'bad CSV row: ' || (obj ->> '$.__csv_error__')",
        # A field named twice: this store would read the first value, most JSON readers the last.
        "WHEN repeated_field IS NOT NULL THEN 'duplicate field: ' || repeated_field || ' appears more than once'",
    ]
    for name, kind, required in FIELDS:
        t = _t(name)
        if required:
            branches.append(f"WHEN {t} IS NULL THEN 'missing required field: {name}'")
            branches.append(f"WHEN {t} = 'NULL' THEN '{name}: required, got null'")
        got = f"left(CASE WHEN {t} = 'VARCHAR' THEN to_json({_s(name)})::VARCHAR ELSE {_s(name)} END, 80)"
        if kind in _BIGINT_KINDS:
            # Past 2^127 even the wide integer read fails: a finite number that large is out of range too.
            huge = f"(f_{name} IS NULL AND {t} = 'DOUBLE' AND try_cast({_s(name)} AS DOUBLE) > {_BIGINT_MAX} " \
                   f"AND isfinite(try_cast({_s(name)} AS DOUBLE)))"
            branches.append(f"WHEN f_{name} > {_BIGINT_MAX} OR {huge} THEN '{name}: out of range "
                            f"(at most {_BIGINT_MAX}), got ' || {got}")
        cond = f"{t} IS NOT NULL AND {t} <> 'NULL' AND NOT {_valid_sql(name, kind)}"
        branches.append(
            f"WHEN {cond} THEN '{name}: expected {_EXPECTED[kind]}, got ' || {got}"
        )
    branches.append(
        "WHEN f_prompt IS NULL AND f_prompt_hash IS NULL "
        "THEN 'missing required field: one of prompt or prompt_hash'"
    )
    branches.append(
        "WHEN f_prompt IS NOT NULL AND f_prompt_hash IS NOT NULL AND sha256(f_prompt) <> lower(f_prompt_hash) "
        "THEN 'prompt_hash: does not match the SHA-256 of prompt'"
    )
    return "CASE " + "\n".join(branches) + " END"


def _paths_literal() -> str:
    return "[" + ", ".join(f"'$.\"{name}\"'" for name in FIELD_NAMES) + "]"


def _typed_columns_sql() -> str:
    return ",\n".join([
        "f_request_id AS request_id",
        "f_ts AS ts",
        "f_prompt AS prompt",
        # The prompt's own hash is computed once per distinct identity, not per row.
        "lower(f_prompt_hash) AS prompt_hash",
        "f_target_model AS target_model",
        "f_draft_model AS draft_model",
        "try_cast(f_num_speculative_tokens AS BIGINT) AS num_speculative_tokens",
        "f_temperature AS temperature",
        "coalesce(f_top_p, 1.0) AS top_p",
        "try_cast(f_top_k AS BIGINT) AS top_k",
        "try_cast(f_max_tokens AS BIGINT) AS max_tokens",
        "f_seed AS seed",
        "f_stop AS stop",
        "f_tokenizer_version AS tokenizer_version",
        "f_deployment AS deployment",
        "f_cache_key AS cache_key",
        "f_cache_hit AS cache_hit",
        "f_cached_fingerprint::JSON AS cached_fingerprint",
        "f_output_text AS output_text",
        "try_cast(f_output_tokens AS BIGINT) AS output_tokens",
        "f_finish_reason AS finish_reason",
        "f_latency_ms AS latency_ms",
        "try_cast(f_draft_tokens AS BIGINT) AS draft_tokens",
        "try_cast(f_accepted_tokens AS BIGINT) AS accepted_tokens",
        "extra",
    ])


# Fields the contract does not name are kept: a JSON merge patch with null deletes the known ones.
# Only records with more keys than known fields present have any, so only they are patched.
_EXTRA_SQL = ("CASE WHEN n_keys > n_known THEN nullif(json_merge_patch(obj, '{"
              + ",".join(f'"{n}":null' for n in FIELD_NAMES) + "}')::VARCHAR, '{}')::JSON END")


_CONTENT_COLUMNS = (
    "request_id", "ts", "prompt", "prompt_hash", "target_model", "draft_model", "num_speculative_tokens",
    "temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "tokenizer_version", "deployment",
    "cache_key", "cache_hit", "cached_fingerprint", "output_text", "output_tokens", "finish_reason",
    "latency_ms", "draft_tokens", "accepted_tokens", "extra",
)
_IDENTITY_INPUT = ("prompt", "prompt_hash", "target_model", "draft_model", "num_speculative_tokens", "temperature",
                   "top_p", "top_k", "max_tokens", "seed", "stop", "tokenizer_version")


def _content_hash_sql(alias: str, prompt_hash: str) -> str:
    """A digest of a stored row's content; computed alike for new rows and loaded ones, only where ids repeat."""
    cols = [prompt_hash if c == "prompt_hash" else f"{alias}.{c}" for c in _CONTENT_COLUMNS]
    return "md5(concat_ws(chr(31), " + ", ".join(f"coalesce(to_json({c})::VARCHAR, '~')" for c in cols) + "))"


# DuckDB's hash function makes the join an equi-join; the exact comparison after it rules out collisions.
_ID_HASH = f"hash({', '.join(_IDENTITY_INPUT)})"  # hash-ok: DuckDB's, within one ingest
_ID_JOIN = "t.id_hash = m.id_hash"
# Only needed when two distinct identity tuples share a hash (checked per ingest): then the exact match decides.
_ID_JOIN_EXACT = _ID_JOIN + " AND " + " AND ".join(f"t.{c} IS NOT DISTINCT FROM m.{c}" for c in _IDENTITY_INPUT)


# DuckDB reads JSON Lines as raw lines, in parallel and in file order (insertion order is kept, so a
# row's rowid is its line number - 1); the separator is a control character, so a line holding one
# fails the strict read and the file is read by the Python reader instead, which takes anything.
_RAW_LINES_SQL = (
    "CREATE OR REPLACE TEMP TABLE {table} AS SELECT raw FROM read_csv(?, columns = {{'raw': 'VARCHAR'}}, "
    "delim = chr(1), quote = '', escape = '', header = false, auto_detect = false, strict_mode = true, "
    "max_line_size = 1000000000)"
)


@dataclass(frozen=True)
class _Lines:
    """One file's lines in a temp table, listed by `sql` as (seq, source_line, raw)."""

    table: str
    first_seq: int
    count: int  # rows in the table, blank lines included: the seq values this file uses
    sql: str


def _stage_file(con: duckdb.DuckDBPyConnection, path: Path, table: str, first_seq: int) -> _Lines:
    """Load a file's lines or records, as they were, into the temp table `table`."""
    name = str(path.resolve())
    if path.name.lower().endswith(JSONL_SUFFIXES):
        try:
            con.execute(_RAW_LINES_SQL.format(table=table), [str(path)])
        except duckdb.Error:
            pass  # not clean UTF-8 text, or a control character in a line: the Python reader copes
        else:
            count = scalar(con, f"SELECT count(*) FROM {table}")
            return _Lines(table, first_seq, count,
                          f"SELECT {first_seq} + rowid AS seq, rowid + 1 AS source_line, raw FROM {table}")
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (source_line BIGINT, raw VARCHAR)")
    for chunk in read_file(path, resolved_name=name):
        con.register("chunk_arrow", pa.table({"source_line": pa.array(chunk.line_numbers, pa.int64()),
                                              "raw": pa.array(chunk.raws, pa.string())}))
        con.execute(f"INSERT INTO {table} SELECT * FROM chunk_arrow")
        con.unregister("chunk_arrow")
    count = scalar(con, f"SELECT count(*) FROM {table}")
    return _Lines(table, first_seq, count, f"SELECT {first_seq} + rowid AS seq, source_line, raw FROM {table}")


_NO_LINES = _Lines("", 0, 0, "SELECT NULL::BIGINT AS seq, NULL::BIGINT AS source_line, NULL::VARCHAR AS raw LIMIT 0")


def _validate(con: duckdb.DuckDBPyConnection, lines: _Lines, source_file: str, create: bool = False) -> int:
    """Check every record of a file in one pass into `checked`: its typed columns, or why it is rejected.

    Blank lines are not records. Returns how many records the file holds.
    """
    paths = _paths_literal()
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
                          {", ".join(f"t[{i}] AS {_t(n)}, s[{i}] AS {_s(n)}" for n, i in _INDEX.items())}
                   FROM lists),
        vals AS (SELECT *, {_values_sql()},
                        CASE WHEN n_keys > n_known THEN {_REPEATED_FIELD} END AS repeated_field FROM fields),
        -- The raw text stays in the file's table: rejected rows are joined back to it by seq.
        verdict AS (
            SELECT seq, source_file, source_line, {_EXTRA_SQL} AS extra, {", ".join(f"f_{n}" for n in FIELD_NAMES)},
                   {_reason_sql()} AS reason,
                   CASE WHEN {_t('request_id')} = 'VARCHAR' THEN {_s('request_id')} END AS raw_request_id
            FROM vals
        ),
        typed_rows AS (
            SELECT seq, source_file, source_line, reason, raw_request_id, {_typed_columns_sql()} FROM verdict
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
        columns["seed"] = [None if v is None else str(v) for v in columns["seed"]]
        con.register("idmap_arrow", pa.table({**{c: pa.array(v, type=_arrow_type(c))
                                                   for c, v in columns.items()},
                                                "fingerprint": fps, "prompt_sha": prompt_shas,
                                                "reject_reason": reasons}))
        con.execute(f"INSERT INTO idmap SELECT {cols.replace('seed', 'seed::HUGEINT')}, id_hash, fingerprint, prompt_sha, "
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
    # HUGEINT seeds go through text: Arrow has no 128-bit integer.
    return {"seed": pa.string(), "stop": pa.list_(pa.string()), "id_hash": pa.uint64()}.get(column)


def _insert_identities(con: duckdb.DuckDBPyConnection, rows: dict[str, str]) -> None:
    if not rows:
        return
    objs = [json.loads(text) for text in rows.values()]
    table = pa.table({
        "fingerprint": list(rows),
        "identity": list(rows.values()),
        "greedy": ["seed" not in o for o in objs],
        **{name: [o.get(name) for o in objs]
           for name in ("prompt", "target_model", "draft_model", "num_speculative_tokens", "temperature",
                        "top_p", "top_k", "max_tokens", "tokenizer_version")},
        "seed": pa.array([None if o.get("seed") is None else str(o["seed"]) for o in objs], pa.string()),
        "stop": [json.dumps(o["stop"], ensure_ascii=False) for o in objs],
    })
    con.register("identities_arrow", table)
    con.execute("""
        INSERT OR IGNORE INTO identities
        SELECT fingerprint, identity::JSON, greedy, prompt, target_model, draft_model, num_speculative_tokens,
               temperature, top_p, top_k, max_tokens, seed::HUGEINT, stop, tokenizer_version
        FROM identities_arrow
    """)
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
    accepted = con.execute(f"""
        INSERT INTO requests
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
    # A bad line quarantined by an earlier ingest of the same file is a duplicate, not a new record.
    con.execute("""
        CREATE OR REPLACE TEMP TABLE bad_new AS
        SELECT b.* FROM bad b
        WHERE NOT EXISTS (SELECT 1 FROM quarantine q WHERE q.source_file = b.source_file
                          AND q.source_line = b.source_line AND q.raw_hash = b.raw_hash)
    """)
    con.execute("""
        INSERT INTO quarantine
        SELECT ?, source_file, source_line, request_id, reason, raw, raw_hash FROM bad_new
    """, [ingest_id])
    quarantined = scalar(con, "SELECT count(*) FROM bad_new")
    return accepted, quarantined


def ingest(
    store: Store,
    paths: list[str],
    progress: ProgressCallback | None = None,
) -> IngestResult:
    """Validate and load log files; all of them become visible at once, or none on error."""
    files = resolve_paths(paths)  # raises LogReadError before anything is written
    with store.write() as con:
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
            staged.append(_stage_file(con, f, f"lines_{n}", first_seq))
            say(f"checking {f.name}")
            read += _validate(con, staged[-1], str(f.resolve()))
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
