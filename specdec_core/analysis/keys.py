"""Cache keys shared by several identities, and who shared each one."""

from __future__ import annotations

import pandas as pd

from specdec_core.analysis.query import (
    NO_FILTERS,
    Filters,
    df,
)
from specdec_core.derived.aliases import resolved_keys, resolved_request_keys, resolved_rows
from specdec_core.derived.summaries import key_hash
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


def key_collisions_sql(where: str) -> str:
    return f"""
SELECT {deployment_label()} AS deployment, r.cache_key, count(DISTINCT r.fingerprint) AS identities,
       count(*) AS requests, count(*) FILTER (WHERE r.cache_hit) AS hits,
       min(r.ts) AS first_seen, max(r.ts) AS last_seen
FROM {resolved_rows()} r WHERE r.cache_key IS NOT NULL AND {where}
GROUP BY ALL HAVING count(DISTINCT r.fingerprint) > 1
ORDER BY identities DESC, requests DESC, deployment, cache_key LIMIT $limit
"""


def key_collisions_whole_sql(dims: str) -> str:
    return f"""
WITH shared AS (
    SELECT c.key_id, count(DISTINCT c.fp_id) AS identities, sum(c.requests)::BIGINT AS requests,
           sum(c.hits)::BIGINT AS hits,
           min(c.first_seen) AS first_seen, max(c.last_seen) AS last_seen,
           any_value(c.deployment) AS deployment, any_value(c.cache_key) AS cache_key
    FROM {resolved_keys('summary_shared_keys')} c WHERE {dims}
    GROUP BY c.key_id HAVING count(DISTINCT c.fp_id) > 1
)
SELECT deployment, cache_key, identities, requests, hits, first_seen, last_seen FROM shared
ORDER BY identities DESC, requests DESC, deployment, cache_key LIMIT $limit
"""


# A time range: a key shared within it is shared in the whole log, so only the per-request key hashes of the keys
# the summary lists as shared are grouped, and the groups take their key's text from that list.
def key_collisions_shared_sql(source: str, where: str) -> str:
    return f"""
WITH shared AS (
    SELECT DISTINCT {key_hash("deployment", "cache_key")} AS key_hash, deployment, cache_key FROM summary_shared_keys
), g AS (
    SELECT r.key_hash, count(DISTINCT r.identity_hash) AS identities, count(*) AS requests,
           count(*) FILTER (WHERE r.cache_hit) AS hits, min(r.ts) AS first_seen, max(r.ts) AS last_seen
    FROM {resolved_request_keys()} r SEMI JOIN shared s USING (key_hash) WHERE {where}
    GROUP BY 1 HAVING count(DISTINCT r.identity_hash) > 1
)
SELECT s.deployment, s.cache_key, g.identities, g.requests, g.hits, g.first_seen, g.last_seen
FROM g JOIN shared s USING (key_hash)
ORDER BY identities DESC, requests DESC, deployment, cache_key LIMIT $limit
"""


def key_collisions(store: Store, filters: Filters = NO_FILTERS, limit: int = 10_000) -> pd.DataFrame:
    """Cache keys shared by more than one identity."""
    return df(store, key_collisions_sql, filters, {"limit": limit}, whole=key_collisions_whole_sql,
              ranged=key_collisions_shared_sql)


def key_collision_identities_sql(where: str) -> str:
    """Each identity behind one key, a request whose log left fields unknown counted as the identity that stands
    for it (derived/aliases.py); the fields are the identity's as stored (canonical), `unknown_fields` those its
    log left unknown (a partial identity no other stands for: a hit that differs in a field both know)."""
    return f"""
WITH g AS (
    SELECT r.fingerprint, arg_min(r.request_id, (r.ts, r.request_id)) AS first_request_id, count(*) AS requests,
           count(*) FILTER (WHERE r.cache_hit) AS hits, min(r.ts) AS first_seen, max(r.ts) AS last_seen
    FROM {resolved_rows()} r
    WHERE {where} AND {deployment_label()} = $deployment AND r.cache_key = $cache_key GROUP BY 1
)
SELECT g.*, i.target_model, coalesce(i.draft_model, 'none') AS draft_model, i.temperature, i.max_tokens,
       i.seed::VARCHAR AS seed, i.tokenizer_version, i.identity::VARCHAR AS identity,
       coalesce(i.unknown, []) AS unknown_fields
FROM g JOIN identities i USING (fingerprint) ORDER BY first_seen, fingerprint
"""


def key_collision_identities(store: Store, deployment: str, cache_key: str,
                             filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """The identities that shared one cache key, with counts and first/last seen."""
    return df(store, key_collision_identities_sql, filters, {"deployment": deployment, "cache_key": cache_key})


