"""One shared cache key in detail: the prompts behind it and which identity fields differ between them."""

from __future__ import annotations

import pandas as pd

from specdec_core.analysis.query import NO_FILTERS, Filters, df
from specdec_core.contract import fields as contract
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


def key_prompts_sql(where: str) -> str:
    return f"""
SELECT r.fingerprint, any_value(r.prompt) AS prompt, any_value(r.prompt_hash) AS prompt_hash,
       min(r.ts) AS first_seen
FROM requests r WHERE {where} AND {deployment_label()} = $deployment AND r.cache_key = $cache_key
GROUP BY r.fingerprint ORDER BY first_seen
"""


def key_prompts(store: Store, deployment: str, cache_key: str, filters: Filters = NO_FILTERS) -> pd.DataFrame:
    """Each identity behind a key with its prompt (None where the log kept only the hash)."""
    return df(store, key_prompts_sql, filters, {"deployment": deployment, "cache_key": cache_key})


def differing_identity_columns(identities: pd.DataFrame) -> list[str]:
    """The identity fields (columns of `key_collision_identities`) whose values differ between the rows: a value
    the row's log left unknown (`unknown_fields`) is never compared."""
    names = [f.name for f in contract.FIELDS if f.identity and f.name in identities.columns]
    unknown = identities["unknown_fields"] if "unknown_fields" in identities else pd.Series([[]] * len(identities))
    known = [[n not in list(u) for u in unknown] for n in names]
    return [n for n, rows in zip(names, known, strict=True)
            if identities[n][rows].astype(str).nunique(dropna=False) > 1]
