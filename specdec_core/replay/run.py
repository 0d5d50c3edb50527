"""Replay a logged request with its full identity, diff it against production, and say why they differ.

A replay runs the request through a decoder (in-process, or the engine the registry names) with no cache: its full
identity is the key. What decides the classification is kept as evidence:

- `match`: the replay returned production's output exactly (on a contaminated hit, the
  evidence says the contamination was harmless for this request).
- `foreign`: production returned what another identity produces. The store knows the
  request that populated the cache entry; its identity is replayed too, and its output
  equals production's, or production stops at the source's max_tokens where this request
  would not. This is the proof of root cause, and it is weighed before near-ties.
- `near_tie`: a greedy request whose first divergent token had a top-1/top-2 margin
  under the target below `near_tie_margin` logits, and no cache source explains
  production: numerics, not the cache.
- `sampled`: a sampled request whose replay differs; production's tokens are scored
  under the target with this identity's sampling so an implausible output stands out.
- `diverged`: a greedy output that differs beyond numerics and whose source is unknown.
- `unavailable`: a model or tokenizer named in the log is not in the registry (or not on disk).
- `redacted`: the log holds only the prompt's hash; give the prompt to replay.
"""

from __future__ import annotations

import json
import math
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from specdec_core.analysis import request_record
from specdec_core.contract import fields as contract
from specdec_core.contract.identity import DecodeRequest, sha256_hex
from specdec_core.contract.result import DecodeError
from specdec_core.decoding.protocol import Decoder
from specdec_core.decoding.router import DecoderRouter, routed
from specdec_core.replay.classify import (
    NEAR_TIE_LOGIT_MARGIN,
    classify_difference,
    greedy_explains,
    harmless_contamination,
    match_message,
    production_ids,
    replay_length,
    unscored_note,
    unscored_verdict,
    weigh_source,
)
from specdec_core.replay.diff import OutputDiff, diff_outputs
from specdec_core.store.connection import Store
from specdec_core.store.schema import REPLAY_COLUMNS


class ReplayError(ValueError):
    """A replay that can't start (unknown request id, a prompt whose hash doesn't match)."""


@dataclass(frozen=True)
class ReplayResult:
    request_id: str
    classification: str
    message: str
    evidence: dict[str, Any] = field(default_factory=dict)
    production_text: str = ""
    replay_text: str | None = None
    replay_token_ids: tuple[int, ...] = ()
    diff: OutputDiff | None = None
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    accepted_per_step: tuple[int, ...] = ()
    source_request_id: str | None = None
    source_replay_text: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    latency_ms: float | None = None
    replay_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    replayed_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))

    def to_json(self) -> dict[str, Any]:
        """Strict JSON values: a score that is not a finite number (a margin with no second token) is null."""
        return finite_json({
            "replay_id": self.replay_id,
            "request_id": self.request_id,
            "replayed_at": self.replayed_at.isoformat(),
            "classification": self.classification,
            "message": self.message,
            "evidence": self.evidence,
            "production_text": self.production_text,
            "replay_text": self.replay_text,
            "replay_token_ids": list(self.replay_token_ids),
            "diff": self.diff.to_json() if self.diff else None,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "accepted_per_step": list(self.accepted_per_step),
            "source_request_id": self.source_request_id,
            "source_replay_text": self.source_replay_text,
            "environment": self.environment,
            "latency_ms": self.latency_ms,
        })


def finite_json(value: Any) -> Any:
    """`value` with every NaN or infinite float made null, so that json.dumps(allow_nan=False) takes it."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_json(v) for v in value]
    return value


@lru_cache(maxsize=1)
def default_decoder() -> Decoder:
    """One router per process on the configured registry: loaded models and engine decoders are reused."""
    from specdec_core.decoding.engine import SpecDecoder

    return DecoderRouter(SpecDecoder())


def _request_from(record: dict[str, Any], prompt: str | None) -> DecodeRequest:
    fields = {k: record.get(k) for k in contract.IDENTITY_INPUT}
    if fields["prompt"] is None and prompt is not None:
        if sha256_hex(prompt) != fields["prompt_hash"]:
            raise ReplayError(f"request {record['request_id']}: the prompt given hashes to {sha256_hex(prompt)}, "
                              f"the log has {fields['prompt_hash']}; check the prompt's exact text")
        fields["prompt"] = prompt
    return DecodeRequest.from_record(fields)


def _unknown_identity(record: dict[str, Any]) -> tuple[list[str], list[str]]:
    """The identity fields the record's log left unknown (LiteLLM's hits: the sampling parameters and max_tokens),
    and those of them a replay can't do without (required, or the prompt)."""
    unknown = [f for f in record.get("unknown_fields") or () if f in contract.IDENTITY_FIELDS]
    return unknown, [f for f in unknown if contract.BY_NAME[f].required or f == "prompt"]


def _unavailable(decoder: Decoder, req: DecodeRequest) -> dict[str, str]:
    registry = decoder.registry
    if registry.engine_of(req.target_model) is not None:
        # The engine runs its own draft; a tokenizer version not here means the chat endpoint with the messages.
        return {}
    missing = registry.unknown_names(req)
    if missing:
        return {f: f"{v!r} is not in the registry ({registry.source or 'specdec.toml'})" for f, v in missing.items()}
    names = {"target_model": req.target_model, "tokenizer_version": req.tokenizer_version}
    if req.speculation is not None:
        names["draft_model"] = req.speculation
    return {f: f"{v!r} is in the registry but its files are not on disk" for f, v in names.items()
            if not registry.is_available(v)}


def _how_to_add(missing: dict[str, str]) -> str:
    if all("not on disk" in why for why in missing.values()):
        return "run `specdec models fetch` (or point the registry entry at the files)"
    return ("add an entry to specdec.toml or the file SPECDEC_CONFIG names, e.g. [models.NAME] path = "
            "\"/path/to/weights\" for a model, [tokenizers.NAME] path = ... for a tokenizer version; "
            "`specdec models list` shows what is known")


def _source_of(store: Store, record: dict[str, Any]) -> dict[str, Any] | None:
    source_id = record.get("source_request_id")
    if record.get("cache_hit") and source_id:
        source = request_record(store, source_id)
        return None if source is None else source.as_log_record()
    return None


def replay_record(store: Store, record: dict[str, Any], decoder: Decoder, *, prompt: str | None = None,
                  near_tie_margin: float = NEAR_TIE_LOGIT_MARGIN) -> ReplayResult:
    """Replay one logged request (as `analysis.request_record` returns it); does not store the result."""
    decoder = routed(decoder)
    request_id = record["request_id"]
    production = record["output_text"]
    unknown, needed = _unknown_identity(record)
    if needed:
        source = record.get("source_request_id")
        return ReplayResult(
            request_id, "unavailable",
            f"can't replay: the log leaves {', '.join(needed)} unknown for request {request_id} (as LiteLLM does "
            "on a cache hit), so its full identity is not in the log"
            + (f"; replay its source {source} to see the output that was cached" if source else ""),
            {"unknown_fields": ", ".join(unknown)}, production_text=production)
    req = _request_from(record, prompt)
    if req.prompt is None:
        return ReplayResult(
            request_id, "redacted",
            f"request {request_id} was logged with only prompt_hash {req.prompt_hash}: it can't be replayed; "
            "give the prompt (--prompt) and it is replayed once its SHA-256 matches",
            {"prompt_hash": req.prompt_hash}, production_text=production)
    missing = _unavailable(decoder, req)
    if missing:
        return ReplayResult(request_id, "unavailable",
                            "can't replay: " + "; ".join(f"{f} {why}" for f, why in missing.items())
                            + ". To add it: " + _how_to_add(missing),
                            {"missing": missing}, production_text=production)
    try:
        result = decoder.generate(req)
    except DecodeError as exc:
        return ReplayResult(request_id, "unavailable", f"can't replay: {exc}", {"too_long": str(exc)},
                            production_text=production)
    prod_ids = production_ids(decoder, req, production, result.token_ids)
    try:  # scoring production's output, and diffing it, cost quadratic time past the context
        decoder.fits(req, len(prod_ids))
    except DecodeError as exc:
        return ReplayResult(request_id, "unavailable", f"can't compare production's {exc}; production did not "
                            "decode it with this model", {"too_long": str(exc)}, production_text=production,
                            replay_text=result.text, replay_token_ids=result.token_ids, draft_tokens=result.draft_tokens,
                            accepted_tokens=result.accepted_tokens, accepted_per_step=result.accepted_per_step,
                            environment=result.environment, latency_ms=result.latency_ms)
    diff = diff_outputs(production, prod_ids, result.text, result.token_ids, req.max_tokens)
    environment = dict(result.environment)
    engine = environment.pop("engine_evidence", None)
    common = {
        "production_text": production, "replay_text": result.text, "replay_token_ids": result.token_ids,
        "diff": diff, "draft_tokens": result.draft_tokens, "accepted_tokens": result.accepted_tokens,
        "accepted_per_step": result.accepted_per_step, "environment": environment,
        "latency_ms": result.latency_ms,
    }
    length_note = ({"production_over_max_tokens": f"production has {record['output_tokens']} tokens, "
                                                  f"max_tokens is {req.max_tokens}"}
                   if record["output_tokens"] > req.max_tokens else {})
    if engine is not None:  # what the server said about itself and the identity it could not take
        length_note["engine"] = engine
    if unknown:  # optional fields (OpenInference's top_k): replayed as a request that did not send them
        length_note["unknown_fields"] = f"{', '.join(unknown)} unknown in the log: replayed as not sent"
    if diff.identical:
        evidence = {"output_tokens": replay_length(result), **harmless_contamination(record, req), **length_note}
        return ReplayResult(request_id, "match", match_message(evidence), evidence, **common)

    scores = decoder.can_score(req)
    if not scores:
        length_note["not_available"] = unscored_note(decoder, req)
    greedy = greedy_explains(decoder, req, prod_ids, near_tie_margin) if req.is_greedy and scores else None
    # The source comes first: a near-tie in production's prefix is no alibi when production is its output.
    source = _source_of(store, record)
    if source is not None and _unknown_identity(source)[1]:
        source = None  # a source whose own identity the log left unknown can't be replayed either
    source_evidence: dict[str, Any] = {}
    if source is not None:
        source_req = _request_from(source, prompt if source.get("prompt") is None else None)
        weighed = weigh_source(decoder, record, req, result, prod_ids, greedy, source, source_req,
                               not _unavailable(decoder, source_req), near_tie_margin,
                               scores=scores and decoder.can_score(source_req))
        common["source_request_id"] = source["request_id"]
        common["source_replay_text"] = weighed.source_replay_text
        if weighed.verdict is not None:
            return ReplayResult(request_id, weighed.verdict.classification, weighed.verdict.message,
                                {**weighed.verdict.evidence, **length_note}, **common)
        source_evidence = weighed.evidence
    verdict = (classify_difference(decoder, req, prod_ids, result, greedy) if scores
               else unscored_verdict(req, diff))
    return ReplayResult(request_id, verdict.classification, verdict.message,
                        {**verdict.evidence, **source_evidence, **length_note}, **common)


def _replay_row(r: ReplayResult) -> dict[str, Any]:
    """One `replays` row by column name: REPLAY_COLUMNS defines the table, in whatever order it lists them."""
    return {
        "replay_id": r.replay_id, "request_id": r.request_id, "replayed_at": r.replayed_at,
        "classification": r.classification, "replay_text": r.replay_text, "token_ids": list(r.replay_token_ids),
        "production_text": r.production_text,
        "first_divergent_token": r.diff.first_divergent_token if r.diff else None,
        "first_divergent_char": r.diff.first_divergent_char if r.diff else None,
        "common_prefix_tokens": r.diff.common_prefix_tokens if r.diff else None,
        "similarity": r.diff.similarity if r.diff else None,
        "draft_tokens": r.draft_tokens, "accepted_tokens": r.accepted_tokens,
        "source_request_id": r.source_request_id,
        "evidence": json.dumps(finite_json(stored_evidence(r)), default=str, allow_nan=False),
        "environment": json.dumps(finite_json(r.environment), default=str, allow_nan=False),
    }


# Kept inside the stored evidence so a replay reopened later (another tab, the CLI's) reads as it was shown:
# the sentence that explains it and, for a foreign output, the source's replay that proves the cause.
STORED_MESSAGE_KEY = "replay_message"
STORED_SOURCE_TEXT_KEY = "source_replay_text"


def stored_evidence(r: ReplayResult) -> dict[str, Any]:
    extra: dict[str, Any] = {STORED_MESSAGE_KEY: r.message}
    if r.source_replay_text is not None:
        extra[STORED_SOURCE_TEXT_KEY] = r.source_replay_text
    return {**r.evidence, **extra}


def _save(store: Store, results: list[ReplayResult]) -> None:
    rows = [_replay_row(r) for r in results if r.classification != "redacted"]
    if not rows:
        return
    names = [name for name, _ in REPLAY_COLUMNS]
    unknown = set(names) ^ set(rows[0])
    if unknown:
        raise ValueError(f"replays columns and ReplayResult fields disagree on {', '.join(sorted(unknown))}; "
                         "update _replay_row with store.schema.REPLAY_COLUMNS")
    with store.write() as con:
        con.executemany(f"INSERT INTO replays ({', '.join(names)}) VALUES ({', '.join('?' * len(names))})",
                        [[row[name] for name in names] for row in rows])


def replay(store: Store, request_id: str, decoder: Decoder | None = None, *, prompt: str | None = None,
           near_tie_margin: float = NEAR_TIE_LOGIT_MARGIN) -> ReplayResult:
    """Replay one request, classify the difference, and store the result in `replays`."""
    record = request_record(store, request_id)
    if record is None:
        raise ReplayError(f"request_id {request_id!r} is not in {store.path}; load its log with `specdec ingest`")
    result = replay_record(store, record.as_log_record(), decoder or default_decoder(), prompt=prompt,
                           near_tie_margin=near_tie_margin)
    _save(store, [result])
    return result


ReplayProgress = Callable[[int, int, ReplayResult], None]


def replay_many(store: Store, request_ids: Iterable[str], decoder: Decoder | None = None,
                progress: ReplayProgress | None = None, failures: list[str] | None = None) -> list[ReplayResult]:
    """Replay several requests with one decoder (models load once); stored together at the end.

    Requests of a model on an engine go to it side by side, up to its max_concurrency. A failed engine call
    stores nothing: its one-line reason (one per kind of failure and engine) goes to `failures`, or, without
    that list, is raised as a ReplayError once the others are stored.
    """
    from specdec_core.replay.engine_batch import run_batch

    decoder = routed(decoder or default_decoder())
    ids = list(dict.fromkeys(request_ids))
    records: dict[str, dict[str, Any]] = {}
    for request_id in ids:
        record = request_record(store, request_id)
        if record is None:
            raise ReplayError(f"request_id {request_id!r} is not in {store.path}")
        records[request_id] = record.as_log_record()
    registry = decoder.registry
    done: dict[str, ReplayResult] = {}

    def on_result(result: ReplayResult) -> None:
        done[result.request_id] = result
        if progress:
            progress(len(done), len(ids), result)

    failed = run_batch(ids, lambda rid: registry.engine_of(records[rid]["target_model"]),
                       lambda rid: replay_record(store, records[rid], decoder), on_result)
    lines = [f.line() for f in failed]
    results = [done[rid] for rid in ids if rid in done]
    _save(store, results)
    if lines and failures is None:
        raise ReplayError("; ".join(lines))
    if failures is not None:
        failures.extend(lines)
    return results


def replays_table(store: Store, limit: int = 1000) -> Any:
    """Stored replays, newest first."""
    with store.read() as con:
        return con.execute(
            "SELECT replayed_at, request_id, classification, similarity, first_divergent_token, "
            "common_prefix_tokens, draft_tokens, accepted_tokens, source_request_id, evidence::VARCHAR AS evidence "
            "FROM replays ORDER BY replayed_at DESC LIMIT ?", [limit]).df()
