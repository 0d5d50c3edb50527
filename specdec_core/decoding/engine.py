"""A speculative decoder on transformers + torch that returns acceptance counts.

The speculation kind follows the request: a draft model from the registry
(transformers' assisted generation), `ngram-N` (prompt lookup with n-grams up to N),
or none. Everything that decides the output comes from the request, so the same
request gives the same tokens every time in the same environment:

- the draft length is constant (`num_speculative_tokens`, default 5): transformers'
  draft-length heuristics and its confidence-threshold early exit (tuned with
  scikit-learn when installed) are switched off, so no call depends on earlier ones;
- sampling is seeded per request, from `seed`, or from the fingerprint when the
  request has none; the process-wide RNG state is restored afterwards;
- the prompt is preprocessed as the request's tokenizer version says.

transformers does not return acceptance counts; the candidate generator's
`update_candidate_strategy(input_ids, scores, num_matches)` sees them after every
verification step, so `_record_acceptance` wraps it for the length of one call.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from specdec_core.contract.identity import DecodeRequest
from specdec_core.contract.result import DecodeError, DecodeResult
from specdec_core.decoding.loader import ModelLoader
from specdec_core.decoding.proposers import DEFAULT_DRAFT_TOKENS, Proposer, proposer_for  # noqa: F401 (the default is public)
from specdec_core.decoding.registry import Registry
from specdec_core.decoding.scoring import TokenScores, sampling_logits
from specdec_core.decoding.seeds import request_seed
from specdec_core.decoding.stops import cut_at_stop
from specdec_core.decoding.tokenizers import Tokenizers
from specdec_core.extras import require

torch = require("replay", "torch")

# Below this many target parameters a CPU decode runs on one thread: splitting such small
# matrices only adds overhead, and on a busy 2-core machine two contending threads made
# the tiny models thirty times slower.
SINGLE_THREAD_BELOW_PARAMS = 20_000_000


class LogitRounding:
    """Round the target's logits to a lower precision, as a bf16 or fp16 GPU deployment computes them.

    A greedy choice whose top two logits are closer than that precision's resolution can flip:
    the near-ties that replay in float32 then classifies as numerics, not the cache.
    """

    def __init__(self, dtype: torch.dtype = torch.bfloat16) -> None:
        self.dtype = dtype

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        return scores.to(self.dtype).to(scores.dtype)

    def __repr__(self) -> str:
        return f"LogitRounding({str(self.dtype).removeprefix('torch.')})"


class _StopOnText:
    """Stops generation once the decoded output contains a stop sequence (cut afterwards)."""

    def __init__(self, tokenizer: Any, prompt_len: int, stops: Sequence[str]) -> None:
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.stops = [s for s in stops if s]

    def __call__(self, input_ids: torch.LongTensor, scores: Any, **kwargs: Any) -> torch.BoolTensor:
        text = self.tokenizer.decode(input_ids[0, self.prompt_len :].tolist(), skip_special_tokens=True)
        done = any(s in text for s in self.stops)
        return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)


@contextmanager
def _record_acceptance(target: Any) -> Iterator[list[tuple[int, int]]]:
    """(proposed, accepted) per verification step of the next generate() call on `target`.

    Patches the instance (not the class) so only this model and this call are affected;
    callers hold the engine's lock. Steps where nothing was proposed (a prompt lookup
    that found no match) are plain decoding steps and are not recorded.
    """
    steps: list[tuple[int, int]] = []
    original = target._get_candidate_generator

    def patched(*args: Any, **kwargs: Any) -> Any:
        generator = original(*args, **kwargs)
        update = generator.update_candidate_strategy

        def record(input_ids: torch.LongTensor, scores: torch.Tensor, num_matches: Any) -> Any:
            proposed = int(scores.shape[1]) - 1  # scores hold candidate_length + 1 positions
            if proposed > 0:
                steps.append((proposed, int(num_matches)))
            return update(input_ids, scores, num_matches)

        generator.update_candidate_strategy = record
        return generator

    target._get_candidate_generator = patched
    try:
        yield steps
    finally:
        target.__dict__.pop("_get_candidate_generator", None)




def resolve_device(device: str = "auto") -> tuple[torch.device, torch.dtype]:
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)


@dataclass(frozen=True)
class _Finished:
    """A decode's output once cut at EOS and stop sequences, with its acceptance counts."""

    text: str
    token_ids: list[int]
    finish_reason: str
    draft_tokens: int | None
    accepted_tokens: int | None
    accepted_per_step: tuple[int, ...]


def context_positions(model: Any) -> int | None:
    """How many positions (prompt and output tokens together) the model was made for; None when it doesn't say."""
    for name in ("max_position_embeddings", "n_positions", "n_ctx"):
        value = getattr(model.config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


class SpecDecoder:
    """Decodes a DecodeRequest in this process with the speculation it names; reuses loaded models between calls.

    A model the registry puts on an engine is not decoded here: `decoding.router.DecoderRouter` sends it there.

    A prompt, or a prompt and output to score, longer than the target's context is refused (DecodeError) before
    the model sees it: one such logged record would otherwise hold the decoder in a forward pass over millions
    of positions (quadratic in time), where no production service could have decoded it.
    """

    def __init__(
        self,
        registry: Registry | None = None,
        device: str = "auto",
        *,
        capacity: int = 4,
        logits_processors: Sequence[Any] = (),
        threads: int | None = None,
    ) -> None:
        """threads: torch CPU threads during a call; None picks 1 for small models, else torch's setting."""
        self.registry = registry if registry is not None else Registry.load()
        # Extra transformers LogitsProcessors applied to the target's scores, e.g. to emulate another
        # numeric environment (the demo's "production GPU"); none by default.
        self.logits_processors = tuple(logits_processors)
        self.device, self.dtype = resolve_device(device)
        self.loader = ModelLoader(self.registry, device=str(self.device), dtype=self.dtype, capacity=capacity)
        self.tokenizers = Tokenizers(self.registry, self.loader)
        self.threads = threads
        self._lock = threading.RLock()

    def _threads_for(self, target: Any) -> int:
        if self.threads is not None:
            return self.threads
        if self.device.type == "cpu" and sum(p.numel() for p in target.parameters()) < SINGLE_THREAD_BELOW_PARAMS:
            return 1
        return torch.get_num_threads()

    @contextmanager
    def _cpu_threads(self, target: Any) -> Iterator[int]:
        """Run a call on the chosen number of CPU threads, then restore the process's setting."""
        before = torch.get_num_threads()
        wanted = self._threads_for(target)
        if wanted != before:
            torch.set_num_threads(wanted)
        try:
            yield wanted
        finally:
            if wanted != before:
                torch.set_num_threads(before)

    def can_score(self, req: DecodeRequest) -> bool:
        """Always: the target is loaded here, and its logits are at hand."""
        return True

    @property
    def load_count(self) -> int:
        """Models loaded from disk so far; stays put while requests reuse loaded models."""
        return self.loader.load_count

    # --- tokens in and out -------------------------------------------------------------------

    def positions(self, model_name: str) -> int | None:
        """The context length of a model of the registry (context_positions)."""
        return context_positions(self.loader.model(model_name, "target model"))

    def fits(self, req: DecodeRequest, output_tokens: int = 0) -> None:
        """Raise DecodeError unless the request's prompt, and `output_tokens` after it, fit the target's context."""
        with self._lock:
            self._fits(req, self.loader.model(req.target_model, "target model"), len(self.prompt_ids(req)),
                       output_tokens)

    def _fits(self, req: DecodeRequest, target: Any, prompt: int, output: int = 0) -> int | None:
        """The target's context length, once the prompt (and `output` tokens after it) are known to fit in it."""
        limit = context_positions(target)
        if limit is None:
            return None
        if output == 0 and prompt >= limit:
            raise DecodeError(f"prompt: {prompt:,} tokens under {req.tokenizer_version}, and {req.target_model} holds "
                              f"{limit:,} positions: no room to decode a token")
        if prompt + output > limit:
            raise DecodeError(f"output: {output:,} tokens after a prompt of {prompt:,} under {req.tokenizer_version}, "
                              f"past the {limit:,} positions {req.target_model} holds")
        return limit

    def prompt_ids(self, req: DecodeRequest) -> list[int]:
        """The prompt as the request's tokenizer version feeds it to the model."""
        return self.tokenizers.prompt_ids(req)

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        """Token ids of an output text (a production output) under the request's tokenizer."""
        return self.tokenizers.encode_output(req, text)

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        return self.tokenizers.decode(req, token_ids)

    # --- environment -------------------------------------------------------------------------

    def environment(self, req: DecodeRequest) -> dict[str, Any]:
        """What a replay must match for its output to be comparable with this one."""
        transformers = require("replay", "transformers")

        proposer = proposer_for(req)
        return {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": str(self.device),
            "dtype": str(self.dtype).removeprefix("torch."),
            # scikit-learn switches on transformers' adaptive draft-confidence threshold
            # (disabled here, but recorded: other engines may not disable it).
            "sklearn": importlib.util.find_spec("sklearn") is not None,
            "target_model": req.target_model,
            "target_source": self.registry.model(req.target_model).source,
            "draft_model": req.speculation,
            "speculation": proposer.kind,
            "num_speculative_tokens": proposer.draft_tokens,
            "tokenizer_version": req.tokenizer_version,
            "tokenizer": self.registry.tokenizer(req.tokenizer_version).settings(),
            "seed": request_seed(req),
            "logits_processors": [repr(p) for p in self.logits_processors],
        }

    # --- decoding ----------------------------------------------------------------------------

    def _eos_ids(self, model: Any, tok: Any) -> list[int]:
        ids: list[int] = []
        for source in (model.generation_config.eos_token_id, model.config.eos_token_id, tok.eos_token_id):
            for i in source if isinstance(source, (list, tuple)) else [source]:
                if i is not None and int(i) not in ids:
                    ids.append(int(i))
        return ids

    def _generation_config(self, req: DecodeRequest, eos: list[int], proposer: Proposer, room: int | None = None
                           ) -> Any:
        """`room`: the positions the target's context leaves after the prompt; generation stops there at the latest
        (a service refuses max_tokens past it; a logged 10**18 would otherwise decode until cancelled)."""
        GenerationConfig = require("replay", "transformers").GenerationConfig

        args: dict[str, Any] = {
            "max_new_tokens": req.max_tokens if room is None else min(req.max_tokens, room),
            "eos_token_id": eos or None,
            "pad_token_id": eos[0] if eos else None,
            "num_beams": 1,
            "do_sample": not req.is_greedy,
        }
        if not req.is_greedy:
            # top_k=0 explicitly: transformers' default is 50, which the request did not ask for.
            args.update(temperature=float(req.temperature), top_p=float(req.top_p), top_k=req.top_k or 0)
        args.update(proposer.generation_args())
        return GenerationConfig(**args)

    def generate(self, req: DecodeRequest, *, watchers: Sequence[Any] = ()) -> DecodeResult:
        """`watchers`: logits processors for this call only (progress, cancel), left out of the environment."""
        with self._lock:
            started = time.perf_counter()
            proposer = proposer_for(req)
            target = self.loader.model(req.target_model, "target model")
            tok = self.loader.tokenizer(req.tokenizer_version)
            prompt = self.prompt_ids(req)
            limit = self._fits(req, target, len(prompt))
            eos = self._eos_ids(target, tok)
            config = self._generation_config(req, eos, proposer, None if limit is None else limit - len(prompt))
            kwargs: dict[str, Any] = proposer.generate_kwargs(self.loader, target)
            if req.stop:
                StoppingCriteriaList = require("replay", "transformers").StoppingCriteriaList

                kwargs["stopping_criteria"] = StoppingCriteriaList([_StopOnText(tok, len(prompt), req.stop)])
            if self.logits_processors or watchers:
                LogitsProcessorList = require("replay", "transformers").LogitsProcessorList

                kwargs["logits_processor"] = LogitsProcessorList([*self.logits_processors, *watchers])
            input_ids = torch.tensor([prompt], dtype=torch.long, device=target.device)
            devices = [self.device.index or 0] if self.device.type == "cuda" else []
            with (
                self._cpu_threads(target) as threads,
                torch.random.fork_rng(devices=devices),
                _record_acceptance(target) as steps,
            ):
                torch.manual_seed(request_seed(req))
                out = target.generate(
                    input_ids=input_ids,
                    attention_mask=torch.ones_like(input_ids),
                    generation_config=config,
                    **kwargs,
                )
            generated = out[0, len(prompt) :].tolist()
            result = self._finish(req, tok, generated, eos, steps if proposer.counts_acceptance else None)
            latency = (time.perf_counter() - started) * 1000.0
            return DecodeResult(
                **dataclasses.asdict(result),
                latency_ms=round(latency, 3),
                environment={**self.environment(req), "cpu_threads": threads},
            )

    def _finish(
        self,
        req: DecodeRequest,
        tok: Any,
        generated: list[int],
        eos: list[int],
        steps: list[tuple[int, int]] | None,
    ) -> _Finished:
        """Cut at EOS and stop sequences; the token ids kept are those of the returned text."""
        finish = "length" if len(generated) >= req.max_tokens else "stop"
        eos_at = next((i for i, t in enumerate(generated) if t in eos), None)
        if eos_at is not None:
            generated, finish = generated[:eos_at], "stop"
        text = tok.decode(generated, skip_special_tokens=True)
        cut = cut_at_stop(text, req.stop)
        if cut is not None:
            text, finish = text[:cut], "stop"
            # The fewest tokens whose text covers the kept text; tokens wholly inside the stop go.
            k = 0
            while k < len(generated) and len(tok.decode(generated[:k], skip_special_tokens=True)) < cut:
                k += 1
            generated = generated[:k]
        if steps is None:
            return _Finished(text, generated, finish, None, None, ())
        accepted = tuple(a for _, a in steps)
        return _Finished(text, generated, finish, sum(p for p, _ in steps), sum(accepted), accepted)

    # --- scoring -----------------------------------------------------------------------------

    def score(self, req: DecodeRequest, output_token_ids: Sequence[int]) -> TokenScores:
        """Run the target over prompt + output (teacher forcing) and score every output token."""
        with self._lock:
            target = self.loader.model(req.target_model, "target model")
            prompt = self.prompt_ids(req)
            output = [int(t) for t in output_token_ids]
            self._fits(req, target, len(prompt), max(len(output), 1))
            if not output:
                return TokenScores((), (), (), (), (), (), (), len(prompt))
            ids = torch.tensor([prompt + output], dtype=torch.long, device=target.device)
            with self._cpu_threads(target), torch.inference_mode():
                logits = target(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
            chosen = torch.tensor(output, device=logits.device)
            raw = logits.log_softmax(-1)
            picked = logits.gather(1, chosen[:, None])
            ranks = (logits > picked).sum(-1) + 1
            top2 = logits.topk(min(2, logits.shape[-1]), dim=-1).values
            margins = top2[:, 0] - top2[:, -1]
            argmax = logits.argmax(-1)
            if req.is_greedy:
                sampled = torch.where(chosen == argmax, 0.0, -math.inf)
            else:
                sampled = sampling_logits(logits, req).log_softmax(-1).gather(1, chosen[:, None])[:, 0]
            return TokenScores(
                token_ids=tuple(output),
                logprobs=tuple(float(x) for x in sampled.tolist()),
                raw_logprobs=tuple(float(x) for x in raw.gather(1, chosen[:, None])[:, 0].tolist()),
                ranks=tuple(int(x) for x in ranks.tolist()),
                margins=tuple(float(x) for x in margins.tolist()),
                top_logits=tuple(float(x) for x in top2[:, 0].tolist()),
                argmax_ids=tuple(int(x) for x in argmax.tolist()),
                prompt_tokens=len(prompt),
            )
