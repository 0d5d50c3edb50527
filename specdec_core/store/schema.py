"""The store's tables. The contract's columns of `requests` and `identities` come from the one field table."""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

import duckdb

from specdec_core.contract import fields as contract

# Columns that an ingest computes for every stored row, after the contract's own.
_ROW_COLUMNS = """
    extra JSON,
    unknown_fields VARCHAR[],  -- fields the log marked unknown (not null): never compared
    source_link VARCHAR,  -- the request whose output this hit served, where the log says so
    fingerprint VARCHAR NOT NULL,
    cached_identity_fingerprint VARCHAR,
    source_file VARCHAR NOT NULL,
    source_line BIGINT NOT NULL,
    ingest_id BIGINT NOT NULL"""


# DuckDB 1.5.5 bit-packs a HUGEINT column of small numbers (a seed of 42) and unpacks it at about 250 ns a
# value, skipped ones included: any read of the seed column took 0.25 s at 1M rows and 4.5-5.2 s at 20M, a
# filtered read as much as a whole one (BIGINT columns: 0.002 s at 1M). Run-length encoded it reads in 4 ms
# at 1M and the services log's store grows by 1 MB (92 to 93 MB; uncompressed: 107 MB). A lake's Parquet
# files have no such column: the clause is left out there (ddl.create_tables).
_COMPRESSION = {"HUGEINT": " USING COMPRESSION rle"}


def _stored_type(f: contract.Field) -> str:
    return f.sql_type + _COMPRESSION.get(f.sql_type, "")


def _not_null(f: contract.Field) -> bool:
    # prompt_hash is computed where the log has only the prompt; an absent top_p is its default. A field
    # that may be unknown is NULL where the log marks it so.
    return (f.required or f.name == "prompt_hash" or f.default is not None) and not _may_be_unknown(f)


def _may_be_unknown(f: contract.Field) -> bool:
    return f.name in contract.UNKNOWABLE_FIELDS or f.name == "prompt_hash"


def _request_column(f: contract.Field) -> str:
    not_null = _not_null(f)
    return f"    {f.name} {_stored_type(f)}{' NOT NULL' if not_null else ''}"


def _identity_type(f: contract.Field) -> str:
    # The prompt is kept as its SHA-256 and a stop set as its canonical JSON text.
    return "VARCHAR" if f.canonical in ("sha256", "string_set") else f.sql_type


def requests_ddl() -> str:
    columns = ",\n".join(_request_column(f) for f in contract.FIELDS)
    # Unique by ingest's own dedupe; no index: an ART index over 1M ids costs more than it saves.
    return f"CREATE TABLE IF NOT EXISTS requests (\n{columns},{_ROW_COLUMNS}\n);"


def identities_ddl() -> str:
    """Unique by the ingest's own NOT EXISTS, as in a lake; no index: every checkpoint of a batch that adds an
    identity wrote the whole index again (0.1 s a batch at 40,000 identities)."""
    columns = ", ".join(f"{f.name} {_identity_type(f)}" for f in contract.FIELDS if f.identity)
    return ("CREATE TABLE IF NOT EXISTS identities (\n    fingerprint VARCHAR NOT NULL,\n"
            f"    identity JSON NOT NULL,\n    greedy BOOLEAN NOT NULL,\n    {columns},\n    unknown VARCHAR[]\n);")


# Each hit first judged contaminated, never removed: what monitoring counts (derived/verdicts.py). Made by the
# first write that judges hits. No key: the ingest adds only ids not there yet, and a store's writers take
# turns; its index cost the first ingest of 300,000 contaminated hits 0.3 s on one thread.
FIRST_VERDICTS_DDL = """
CREATE TABLE IF NOT EXISTS contaminated_first_verdicts (
    request_id VARCHAR NOT NULL,
    deployment VARCHAR,        -- '' for none, as the summaries hold it
    target_model VARCHAR,
    draft_model VARCHAR,       -- 'none' for no speculation
    differing_fields VARCHAR,  -- as first judged: sorted log names joined with ';'
    ingest_id BIGINT           -- the ingest that first judged it contaminated (NULL: by `specdec migrate`)
);
"""

# Tables that had a PRIMARY KEY in stores made before it was dropped, with their key column and their DDL
# now: ensure_schema makes them again without it, once, rows kept.
UNKEYED_TABLES = {"identities": ("fingerprint", identities_ddl),
                  "contaminated_first_verdicts": ("request_id", lambda: FIRST_VERDICTS_DDL)}


def drop_key_sql(table: str) -> str:
    """The statements that move `table`'s rows into a table made by its DDL now (UNKEYED_TABLES), without the key."""
    return (f"ALTER TABLE {table} RENAME TO {table}_keyed;\n{UNKEYED_TABLES[table][1]()}\n"
            f"INSERT INTO {table} BY NAME SELECT * FROM {table}_keyed;\nDROP TABLE {table}_keyed;")


REPLAY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("replay_id", "VARCHAR PRIMARY KEY"),
    ("request_id", "VARCHAR NOT NULL"),
    ("replayed_at", "TIMESTAMPTZ NOT NULL"),
    ("classification", "VARCHAR NOT NULL"),
    ("replay_text", "VARCHAR"),
    ("token_ids", "BIGINT[]"),
    ("production_text", "VARCHAR"),
    ("first_divergent_token", "BIGINT"),
    ("first_divergent_char", "BIGINT"),
    ("common_prefix_tokens", "BIGINT"),
    ("similarity", "DOUBLE"),
    ("draft_tokens", "BIGINT"),
    ("accepted_tokens", "BIGINT"),
    ("source_request_id", "VARCHAR"),
    ("evidence", "JSON"),
    ("environment", "JSON"),
)

# What `specdec cache purge` and `restore` did to a production cache (remediation/log.py), for the
# incident report: one row a run, dry runs included.
PURGE_COLUMNS: tuple[tuple[str, str], ...] = (
    ("ts", "TIMESTAMPTZ NOT NULL"),
    ("kind", "VARCHAR NOT NULL"),  # plan | namespace | restore
    ("target", "VARCHAR NOT NULL"),  # the Redis URL, any password masked
    ("plan", "VARCHAR"),
    ("namespace", "VARCHAR"),
    ("planned", "BIGINT NOT NULL"),
    ("deleted", "BIGINT NOT NULL"),
    ("missing", "BIGINT NOT NULL"),
    ("dry_run", "BOOLEAN NOT NULL"),
)

_OTHER_TABLES = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS quarantine (
    ingest_id BIGINT NOT NULL,
    source_file VARCHAR NOT NULL,
    source_line BIGINT NOT NULL,
    request_id VARCHAR,
    reason VARCHAR NOT NULL,
    raw VARCHAR NOT NULL,
    raw_hash VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS ingests (
    ingest_id BIGINT PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    paths VARCHAR[] NOT NULL,
    n_read BIGINT, n_accepted BIGINT, n_duplicates BIGINT, n_quarantined BIGINT
);
-- One row per cache hit: the miss that populated its entry, and whether it served another identity.
CREATE TABLE IF NOT EXISTS hit_sources (
    request_id VARCHAR NOT NULL,
    source_request_id VARCHAR,
    contaminated BOOLEAN NOT NULL,
    fingerprint_mismatch BOOLEAN NOT NULL,
    differing_fields VARCHAR,
    first_sight BOOLEAN,  -- a hit on an identity its deployment had not seen before in the log
    source_ts TIMESTAMPTZ
);
-- The partial identities (fields the log left unknown) that count as another identity of their key
-- (derived/aliases.py): made here too, as the counts over the rows read it before any hit was judged.
CREATE TABLE IF NOT EXISTS identity_aliases (
    deployment VARCHAR, cache_key VARCHAR, key_id BIGINT, fp_id BIGINT, fingerprint VARCHAR, alias VARCHAR,
    alias_fp_id BIGINT, key_hash UBIGINT, identity_hash UBIGINT, alias_hash UBIGINT
);
"""


def schema_sql() -> str:
    replays = ",\n".join(f"    {name} {sql_type}" for name, sql_type in REPLAY_COLUMNS)
    purges = ",\n".join(f"    {name} {sql_type}" for name, sql_type in PURGE_COLUMNS)
    return "\n".join([_OTHER_TABLES, requests_ddl(), identities_ddl(),
                      f"CREATE TABLE IF NOT EXISTS replays (\n{replays}\n);",
                      f"CREATE TABLE IF NOT EXISTS purges (\n{purges}\n);"])


def column_migrations_sql() -> str:
    """Columns added after a table first shipped, and contract fields added since a store was made."""
    statements = [
        "ALTER TABLE hit_sources ADD COLUMN IF NOT EXISTS first_sight BOOLEAN;",
        "ALTER TABLE hit_sources ADD COLUMN IF NOT EXISTS source_ts TIMESTAMPTZ;",
    ]
    # A field added to the contract is NULL in rows stored before it existed (DuckDB can't add a NOT NULL column).
    statements += [f"ALTER TABLE requests ADD COLUMN IF NOT EXISTS {f.name} {_stored_type(f)};"
                   for f in contract.FIELDS]
    statements += [f"ALTER TABLE identities ADD COLUMN IF NOT EXISTS {f.name} {_identity_type(f)};"
                   for f in contract.FIELDS if f.identity]
    statements += ["ALTER TABLE requests ADD COLUMN IF NOT EXISTS unknown_fields VARCHAR[];",
                   "ALTER TABLE requests ADD COLUMN IF NOT EXISTS source_link VARCHAR;",
                   "ALTER TABLE identities ADD COLUMN IF NOT EXISTS unknown VARCHAR[];"]
    return "\n".join(statements)


def columns_to_relax(not_null: set[str]) -> list[str]:
    """Stores made before fields could be unknown have NOT NULL on them: the columns of `requests` that still do."""
    return [f.name for f in contract.FIELDS if _may_be_unknown(f) and f.name in not_null]


def relax_not_null_sql(columns: list[str]) -> str:
    return "\n".join(f"ALTER TABLE requests ALTER COLUMN {name} DROP NOT NULL;" for name in columns)


def is_specdec_store(con: duckdb.DuckDBPyConnection, tables: dict[str, set[str]]) -> bool:
    """Whether a database's tables (name -> columns) are a specdec store's, of this version or an older one:
    its requests carry fingerprints, or its meta names a schema version."""
    if {"request_id", "fingerprint"} <= tables.get("requests", set()):
        return True
    if not {"key", "value"} <= tables.get("meta", set()):
        return False
    return con.execute("SELECT count(*) FROM meta WHERE key = 'schema_version'").fetchall()[0][0] > 0


# The derived tables' version, which the store records in `meta` and checks before a read
# (specdec_core.derived builds the tables).
# Bump when a summary table, or how hits are judged, changes: an older store is rejudged and rebuilt
# by `specdec migrate` or the next ingest (a read asks for the migrate). 4: ties among misses at one instant go to the one logged last.
# 5: summary_outputs. 6: identity_first_seen (built by the judging, hit_sources.py). 7: summary_request_keys.
# 8: key_last_miss (built by the judging). 9: summary_request_outputs.
# 10: summary_minute's logged token sums; summary_first_verdicts (derived/verdicts.py).
# 11: summary_audience and summary_impact_hits (consumer and experiment).
# 12: summary_minute's logging-gap counts (unknown_<field>, set_<field>).
# 13: summary_violations. 14: chr(1), not NUL, the stored partition (dep) of requests that log no deployment.
# 15: identity_aliases (derived/aliases.py); partial_hits in summary_minute and summary_keys
# (derived/upgrades.py).
SUMMARY_VERSION = "15"

# A store's rows of summary_request_keys hold hashes that the DuckDB which wrote them computed, and DuckDB does not
# promise its hash() stays the same across versions. The version stored names that hash too, as the connection
# that writes or reads computes it: a DuckDB whose hash differs takes the summaries for out of date (a read asks
# for `specdec migrate`, which rebuilds them, as an ingest does), so hashes of two versions never meet in one count.
HASH_NAME_SQL = "printf('%x', hash('specdec_core summary hash'))"  # this DuckDB's hash(), by one value of it
STORED_VERSION_SQL = f"'{SUMMARY_VERSION}.' || {HASH_NAME_SQL}"
VERSION_SQL = ("DELETE FROM meta WHERE key = 'summary_version'; "
               f"INSERT INTO meta SELECT 'summary_version', {STORED_VERSION_SQL}")


# What the open read (Store.read) found of its state's summaries: (its connection, built by this code). A read
# checks once per state; asked again for each question, a lake's meta took 6-7 ms a time, 20-30 times a page.
READ_SUMMARIES: ContextVar[tuple[object, bool] | None] = ContextVar("specdec_read_summaries", default=None)
# The open read's state of a DuckDB file, where the rows of a time range's cut minutes are kept once aggregated
# (summaries.named_minute_source): (its connection, {the rows' query: a table of the view's own database}, a lock).
READ_EDGES: ContextVar[tuple[Any, dict[Any, str], Any] | None] = ContextVar("specdec_read_edges", default=None)


def current_version_sql(meta: str = "meta") -> str:
    """Whether the summaries in `meta` match this code and this DuckDB's hash: no row, or one true/false."""
    return f"SELECT value = {STORED_VERSION_SQL} FROM {meta} WHERE key = 'summary_version'"
