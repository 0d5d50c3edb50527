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

from .readers import RawBatch, read_file, resolve_paths
from .request import canonicalize_identity, fingerprint_of_identity, identity
from .store import Store, scalar

# (name, kind, required). Kinds: str, nonempty_str, int, int>=0, int>=1, num>=0, top_p,
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
    ("latency_ms", "num>=0", False),
    ("draft_tokens", "int>=0", False),
    ("accepted_tokens", "int>=0", False),
)
FIELD_NAMES = tuple(f for f, _, _ in FIELDS)
_INDEX = {name: i + 1 for i, name in enumerate(FIELD_NAMES)}  # DuckDB lists are 1-based

_EXPECTED = {
    "str": "a string", "nonempty_str": "a non-empty string", "hex64": "64 hex characters",
    "int": "an integer", "int>=0": "an integer >= 0", "int>=1": "an integer >= 1",
    "num>=0": "a number >= 0", "top_p": "a number in (0, 1]", "bool": "a boolean",
    "ts": "an RFC 3339 string or integer epoch milliseconds", "str_list": "a list of strings",
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


ProgressCallback = Callable[[int, int, str], None]  # (files done, files total, current file)


def _t(name: str) -> str:
    return f"t[{_INDEX[name]}]"


def _s(name: str) -> str:
    return f"s[{_INDEX[name]}]"


def _is_int(name: str) -> str:
    # An integral double (64.0) is accepted: CSV and some writers produce them.
    return (f"({_t(name)} IN ('BIGINT', 'UBIGINT') OR ({_t(name)} = 'DOUBLE' "
            f"AND isfinite(try_cast({_s(name)} AS DOUBLE)) "
            f"AND try_cast({_s(name)} AS DOUBLE) = floor(try_cast({_s(name)} AS DOUBLE))))")


def _int_value(name: str) -> str:
    return (f"CASE WHEN {_t(name)} IN ('BIGINT', 'UBIGINT') THEN try_cast({_s(name)} AS HUGEINT) "
            f"WHEN {_is_int(name)} THEN try_cast(try_cast({_s(name)} AS DOUBLE) AS HUGEINT) END")


def _num_value(name: str) -> str:
    return (f"CASE WHEN {_t(name)} IN ('BIGINT', 'UBIGINT', 'DOUBLE') "
            f"AND isfinite(try_cast({_s(name)} AS DOUBLE)) THEN try_cast({_s(name)} AS DOUBLE) END")


def _ts_value() -> str:
    return (f"CASE WHEN {_t('ts')} = 'VARCHAR' THEN try_cast({_s('ts')} AS TIMESTAMPTZ) "
            f"WHEN {_is_int('ts')} THEN try_cast(epoch_ms(try_cast(try_cast({_s('ts')} AS DOUBLE) AS BIGINT)) "
            "AS TIMESTAMPTZ) END")


def _valid(name: str, kind: str) -> str:
    """SQL true when a present, non-null value of this field is acceptable."""
    t = _t(name)
    if kind == "str":
        return f"{t} = 'VARCHAR'"
    if kind == "nonempty_str":
        return f"({t} = 'VARCHAR' AND length({_s(name)}) > 0)"
    if kind == "hex64":
        return f"({t} = 'VARCHAR' AND regexp_full_match({_s(name)}, '[0-9a-fA-F]{{64}}'))"
    if kind == "bool":
        return f"{t} = 'BOOLEAN'"
    if kind == "object":
        return f"{t} = 'OBJECT'"
    if kind == "str_list":
        return (f"({t} = 'ARRAY' AND len(list_filter(json_type(v[{_INDEX[name]}], '$[*]'), "
                "lambda x: x <> 'VARCHAR')) = 0)")
    if kind == "ts":
        return f"({_ts_value()}) IS NOT NULL"
    if kind.startswith("int"):
        bound = {"int": "", "int>=0": " AND v0 >= 0", "int>=1": " AND v0 >= 1"}[kind]
        return f"({_is_int(name)}{bound.replace('v0', _int_value(name))})"
    if kind == "num>=0":
        return f"(({_num_value(name)}) >= 0)"
    if kind == "top_p":
        return f"(({_num_value(name)}) > 0 AND ({_num_value(name)}) <= 1)"
    raise AssertionError(kind)


def _reason_sql() -> str:
    """The first rule a record breaks, as a one-line reason; NULL when it breaks none."""
    branches = [
        "WHEN NOT valid THEN 'bad JSON: the line is not valid JSON'",
        "WHEN root <> 'OBJECT' THEN 'not a JSON object: got ' || lower(root)",
        "WHEN json_exists(obj, '$.__csv_error__') THEN 'bad CSV row: ' || (obj ->> '$.__csv_error__')",
    ]
    for name, kind, required in FIELDS:
        t = _t(name)
        if required:
            branches.append(f"WHEN {t} IS NULL THEN 'missing required field: {name}'")
            branches.append(f"WHEN {t} = 'NULL' THEN '{name}: required, got null'")
        cond = f"{t} IS NOT NULL AND {t} <> 'NULL' AND NOT {_valid(name, kind)}"
        branches.append(
            f"WHEN {cond} THEN '{name}: expected {_EXPECTED[kind]}, got ' || "
            f"left(coalesce(v[{_INDEX[name]}]::VARCHAR, 'null'), 80)"
        )
    branches.append(
        f"WHEN ({_t('prompt')} IS NULL OR {_t('prompt')} = 'NULL') AND "
        f"({_t('prompt_hash')} IS NULL OR {_t('prompt_hash')} = 'NULL') "
        "THEN 'missing required field: one of prompt or prompt_hash'"
    )
    branches.append(
        f"WHEN {_t('prompt')} = 'VARCHAR' AND {_t('prompt_hash')} = 'VARCHAR' "
        f"AND sha256({_s('prompt')}) <> lower({_s('prompt_hash')}) "
        "THEN 'prompt_hash: does not match the SHA-256 of prompt'"
    )
    return "CASE " + "\n".join(branches) + " END"


def _paths_literal() -> str:
    return "[" + ", ".join(f"'$.\"{name}\"'" for name in FIELD_NAMES) + "]"


def _typed_columns_sql() -> str:
    def s(name: str) -> str:
        return f"CASE WHEN {_t(name)} = 'VARCHAR' THEN {_s(name)} END"

    def i(name: str) -> str:
        return f"({_int_value(name)})"

    return ",\n".join([
        f"{s('request_id')} AS request_id",
        f"({_ts_value()}) AS ts",
        f"{s('prompt')} AS prompt",
        f"coalesce(lower({s('prompt_hash')}), sha256({s('prompt')})) AS prompt_hash",
        f"{s('target_model')} AS target_model",
        f"{s('draft_model')} AS draft_model",
        f"{i('num_speculative_tokens')}::BIGINT AS num_speculative_tokens",
        f"({_num_value('temperature')}) AS temperature",
        f"coalesce({_num_value('top_p')}, 1.0) AS top_p",
        f"{i('top_k')}::BIGINT AS top_k",
        f"{i('max_tokens')}::BIGINT AS max_tokens",
        f"{i('seed')} AS seed",
        f"CASE WHEN {_t('stop')} = 'ARRAY' THEN json_extract_string(v[{_INDEX['stop']}], '$[*]') END AS stop",
        f"{s('tokenizer_version')} AS tokenizer_version",
        f"{s('deployment')} AS deployment",
        f"{s('cache_key')} AS cache_key",
        f"CASE WHEN {_t('cache_hit')} = 'BOOLEAN' THEN {_s('cache_hit')}::BOOLEAN END AS cache_hit",
        f"CASE WHEN {_t('cached_fingerprint')} = 'OBJECT' THEN v[{_INDEX['cached_fingerprint']}] END "
        "AS cached_fingerprint",
        f"{s('output_text')} AS output_text",
        f"{i('output_tokens')}::BIGINT AS output_tokens",
        f"{s('finish_reason')} AS finish_reason",
        f"({_num_value('latency_ms')}) AS latency_ms",
        f"{i('draft_tokens')}::BIGINT AS draft_tokens",
        f"{i('accepted_tokens')}::BIGINT AS accepted_tokens",
        # Fields the contract does not name are kept: a JSON merge patch with null deletes the known ones.
        "nullif(json_merge_patch(obj, '{" + ",".join(f'"{n}":null' for n in FIELD_NAMES)
        + "}')::VARCHAR, '{}')::JSON AS extra",
    ])


_CONTENT_COLUMNS = (
    "request_id", "ts", "prompt", "prompt_hash", "target_model", "draft_model", "num_speculative_tokens",
    "temperature", "top_p", "top_k", "max_tokens", "seed", "stop", "tokenizer_version", "deployment",
    "cache_key", "cache_hit", "cached_fingerprint", "output_text", "output_tokens", "finish_reason",
    "latency_ms", "draft_tokens", "accepted_tokens", "extra",
)
_IDENTITY_INPUT = ("prompt_hash", "target_model", "draft_model", "num_speculative_tokens", "temperature",
                   "top_p", "top_k", "max_tokens", "seed", "stop", "tokenizer_version")


def _load_staging(con: duckdb.DuckDBPyConnection, batches: list[RawBatch]) -> int:
    files, lines, raws = [], [], []
    for b in batches:
        files.extend([b.source_file] * len(b.raws))
        lines.extend(b.line_numbers)
        raws.extend(b.raws)
    staging = pa.table({
        "seq": pa.array(range(len(raws)), pa.int64()),
        "source_file": pa.array(files, pa.string()),
        "source_line": pa.array(lines, pa.int64()),
        "raw": pa.array(raws, pa.string()),
    })
    con.register("staging_arrow", staging)
    con.execute("CREATE OR REPLACE TEMP TABLE staging AS SELECT * FROM staging_arrow")
    con.unregister("staging_arrow")
    return len(raws)


def _validate(con: duckdb.DuckDBPyConnection) -> None:
    paths = _paths_literal()
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE extracted AS
        WITH p AS (SELECT *, json_valid(raw) AS valid FROM staging),
        q AS (SELECT *, CASE WHEN valid THEN json_type(CASE WHEN valid THEN raw ELSE '{{}}' END) END AS root
              FROM p),
        -- JSON functions are evaluated on every row of a vector: give the broken ones an empty object.
        o AS (SELECT *, CASE WHEN root = 'OBJECT' THEN raw ELSE '{{}}' END AS obj FROM q)
        SELECT seq, source_file, source_line, raw, valid, root, obj,
               json_type(obj, {paths}) AS t, json_extract(obj, {paths}) AS v,
               json_extract_string(obj, {paths}) AS s
        FROM o
    """)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE checked AS
        SELECT seq, source_file, source_line, raw, {_reason_sql()} AS reason,
               CASE WHEN {_t('request_id')} = 'VARCHAR' THEN {_s('request_id')} END
                   AS raw_request_id
        FROM extracted
    """)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE typed AS
        SELECT c.seq, c.source_file, c.source_line, {_typed_columns_sql()}
        FROM checked c JOIN extracted e USING (seq)
        WHERE c.reason IS NULL
    """)
    content = ", ".join(f"{c} := {c}" for c in _CONTENT_COLUMNS)
    con.execute("ALTER TABLE typed ADD COLUMN content_hash VARCHAR")
    con.execute(f"UPDATE typed SET content_hash = md5(to_json(struct_pack({content}))::VARCHAR)")


def _compute_identities(con: duckdb.DuckDBPyConnection) -> list[tuple[int, str]]:
    """Fingerprint every distinct identity tuple with `request.identity`; return rows it rejects."""
    cols = ", ".join(_IDENTITY_INPUT)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE typed_id AS
        SELECT *, md5(to_json([{", ".join(f"to_json({c})" for c in _IDENTITY_INPUT)}])::VARCHAR) AS id_key
        FROM typed
    """)
    tuples = con.execute(f"SELECT DISTINCT id_key, {cols} FROM typed_id").fetchall()
    id_keys, fps, identity_rows, rejected_keys = [], [], {}, {}
    for row in tuples:
        record = dict(zip(_IDENTITY_INPUT, row[1:], strict=True))
        try:
            obj = identity(record)
        except ValueError as exc:
            rejected_keys[row[0]] = str(exc)
            continue
        fp = fingerprint_of_identity(obj)
        id_keys.append(row[0])
        fps.append(fp)
        identity_rows[fp] = obj
    # cached_fingerprint objects are canonicalised too, so a writer's spelling of an equivalence can't matter.
    cached = con.execute(
        "SELECT DISTINCT cached_fingerprint::VARCHAR FROM typed_id WHERE cached_fingerprint IS NOT NULL"
    ).fetchall()
    cached_texts, cached_fps = [], []
    for (text,) in cached:
        try:
            obj = canonicalize_identity(json.loads(text))
        except (ValueError, TypeError, KeyError):
            continue  # not an identity object we can read: the row keeps it, the guard can't use it
        fp = fingerprint_of_identity(obj)
        cached_texts.append(text)
        cached_fps.append(fp)
        identity_rows[fp] = obj
    con.register("idmap_arrow", pa.table({"id_key": id_keys, "fingerprint": fps}))
    con.register("cachedmap_arrow", pa.table({"text": cached_texts, "fingerprint": cached_fps}))
    con.execute("CREATE OR REPLACE TEMP TABLE idmap AS SELECT * FROM idmap_arrow")
    con.execute("CREATE OR REPLACE TEMP TABLE cachedmap AS SELECT * FROM cachedmap_arrow")
    con.unregister("idmap_arrow")
    con.unregister("cachedmap_arrow")
    _insert_identities(con, identity_rows)
    if not rejected_keys:
        return []
    rejected = con.execute(
        "SELECT seq, id_key FROM typed_id WHERE list_contains(?, id_key)", [list(rejected_keys)]
    ).fetchall()
    return [(seq, rejected_keys[key]) for seq, key in rejected]


def _insert_identities(con: duckdb.DuckDBPyConnection, rows: dict[str, dict]) -> None:
    if not rows:
        return
    table = pa.table({
        "fingerprint": list(rows),
        "identity": [json.dumps(o, sort_keys=True, ensure_ascii=False) for o in rows.values()],
        "greedy": ["seed" not in o for o in rows.values()],
        **{name: [o.get(name) for o in rows.values()]
           for name in ("prompt", "target_model", "draft_model", "num_speculative_tokens", "temperature",
                        "top_p", "top_k", "max_tokens", "tokenizer_version")},
        "seed": pa.array([None if o.get("seed") is None else str(o["seed"]) for o in rows.values()],
                         pa.string()),
        "stop": [json.dumps(o["stop"], ensure_ascii=False) for o in rows.values()],
    })
    con.register("identities_arrow", table)
    con.execute("""
        INSERT OR IGNORE INTO identities
        SELECT fingerprint, identity::JSON, greedy, prompt, target_model, draft_model, num_speculative_tokens,
               temperature, top_p, top_k, max_tokens, seed::HUGEINT, stop, tokenizer_version
        FROM identities_arrow
    """)
    con.unregister("identities_arrow")


def _classify(con: duckdb.DuckDBPyConnection, rejected: list[tuple[int, str]]) -> None:
    """Split valid rows into accepted, duplicates and conflicts (the first occurrence wins)."""
    con.execute("CREATE OR REPLACE TEMP TABLE rejected_identity (seq BIGINT, reason VARCHAR)")
    if rejected:
        con.executemany("INSERT INTO rejected_identity VALUES (?, ?)", rejected)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE ranked AS
        SELECT t.*, first_value(t.content_hash) OVER w AS first_hash,
               first_value(t.source_file || ':' || t.source_line) OVER w AS first_at,
               row_number() OVER w AS occurrence,
               ex.content_hash AS existing_hash, ex.source_file || ':' || ex.source_line AS existing_at
        FROM typed_id t
        LEFT JOIN requests ex ON ex.request_id = t.request_id
        WHERE t.seq NOT IN (SELECT seq FROM rejected_identity)
        WINDOW w AS (PARTITION BY t.request_id ORDER BY t.seq)
    """)
    con.execute("""
        CREATE OR REPLACE TEMP TABLE outcome AS
        SELECT seq,
          CASE
            WHEN existing_hash IS NOT NULL AND existing_hash = content_hash THEN 'duplicate'
            WHEN existing_hash IS NOT NULL THEN 'conflict: request_id ' || request_id
                 || ' was loaded before from ' || existing_at || ' with different content'
            WHEN occurrence = 1 THEN 'accept'
            WHEN content_hash = first_hash THEN 'duplicate'
            ELSE 'conflict: request_id ' || request_id || ' appears earlier at ' || first_at
                 || ' with different content'
          END AS outcome
        FROM ranked
    """)


def _commit(con: duckdb.DuckDBPyConnection, ingest_id: int) -> tuple[int, int, int]:
    columns = ", ".join(_CONTENT_COLUMNS)
    con.execute(f"""
        INSERT INTO requests
        SELECT {columns}, m.fingerprint, cm.fingerprint, t.content_hash, t.source_file, t.source_line, ?
        FROM typed_id t
        JOIN outcome o USING (seq)
        JOIN idmap m USING (id_key)
        LEFT JOIN cachedmap cm ON cm.text = t.cached_fingerprint::VARCHAR
        WHERE o.outcome = 'accept'
    """, [ingest_id])
    accepted = scalar(con, "SELECT count(*) FROM outcome WHERE outcome = 'accept'")
    con.execute("""
        CREATE OR REPLACE TEMP TABLE bad AS
        SELECT c.seq, c.source_file, c.source_line, c.raw_request_id AS request_id,
               coalesce(c.reason, ri.reason, o.outcome) AS reason, c.raw, md5(c.raw) AS raw_hash
        FROM checked c
        LEFT JOIN rejected_identity ri USING (seq)
        LEFT JOIN outcome o USING (seq)
        WHERE c.reason IS NOT NULL OR ri.reason IS NOT NULL OR o.outcome LIKE 'conflict:%'
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
    total = scalar(con, "SELECT count(*) FROM staging")
    return accepted, total - accepted - quarantined, quarantined


HIT_SOURCES_SQL = """
CREATE OR REPLACE TABLE hit_sources AS
WITH r AS (
    SELECT request_id, ts, coalesce(deployment, chr(0)) AS dep, cache_key, cache_hit,
           fingerprint, cached_identity_fingerprint
    FROM requests
), hits AS (SELECT * FROM r WHERE cache_hit), misses AS (SELECT * FROM r WHERE NOT cache_hit),
joined AS (
    SELECT h.request_id, m.request_id AS source_request_id, h.fingerprint AS fp,
           m.fingerprint AS source_fp, h.cached_identity_fingerprint AS cached_fp
    FROM hits h ASOF LEFT JOIN misses m
      ON h.dep = m.dep AND h.cache_key = m.cache_key AND h.ts >= m.ts
), judged AS (
    SELECT *, coalesce(source_fp <> fp, false) AS source_differs,
           coalesce(cached_fp <> fp, false) AS fingerprint_mismatch
    FROM joined
)
SELECT j.request_id, j.source_request_id,
       j.source_differs OR j.fingerprint_mismatch AS contaminated,
       j.fingerprint_mismatch,
       CASE WHEN j.source_differs OR j.fingerprint_mismatch THEN array_to_string(list_sort(list_filter([
           CASE WHEN a.prompt IS DISTINCT FROM b.prompt THEN 'prompt' END,
           CASE WHEN a.target_model IS DISTINCT FROM b.target_model THEN 'target_model' END,
           CASE WHEN a.draft_model IS DISTINCT FROM b.draft_model THEN 'draft_model' END,
           CASE WHEN a.num_speculative_tokens IS DISTINCT FROM b.num_speculative_tokens
                THEN 'num_speculative_tokens' END,
           CASE WHEN a.temperature IS DISTINCT FROM b.temperature THEN 'temperature' END,
           CASE WHEN NOT (a.greedy OR b.greedy) AND a.top_p IS DISTINCT FROM b.top_p THEN 'top_p' END,
           CASE WHEN NOT (a.greedy OR b.greedy) AND a.top_k IS DISTINCT FROM b.top_k THEN 'top_k' END,
           CASE WHEN a.max_tokens IS DISTINCT FROM b.max_tokens THEN 'max_tokens' END,
           CASE WHEN NOT (a.greedy OR b.greedy) AND a.seed IS DISTINCT FROM b.seed THEN 'seed' END,
           CASE WHEN a.stop IS DISTINCT FROM b.stop THEN 'stop' END,
           CASE WHEN a.tokenizer_version IS DISTINCT FROM b.tokenizer_version THEN 'tokenizer_version' END
       ], lambda x: x IS NOT NULL)), ';') END AS differing_fields
FROM judged j
JOIN identities a ON a.fingerprint = j.fp
LEFT JOIN identities b ON b.fingerprint = CASE WHEN j.source_differs THEN j.source_fp ELSE j.cached_fp END
"""


def ingest(
    store: Store,
    paths: list[str],
    progress: ProgressCallback | None = None,
) -> IngestResult:
    """Validate and load log files; all of them become visible at once, or none on error."""
    files = resolve_paths(paths)  # raises LogReadError before anything is written
    batches: list[RawBatch] = []
    for n, f in enumerate(files):
        if progress:
            progress(n, len(files), str(f))
        batch = read_file(f)
        batches.append(RawBatch(str(Path(batch.source_file).resolve()), batch.line_numbers, batch.raws))
    if progress:
        progress(len(files), len(files), "")
    with store.write() as con:
        ingest_id = scalar(con, "SELECT coalesce(max(ingest_id), 0) + 1 FROM ingests")
        read = _load_staging(con, batches)
        _validate(con)
        rejected = _compute_identities(con)
        _classify(con, rejected)
        accepted, duplicates, quarantined = _commit(con, ingest_id)
        if accepted:
            con.execute(HIT_SOURCES_SQL)
        con.execute(
            "INSERT INTO ingests VALUES (?, now(), ?, ?, ?, ?, ?)",
            [ingest_id, [str(f) for f in files], read, accepted, duplicates, quarantined],
        )
    return IngestResult(read, accepted, duplicates, quarantined, len(files), ingest_id)
