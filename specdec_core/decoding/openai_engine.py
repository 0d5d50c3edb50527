"""Replay on an OpenAI-compatible engine (vLLM, SGLang, TGI, `transformers serve`), behind the `Decoder` protocol.

The request goes with its identity, exactly:

- the prompt after its tokenizer version's preprocessing when that tokenizer is on this machine: as token ids
  (vLLM and SGLang take them), else, for a server that refuses ids, as the preprocessed text; otherwise the
  chat endpoint with the messages (the server's own template, and no normalisation);
- every sampling field, "off" values included, since an engine fills any field left out with its own default
  (llama.cpp: top_k 40, min_p 0.05; vLLM: the model's generation_config.json): temperature, top_p, top_k (the
  request's, else -1, which vLLM, SGLang and llama.cpp read as off), min_p 0, neutral penalties under each
  engine's spelling, seed for a sampled request (the request's, else the one the in-process decoder derives from
  the fingerprint), max_tokens, stop, n=1.

A field the server refuses is dropped and said in the evidence (an "off" value it refuses is a sampler it does
not have: dropped silently). Where the server reports the settings it applied (llama.cpp's
`generation_settings`), they are compared with what was sent: a difference is `parameters_ignored`. The output's
length is the server's own tokens where it returns them (llama.cpp's `tokens` with `return_tokens`), else this
tokenizer's count, else the server's count; the evidence says which. A server's speculative config can't be set
per request, so the evidence says that the logged draft_model and num_speculative_tokens were not applied. Scores
come from vLLM-style `prompt_logprobs` over prompt + output: where a server gives none, `can_score` is False and
replay decides only what needs no scores.
"""

from __future__ import annotations

import json
import math
import re
import threading
from collections.abc import Sequence
from typing import Any

from specdec_core.contract.identity import DecodeRequest
from specdec_core.contract.result import DecodeResult
from specdec_core.decoding.engine_answers import (
    applied_differences,
    natural_count,
    sampled_logprob,
    scored_tokens,
    server_count,
    server_ids,
)
from specdec_core.decoding.engine_client import (
    HTTP,
    MALFORMED,
    UNKNOWN_MODEL,
    EngineClient,
    EngineError,
    shown,
)
from specdec_core.decoding.protocol import TokenizerProvider
from specdec_core.decoding.registry import EngineSpec, Registry
from specdec_core.decoding.scoring import TokenScores
from specdec_core.decoding.seeds import request_seed
from specdec_core.decoding.stops import cut_at_stop

# vLLM caps prompt_logprobs at --max-logprobs, 20 by default.
PROMPT_LOGPROBS = 20
# top_k's "off": vLLM and SGLang take -1 (SGLang refuses 0), llama.cpp reads any value <= 0 as off.
TOP_K_OFF = -1
# Samplers switched off explicitly, each under the names the engines that have it use: vLLM and SGLang
# (repetition_penalty, min_p), llama.cpp (repeat_penalty, typical_p, mirostat, xtc, dry, top_n_sigma). An engine
# ignores the names it does not know, or refuses them (then it has no such sampler and they are dropped).
NEUTRAL = {"min_p": 0.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "repetition_penalty": 1.0,
           "repeat_penalty": 1.0, "typical_p": 1.0, "mirostat": 0, "xtc_probability": 0.0, "dry_multiplier": 0.0,
           "top_n_sigma": -1.0}
# Fields a server may refuse one by one (transformers serve answers 422 naming them); the rest are the request.
DROPPABLE = ("top_k", "top_p", "seed", "n", "stop", "generation_config", "return_tokens", *NEUTRAL)
# Said when refused: they carry the request's identity. Other refused fields were "off" values or plumbing.
IDENTITY_FIELDS = ("top_k", "top_p", "seed", "stop")
# No tokenizer's token is longer than this many characters: an answer longer than max_tokens of them is cut
# before it is tokenized (a server that ignores max_tokens must not cost minutes and gigabytes here).
MAX_TOKEN_CHARS = 1024
NO_PROMPT_LOGPROBS = "no prompt_logprobs"
SPECULATION_NOTE = ("the server's own speculative config: the logged draft_model {draft!r} and "
                    "num_speculative_tokens {n!r} can't be set per request")


def messages_of(prompt: str) -> list[dict[str, Any]]:
    """The chat messages a logged prompt holds: a JSON list of messages (or {"messages": [...]}), else one user turn."""
    try:
        value = json.loads(prompt)
    except ValueError:
        value = None
    if isinstance(value, dict) and isinstance(value.get("messages"), list):
        value = value["messages"]
    if isinstance(value, list) and value and all(isinstance(m, dict) and "role" in m for m in value):
        return value
    return [{"role": "user", "content": prompt}]


def _refused_fields(detail: str, sent: Sequence[str]) -> list[str]:
    return [name for name in sent if re.search(rf"['\"`]{name}['\"`]|\b{name}\b", detail)]


class EngineDecoder:
    """Generates (and, where the engine returns prompt log-probabilities, scores) on one engine."""

    def __init__(self, spec: EngineSpec, registry: Registry, tokenizers: TokenizerProvider,
                 client: EngineClient | None = None) -> None:
        """`tokenizers`: the tokenizer versions on this machine, to send token ids and count an answer's tokens."""
        self.spec, self.registry, self.tokenizers = spec, registry, tokenizers
        self.client = client or EngineClient(spec)
        self._refused: set[str] = set()  # fields this server refused once: not sent again
        self._ids_refused = False
        self._scoring: bool | None = None
        self._scoring_note = ""
        self._lock = threading.Lock()

    # --- tokens -------------------------------------------------------------------------------

    def local_tokenizer(self, req: DecodeRequest) -> bool:
        return self.tokenizers.available(req.tokenizer_version)

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        """Token ids of a text; without the tokenizer here, its UTF-8 bytes (positions then count bytes)."""
        if self.local_tokenizer(req):
            return self.tokenizers.encode_output(req, text)
        return list(text.encode("utf-8"))

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        if self.local_tokenizer(req):
            return self.tokenizers.decode(req, token_ids)
        return bytes(int(t) & 0xFF for t in token_ids).decode("utf-8", errors="replace")

    def served_name(self, req: DecodeRequest) -> str:
        return self.registry.model(req.target_model).model_on_engine

    # --- generation ---------------------------------------------------------------------------

    def _body(self, req: DecodeRequest) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(endpoint, body, notes) for the request's identity."""
        notes: dict[str, Any] = {}
        sampled = not req.is_greedy
        body: dict[str, Any] = {"model": self.served_name(req), "max_tokens": req.max_tokens,
                                "temperature": float(req.temperature), "n": 1, "stream": False,
                                "top_p": float(req.top_p) if sampled else 1.0,
                                "top_k": int(req.top_k) if sampled and req.top_k else TOP_K_OFF,
                                **NEUTRAL, "return_tokens": True}
        if sampled:
            body["seed"] = request_seed(req) % 2**63
            if req.seed is None:
                notes["seed"] = f"the log has none; sent {body['seed']}, derived from the fingerprint as in-process"
        # transformers serve samples only when told (its models' default is greedy) and takes top_k, min_p and
        # repetition_penalty only here, over the model's generation_config; vLLM ignores the field, a server that
        # refuses it goes without.
        body["generation_config"] = json.dumps({"do_sample": True, "top_k": int(req.top_k or 0), "min_p": 0.0,
                                                "repetition_penalty": 1.0} if sampled else
                                               {"repetition_penalty": 1.0})
        if req.stop:
            body["stop"] = list(req.stop)
        assert req.prompt is not None
        if self.local_tokenizer(req):
            if self._ids_refused:
                body["prompt"] = self.tokenizers.prompt_text(req)
                notes["prompt"] = "the preprocessed text (the server refuses token ids): the server tokenized it"
            else:
                body["prompt"] = self.tokenizers.prompt_ids(req)
                notes["prompt"] = f"token ids after {req.tokenizer_version}'s preprocessing"
            return "/completions", body, notes
        body["messages"] = messages_of(req.prompt)
        notes["prompt"] = (f"chat messages: tokenizer {req.tokenizer_version!r} is not on this machine, so the "
                           "server's chat template applied and no normalisation")
        return "/chat/completions", body, notes

    def _post(self, path: str, body: dict[str, Any], refused: list[str]) -> Any:
        """POST, dropping a field the server refuses (said in `refused`), or token ids it refuses."""
        for name in list(body):
            if name in self._refused and name in DROPPABLE:
                body.pop(name)
                refused.append(name)
        while True:
            try:
                return self.client.call("POST", path, body)
            except EngineError as exc:
                if exc.kind != HTTP or exc.status not in (400, 404, 422):
                    raise
                if exc.status in (400, 404) and (repr(body["model"]) in exc.detail or "model" in exc.detail.lower()):
                    raise EngineError(self.spec, UNKNOWN_MODEL, f"does not serve {body['model']!r}: "
                                      f"{exc.detail}", exc.status) from None
                names = [n for n in _refused_fields(exc.detail, [k for k in body if k in DROPPABLE])]
                if names:
                    for n in names:
                        body.pop(n)
                        refused.append(n)
                        self._refused.add(n)
                    continue
                if isinstance(body.get("prompt"), list) and not self._ids_refused:
                    self._ids_refused = True
                    raise _RetryAsText() from None
                raise

    def generate(self, req: DecodeRequest) -> DecodeResult:
        refused: list[str] = []
        try:
            path, body, notes = self._body(req)
            response = self._post(path, body, refused)
        except _RetryAsText:
            path, body, notes = self._body(req)
            response = self._post(path, body, refused)
        answer = response.body
        text, finish = self._answer_text(answer, path)
        model = answer.get("model")
        if isinstance(model, str) and model != body["model"]:
            raise EngineError(self.spec, UNKNOWN_MODEL, f"asked for model {body['model']!r}, the answer is from "
                              f"{shown(model, 80)!r}", response.status)
        evidence: dict[str, Any] = {"name": self.spec.name, "model": shown(model if model is not None else "–", 120)}
        for key in ("system_fingerprint", "version"):
            if isinstance(answer.get(key), (str, int, float)):
                evidence[key] = shown(answer[key], 120)
        server = response.headers.get("Server")
        if server:
            evidence["server"] = shown(server, 80)
        evidence["prompt"] = notes.pop("prompt")
        evidence.update(notes)
        if "top_k" in refused and "generation_config" in body:
            refused.remove("top_k")  # it went in generation_config, which the server took
        said = [n for n in refused if n in IDENTITY_FIELDS and _carries_identity(req, n)]
        if said:
            evidence["parameters_refused"] = ", ".join(f"{n}={req_value(req, n)!r}" for n in said)
        ignored = applied_differences(answer, body)
        cut = cut_at_stop(text, req.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            evidence["stop_applied_here"] = "the server's text went past a stop sequence: cut here"
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        if self.local_tokenizer(req) and natural_count(usage.get("prompt_tokens")) is not None:
            here = len(self.tokenizers.prompt_ids(req))
            if usage["prompt_tokens"] != here:
                evidence["prompt_tokens"] = f"the server counted {usage['prompt_tokens']}, this tokenizer {here}"
        counted = server_count(answer)
        text, token_ids, output_tokens, how, over = self._output_tokens(req, text, server_ids(answer),
                                                                        counted, cut is None)
        evidence["output_length"] = how
        if over is not None:
            ignored.insert(0, over)
            if len(token_ids) == req.max_tokens:
                finish = "length"
        if ignored:
            evidence["parameters_ignored"] = "; ".join(ignored)
        evidence["speculation"] = (SPECULATION_NOTE.format(draft=req.speculation, n=req.num_speculative_tokens)
                                   if req.speculation is not None else
                                   "the server's own speculative config (the log names no draft); it can't be set "
                                   "per request")
        environment = {**self.environment(req),
                       "parameters_sent": {k: v for k, v in body.items() if k not in ("prompt", "messages")},
                       "engine_evidence": evidence}
        return DecodeResult(text=text, token_ids=tuple(token_ids), finish_reason=finish, output_tokens=output_tokens,
                            latency_ms=round(response.seconds * 1000.0, 3), environment=environment)

    def _output_tokens(self, req: DecodeRequest, text: str, server_ids: list[int] | None,
                       counted: tuple[int, str] | None, uncut: bool
                       ) -> tuple[str, list[int], int, str, str | None]:
        """(text, token ids, length in tokens, how it was counted, what max_tokens the server ignored or None).

        An answer longer than max_tokens allows is cut to max_tokens tokens where they can be counted here (the
        prefix is what the request asked for), and refused where they can't: nothing past the limit is kept.
        """
        limit = req.max_tokens
        over: str | None = None
        if counted is not None and counted[0] > limit:
            over = f"max_tokens={limit} (the server returned {counted[0]} tokens, {counted[1]})"
        if not self.local_tokenizer(req):
            if len(text) > limit * MAX_TOKEN_CHARS:
                raise EngineError(self.spec, MALFORMED, f"the answer holds {len(text):,} characters, more than "
                                  f"max_tokens={limit} tokens can: the server ignored max_tokens; nothing kept")
            ids = list(text.encode("utf-8"))
            if counted is None or not uncut:
                why = "gives no token count" if counted is None else "counted the text before its stop sequence"
                return text, ids, len(ids), (f"unknown: the server {why} and tokenizer {req.tokenizer_version!r} "
                                             "is not here; positions count UTF-8 bytes"), over
            if over is not None:
                raise EngineError(self.spec, MALFORMED, f"the server ignored max_tokens={limit}: it returned "
                                  f"{counted[0]} tokens, which can't be cut here without tokenizer "
                                  f"{req.tokenizer_version!r}; nothing kept")
            return text, ids, counted[0], (f"{counted[0]} tokens, the server's count ({counted[1]}); tokenizer "
                                           f"{req.tokenizer_version!r} is not here, so diff positions count UTF-8 "
                                           "bytes"), over
        if server_ids is not None and uncut and len(server_ids) <= limit and self.decode(req, server_ids) == text:
            return text, server_ids, len(server_ids), f"{len(server_ids)} tokens, the server's own token ids", over
        if len(text) > limit * MAX_TOKEN_CHARS:
            text = text[: limit * MAX_TOKEN_CHARS]
        ids = self.encode_output(req, text)
        how = f"{len(ids)} tokens, the text re-tokenized here with {req.tokenizer_version}"
        if len(ids) > limit:
            ids = ids[:limit]
            text = self.decode(req, ids)
            over = over or f"max_tokens={limit} (counted here: the server returned more tokens)"
            how = f"{limit} tokens, the text re-tokenized here with {req.tokenizer_version} and cut to max_tokens"
        elif counted is not None and counted[0] != len(ids):
            how += f" (the server counted {counted[0]}, {counted[1]})"
        return text, ids, len(ids), how, over

    def environment(self, req: DecodeRequest) -> dict[str, Any]:
        """Where the request goes; a generated result adds what was sent and what the server said of itself."""
        return {"engine": self.spec.name, "engine_url": self.spec.url,
                "endpoint": "/completions" if self.local_tokenizer(req) else "/chat/completions",
                "served_model": self.served_name(req), "target_model": req.target_model,
                "tokenizer_version": req.tokenizer_version, "draft_model": req.speculation, "speculation": "engine"}

    def fits(self, req: DecodeRequest, output_tokens: int = 0) -> None:
        """Nothing to check here: the server refuses what its context can't hold."""

    def _answer_text(self, answer: dict[str, Any], path: str) -> tuple[str, str | None]:
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise EngineError(self.spec, MALFORMED, f"the answer to {path} has no choices")
        choice = choices[0]
        message = choice.get("message")
        text = choice.get("text") if path == "/completions" else (message.get("content") if isinstance(
            message, dict) else None)
        if not isinstance(text, str):
            raise EngineError(self.spec, MALFORMED, f"the answer to {path} has no text in choices[0]")
        finish = choice.get("finish_reason")
        return text, finish if isinstance(finish, str) else None

    # --- scoring ------------------------------------------------------------------------------

    def can_score(self, req: DecodeRequest) -> bool:
        """Whether this engine returns prompt log-probabilities (asked once) and the tokenizer is here."""
        if not self.local_tokenizer(req) or req.prompt is None:
            return False
        with self._lock:
            if self._scoring is None:
                try:
                    rows = self._prompt_logprobs(req, self.tokenizers.prompt_ids(req)[:2], 1)
                except EngineError as exc:
                    # A refusal, or an answer without the field, says the server has none; an answer holding
                    # impossible values is malformed, and nothing of it may become a verdict.
                    if exc.kind != HTTP and not exc.detail.startswith(NO_PROMPT_LOGPROBS):
                        raise
                    self._scoring, self._scoring_note = False, exc.detail
                    return False
                for i, row in enumerate(rows):
                    try:
                        scored_tokens(row)
                    except ValueError as err:
                        raise EngineError(self.spec, MALFORMED, f"prompt_logprobs at prompt token {i}: {err}"
                                          ) from None
                self._scoring = True
            return self._scoring

    def scoring_note(self) -> str:
        why = f" ({self._scoring_note})" if self._scoring_note else ""
        return f"engine {self.spec.name} returns no prompt log-probabilities{why}"

    def _prompt_logprobs(self, req: DecodeRequest, ids: list[int], k: int) -> list[Any]:
        body = {"model": self.served_name(req), "prompt": ids, "max_tokens": 1, "temperature": 0.0, "n": 1,
                "prompt_logprobs": k, "stream": False}
        answer = self.client.call("POST", "/completions", body).body
        choices = answer.get("choices") or [{}]
        plp = choices[0].get("prompt_logprobs") if isinstance(choices[0], dict) else None
        plp = plp if plp is not None else answer.get("prompt_logprobs")
        if not isinstance(plp, list) or len(plp) != len(ids):
            raise EngineError(self.spec, MALFORMED, f"{NO_PROMPT_LOGPROBS} for the prompt in the answer")
        return plp

    def score(self, req: DecodeRequest, output_token_ids: Sequence[int]) -> TokenScores:
        """The target's view of an output from the engine's top-20 prompt log-probabilities.

        Ranks and top-two margins are exact where the token is among those the engine lists (vLLM lists the
        chosen token with its rank); log-probabilities under a sampled request's temperature, top-k and top-p
        are computed over the listed tokens only. Raw logits are not returned: the relative near-tie threshold
        falls back to the absolute margin.
        """
        prompt = self.tokenizers.prompt_ids(req)
        output = [int(t) for t in output_token_ids]
        if not output:
            return TokenScores((), (), (), (), (), (), (), len(prompt))
        rows = self._prompt_logprobs(req, prompt + output, PROMPT_LOGPROBS)[len(prompt):]
        logprobs, raw, ranks, margins, argmax = [], [], [], [], []
        for i, (token, row) in enumerate(zip(output, rows, strict=True)):
            try:
                listed = scored_tokens(row)
            except ValueError as exc:
                raise EngineError(self.spec, MALFORMED, f"prompt_logprobs at output token {i}: {exc}") from None
            if token not in listed:
                raise EngineError(self.spec, MALFORMED, "prompt_logprobs leave out the scored token")
            lp, rank = listed[token]
            order = sorted(listed.items(), key=lambda kv: -kv[1][0])
            top = [v[0] for _, v in order[:2]]
            raw.append(lp)
            ranks.append(rank if rank is not None else 1 + sum(1 for v, _ in listed.values() if v > lp))
            margins.append(top[0] - top[1] if len(top) > 1 else math.inf)
            argmax.append(order[0][0])
            logprobs.append(sampled_logprob(req, listed, token, ranks[-1]))
        return TokenScores(tuple(output), tuple(logprobs), tuple(raw), tuple(ranks), tuple(margins),
                           tuple(0.0 for _ in output), tuple(argmax), len(prompt))


class _RetryAsText(Exception):
    """The server refused the prompt as token ids: the call is made again with the text."""


def req_value(req: DecodeRequest, name: str) -> Any:
    return list(req.stop or ()) if name == "stop" else getattr(req, name, None)


def _carries_identity(req: DecodeRequest, name: str) -> bool:
    """Whether a refused field held something of the request's own (not an "off" value sent to be explicit)."""
    if name == "top_k":
        return bool(req.top_k) and not req.is_greedy
    if name == "top_p":
        return not req.is_greedy and req.top_p < 1.0
    if name == "stop":
        return bool(req.stop)
    return True
