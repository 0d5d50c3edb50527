"""Fingerprint every distinct identity of an ingest batch with the library's own `identity`, so the store
and the library cannot disagree, and keep each canonical identity in `identities`."""

from __future__ import annotations

import json

import duckdb
import pyarrow as pa

from specdec_core.contract import fields as contract
from specdec_core.contract.identity import (
    DecodeRequest,
    canonical_json,
    canonicalize_identity,
    identity_json,
    identity_with_unknown,
    sha256_hex,
)

# What decides a row's identity: its identity fields, and which of them the log left unknown.
_IDENTITY_INPUT = (*contract.IDENTITY_INPUT, "unknown_fields")
# DuckDB's hash function makes the join an equi-join; the exact comparison after it rules out collisions.
ID_HASH = f"hash({', '.join(_IDENTITY_INPUT)})"  # DuckDB's hash, within one ingest
_ID_JOIN = "t.id_hash = m.id_hash"
# Only needed when two distinct identity tuples share a hash (checked per ingest): then the exact match decides.
_ID_JOIN_EXACT = _ID_JOIN + " AND " + " AND ".join(f"t.{c} IS NOT DISTINCT FROM m.{c}" for c in _IDENTITY_INPUT)


def compute_identities(con: duckdb.DuckDBPyConnection) -> str:
    """Fingerprint every distinct identity tuple with `request.identity` into `idmap` (or say why not).

    Returns the condition that joins `typed t` to `idmap m`.
    """
    cols = ", ".join(_IDENTITY_INPUT)
    tuples = con.execute(f"SELECT DISTINCT {cols}, id_hash FROM typed").fetchall()
    fps: list[str | None] = []
    prompt_shas: list[str | None] = []
    reasons: list[str | None] = []
    identity_rows: dict[str, str] = {}  # fingerprint -> canonical identity JSON
    unknown_of: dict[str, list[str]] = {}  # fingerprint -> the fields its identity leaves out as unknown
    for row in tuples:
        record = dict(zip(_IDENTITY_INPUT, row[:-1], strict=True))
        unknown = record.pop("unknown_fields") or []
        try:
            if unknown:
                text = canonical_json(identity_with_unknown(record, unknown))
                prompt_sha = (None if "prompt" in unknown else sha256_hex(record["prompt"])
                              if record["prompt"] is not None else record["prompt_hash"])
            else:
                req = DecodeRequest.from_record(record)
                text = identity_json(req)  # canonical_json(identity(req)), pinned equal by test_request
                prompt_sha = req.prompt_sha256
        except ValueError as exc:
            fps.append(None)
            prompt_shas.append(None)
            reasons.append(str(exc))
            continue
        fp = sha256_hex(text)
        fps.append(fp)
        prompt_shas.append(prompt_sha)
        reasons.append(None)
        identity_rows[fp] = text
        if unknown:
            unknown_of[fp] = sorted(unknown)
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
    identity_rows.update(_canonical_cached_fingerprints(con))
    _insert_identities(con, identity_rows, unknown_of)
    return join


def _canonical_cached_fingerprints(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """`cachedmap` (text, fingerprint) of the batch's cached_fingerprint objects; returns their identities.

    They are canonicalised too, so a writer's spelling of an equivalence can't matter.
    """
    canonical_rows: dict[str, str] = {}
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
        canonical_rows[fp] = canonical
    con.register("cachedmap_arrow", pa.table({"text": pa.array(cached_texts, pa.string()),
                                              "fingerprint": pa.array(cached_fps, pa.string())}))
    con.execute("CREATE OR REPLACE TEMP TABLE cachedmap AS SELECT * FROM cachedmap_arrow")
    con.unregister("cachedmap_arrow")
    return canonical_rows


def _arrow_type(column: str) -> pa.DataType | None:
    # HUGEINT values (seeds) go through text: Arrow has no 128-bit integer.
    if column == "id_hash":
        return pa.uint64()
    if column == "unknown_fields":
        return pa.list_(pa.string())
    f = contract.BY_NAME[column]
    return pa.string() if f.sql_type == "HUGEINT" else pa.list_(pa.string()) if f.kind == "str_list" else None


def _as_text(values: list) -> list:
    return [None if v is None else str(v) for v in values]


_HUGEINT_INPUT = tuple(c for c in _IDENTITY_INPUT if c in contract.BY_NAME and contract.BY_NAME[c].sql_type == "HUGEINT")
_IDENTITY_FIELDS = tuple(f for f in contract.FIELDS if f.identity)


def _identity_column(f: contract.Field, objs: list[dict]) -> pa.Array | list:
    values = [o.get(f.name) for o in objs]
    if f.canonical == "string_set":
        return [json.dumps(v, ensure_ascii=False) for v in values]  # the canonical set as JSON text
    if f.sql_type == "HUGEINT":
        return pa.array(_as_text(values), pa.string())
    return values


def _insert_identities(con: duckdb.DuckDBPyConnection, rows: dict[str, str],
                       unknown_of: dict[str, list[str]] | None = None) -> None:
    if not rows:
        return
    objs = [json.loads(text) for text in rows.values()]
    table = pa.table({
        "fingerprint": list(rows),
        "identity": list(rows.values()),
        # Greedy: a known temperature of 0 (an unknown one counts as sampled, so known sampling fields compare).
        "greedy": [o.get("temperature", -1.0) == 0.0 for o in objs],
        **{f.name: _identity_column(f, objs) for f in _IDENTITY_FIELDS},
        "unknown": pa.array([(unknown_of or {}).get(fp) for fp in rows], pa.list_(pa.string())),
    })
    names = ["fingerprint", "identity", "greedy", *(f.name for f in _IDENTITY_FIELDS), "unknown"]
    values = ["fingerprint", "identity::JSON", "greedy",
              *(f"{f.name}::HUGEINT" if f.sql_type == "HUGEINT" else f.name for f in _IDENTITY_FIELDS), "unknown"]
    con.register("identities_arrow", table)
    con.execute(f"INSERT INTO identities ({', '.join(names)}) SELECT {', '.join(values)} "
                "FROM identities_arrow a WHERE NOT EXISTS (SELECT 1 FROM identities i "
                "WHERE i.fingerprint = a.fingerprint)")
    con.unregister("identities_arrow")


