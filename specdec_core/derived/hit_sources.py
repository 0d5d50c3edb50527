"""Which cache hits served another identity's output, and which request put it in the cache.

The contract's rules (shared/log-schema.md, "Contamination"): a hit's *source* is the latest
earlier miss with the same deployment and cache_key; the hit is contaminated when its identity
differs from the source's, or from the `cached_fingerprint` it logged. A miss at the same instant
as the hit counts as earlier; of several misses at one instant, the one logged last (file, line)
is the source, since it wrote the entry last. Judged over the whole store by the first ingest (and
`specdec migrate`); later ingests judge again only the hits their batch may change (derived/incremental.py),
since a new file may hold an earlier miss or a later hit.

Two rules hold for any log format that has them: a logged source link (LiteLLM's `response.id` on a
hit) names the source whatever the timestamps say; and a field the log marks unknown is never
compared, so a hit that differs from its source only in unknown fields is not contaminated.
"""

from __future__ import annotations

import duckdb

from specdec_core.contract import fields as contract
from specdec_core.derived.aliases import field_differs
from specdec_core.derived.summaries import folded_sql, partial
from specdec_core.store.sql import deployment_partition

# What the judging reads of a request.
ROW_SQL = f"""SELECT request_id, ts, {deployment_partition(None)} AS dep, cache_key, cache_hit,
           fingerprint, cached_identity_fingerprint, source_file, source_line, source_link,
           {partial(None)} AS partial
    FROM requests"""

# Every hit, judged against every request: the full rebuild.
# When each deployment first saw each identity: the first sights read it (also the incremental judging,
# which keeps it up to date per batch, derived/incremental.py).
FIRST_SEEN_SQL = f"""CREATE OR REPLACE TABLE identity_first_seen AS
SELECT {deployment_partition(None)} AS dep, fingerprint, min(ts) AS first_ts FROM requests GROUP BY 1, 2"""

# The latest miss of each (deployment, cache_key), of several at one instant the one logged last: what a hit
# later than every stored miss of its key is judged against, so that live traffic's judging reads no stored
# misses (derived/incremental.py). Batches append their own latest misses; a key's latest is the last over its
# rows (last_miss_sql), and the table is folded to one row per key once it has doubled.
_LAST = "arg_max(struct_pack(ts, request_id, fingerprint, source_file, source_line), (ts, source_file, source_line))"
MISS_COLUMNS = "dep, cache_key, ts, request_id, fingerprint, source_file, source_line"


def last_miss_sql(rows: str) -> str:
    """One row per (dep, cache_key) of `rows` (MISS_COLUMNS): its latest miss."""
    return (f"SELECT dep, cache_key, m.ts AS ts, m.request_id AS request_id, m.fingerprint AS fingerprint, "
            f"m.source_file AS source_file, m.source_line AS source_line "
            f"FROM (SELECT dep, cache_key, {_LAST} AS m FROM ({rows}) GROUP BY ALL)")


LAST_MISS_FOLDED = "last_miss_folded"  # meta's key: key_last_miss's rows when last folded
LAST_MISS_SQL = ("CREATE OR REPLACE TABLE key_last_miss AS " + last_miss_sql(
    f"SELECT {deployment_partition(None)} AS dep, cache_key, ts, request_id, fingerprint, source_file, source_line "
    "FROM requests WHERE NOT cache_hit AND cache_key IS NOT NULL"))
FOLD_LAST_MISS_SQL = "CREATE OR REPLACE TABLE key_last_miss AS " + last_miss_sql("SELECT * FROM key_last_miss")

# Read three times: scanned each time, not materialized (a 1M-row store's judging 5% faster).
ALL_ROWS = f"""r AS NOT MATERIALIZED ({ROW_SQL}), hits AS (SELECT * FROM r WHERE cache_hit),
miss_rows AS (SELECT * FROM r WHERE NOT cache_hit),
first_rows AS (SELECT dep, fingerprint, first_ts AS ts FROM identity_first_seen),
-- Only the rows a hit names: joined whole, the store's every row would be the hash table.
link_rows AS (SELECT * FROM r WHERE request_id IN (SELECT source_link FROM r WHERE source_link IS NOT NULL))"""


def _difference(f: contract.Field) -> str:
    return f"           CASE WHEN {field_differs(f)} THEN '{f.name}' END"


def hit_sources_sql(rows: str = ALL_ROWS) -> str:
    """The verdict of each hit in `hits`; `rows` defines hits, miss_rows, first_rows and link_rows: the hits
    to judge, and (at least) the misses of their keys, the rows of their identities and their linked sources."""
    differences = ",\n".join(_difference(f) for f in contract.FIELDS if f.identity)
    return f"""
WITH {rows},
-- Misses of one entry at the same instant: the one logged last wrote the entry last. One per instant
-- also makes the ASOF join's pick deterministic.
misses AS (
    SELECT dep, cache_key, ts, m.request_id, m.fingerprint
    FROM (SELECT dep, cache_key, ts,
                 arg_max(struct_pack(request_id, fingerprint), (source_file, source_line)) AS m
          FROM miss_rows GROUP BY ALL)
),
-- When each deployment first saw each identity: a grouped minimum, cheaper than a second ASOF join.
firsts AS (SELECT dep, fingerprint, min(ts) AS first_ts FROM first_rows GROUP BY ALL),
joined AS (
    SELECT h.request_id,
           CASE WHEN h.source_link IS NULL THEN m.request_id ELSE l.request_id END AS source_request_id,
           CASE WHEN h.source_link IS NULL THEN m.ts ELSE l.ts END AS source_ts, h.fingerprint AS fp,
           CASE WHEN h.source_link IS NULL THEN m.fingerprint ELSE l.fingerprint END AS source_fp,
           h.cached_identity_fingerprint AS cached_fp,
           -- No earlier request of this deployment had this identity: a correct key could not hit here.
           -- Unknowable for a hit whose log leaves identity fields unknown.
           CASE WHEN NOT h.partial THEN h.ts <= f.first_ts END AS first_sight
    FROM hits h
    ASOF LEFT JOIN misses m ON h.dep = m.dep AND h.cache_key = m.cache_key AND h.ts >= m.ts
    LEFT JOIN link_rows l ON l.request_id = h.source_link
    JOIN firsts f ON f.dep = h.dep AND f.fingerprint = h.fingerprint
), judged AS (
    SELECT *, coalesce(source_fp <> fp, false) AS source_differs,
           coalesce(cached_fp <> fp, false) AS fingerprint_mismatch,
           CASE WHEN coalesce(source_fp <> fp, false) THEN source_fp ELSE cached_fp END AS other_fp
    FROM joined
), pairs AS (
    -- Differing fields depend only on the two identities: work them out once per pair.
    SELECT DISTINCT fp, other_fp FROM judged WHERE source_differs OR fingerprint_mismatch
), diffs AS (
    SELECT p.fp, p.other_fp, array_to_string(list_sort(list_filter([
{differences}
       ], lambda x: x IS NOT NULL)), ';') AS differing_fields
    FROM pairs p JOIN identities a ON a.fingerprint = p.fp LEFT JOIN identities b ON b.fingerprint = p.other_fp
)
-- Fingerprints differ but no field known to both does: the difference lies in unknown fields only.
SELECT j.request_id, j.source_request_id,
       (j.source_differs OR j.fingerprint_mismatch) AND coalesce(d.differing_fields <> '', true) AS contaminated,
       j.fingerprint_mismatch AND coalesce(d.differing_fields <> '', true) AS fingerprint_mismatch,
       nullif(d.differing_fields, '') AS differing_fields, j.first_sight, j.source_ts
FROM judged j LEFT JOIN diffs d ON d.fp = j.fp AND d.other_fp = j.other_fp
"""


def judge_hits(con: duckdb.DuckDBPyConnection) -> None:
    """Rebuild `identity_first_seen`, `key_last_miss` and `hit_sources`: one row per hit with its source,
    verdict and differing fields."""
    con.execute(FIRST_SEEN_SQL)
    con.execute(LAST_MISS_SQL)
    con.execute(folded_sql("key_last_miss", LAST_MISS_FOLDED))
    con.execute("CREATE OR REPLACE TABLE hit_sources AS " + hit_sources_sql())
