"""When a request whose log leaves identity fields unknown is another identity of its cache key, and when not.

LiteLLM logs no sampling parameters on a cache hit: the hit's identity is *partial*, its fingerprint taken over
the fields it knows. Counted as it is, every clean hit of a key would be one more identity of that key, and every
key with a hit a collision. The contract's rule ("Unknown is not null: an unknown field is never compared") decides
it as the judging of hits does: a partial identity that agrees, on every field it knows, with an identity of the
same key that knows at least those fields is that identity as far as the log can tell, not another one.

`identity_aliases` holds one row per (deployment, cache_key, fingerprint) of summary_keys whose identity is such a
partial one: `alias` is the identity of the key it counts as (of several, the one that knows most, then the least
fingerprint; it knows every field the partial one knows, so no alias has an alias of its own). Every count of
identities and collisions reads a key's fingerprints through it (`resolved_*`): its rows, the whole-log summaries
and the per-request hashes alike. A key's aliases depend on the set of its fingerprints alone: a batch that adds a
fingerprint to a key works that key's out again (derived/incremental.py), and the result equals a full build.
"""

from __future__ import annotations

import duckdb

from specdec_core.contract import fields as contract
from specdec_core.store.sql import deployment_label

TABLE = "identity_aliases"


def field_differs(f: contract.Field, a: str = "a", b: str = "b", bit: int | None = None) -> str:
    """SQL: whether identities `a` and `b` differ in `f`. A field left out of either identity (greedy, for a
    sampling-only field) or unknown in either is not compared. Rows of `identities` (their `unknown` lists); with
    `bit`, relations with identity_columns() (their `unknown_bits`)."""
    guard = f"NOT ({a}.greedy OR {b}.greedy) AND " if f.sampling_only else ""
    known = (f"NOT coalesce(list_contains({a}.unknown, '{f.name}'), false) "
             f"AND NOT coalesce(list_contains({b}.unknown, '{f.name}'), false)" if bit is None
             else f"(({a}.unknown_bits | {b}.unknown_bits) & {bit}) = 0")
    return f"{guard}{known} AND {a}.{f.name} IS DISTINCT FROM {b}.{f.name}"


def _bits() -> list[tuple[contract.Field, int]]:
    return [(f, 1 << n) for n, f in enumerate(f for f in contract.FIELDS if f.identity)]


PROMPT_BIT = dict((f.name, bit) for f, bit in _bits())["prompt"]


def identity_columns(alias: str = "i") -> str:
    """The columns of `identities` the rule reads, the unknown fields as the bits of an integer (`unknown_bits`, 0
    where every field is known): a pair's test is then integer arithmetic, not a list lookup per field (a million
    LiteLLM requests' outputs: 0.8 s with lists)."""
    # A greedy identity leaves its sampling-only fields out whether the log knew them or not: unknown there says
    # nothing (and which of two such logs' lists the identity row kept would decide the rule).
    bits = " + ".join(f"CASE WHEN list_contains({alias}.unknown, '{f.name}')"
                      + (f" AND NOT {alias}.greedy" if f.sampling_only else "") + f" THEN {bit} ELSE 0 END"
                      for f, bit in _bits())
    fields = ", ".join(f"{alias}.{f.name}" for f, _ in _bits())
    return f"{alias}.greedy, ({bits})::BIGINT AS unknown_bits, {fields}"


def stands_for(a: str, b: str) -> str:
    """SQL: whether identity `b` stands for the partial identity `a` (relations with identity_columns()): `b` knows
    every field `a` knows and more, and no field known to both differs (field_differs' rule)."""
    agree = " AND ".join(f"NOT ({field_differs(f, a, b, bit)})" for f, bit in _bits())
    # Equal masks compare with `<>`, not `<`: a comparison of the two sides' sizes became a range join's condition.
    return (f"({a}.unknown_bits & {b}.unknown_bits) = {b}.unknown_bits AND {a}.unknown_bits <> {b}.unknown_bits AND "
            + agree)


def aliases_sql(keys: str = "TRUE") -> str:
    """The aliases of the keys `keys` picks (a condition over summary_keys `c`)."""
    return f"""
-- Only the keys that hold a partial identity are read whole: most stores have none (a 1M-row store's 168,815 pairs
-- joined with their identities first took 0.1-0.16 s of each full build for nothing).
WITH partial_keys AS (
    SELECT DISTINCT c.key_id FROM summary_keys c
    WHERE {keys} AND c.fingerprint IN (SELECT fingerprint FROM identities WHERE unknown IS NOT NULL)
),
k AS (SELECT c.deployment, c.cache_key, c.key_id, c.fp_id, c.fingerprint FROM summary_keys c
      WHERE {keys} AND c.key_id IN (SELECT key_id FROM partial_keys)),
i AS (SELECT i.fingerprint, {identity_columns()} FROM identities i WHERE i.fingerprint IN (SELECT fingerprint FROM k)),
candidates AS (SELECT * FROM k JOIN i USING (fingerprint)),
partial AS (SELECT * FROM candidates WHERE unknown_bits <> 0),
found AS (
    SELECT a.deployment, a.cache_key, a.key_id, a.fp_id, a.fingerprint,
           arg_min(struct_pack(fingerprint := b.fingerprint, fp_id := b.fp_id),
                   (bit_count(b.unknown_bits), b.fingerprint)) AS m
    -- One that stands for a partial identity knows its target, equal: a join on it too (a key's identities mostly
    -- share their prompt, a key of the prompt alone all of them).
    FROM partial a JOIN candidates b ON a.key_id = b.key_id AND a.target_model = b.target_model
    WHERE {stands_for('a', 'b')}
    GROUP BY ALL
)
SELECT deployment, cache_key, key_id, fp_id, fingerprint, m.fingerprint AS alias, m.fp_id AS alias_fp_id,
       hash(deployment, cache_key) AS key_hash, hash(deployment, fingerprint) AS identity_hash,
       hash(deployment, m.fingerprint) AS alias_hash
FROM found"""


BUILD_SQL = f"CREATE OR REPLACE TABLE {TABLE} AS {aliases_sql()}"


def update_aliases(con: duckdb.DuckDBPyConnection, key_ids: str) -> None:
    """Work out again the aliases of the keys whose ids the relation `key_ids` lists (those that gained a
    fingerprint)."""
    con.execute(f"DELETE FROM {TABLE} WHERE key_id IN (SELECT key_id FROM {key_ids})")
    con.execute(f"INSERT INTO {TABLE} BY NAME {aliases_sql(f'c.key_id IN (SELECT key_id FROM {key_ids})')}")


# The identity a request counts as, where its row has a cache key: its own fingerprint, or its alias.
def resolved_rows(where: str = "TRUE") -> str:
    """`requests r` (filtered by `where`) with `fingerprint` read through the aliases: a relation `r`."""
    return (f"(SELECT r.* REPLACE (coalesce(a.alias, r.fingerprint) AS fingerprint) FROM requests r "
            f"LEFT JOIN {TABLE} a ON a.deployment = {deployment_label('r')} AND a.cache_key = r.cache_key "
            f"AND a.fingerprint = r.fingerprint WHERE {where})")


def resolved_keys(table: str = "summary_keys") -> str:
    """summary_keys (or summary_shared_keys) with `fingerprint` and `fp_id` read through the aliases. A key's
    rows keep their counts; an alias makes two of them one identity."""
    return (f"(SELECT c.* REPLACE (coalesce(a.alias, c.fingerprint) AS fingerprint, "
            f"coalesce(a.alias_fp_id, c.fp_id) AS fp_id) FROM {table} c "
            f"LEFT JOIN {TABLE} a ON a.key_id = c.key_id AND a.fp_id = c.fp_id)")


def resolved_request_keys() -> str:
    """summary_request_keys with `identity_hash` read through the aliases."""
    return (f"(SELECT r.* REPLACE (coalesce(a.alias_hash, r.identity_hash) AS identity_hash) "
            f"FROM summary_request_keys r LEFT JOIN {TABLE} a "
            f"ON a.key_hash = r.key_hash AND a.identity_hash = r.identity_hash)")
