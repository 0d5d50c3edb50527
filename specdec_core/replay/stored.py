"""Stored replays read back: one replay by its id, the history of replays, and their evidence in words.

Every replay is stored when it finishes (the dashboard's, a batch's, the CLI's), so its page can be
reopened by `replay_id` from any tab or a link pasted into a ticket, without decoding again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import pandas as pd

from specdec_core.analysis.query import NO_FILTERS, Filters, execute
from specdec_core.replay.diff import WordOp, word_diff
from specdec_core.replay.run import STORED_MESSAGE_KEY, STORED_SOURCE_TEXT_KEY
from specdec_core.store.connection import Store
from specdec_core.store.sql import deployment_label


@dataclass(frozen=True)
class StoredReplay:
    replay_id: str
    request_id: str
    replayed_at: datetime
    classification: str
    message: str
    production_text: str
    replay_text: str | None
    source_request_id: str | None
    source_replay_text: str | None
    similarity: float | None
    first_divergent_token: int | None
    common_prefix_tokens: int | None
    replay_tokens: int
    draft_tokens: int | None
    accepted_tokens: int | None
    evidence: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] = field(default_factory=dict)

    @property
    def proof(self) -> tuple[str, str | None]:
        """(what production is compared with, its text): the replay that proves the cause.

        For a foreign output whose source's replay differs from production (equal up to near-ties, or a
        plausible sample of it), that replay: the diff shows where the two part. Where the source's replay
        equals production exactly, a diff against it has nothing to show: the request's own replay is what
        production should have been, and the diff against it shows what the cache changed.
        """
        if (self.classification == "foreign" and self.source_replay_text is not None
                and self.source_replay_text != self.production_text):
            return f"the replay of the source request {self.source_request_id}", self.source_replay_text
        if self.classification == "foreign" and self.source_replay_text is not None:
            return (f"the replay with the request's own identity (production equals the replay of the source "
                    f"request {self.source_request_id} exactly)", self.replay_text)
        return "the replay with the request's own identity", self.replay_text

    def proof_diff(self) -> tuple[tuple[WordOp, ...], float] | None:
        against = self.proof[1]
        return None if against is None else word_diff(self.production_text, against)

    def served_source(self, source_request_id: str | None) -> str | None:
        """For a sampled request whose cache hit served another identity's output (`source_request_id`, as the
        store found it): what it is, in words, and whether this request could have produced it too, how likely.
        None for every other verdict, which says it already."""
        if self.classification != "sampled" or not source_request_id:
            return None
        said = (f"A contaminated hit: production served the output cached by request {source_request_id}, "
                "another identity. ")
        own, replay = self.evidence.get("production_mean_logprob"), self.evidence.get("replay_mean_logprob")
        if self.evidence.get("production_impossible_tokens"):
            return said + "This request could not have produced it: some of its tokens are impossible here."
        if own is None or replay is None:
            return said + "Whether this request could have produced it too can't be scored here."
        ratio = math.exp(replay - own)
        if self.evidence.get("production_implausible"):
            return said + (f"This request could hardly have produced it: each token is about {ratio:,.0f} times "
                           "less likely under its identity than its own replay's tokens.")
        closeness = "as likely as" if ratio < 1.5 else f"about {ratio:.1f} times less likely than"
        return said + (f"This request could have produced it too, by sampling: its tokens are {closeness} "
                       "the replay's own, per token, under this request's identity.")


STORED_REPLAY_SQL = """
SELECT replay_id, request_id, replayed_at, classification, production_text, replay_text, source_request_id,
       similarity, first_divergent_token, common_prefix_tokens, len(token_ids) AS replay_tokens, draft_tokens,
       accepted_tokens, evidence::VARCHAR AS evidence, environment::VARCHAR AS environment
FROM replays WHERE replay_id = $replay_id
"""


def stored_replay(store: Store, replay_id: str) -> StoredReplay | None:
    """One stored replay, or None when this database has no replay of that id."""
    with store.read() as con:
        cur = con.execute(STORED_REPLAY_SQL, {"replay_id": replay_id})
        rows = cur.fetchall()
        if not rows:
            return None
        row = dict(zip([d[0] for d in cur.description], rows[0], strict=True))
    evidence = _json(row.pop("evidence"))
    message = evidence.pop(STORED_MESSAGE_KEY, "")
    source_text = evidence.pop(STORED_SOURCE_TEXT_KEY, None)
    return StoredReplay(message=message or "", source_replay_text=source_text, evidence=evidence,
                        environment=_json(row.pop("environment")), **{**row, "replay_tokens": row["replay_tokens"] or 0})


def _json(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    value = json.loads(text)
    return value if isinstance(value, dict) else {"value": value}


def replay_history_sql(where: str) -> str:
    return f"""
SELECT p.replay_id, p.replayed_at, p.request_id, p.classification, p.similarity, p.first_divergent_token,
       p.source_request_id, {deployment_label()} AS deployment, r.target_model, r.ts AS request_ts
FROM replays p JOIN requests r USING (request_id)
WHERE {where} AND ($request_id IS NULL OR p.request_id = $request_id)
      AND ($replay_ids IS NULL OR list_contains($replay_ids, p.replay_id))
ORDER BY p.replayed_at DESC, p.replay_id LIMIT $limit
"""


def replay_history(store: Store, filters: Filters = NO_FILTERS, *, request_id: str | None = None,
                   replay_ids: tuple[str, ...] | None = None, limit: int = 1000) -> pd.DataFrame:
    """Stored replays of the requests the filters select, newest first (of one request, or of given ids)."""
    where, params = filters.named_where()
    ids = list(replay_ids) if replay_ids is not None else None
    with store.read() as con:
        return execute(con, replay_history_sql(where),
                       params | {"request_id": request_id, "replay_ids": ids, "limit": limit}).df()


def replays_for_export_sql(where: str) -> str:
    return f"""
SELECT p.replayed_at, p.replay_id, p.request_id, {deployment_label()} AS deployment, r.target_model,
       p.classification, p.similarity, p.first_divergent_token, p.common_prefix_tokens, p.draft_tokens,
       p.accepted_tokens, p.source_request_id, p.evidence::VARCHAR AS evidence
FROM replays p JOIN requests r USING (request_id)
WHERE {where}
ORDER BY p.replayed_at DESC, p.replay_id LIMIT $limit
"""


def replays_for_export(store: Store, filters: Filters = NO_FILTERS, limit: int | None = None) -> pd.DataFrame:
    """Stored replays of the requests the filters select, newest first: what the Export page serves."""
    where, params = filters.named_where()
    with store.read() as con:
        return execute(con, replays_for_export_sql(where), params | {"limit": limit if limit is not None else 2**62}).df()


# --- the evidence as sentences and numbers -------------------------------------------------------------------

LABELS = {
    "source_request_id": "Source request (put the output in the cache)",
    "differing_fields": "Identity fields that differ from the source",
    "cache_key": "Cache key",
    "source_replay_equals_production": "The source's replay equals production exactly",
    "source_explains_production": "How the source explains production",
    "length_explained_by_source_max_tokens": "Length explained by the source's max_tokens",
    "first_divergent_token": "First divergent token",
    "production_rank_at_divergence": "Rank of production's token there",
    "margin_at_divergence": "Top-two logit margin there",
    "top_logit_at_divergence": "Top logit there",
    "near_tie_threshold": "Near-tie threshold",
    "near_tie_positions": "Near-tie positions",
    "own_near_tie_positions": "Near-tie positions of this request",
    "source_near_tie_positions": "Near-tie positions of the source",
    "production_mean_logprob": "Production's mean log-probability under this identity",
    "replay_mean_logprob": "The replay's mean log-probability",
    "production_mean_raw_logprob": "Production's mean raw log-probability",
    "replay_mean_raw_logprob": "The replay's mean raw log-probability",
    "production_mean_rank": "Production's mean token rank",
    "production_impossible_tokens": "Production tokens impossible under this identity",
    "production_implausible": "Production implausible for this request",
    "source_sample_mean_logprob": "Production's mean log-probability under the source",
    "source_impossible_tokens": "Production tokens impossible under the source",
    "own_sample_mean_logprob": "Production's mean log-probability under this request",
    "production_over_max_tokens": "Over max_tokens",
    "output_tokens": "Output tokens",
    "contaminated_hit": "Contaminated hit",
    "harmless": "Harmless",
    "why_harmless": "Why harmless",
    "missing": "Missing",
    "prompt_hash": "Prompt hash",
    "source_replay": "Source replay",
}


def readable(value: Any) -> str:
    """A value of the evidence as a person reads it: 4 significant digits, lists joined, yes/no."""
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        return f"{value:.4g}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, (list, tuple)):
        return ", ".join(readable(v) for v in value) if value else "none"
    if isinstance(value, dict):
        return "; ".join(f"{k}: {readable(v)}" for k, v in value.items())
    return str(value)


def evidence_lines(evidence: dict[str, Any]) -> list[tuple[str, str]]:
    """The evidence as (label, readable value) pairs, in the order the classification weighed it."""
    return [(LABELS.get(key, key.replace("_", " ").capitalize()), readable(value)) for key, value in evidence.items()]


def as_stored(result: Any) -> StoredReplay:
    """A replay just run, in the shape of a stored one: one view shows both."""
    diff = result.diff
    return StoredReplay(
        replay_id=result.replay_id, request_id=result.request_id, replayed_at=result.replayed_at,
        classification=result.classification, message=result.message, production_text=result.production_text,
        replay_text=result.replay_text, source_request_id=result.source_request_id,
        source_replay_text=result.source_replay_text,
        similarity=diff.similarity if diff else None,
        first_divergent_token=diff.first_divergent_token if diff else None,
        common_prefix_tokens=diff.common_prefix_tokens if diff else None,
        replay_tokens=len(result.replay_token_ids) or (diff.replay_tokens if diff else 0),
        draft_tokens=result.draft_tokens, accepted_tokens=result.accepted_tokens,
        evidence=dict(result.evidence), environment=dict(result.environment),
    )
