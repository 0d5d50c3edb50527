"""From a stored summary version, what makes the next: a table or column added is built alone, not every verdict
and summary of the store again (a full rebuild of a 20M-row lake outgrew its writer's 1 GB).

- 12 -> 13: summary_violations.
- 13 -> 14: the stored partitions (store.sql.deployment_partition), NUL for no deployment then and each name as it
  is, rewritten whole: a filter naming NUL would reach a lake's catalog query.
- 14 -> 15: identity_aliases (derived/aliases.py), and the hits whose log left identity fields unknown counted
  apart in summary_minute and summary_keys (`partial_hits`): whether those are first sights can't be told.
"""

from __future__ import annotations

import duckdb

from specdec_core.derived import aliases
from specdec_core.derived.summaries import (
    MINUTE_DIMENSIONS,
    PARTIAL_HIT,
    VIOLATIONS_BUILD_SQL,
    shared_keys_sql,
)
from specdec_core.store.schema import HASH_NAME_SQL, SUMMARY_VERSION, VERSION_SQL
from specdec_core.store.sql import deployment_label, partition_of


def _partial_hits_sql() -> str:
    """Version 15's partial_hits: a column of 0 where a store holds no such hit (most), counted from the few that
    are elsewhere. summary_shared_keys is made again from summary_keys (its rows are summary_keys')."""
    minute_keys = ("minute", "deployment", "target_model", "draft_model", "temperature", "cache_hit")
    same = " AND ".join(f"c.{k} IS NOT DISTINCT FROM d.{k}" for k in minute_keys)
    pair = " AND ".join(f"c.{k} IS NOT DISTINCT FROM d.{k}" for k in ("deployment", "cache_key", "fingerprint"))
    return f"""
ALTER TABLE summary_minute ADD COLUMN IF NOT EXISTS partial_hits BIGINT DEFAULT 0;
UPDATE summary_minute c SET partial_hits = d.n FROM (
    SELECT {MINUTE_DIMENSIONS}, count(*) AS n FROM requests r WHERE {PARTIAL_HIT} GROUP BY ALL) d WHERE {same};
ALTER TABLE summary_keys ADD COLUMN IF NOT EXISTS partial_hits BIGINT DEFAULT 0;
UPDATE summary_keys c SET partial_hits = d.n FROM (
    SELECT {deployment_label('r')} AS deployment, r.cache_key, r.fingerprint, count(*) AS n FROM requests r
    WHERE {PARTIAL_HIT} GROUP BY ALL) d WHERE {pair};
CREATE OR REPLACE TABLE summary_shared_keys AS {shared_keys_sql()};
{aliases.BUILD_SQL};
"""


UPGRADES = {"12": VIOLATIONS_BUILD_SQL,
            "13": "; ".join(f"UPDATE {table} SET dep = {partition_of('CASE WHEN dep <> chr(0) THEN dep END')}"
                            for table in ("identity_first_seen", "key_last_miss")),
            "14": _partial_hits_sql()}


def upgrade_summaries(con: duckdb.DuckDBPyConnection) -> bool:
    """Bring summaries of an older version up to this one by UPGRADES' steps, within a write. False where there is
    no such path (a version before the first step, or hashes another DuckDB computed): they are rebuilt whole."""
    rows = con.execute(f"SELECT value, {HASH_NAME_SQL} FROM meta WHERE key = 'summary_version'").fetchall()
    if not rows:
        return False
    major, _, hashed = str(rows[0][0]).partition(".")
    if hashed != rows[0][1] or major == SUMMARY_VERSION:
        return False
    steps = []
    while major != SUMMARY_VERSION:
        if major not in UPGRADES:
            return False
        steps.append(UPGRADES[major])
        major = str(int(major) + 1)
    for step in steps:
        con.execute(step)
    con.execute(VERSION_SQL)
    return True
