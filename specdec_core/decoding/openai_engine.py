"""Replay on an OpenAI-compatible engine (vLLM, SGLang, TGI, `transformers serve`), behind SpecDecoder's interface.

The request goes with its identity, exactly:

- the prompt after its tokenizer version's preprocessing when that tokenizer is on this machine: as token ids
  (vLLM and SGLang take them), else, for a server that refuses ids, as the preprocessed text; otherwise the
  chat endpoint with the messages (the server's own template, and no normalisation);
- temperature, and for a sampled request top_p, top_k, seed (the request's, else the one the in-process
  decoder derives from the fingerprint), max_tokens, stop, n=1.

A field the server refuses is dropped and said in the evidence; a server's speculative config can't be set per
request, so the evidence says that the logged draft_model and num_speculative_tokens were not applied. Scores
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
from specdec_core.decoding.engine_client import (
    HTTP,
    MALFORMED,
    UNKNOWN_MODEL,
    EngineClient,
    EngineError,
    shown,
)
from specdec_core.decoding.registry import EngineSpec
from specdec_core.decoding.scoring import TokenScores
from specdec_core.decoding.seeds import request_seed

# vLLM caps prompt_logprobs at --max-logprobs, 20 by default.
PROMPT_LOGPROBS = 20
# Fields a server may refuse one by one (transformers serve answers 422 naming them); the rest are the request.
DROPPABLE = ("top_k", "seed", "n", "stop", "generation_config")
SPECULATION_NOTE = ("the server's own speculative config: the logged draft_model {draft!r} and "
                    "num_speculative_tokens {n!r} can't be set per request")


def engine_decoder(local: Any, spec: EngineSpec) -> EngineDecoder:
    """The one EngineDecoder of an engine on `local`'s registry (made on first use)."""
    clients = local.registry.engine_clients
    with _MAKE_LOCK:
        if spec.name not in clients:
            clients[spec.name] = EngineDecoder(local, spec)
        return clients[spec.name]


_MAKE_LOCK = threading.Lock()


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

    def __init__(self, local: Any, spec: EngineSpec, client: EngineClient | None = None) -> None:
        self.local, self.registry, self.spec = local, local.registry, spec
        self.client = client or EngineClient(spec)
        self._refused: set[str] = set()  # fields this server refused once: not sent again
        self._ids_refused = False
        self._scoring: bool | None = None
        self._scoring_note = ""
        self._lock = threading.Lock()

    # --- tokens -------------------------------------------------------------------------------

    def local_tokenizer(self, req: DecodeRequest) -> bool:
        name = req.tokenizer_version
        return self.registry.knows(name, "tokenizer") and self.registry.is_available(name)

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        """Token ids of a text; without the tokenizer here, its UTF-8 bytes (positions then count bytes)."""
        if self.local_tokenizer(req):
            return list(self.local.loader.tokenizer(req.tokenizer_version).encode(text, add_special_tokens=False))
        return list(text.encode("utf-8"))

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        if self.local_tokenizer(req):
            tok = self.local.loader.tokenizer(req.tokenizer_version)
            return tok.decode(list(token_ids), skip_special_tokens=True)
        return bytes(int(t) & 0xFF for t in token_ids).decode("utf-8", errors="replace")

    def served_name(self, req: DecodeRequest) -> str:
        return self.registry.model(req.target_model).model_on_engine

    # --- generation ---------------------------------------------------------------------------

    def _body(self, req: DecodeRequest) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """(endpoint, body, notes) for the request's identity."""
        notes: dict[str, Any] = {}
        body: dict[str, Any] = {"model": self.served_name(req), "max_tokens": req.max_tokens,
                                "temperature": float(req.temperature), "n": 1, "stream": False}
        if not req.is_greedy:
            body["top_p"] = float(req.top_p)
            if req.top_k:
                body["top_k"] = int(req.top_k)
            body["seed"] = request_seed(req) % 2**63
            # transformers serve samples only when told (its models' default is greedy) and takes top_k only
            # here; vLLM ignores the field, a server that refuses it gets the request without it.
            body["generation_config"] = json.dumps({"do_sample": True, "top_k": int(req.top_k or 0)})
            if req.seed is None:
                notes["seed"] = f"the log has none; sent {body['seed']}, derived from the fingerprint as in-process"
        if req.stop:
            body["stop"] = list(req.stop)
        assert req.prompt is not None
        if self.local_tokenizer(req):
            if self._ids_refused:
                body["prompt"] = self._rendered(req)
                notes["prompt"] = "the preprocessed text (the server refuses token ids): the server tokenized it"
            else:
                body["prompt"] = self.local.prompt_ids(req)
                notes["prompt"] = f"token ids after {req.tokenizer_version}'s preprocessing"
            return "/completions", body, notes
        body["messages"] = messages_of(req.prompt)
        notes["prompt"] = (f"chat messages: tokenizer {req.tokenizer_version!r} is not on this machine, so the "
                           "server's chat template applied and no normalisation")
        return "/chat/completions", body, notes

    def _rendered(self, req: DecodeRequest) -> str:
        """The prompt text as the tokenizer version feeds it: normalised, then the chat template where it has one."""
        spec = self.registry.tokenizer(req.tokenizer_version)
        text = spec.preprocess(req.prompt or "")
        if spec.chat_template:
            tok = self.local.loader.tokenizer(req.tokenizer_version)
            text = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                           tokenize=False)
        return text

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
            if answer.get(key) is not None:
                evidence[key] = shown(answer[key], 120)
        server = response.headers.get("Server")
        if server:
            evidence["server"] = shown(server, 80)
        evidence["prompt"] = notes.pop("prompt")
        evidence.update(notes)
        if "top_k" in refused and "generation_config" in body:
            refused.remove("top_k")  # it went in generation_config, which the server took
        refused = [n for n in refused if n not in ("n", "generation_config")]
        if refused:
            evidence["parameters_refused"] = ", ".join(f"{n}={req_value(req, n)!r}" for n in refused)
        cut = _cut_at_stop(text, req.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            evidence["stop_applied_here"] = "the server's text went past a stop sequence: cut here"
        usage = answer.get("usage") if isinstance(answer.get("usage"), dict) else {}
        if self.local_tokenizer(req) and isinstance(usage.get("prompt_tokens"), int):
            here = len(self.local.prompt_ids(req))
            if usage["prompt_tokens"] != here:
                evidence["prompt_tokens"] = f"the server counted {usage['prompt_tokens']}, this tokenizer {here}"
        token_ids = self.encode_output(req, text)
        completion = usage.get("completion_tokens")
        if isinstance(completion, int) and completion > req.max_tokens:
            evidence["parameters_ignored"] = f"max_tokens={req.max_tokens} (the server returned {completion} tokens)"
        evidence["speculation"] = (SPECULATION_NOTE.format(draft=req.speculation, n=req.num_speculative_tokens)
                                   if req.speculation is not None else
                                   "the server's own speculative config (the log names no draft); it can't be set "
                                   "per request")
        environment = {"engine": self.spec.name, "engine_url": self.spec.url, "endpoint": path,
                       "served_model": body["model"], "target_model": req.target_model,
                       "tokenizer_version": req.tokenizer_version, "draft_model": req.speculation,
                       "speculation": "engine",
                       "parameters_sent": {k: v for k, v in body.items() if k not in ("prompt", "messages")},
                       "engine_evidence": evidence}
        return DecodeResult(text=text, token_ids=tuple(token_ids), finish_reason=finish,
                            output_tokens=completion if isinstance(completion, int) else None,
                            latency_ms=round(response.seconds * 1000.0, 3), environment=environment)

    def _answer_text(self, answer: dict[str, Any], path: str) -> tuple[str, str | None]:
        choices = answer.get("choices")
        if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
            raise EngineError(self.spec, MALFORMED, f"the answer to {path} has no choices")
        choice = choices[0]
        text = choice.get("text") if path == "/completions" else (choice.get("message") or {}).get("content")
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
                    self._prompt_logprobs(req, self.local.prompt_ids(req)[:2], 1)
                    self._scoring = True
                except EngineError as exc:
                    if exc.kind != HTTP and exc.kind != MALFORMED:
                        raise
                    self._scoring, self._scoring_note = False, exc.detail
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
            raise EngineError(self.spec, MALFORMED, "no prompt_logprobs for the prompt in the answer")
        return plp

    def score(self, req: DecodeRequest, output_token_ids: Sequence[int]) -> TokenScores:
        """The target's view of an output from the engine's top-20 prompt log-probabilities.

        Ranks and top-two margins are exact where the token is among those the engine lists (vLLM lists the
        chosen token with its rank); log-probabilities under a sampled request's temperature, top-k and top-p
        are computed over the listed tokens only. Raw logits are not returned: the relative near-tie threshold
        falls back to the absolute margin.
        """
        prompt = self.local.prompt_ids(req)
        output = [int(t) for t in output_token_ids]
        if not output:
            return TokenScores((), (), (), (), (), (), (), len(prompt))
        rows = self._prompt_logprobs(req, prompt + output, PROMPT_LOGPROBS)[len(prompt):]
        logprobs, raw, ranks, margins, argmax = [], [], [], [], []
        for token, row in zip(output, rows, strict=True):
            listed = _listed(row)
            if token not in listed:
                raise EngineError(self.spec, MALFORMED, "prompt_logprobs leave out the scored token")
            lp, rank = listed[token]
            order = sorted(listed.items(), key=lambda kv: -kv[1][0])
            top = [v[0] for _, v in order[:2]]
            raw.append(lp)
            ranks.append(rank if rank is not None else 1 + sum(1 for v, _ in listed.values() if v > lp))
            margins.append(top[0] - top[1] if len(top) > 1 else math.inf)
            argmax.append(order[0][0])
            logprobs.append(_sampled_logprob(req, listed, token, ranks[-1]))
        return TokenScores(tuple(output), tuple(logprobs), tuple(raw), tuple(ranks), tuple(margins),
                           tuple(0.0 for _ in output), tuple(argmax), len(prompt))


class _RetryAsText(Exception):
    """The server refused the prompt as token ids: the call is made again with the text."""


def req_value(req: DecodeRequest, name: str) -> Any:
    return list(req.stop or ()) if name == "stop" else getattr(req, name, None)


def _listed(row: Any) -> dict[int, tuple[float, int | None]]:
    """{token id: (logprob, rank)} of one prompt_logprobs position (vLLM: {"id": {"logprob", "rank", ...}})."""
    out: dict[int, tuple[float, int | None]] = {}
    if not isinstance(row, dict):
        return out
    for key, value in row.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            continue
        if isinstance(value, dict) and isinstance(value.get("logprob"), (int, float)):
            rank = value.get("rank")
            out[token] = (float(value["logprob"]), int(rank) if isinstance(rank, int) else None)
        elif isinstance(value, (int, float)):
            out[token] = (float(value), None)
    return out


def _sampled_logprob(req: DecodeRequest, listed: dict[int, tuple[float, int | None]], token: int, rank: int) -> float:
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


def _cut_at_stop(text: str, stops: Sequence[str] | None) -> int | None:
    hits = [i for i in (text.find(s) for s in (stops or ()) if s) if i >= 0]
    return min(hits) if hits else None
