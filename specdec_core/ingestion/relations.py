"""The temp relations one ingest batch is worked through, named in one place.

Each step of the load (ingestion/load.py) takes the relations it reads from a `BatchRelations` and writes the
ones it is documented to make; `load` drops them all once the batch is written, so no step finds a relation
that an earlier batch left behind.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BatchRelations:
    """The batch's relations, in the order they are made.

    checked: every record read: its typed columns and id_hash, or why it is rejected (`reason`); made first,
        filled file by file by the checks (staging.set_aside, load._validate), its cache keys backfilled.
    typed: the records of `checked` that pass (a view).
    raws: every staged line's text (seq, raw, origin), to quote rejected records exactly.
    backfilled: the stored misses the batch gave a cache key, as they now are (load._backfill_cache_keys).
    idmap: each distinct identity input of `typed` with its fingerprint and prompt_sha (identities.py).
    cachedmap: each cached_fingerprint text of `typed` with the fingerprint of the identity it holds.
    contested: the request_ids of `typed` that repeat, in the batch or against the store (load._classify).
    outcome: accept, duplicate or conflict of each row of `typed` whose request_id repeats (load._classify).
    links: each source link of the batch's hits with the cache key it gives the miss it names
        (load._backfill_cache_keys).
    bad: the batch's rejects with their quoted text; bad_new: those not quarantined before.
    """

    checked: str = "checked"
    typed: str = "typed"
    raws: str = "raws"
    backfilled: str = "backfilled"
    idmap: str = "idmap"
    cachedmap: str = "cachedmap"
    contested: str = "contested"
    outcome: str = "outcome"
    links: str = "links"
    bad: str = "bad"
    bad_new: str = "bad_new"

    def views(self) -> tuple[str, ...]:
        return (self.typed, self.raws)

    def tables(self) -> tuple[str, ...]:
        return (self.checked, self.backfilled, self.idmap, self.cachedmap, self.contested, self.outcome, self.links,
                self.bad, self.bad_new)
