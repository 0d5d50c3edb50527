"""Why production differs from a replay: the evidence, weighed in order, that decides a replay's class.

The order matters. A cache hit served from another identity's entry is `foreign` when
that identity explains production (its replay reproduces production, or production
stops at the source's max_tokens where this request would not stop): a near-tie in
production's prefix does not clear the cache, since the source ran in production's
numerics too. Only once no source explains production do near-ties (`near_tie`),
other greedy differences (`diverged`) and sampling (`sampled`) decide.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from specdec_core.contract.identity import DecodeRequest, differing_fields, identity
from specdec_core.contract.result import DecodeResult
from specdec_core.decoding.protocol import Decoder
from specdec_core.decoding.router import Routing
from specdec_core.replay.diff import OutputDiff

# Top-two logits closer than this are a near-tie: numerics of another environment can flip them.
NEAR_TIE_LOGIT_MARGIN = 0.05
# ... or closer than half precision resolves at their magnitude: bf16 keeps 8 significant bits,
# so two logits near 30 are only told apart to about 30 * 2**-7 = 0.23.
NEAR_TIE_RELATIVE_MARGIN = 2.0**-7
# Fields that change how a greedy output is computed but never which tokens it has.
LOSSLESS_FOR_GREEDY = frozenset({"draft_model", "num_speculative_tokens"})


@dataclass(frozen=True)
class Verdict:
    classification: str
    message: str
    evidence: dict[str, Any]


def mean(values: Iterable[float]) -> float | None:
    values = [v for v in values if math.isfinite(v)]
    return sum(values) / len(values) if values else None


def production_ids(decoder: Decoder, req: DecodeRequest, production: str, replay_ids: Sequence[int]) -> list[int]:
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


def near_tie_threshold(top_logit: float, near_tie_margin: float) -> float:
    return max(near_tie_margin, NEAR_TIE_RELATIVE_MARGIN * abs(top_logit))


def greedy_explains(decoder: Decoder, req: DecodeRequest, token_ids: list[int],
                    near_tie_margin: float) -> tuple[bool, dict[str, Any]]:
    """Whether greedy decoding of `req` gives these tokens up to near-ties, scored by teacher forcing.

    Every token must be the target's first choice, or its second where the top two logits are
    closer than half precision resolves: another environment's numerics could have picked it.
    """
    scores = decoder.score(req, token_ids)
    near_ties: list[int] = []
    first: dict[str, Any] = {}
    for i, (rank, margin, top) in enumerate(zip(scores.ranks, scores.margins, scores.top_logits, strict=True)):
        if rank == 1:
            continue
        threshold = near_tie_threshold(top, near_tie_margin)
        evidence = {"first_divergent_token": i, "production_rank_at_divergence": rank,
                    "margin_at_divergence": margin, "top_logit_at_divergence": top, "near_tie_threshold": threshold}
        if rank == 2 and margin < threshold:
            near_ties.append(i)
            first = first or evidence
            continue
        return False, {**evidence, "near_tie_positions": near_ties}
    return True, {**first, "near_tie_positions": near_ties}


def _score_evidence(decoder: Decoder, req: DecodeRequest, prod_ids: list[int],
                    replay_ids: tuple[int, ...]) -> dict[str, Any]:
    """Production's tokens under the target for this identity, beside the replay's own tokens."""
    prod = decoder.score(req, prod_ids)
    rep = decoder.score(req, list(replay_ids))
    return {
        "production_mean_logprob": mean(prod.logprobs),
        "production_mean_raw_logprob": mean(prod.raw_logprobs),
        "production_mean_rank": mean(float(r) for r in prod.ranks),
        "production_impossible_tokens": len(prod.impossible_positions()),
        "replay_mean_logprob": mean(rep.logprobs),
        "replay_mean_raw_logprob": mean(rep.raw_logprobs),
    }


def sampled_source_explains(decoder: Decoder, req: DecodeRequest, prod_ids: list[int],
                            greedy: tuple[bool, dict[str, Any]] | None, source_req: DecodeRequest,
                            source_ids: list[int]) -> tuple[bool, dict[str, Any]]:
    """Whether production is a plausible sample of a sampled source, and implausible for this request."""
    source_scores = decoder.score(source_req, source_ids)
    source_mean = mean(source_scores.logprobs)
    impossible_for_source = len(source_scores.impossible_positions())
    evidence: dict[str, Any] = {"source_sample_mean_logprob": source_mean,
                                "source_impossible_tokens": impossible_for_source}
    if impossible_for_source or source_mean is None:
        return False, evidence
    if greedy is not None:  # this request is greedy: production must not be its greedy output
        return not greedy[0], evidence
    own_mean = mean(decoder.score(req, prod_ids).logprobs)
    evidence["own_sample_mean_logprob"] = own_mean
    return own_mean is None or own_mean < source_mean - 1.0, evidence


def replay_length(result: DecodeResult) -> int:
    """The replay's length in tokens: the engine's own count where its token ids can't be had here."""
    return result.output_tokens if result.output_tokens is not None else len(result.token_ids)


def length_only_source_explains(record: dict[str, Any], req: DecodeRequest, source: dict[str, Any],
                                replay_tokens: int) -> str | None:
    """Why production's length fits the source's max_tokens and not this request's, or None.

    Production is longer than this request's max_tokens allows and no longer than the source's: no
    run of this request could have returned it. Or production stopped at exactly the source's limit,
    a limit this request does not have, where this request's own replay does not stop: only the
    source's max_tokens cut it there.
    """
    produced, own_limit, source_limit = record["output_tokens"], req.max_tokens, source.get("max_tokens")
    if source_limit is None or source_limit == own_limit:
        return None
    if own_limit < produced <= source_limit:
        return (f"production has {produced} tokens, more than this request's max_tokens {own_limit} allows, and "
                f"the source's max_tokens {source_limit} allows them")
    if produced != source_limit:
        return None
    if record.get("finish_reason") not in (None, "length") or replay_tokens == produced:
        return None
    return (f"production stopped at {produced} tokens, the source's max_tokens; this request's max_tokens is "
            f"{own_limit} and its replay returns {replay_tokens} tokens")


def harmless_contamination(record: dict[str, Any], req: DecodeRequest) -> dict[str, Any]:
    """Evidence for a replay that matches production although the hit was served another identity's entry."""
    if not record.get("cache_hit") or not record.get("contaminated"):
        return {}
    fields = [f for f in (record.get("differing_fields") or "").split(";") if f]
    why = "the replay with this request's own identity returns production's output exactly"
    if req.is_greedy and fields and set(fields) <= LOSSLESS_FOR_GREEDY:
        why += (": greedy speculative decoding is lossless: it returns the target's greedy output whatever "
                "the draft proposes")
    elif fields:
        why += f": here {', '.join(fields)} did not change the output"
    return {"contaminated_hit": True, "harmless": True, "source_request_id": record.get("source_request_id"),
            "differing_fields": fields, "why_harmless": why}


def match_message(evidence: dict[str, Any]) -> str:
    message = "the replay returned production's output exactly"
    if evidence.get("contaminated_hit"):
        fields = ", ".join(evidence["differing_fields"]) or "its identity"
        message += (f"; the hit was contaminated (served the entry of request {evidence['source_request_id']}, "
                    f"which differs in {fields}) but harmless: {evidence['why_harmless'].split(': ', 1)[-1]}")
    return message


def classify_difference(decoder: Decoder, req: DecodeRequest, prod_ids: list[int], result: DecodeResult,
                        greedy: tuple[bool, dict[str, Any]] | None) -> Verdict:
    """Why production differs from the replay, when no cache source explains it.

    `greedy` is `greedy_explains` of this request (None for a sampled request).
    """
    if greedy is not None:
        explained, evidence = greedy
        if explained and evidence["near_tie_positions"]:
            d = evidence["first_divergent_token"]
            return Verdict("near_tie", f"greedy outputs part at token {d}, where the target's top two logits are "
                           f"{evidence['margin_at_divergence']:.4g} apart (< {evidence['near_tie_threshold']:.3g}, "
                           "below half-precision resolution at that magnitude); every other production token is "
                           "the target's first choice: numerics, not the cache", evidence)
        if explained:
            return Verdict("diverged", "every production token is the target's first choice, but production stops "
                           "at another length than the replay; no cache source explains it", evidence)
        d = evidence["first_divergent_token"]
        return Verdict("diverged", f"at token {d} production took the target's "
                       f"rank-{evidence['production_rank_at_divergence']} token "
                       f"({evidence['margin_at_divergence']:.3g} logits behind the top one): not numerics; no cache "
                       "source explains it", evidence)
    evidence = _score_evidence(decoder, req, prod_ids, result.token_ids)
    implausible = bool(evidence["production_impossible_tokens"]) or (
        evidence["production_mean_logprob"] is not None and evidence["replay_mean_logprob"] is not None
        and evidence["production_mean_logprob"] < evidence["replay_mean_logprob"] - 2.0)
    evidence["production_implausible"] = implausible
    message = (f"sampled request (temperature {req.temperature}) whose replay differs; production's tokens "
               f"average log-probability {_num(evidence['production_mean_logprob'])} under this identity "
               f"vs {_num(evidence['replay_mean_logprob'])} for the replay")
    if implausible:
        message += ": production's output is implausible for this request"
    return Verdict("sampled", message, evidence)


def unscored_note(decoder: Decoder, req: DecodeRequest) -> str:
    remote = decoder.engine_for(req) if isinstance(decoder, Routing) else None
    why = remote.scoring_note() if remote is not None and remote.local_tokenizer(req) else (
        f"tokenizer {req.tokenizer_version!r} is not on this machine, so production's text can't be scored")
    return (f"near_tie vs diverged, production's plausibility and a source equal up to near-ties need the "
            f"target's log-probabilities: {why}")


def unscored_verdict(req: DecodeRequest, diff: OutputDiff) -> Verdict:
    """Why production differs, where nothing can be scored: a sampled request says so; a greedy one is undecided."""
    at = diff.first_divergent_token
    if not req.is_greedy:
        return Verdict("sampled", f"sampled request (temperature {req.temperature}) whose replay differs from token "
                       f"{at}; production's plausibility can't be scored here", {"first_divergent_token": at})
    return Verdict("unavailable", f"the greedy replay parts from production at token {at}; whether that is a near-tie "
                   "(numerics) or a divergence needs the target's log-probabilities, which this engine does not "
                   "return", {"first_divergent_token": at})


def _num(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.3g}"


@dataclass(frozen=True)
class SourceWeighing:
    """What the request that populated the cache entry says about production."""

    verdict: Verdict | None  # `foreign` when the source explains production, else None
    evidence: dict[str, Any]
    source_replay_text: str | None


def weigh_source(decoder: Decoder, record: dict[str, Any], req: DecodeRequest, result: DecodeResult,
                 prod_ids: list[int], greedy: tuple[bool, dict[str, Any]] | None, source: dict[str, Any],
                 source_req: DecodeRequest, source_replayable: bool, near_tie_margin: float, *,
                 scores: bool = True) -> SourceWeighing:
    """Whether production is the source's output: weighed before near-ties, which the source shares.

    Without scores (an engine that returns no log-probabilities) only an exact source replay and the length
    rule can show it."""
    fields = differing_fields(identity(req), identity(source_req))
    evidence: dict[str, Any] = {"source_request_id": source["request_id"], "differing_fields": fields,
                                "cache_key": record["cache_key"]}
    if not fields:
        return SourceWeighing(None, evidence, None)
    if req.is_greedy and source_req.is_greedy and set(fields) <= LOSSLESS_FOR_GREEDY:
        # Both outputs are the target's greedy tokens: a difference is numerics, which near-ties judge.
        evidence["source_output_is_this_requests_output"] = "greedy, differing only in speculation settings"
        return SourceWeighing(None, evidence, None)
    production = record["output_text"]
    reproduces = None
    source_text = None
    if source_replayable and source_req.prompt is not None:
        source_result = decoder.generate(source_req)
        source_text = source_result.text
        exact = source_text == production
        evidence["source_replay_equals_production"] = exact
        source_ids = production_ids(decoder, source_req, production, source_result.token_ids)
        if exact:
            reproduces = "equals production exactly"
        elif not scores:
            evidence["source_up_to_near_ties"] = "unavailable: no log-probabilities to score the source's output"
        elif source_req.is_greedy:
            # The source ran in production's numerics too: equal up to near-ties is still its output,
            # unless this request's own replay is the same output (then the source explains nothing).
            near, tie = greedy_explains(decoder, source_req, source_ids, near_tie_margin)
            evidence["source_near_tie_positions"] = tie.get("near_tie_positions", [])
            if near and tie["near_tie_positions"] and source_text != result.text:
                reproduces = "equals production up to near-ties"
        else:
            # A sampled source drawn in production's numerics need not redraw the same tokens here; what
            # can be shown is that production is a plausible sample of the source and not of this request.
            plausible, more = sampled_source_explains(decoder, req, prod_ids, greedy, source_req, source_ids)
            evidence.update(more)
            if plausible:
                reproduces = ("differs, as sampling in another environment can, but production is a plausible "
                              "sample of the source's identity and not an output this request could produce")
    else:
        evidence["source_replay"] = "unavailable: a model or tokenizer it names is not on this machine"
    length = length_only_source_explains(record, req, source, replay_length(result))
    if length:
        evidence["length_explained_by_source_max_tokens"] = length
    if reproduces is None and length is None:
        return SourceWeighing(None, evidence, source_text)
    reasons = ([f"its replay {reproduces}"] if reproduces else []) + ([length] if length else [])
    # The evidence says in words how the source explains production, beside the exact comparison: a foreign
    # verdict on a near-tie read "equals production: no" alone.
    evidence["source_explains_production"] = "; ".join(reasons)
    message = (f"production returned the output of request {source['request_id']} (differs in "
               f"{', '.join(fields)}), which populated cache key {record['cache_key']}: " + "; ".join(reasons))
    own_ties = greedy[1]["near_tie_positions"] if greedy is not None and greedy[0] else []
    if own_ties:
        evidence["own_near_tie_positions"] = own_ties
        message += (f" (the near-ties at production tokens {own_ties} do not clear the cache: the source ran in "
                    "production's numerics too)")
    return SourceWeighing(Verdict("foreign", message, evidence), evidence, source_text)
