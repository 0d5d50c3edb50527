"""What an OpenAI-compatible engine's answer says beyond its text: prompt log-probabilities checked for values no
model gives, the generated token ids and count where the server returns them, the settings it says it applied,
and the probability of a token under the request's own sampling."""

from __future__ import annotations

import math
from typing import Any

from specdec_core.contract.identity import DecodeRequest
from specdec_core.decoding.engine_client import shown

# Log-probabilities come in float32: an exact 0 may arrive as a hair above it.
LOGPROB_SLACK = 1e-4
# Where an engine reports the settings it applied, and their names in what was sent.
APPLIED_KEYS = ("generation_settings", "sampling_params")
APPLIED_NAMES = {"n_predict": "max_tokens", "max_tokens": "max_tokens", "temperature": "temperature",
                 "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "seed": "seed", "typical_p": "typical_p",
                 "presence_penalty": "presence_penalty", "frequency_penalty": "frequency_penalty",
                 "repeat_penalty": "repeat_penalty", "repetition_penalty": "repetition_penalty",
                 "mirostat": "mirostat", "xtc_probability": "xtc_probability", "dry_multiplier": "dry_multiplier",
                 "top_n_sigma": "top_n_sigma"}

def scored_tokens(row: Any) -> dict[int, tuple[float, int | None]]:
    """{token id: (logprob, rank)} of one prompt_logprobs position (vLLM: {"id": {"logprob", "rank", ...}}).

    ValueError for a value no model gives: a log-probability that is NaN, infinite or above 0, a rank below 1.
    Such a score would become a verdict; the answer is malformed instead."""
    out: dict[int, tuple[float, int | None]] = {}
    if not isinstance(row, dict):
        return out
    for key, value in row.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            continue
        rank: Any = None
        if isinstance(value, dict) and is_number(value.get("logprob")):
            logprob, rank = float(value["logprob"]), value.get("rank")
        elif is_number(value):
            logprob = float(value)
        else:
            continue
        if not math.isfinite(logprob) or logprob > LOGPROB_SLACK:
            raise ValueError(f"token {token} has log-probability {logprob!r}; one is finite and at most 0")
        if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 1):
            raise ValueError(f"token {token} has rank {shown(rank, 40)}; a rank is an integer from 1")
        out[token] = (min(logprob, 0.0), rank)
    return out


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def natural_count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def verbose(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """Where an answer may carry an engine's own fields: itself, llama.cpp's `__verbose`, its first choice."""
    places = [answer]
    for extra in (answer.get("__verbose"), (answer.get("choices") or [None])[0]):
        if isinstance(extra, dict):
            places.append(extra)
    return places


def server_ids(answer: dict[str, Any]) -> list[int] | None:
    """The generated token ids, where the server returns them (llama.cpp's `tokens` with `return_tokens`)."""
    for place in verbose(answer):
        ids = place.get("tokens")
        if isinstance(ids, list) and all(natural_count(t) is not None for t in ids):
            return [int(t) for t in ids]
    return None


def server_count(answer: dict[str, Any]) -> tuple[int, str] | None:
    """(generated tokens, where it says so) from the server: usage, llama.cpp's timings or tokens_predicted."""
    usage = answer.get("usage")
    if isinstance(usage, dict) and natural_count(usage.get("completion_tokens")) is not None:
        return usage["completion_tokens"], "usage.completion_tokens"
    timings = answer.get("timings")
    if isinstance(timings, dict) and natural_count(timings.get("predicted_n")) is not None:
        return timings["predicted_n"], "timings.predicted_n"
    for place in verbose(answer):
        if natural_count(place.get("tokens_predicted")) is not None:
            return place["tokens_predicted"], "tokens_predicted"
    return None


def applied_differences(answer: dict[str, Any], sent: dict[str, Any]) -> list[str]:
    """What the server says it applied where that is not what was sent (llama.cpp's `generation_settings`)."""
    out: list[str] = []
    for place in verbose(answer):
        for key in APPLIED_KEYS:
            applied = place.get(key)
            if not isinstance(applied, dict):
                continue
            for name, value in applied.items():
                field = APPLIED_NAMES.get(name)
                if field is None or field not in sent or not is_number(value):
                    continue
                if not same_setting(field, sent[field], value) and not any(o.startswith(f"{field}=") for o in out):
                    out.append(f"{field}={sent[field]!r} (the server applied {shown(value, 40)})")
        if out:
            break
    return out


def same_setting(field: str, asked: Any, applied: float) -> bool:
    if not math.isfinite(applied):
        return False
    if field in ("top_k", "top_n_sigma") and asked <= 0 and applied <= 0:
        return True  # both off
    if field == "seed":  # llama.cpp keeps a 32-bit seed
        return int(applied) in (asked, asked % 2**32)
    if field == "mirostat" or field == "max_tokens":
        return int(applied) == int(asked)
    return math.isclose(float(applied), float(asked), rel_tol=1e-5, abs_tol=1e-6)  # sent as float32


def sampled_logprob(req: DecodeRequest, listed: dict[int, tuple[float, int | None]], token: int, rank: int) -> float:
    if req.is_greedy:
        return 0.0 if rank == 1 else -math.inf
    if req.top_k and rank > req.top_k:
        return -math.inf
    ordered = sorted((lp for lp, _ in listed.values()), reverse=True)
    if req.top_k:
        ordered = ordered[: req.top_k]
    scaled = [lp / float(req.temperature) for lp in ordered]
    top = max(scaled)
    norm = top + math.log(sum(math.exp(s - top) for s in scaled))
    probs = [math.exp(s - norm) for s in scaled]
    mine = listed[token][0] / float(req.temperature) - norm
    if req.top_p < 1.0:
        before = sum(p for p, s in zip(probs, scaled, strict=True) if s > mine + norm)
        if before >= req.top_p:
            return -math.inf
    return mine
