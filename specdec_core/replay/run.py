"""Replay a logged request with its full identity, diff it against production, and say why they differ.

A replay runs the request through the local SpecDecoder with no cache: its full
identity is the key. What decides the classification is kept as evidence:

- `match`: the replay returned production's output exactly.
- `foreign`: production returned what another identity produces. The store knows the
  request that populated the cache entry; its identity is replayed too, and its output
  equals production's. This is the proof of root cause.
- `near_tie`: a greedy request whose first divergent token had a top-1/top-2 margin
  under the target below `near_tie_margin` logits: numerics, not the cache.
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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from typing import Any

from specdec_core.analysis.metrics import request_record
from specdec_core.contract.identity import DecodeRequest, differing_fields, identity, sha256_hex
from specdec_core.contract.result import DecodeResult
from specdec_core.replay.diff import OutputDiff, diff_outputs
from specdec_core.store.connection import Store

# Top-two logits closer than this are a near-tie: numerics of another environment can flip them.
NEAR_TIE_LOGIT_MARGIN = 0.05
# ... or closer than half precision resolves at their magnitude: bf16 keeps 8 significant bits,
# so two logits near 30 are only told apart to about 30 * 2**-7 = 0.23.
NEAR_TIE_RELATIVE_MARGIN = 2.0**-7
CLASSIFICATIONS = ("match", "near_tie", "sampled", "foreign", "diverged", "unavailable", "redacted")


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
        return {
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
        }


@lru_cache(maxsize=1)
def default_decoder() -> Any:
    """One SpecDecoder per process on the configured registry: loaded models are reused."""
    from specdec_core.decoding.engine import SpecDecoder

    return SpecDecoder()


def _request_from(record: dict[str, Any], prompt: str | None) -> DecodeRequest:
    fields = {k: record.get(k) for k in ("prompt", "prompt_hash", "target_model", "draft_model",
                                         "num_speculative_tokens", "temperature", "top_p", "top_k",
                                         "max_tokens", "seed", "stop", "tokenizer_version")}
    if fields["prompt"] is None and prompt is not None:
        if sha256_hex(prompt) != fields["prompt_hash"]:
            raise ReplayError(f"request {record['request_id']}: the prompt given hashes to {sha256_hex(prompt)}, "
                              f"the log has {fields['prompt_hash']}; check the prompt's exact text")
        fields["prompt"] = prompt
    return DecodeRequest.from_record(fields)


def _unavailable(decoder: Any, req: DecodeRequest) -> dict[str, str]:
    registry = decoder.registry
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


def _mean(values: Iterable[float]) -> float | None:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else None


def _score_evidence(decoder: Any, req: DecodeRequest, production_ids: list[int],
                    replay_ids: tuple[int, ...]) -> dict[str, Any]:
    """Production's tokens under the target for this identity, beside the replay's own tokens."""
    prod = decoder.score(req, production_ids)
    rep = decoder.score(req, list(replay_ids))
    return {
        "production_mean_logprob": _mean(prod.logprobs),
        "production_mean_raw_logprob": _mean(prod.raw_logprobs),
        "production_mean_rank": _mean(float(r) for r in prod.ranks),
        "production_impossible_tokens": len(prod.impossible_positions()),
        "replay_mean_logprob": _mean(rep.logprobs),
        "replay_mean_raw_logprob": _mean(rep.raw_logprobs),
    }


def _production_ids(decoder: Any, req: DecodeRequest, production: str, replay_ids: Sequence[int]) -> list[int]:
    """Production's text as tokens, split the way the model split it wherever the replay says the same.

    Re-tokenizing a generated text need not give back the generated tokens (a model may emit a
    non-canonical split); scoring those would show ranks the model never chose. So the longest run
    of replay tokens whose text starts production's is kept, and only the rest is tokenized.
    """
    replay_ids = list(replay_ids)
    lo, hi = 0, len(replay_ids)
    while lo < hi:  # the longest k with decode(replay_ids[:k]) a prefix of production
        mid = (lo + hi + 1) // 2
        if production.startswith(decoder.decode(req, replay_ids[:mid])):
            lo = mid
        else:
            hi = mid - 1
    kept = decoder.decode(req, replay_ids[:lo])
    rest = production[len(kept):]
    return replay_ids[:lo] + (decoder.encode_output(req, rest) if rest else [])


def _near_tie_threshold(top_logit: float, near_tie_margin: float) -> float:
    return max(near_tie_margin, NEAR_TIE_RELATIVE_MARGIN * abs(top_logit))


def _greedy_explains(decoder: Any, req: DecodeRequest, production_ids: list[int],
                     near_tie_margin: float) -> tuple[bool, dict[str, Any]]:
    """Whether greedy decoding of `req` gives these tokens up to near-ties, scored by teacher forcing.

    Every token must be the target's first choice, or its second where the top two logits are
    closer than half precision resolves: another environment's numerics could have picked it.
    """
    scores = decoder.score(req, production_ids)
    near_ties: list[int] = []
    for i, (rank, margin, top) in enumerate(zip(scores.ranks, scores.margins, scores.top_logits, strict=True)):
        if rank == 1:
            continue
        threshold = _near_tie_threshold(top, near_tie_margin)
        evidence = {"first_divergent_token": i, "production_rank_at_divergence": rank,
                    "margin_at_divergence": margin, "top_logit_at_divergence": top, "near_tie_threshold": threshold}
        if rank == 2 and margin < threshold:
            near_ties.append(i)
            if len(near_ties) == 1:
                first = evidence
            continue
        return False, {**evidence, "near_tie_positions": near_ties}
    return True, ({**first, "near_tie_positions": near_ties} if near_ties else {"near_tie_positions": []})


def _sampled_source_explains(decoder: Any, req: DecodeRequest, production_ids: list[int],
                             greedy: tuple[bool, dict[str, Any]] | None, source_req: DecodeRequest,
                             source_ids: list[int]) -> tuple[bool, dict[str, Any]]:
    """Whether production is a plausible sample of a sampled source, and implausible for this request."""
    source_scores = decoder.score(source_req, source_ids)
    source_mean = _mean(source_scores.logprobs)
    impossible_for_source = len(source_scores.impossible_positions())
    evidence: dict[str, Any] = {"source_sample_mean_logprob": source_mean,
                                "source_impossible_tokens": impossible_for_source}
    if impossible_for_source or source_mean is None:
        return False, evidence
    if greedy is not None:  # this request is greedy: production must not be its greedy output
        return not greedy[0], evidence
    own_mean = _mean(decoder.score(req, production_ids).logprobs)
    evidence["own_sample_mean_logprob"] = own_mean
    return own_mean is None or own_mean < source_mean - 1.0, evidence


def _classify_difference(decoder: Any, req: DecodeRequest, production_ids: list[int], result: DecodeResult,
                         greedy: tuple[bool, dict[str, Any]] | None) -> tuple[str, str, dict[str, Any]]:
    """Why production differs from the replay, when no cache source explains it.

    `greedy` is `_greedy_explains` of this request (None for a sampled request).
    """
    if greedy is not None:
        explained, evidence = greedy
        if explained and evidence["near_tie_positions"]:
            d = evidence["first_divergent_token"]
            return ("near_tie", f"greedy outputs part at token {d}, where the target's top two logits are "
                    f"{evidence['margin_at_divergence']:.4g} apart (< {evidence['near_tie_threshold']:.3g}, below "
                    "half-precision resolution at that magnitude); every other production token is the target's "
                    "first choice: numerics, not the cache", evidence)
        if explained:
            return ("diverged", "every production token is the target's first choice, but production stops at "
                    "another length than the replay; no cache source is known", evidence)
        d = evidence["first_divergent_token"]
        return ("diverged", f"at token {d} production took the target's rank-{evidence['production_rank_at_divergence']} "
                f"token ({evidence['margin_at_divergence']:.3g} logits behind the top one): not numerics; no cache "
                "source is known", evidence)
    evidence = _score_evidence(decoder, req, production_ids, result.token_ids)
    implausible = bool(evidence["production_impossible_tokens"]) or (
        evidence["production_mean_logprob"] is not None and evidence["replay_mean_logprob"] is not None
        and evidence["production_mean_logprob"] < evidence["replay_mean_logprob"] - 2.0)
    evidence["production_implausible"] = implausible
    message = (f"sampled request (temperature {req.temperature}) whose replay differs; production's tokens "
               f"average log-probability {evidence['production_mean_logprob']} under this identity "
               f"vs {evidence['replay_mean_logprob']} for the replay")
    if implausible:
        message += ": production's output is implausible for this request"
    return "sampled", message, evidence


def _source_of(store: Store, record: dict[str, Any]) -> dict[str, Any] | None:
    source_id = record.get("source_request_id")
    if record.get("cache_hit") and source_id:
        return request_record(store, source_id)
    return None


def replay_record(store: Store, record: dict[str, Any], decoder: Any, *, prompt: str | None = None,
                  near_tie_margin: float = NEAR_TIE_LOGIT_MARGIN) -> ReplayResult:
    """Replay one logged request (as `metrics.request_record` returns it); does not store the result."""
    request_id = record["request_id"]
    production = record["output_text"]
    req = _request_from(record, prompt)
    if req.prompt is None:
        return ReplayResult(
            request_id, "redacted",
            f"request {request_id} was logged with only prompt_hash {req.prompt_hash}: it can't be replayed; "
            "give the prompt (CLI --prompt, or the Replay page) and it is replayed once its SHA-256 matches",
            {"prompt_hash": req.prompt_hash}, production_text=production)
    missing = _unavailable(decoder, req)
    if missing:
        return ReplayResult(request_id, "unavailable",
                            "can't replay: " + "; ".join(f"{f} {why}" for f, why in missing.items())
                            + ". To add it: " + _how_to_add(missing),
                            {"missing": missing}, production_text=production)
    result = decoder.generate(req)
    production_ids = _production_ids(decoder, req, production, result.token_ids)
    diff = diff_outputs(production, production_ids, result.text, result.token_ids, req.max_tokens)
    common = {
        "production_text": production, "replay_text": result.text, "replay_token_ids": result.token_ids,
        "diff": diff, "draft_tokens": result.draft_tokens, "accepted_tokens": result.accepted_tokens,
        "accepted_per_step": result.accepted_per_step, "environment": result.environment,
        "latency_ms": result.latency_ms,
    }
    length_note = ({"production_over_max_tokens": f"production has {record['output_tokens']} tokens, "
                                                  f"max_tokens is {req.max_tokens}"}
                   if record["output_tokens"] > req.max_tokens else {})
    if diff.identical:
        return ReplayResult(request_id, "match", "the replay returned production's output exactly",
                            {"output_tokens": len(result.token_ids), **length_note}, **common)

    # Production's output may be right for this request up to numerics: then the cache is not to blame.
    greedy = _greedy_explains(decoder, req, production_ids, near_tie_margin) if req.is_greedy else None
    if greedy is not None and greedy[0] and greedy[1]["near_tie_positions"]:
        classification, message, evidence = _classify_difference(decoder, req, production_ids, result, greedy)
        return ReplayResult(request_id, classification, message, {**evidence, **length_note}, **common)

    source = _source_of(store, record)
    source_evidence: dict[str, Any] = {}
    if source is not None:
        source_req = _request_from(source, prompt if source.get("prompt") is None else None)
        if source_req.prompt is not None and not _unavailable(decoder, source_req):
            source_result = decoder.generate(source_req)
            exact = source_result.text == production
            source_evidence = {
                "source_request_id": source["request_id"],
                "source_replay_equals_production": exact,
                "differing_fields": differing_fields(identity(req), identity(source_req)),
                "cache_key": record["cache_key"],
            }
            near = plausible = False
            source_ids = _production_ids(decoder, source_req, production, source_result.token_ids)
            if not exact and source_req.is_greedy:
                # The source ran in production's numerics too: equal up to near-ties is still its output.
                near, tie = _greedy_explains(decoder, source_req, source_ids, near_tie_margin)
                near = near and bool(tie["near_tie_positions"])
                source_evidence["source_near_tie_positions"] = tie.get("near_tie_positions", [])
            elif not exact:
                # A sampled source drawn in production's numerics need not redraw the same tokens here; what
                # can be shown is that production is a plausible sample of the source and not of this request.
                plausible, more = _sampled_source_explains(decoder, req, production_ids, greedy, source_req,
                                                           source_ids)
                source_evidence.update(more)
            if exact or near or plausible:
                fields = ", ".join(source_evidence["differing_fields"]) or "no identity field"
                how = ("equals production exactly" if exact else "equals production up to near-ties" if near
                       else "differs, as sampling in another environment can, but production is a plausible sample "
                            "of the source's identity and not an output this request could produce")
                return ReplayResult(
                    request_id, "foreign",
                    f"production returned the output of request {source['request_id']} (differs in {fields}), "
                    f"which populated cache key {record['cache_key']}: its replay {how}",
                    {**source_evidence, **length_note}, source_request_id=source["request_id"],
                    source_replay_text=source_result.text, **common)
            common["source_replay_text"] = source_result.text
        common["source_request_id"] = source["request_id"]
    classification, message, evidence = _classify_difference(decoder, req, production_ids, result, greedy)
    return ReplayResult(request_id, classification, message, {**evidence, **source_evidence, **length_note},
                        **common)


def _save(store: Store, results: list[ReplayResult]) -> None:
    rows = [r for r in results if r.classification != "redacted"]
    if not rows:
        return
    with store.write() as con:
        con.executemany(
            "INSERT INTO replays VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [[r.replay_id, r.request_id, r.replayed_at, r.classification, r.replay_text,
              list(r.replay_token_ids), r.production_text,
              r.diff.first_divergent_token if r.diff else None,
              r.diff.first_divergent_char if r.diff else None,
              r.diff.common_prefix_tokens if r.diff else None,
              r.diff.similarity if r.diff else None,
              r.draft_tokens, r.accepted_tokens, r.source_request_id,
              json.dumps(r.evidence, default=str), json.dumps(r.environment, default=str)]
             for r in rows],
        )


def replay(store: Store, request_id: str, decoder: Any | None = None, *, prompt: str | None = None,
           near_tie_margin: float = NEAR_TIE_LOGIT_MARGIN) -> ReplayResult:
    """Replay one request, classify the difference, and store the result in `replays`."""
    record = request_record(store, request_id)
    if record is None:
        raise ReplayError(f"request_id {request_id!r} is not in {store.path}; load its log with `specdec ingest`")
    result = replay_record(store, record, decoder or default_decoder(), prompt=prompt,
                           near_tie_margin=near_tie_margin)
    _save(store, [result])
    return result


ReplayProgress = Callable[[int, int, ReplayResult], None]


def replay_many(store: Store, request_ids: Iterable[str], decoder: Any | None = None,
                progress: ReplayProgress | None = None) -> list[ReplayResult]:
    """Replay several requests with one decoder (models load once); stored together at the end."""
    decoder = decoder or default_decoder()
    ids = list(dict.fromkeys(request_ids))
    results: list[ReplayResult] = []
    for n, request_id in enumerate(ids, start=1):
        record = request_record(store, request_id)
        if record is None:
            raise ReplayError(f"request_id {request_id!r} is not in {store.path}")
        results.append(replay_record(store, record, decoder))
        if progress:
            progress(n, len(ids), results[-1])
    _save(store, results)
    return results


def replays_table(store: Store, limit: int = 1000) -> Any:
    """Stored replays, newest first."""
    with store.read() as con:
        return con.execute(
            "SELECT replayed_at, request_id, classification, similarity, first_divergent_token, "
            "common_prefix_tokens, draft_tokens, accepted_tokens, source_request_id, evidence::VARCHAR AS evidence "
            "FROM replays ORDER BY replayed_at DESC LIMIT ?", [limit]).df()
