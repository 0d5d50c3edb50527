"""Fingerprint every distinct identity of an ingest batch exactly as the library does, and keep each
canonical identity in `identities`.

The canonical identity JSON is assembled in SQL over the batch's distinct identity tuples, one part per
field in the library's key order. Each part's text comes from the library itself (`value_json`), once per
distinct value of the field in the batch (a handful of temperatures, models, stop lists), not once per
request; integers are written by the cast (the same digits), the prompt by its SHA-256. So a batch of a
million requests with a million distinct prompts costs a few SQL passes, not a million Python calls, and the
store and the library still cannot disagree: tests/store/test_identity_sql.py holds every stored fingerprint
equal to `fingerprint(record)` over random and hostile values.
"""

from __future__ import annotations

import json

import duckdb

from specdec_core.contract import fields as contract
from specdec_core.contract.identity import (
    canonical_json,
    canonical_value,
    canonicalize_identity,
    sha256_hex,
    value_json,
)
from specdec_core.formats.common import MAX_JSON_DEPTH, TOO_DEEP, FormatError, loads, too_deep
from specdec_core.ingestion.relations import BatchRelations
from specdec_core.ingestion.validation import is_unknown
from specdec_core.store.sql import list_literal, sql_list

_ID_JOIN = "t.id_hash = m.id_hash"


def _identity_input() -> tuple[str, ...]:
    """What decides a row's identity: its identity fields, and which of them the log left unknown."""
    return (*contract.IDENTITY_INPUT, "unknown_fields")


def id_hash_sql() -> str:
    """DuckDB's hash of a row's identity input, within one ingest: it makes the join an equi-join."""
    return f"hash({', '.join(_identity_input())})"


def _id_join_exact() -> str:
    """The join when two distinct identity tuples share a hash (checked per ingest): the exact match decides."""
    return _ID_JOIN + " AND " + " AND ".join(f"t.{c} IS NOT DISTINCT FROM m.{c}" for c in _identity_input())
_INTEGER_FORMS = ("integer", "zero_is_null")


def compute_identities(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> str:
    """Fingerprint every distinct identity tuple of `typed` into `idmap` (fingerprint, prompt_sha), and each
    cached_fingerprint object into `cachedmap`; keep the identities not stored yet.

    Returns the condition that joins `typed t` to `idmap m`.
    """
    _reject_too_deep_cached(con, rel)
    cols = ", ".join(_identity_input())
    tuples_table = "id_tuples"
    con.execute(f"CREATE OR REPLACE TEMP TABLE {tuples_table} AS SELECT DISTINCT {cols}, id_hash FROM {rel.typed}")
    tuples, hashes = con.execute(f"SELECT count(*), count(DISTINCT id_hash) FROM {tuples_table}").fetchall()[0]
    join = _ID_JOIN if hashes == tuples else _id_join_exact()
    fields = sorted((f for f in contract.FIELDS if f.identity), key=lambda f: f.name)  # the canonical key order
    joins: list[str] = []  # the lookups of the fields written by the library, and their columns
    parts, values = [], []  # per field: its '"name":text' part of the identity JSON, and its canonical value
    for f in fields:
        part, value = _field_sql(con, f, joins, tuples_table)
        # Left out when the log leaves the field unknown, or (sampling only) when the request is greedy.
        kept = "NOT (" + " OR ".join([is_unknown(f.name)] + (["greedy"] if f.sampling_only else [])) + ")"
        parts.append(f"CASE WHEN {kept} THEN '{json.dumps(f.name)}:' || {part} END AS part_{f.name}")
        values.append(f"CASE WHEN {kept} THEN {value} END AS value_{f.name}")
    part_names = ", ".join(f"part_{f.name}" for f in fields)
    con.execute(f"""
        CREATE OR REPLACE TEMP TABLE {rel.idmap} AS
        WITH t AS (
            SELECT i.*, CASE WHEN NOT {is_unknown('prompt')} THEN coalesce(i.prompt_hash, sha256(i.prompt)) END
                        AS prompt_sha,
                   -- An unknown temperature counts as sampled: the sampling fields known are compared.
                   coalesce(NOT {is_unknown('temperature')} AND lk_temperature.canon = 0.0, false) AS greedy,
                   {", ".join(f"lk_{f.name}.text AS text_{f.name}, lk_{f.name}.canon AS canon_{f.name}"
                              for f in fields if _looked_up(f))}
            FROM {tuples_table} i {" ".join(joins)}
        )
        SELECT * EXCLUDE ({part_names}), sha256(identity) AS fingerprint FROM (
            SELECT *, '{{' || concat_ws(',', {part_names}) || '}}' AS identity
            FROM (SELECT *, {", ".join(parts)}, {", ".join(values)} FROM t))
    """)
    con.execute(f"""
        INSERT INTO identities (fingerprint, identity, greedy, {", ".join(f.name for f in fields)}, unknown)
        SELECT fingerprint, any_value(identity)::JSON, any_value(greedy),
               {", ".join(f"any_value(value_{f.name})" for f in fields)},
               any_value(nullif(list_sort(list_filter(unknown_fields, lambda u: list_contains(
                   {list_literal(f.name for f in fields)}, u))), []))
        FROM {rel.idmap} m WHERE NOT EXISTS (SELECT 1 FROM identities i WHERE i.fingerprint = m.fingerprint)
        GROUP BY fingerprint
    """)
    _insert_identities(con, _canonical_cached_fingerprints(con, rel))
    for table in [tuples_table, *(_lookup_table(f) for f in fields if _looked_up(f))]:
        con.execute(f"DROP TABLE {table}")
    return join


def _looked_up(f: contract.Field) -> bool:
    """Whether a field's canonical text comes from the library per distinct value (else it is written in SQL)."""
    return f.canonical != "sha256" and not (f.canonical in _INTEGER_FORMS and f.is_integer)


def _lookup_table(f: contract.Field) -> str:
    return f"lk_{f.name}"


def _field_sql(con: duckdb.DuckDBPyConnection, f: contract.Field, joins: list[str], tuples: str) -> tuple[str, str]:
    """A field's canonical JSON text and canonical value as SQL over the distinct identity tuples (`tuples i`) and
    its lookup table's columns (`text_<name>`, `canon_<name>`, whose join it adds to `joins`)."""
    column = f.name
    if f.canonical == "sha256":
        return "'\"' || prompt_sha || '\"'", "prompt_sha"
    if not _looked_up(f):  # an integer: the cast writes the digits Python's str() does
        zero = f" OR {column} = 0" if f.canonical == "zero_is_null" else ""
        return (f"CASE WHEN {column} IS NULL{zero} THEN 'null' ELSE {column}::VARCHAR END",
                f"CASE WHEN {column} IS NULL{zero} THEN NULL ELSE {column} END")
    # Every other form: the library's text and canonical value of each distinct value of the batch.
    distinct = [row[0] for row in con.execute(f"SELECT DISTINCT {f.name} FROM {tuples}").fetchall()]
    encode = value_json(f)
    if f.canonical == "string_set":
        texts = [encode(None if v is None else tuple(v)) for v in distinct]
        # Kept as JSON text the way identities have always held it (json's default spacing), so stored
        # identities compare field by field with new ones.
        canons = [json.dumps(canonical_value(f, v), ensure_ascii=False) for v in distinct]
        canon_type = "VARCHAR"
    else:  # a null here is an unknown field's (left out of the identity) or an absent optional one's
        texts = ["null" if v is None else encode(v) for v in distinct]
        canons = [canonical_value(f, v) for v in distinct]
        canon_type = f.sql_type
    table = _lookup_table(f)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT unnest({sql_list(distinct, f.sql_type)}) AS v, "
                f"unnest({sql_list(texts, 'VARCHAR')}) AS text, unnest({sql_list(canons, canon_type)}) AS canon")
    joins.append(f"LEFT JOIN {table} ON {table}.v IS NOT DISTINCT FROM i.{f.name}")
    return f"text_{f.name}", f"canon_{f.name}"


def _reject_too_deep_cached(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> None:
    """Quarantine the rows whose cached_fingerprint nests too deep for Python to read (DuckDB reads any depth).

    Only a text with more brackets than the depth allowed can be too deep, so almost no row is read here."""
    texts = [text for (text,) in con.execute(f"""
        SELECT DISTINCT text FROM (SELECT cached_fingerprint::VARCHAR AS text FROM {rel.typed}
                                   WHERE cached_fingerprint IS NOT NULL)
        WHERE strlen(text) > {2 * MAX_JSON_DEPTH}
          AND strlen(text) - strlen(replace(replace(text, '[', ''), '{{', '')) > {MAX_JSON_DEPTH}
        """).fetchall() if too_deep(text)]
    if texts:
        con.execute(f"UPDATE {rel.checked} SET reason = $reason WHERE reason IS NULL AND cached_fingerprint::VARCHAR IN "
                    "(SELECT unnest($texts::VARCHAR[]))",
                    {"reason": f"cached_fingerprint: {TOO_DEEP[len('bad JSON: '):]}", "texts": texts})


def _canonical_cached_fingerprints(con: duckdb.DuckDBPyConnection, rel: BatchRelations) -> dict[str, str]:
    """`cachedmap` (text, fingerprint) of the batch's cached_fingerprint objects; returns their identities.

    They are canonicalised too, so a writer's spelling of an equivalence can't matter. (Few: one per
    distinct cached object of the batch.)
    """
    canonical_rows: dict[str, str] = {}
    cached = con.execute(
        f"SELECT DISTINCT cached_fingerprint::VARCHAR FROM {rel.typed} WHERE cached_fingerprint IS NOT NULL"
    ).fetchall()
    cached_texts, cached_fps = [], []
    for (text,) in cached:
        try:
            obj = canonicalize_identity(loads(text))
        except (ValueError, TypeError, KeyError, FormatError):
            continue  # not an identity object we can read: the row keeps it, the guard can't use it
        canonical = canonical_json(obj)
        fp = sha256_hex(canonical)
        cached_texts.append(text)
        cached_fps.append(fp)
        canonical_rows[fp] = canonical
    con.execute(f"CREATE OR REPLACE TEMP TABLE {rel.cachedmap} AS SELECT unnest({sql_list(cached_texts, 'VARCHAR')}) "
                f"AS text, unnest({sql_list(cached_fps, 'VARCHAR')}) AS fingerprint")
    return canonical_rows


def _insert_identities(con: duckdb.DuckDBPyConnection, rows: dict[str, str]) -> None:
    """Keep identities given whole (fingerprint -> canonical JSON), with their fields as the library wrote them."""
    if not rows:
        return
    objs = [json.loads(text) for text in rows.values()]
    fields = [f for f in contract.FIELDS if f.identity]
    columns: list[list] = [list(rows), list(rows.values()), [o.get("temperature", -1.0) == 0.0 for o in objs]]
    casts = ["VARCHAR", "VARCHAR", "BOOLEAN"]
    for f in fields:
        values = [o.get(f.name) for o in objs]
        if f.canonical == "string_set":  # the canonical set as JSON text
            columns.append([None if v is None else json.dumps(v, ensure_ascii=False) for v in values])
            casts.append("VARCHAR")
        else:  # sql_list writes any Python int's digits and casts them: a HUGEINT needs no detour
            columns.append(values)
            casts.append(f.sql_type)
    names = ["fingerprint", "identity", "greedy", *(f.name for f in fields)]
    selected = [f"unnest({sql_list(column, cast)}) AS {name}"
                for column, cast, name in zip(columns, casts, names, strict=True)]
    stored = ["fingerprint", "identity::JSON", "greedy", *(f.name for f in fields)]
    con.execute(f"INSERT INTO identities ({', '.join(names)}) SELECT {', '.join(stored)} "
                f"FROM (SELECT {', '.join(selected)}) a "
                "WHERE NOT EXISTS (SELECT 1 FROM identities i WHERE i.fingerprint = a.fingerprint)")
