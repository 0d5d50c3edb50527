"""Replays run in the background with stages a page can show (loading models, decoding token n of N,
scoring) and a cancel that stops them between tokens; models can be loaded ahead of the first replay.

A job lives in this process, not in a browser session: each finished replay is stored at once, so
its page can be reopened however the job ends.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from specdec_core.contract.identity import DecodeRequest
from specdec_core.contract.result import DecodeResult
from specdec_core.decoding.openai_engine import EngineDecoder
from specdec_core.decoding.protocol import Decoder
from specdec_core.decoding.registry import EngineSpec, Registry
from specdec_core.decoding.router import DecoderRouter, Routing, routed
from specdec_core.decoding.scoring import TokenScores
from specdec_core.replay import run as replay_run
from specdec_core.replay.engine_batch import EngineFailure
from specdec_core.replay.run import ReplayResult
from specdec_core.store.connection import Store


class ReplayCancelled(RuntimeError):
    """The user cancelled the job; the replays finished before stay stored."""


@dataclass
class ReplayJob:
    request_ids: tuple[str, ...]
    job_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    stage: str = "queued"
    token: int = 0
    max_tokens: int = 0
    current: str | None = None
    results: list[ReplayResult] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    # A failed engine call is said once per engine and kind of failure, however many requests it cost.
    engine_failures: list[EngineFailure] = field(default_factory=list)
    cancelled: bool = False
    finished: bool = False
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _done: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def total(self) -> int:
        return len(self.request_ids)

    @property
    def done(self) -> int:
        return len(self.results) + len(self.errors) + sum(f.not_replayed for f in self.engine_failures)

    def cancel(self) -> None:
        self._cancel.set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def describe(self) -> str:
        """The stage in words: what the user waits for now."""
        where = f"request {self.current} ({self.done + 1} of {self.total}): " if self.total > 1 else ""
        if self.stage == "decoding" and self.max_tokens:
            return f"{where}decoding token {min(self.token, self.max_tokens)} of at most {self.max_tokens}"
        if self.stage == "queued":
            return "waiting for the decoder"
        return f"{where}{self.stage}"


_JOBS: dict[str, ReplayJob] = {}
_JOBS_LOCK = threading.Lock()
# Finished jobs kept for a page that still shows one; the oldest go first. Their replays are stored, so a page
# whose job is gone reads them from the store. A running job is always kept.
KEEP_FINISHED = 64


def _prune_finished() -> None:
    """Drop the oldest finished jobs past KEEP_FINISHED; the caller holds _JOBS_LOCK."""
    finished = [job_id for job_id, j in _JOBS.items() if j.finished]
    for job_id in finished[: max(0, len(finished) - KEEP_FINISHED)]:
        del _JOBS[job_id]


def job(job_id: str) -> ReplayJob | None:
    with _JOBS_LOCK:
        return _JOBS.get(job_id)


def running_jobs() -> list[ReplayJob]:
    with _JOBS_LOCK:
        return [j for j in _JOBS.values() if not j.finished]


def wait_all(timeout: float | None = None) -> None:
    for j in running_jobs():
        j.wait(timeout)


class _TokenProgress:
    """A pass-through logits processor: called once per decoding step, it reports and cancels."""

    def __init__(self, job: ReplayJob, prompt_len: int) -> None:
        self.job, self.prompt_len = job, prompt_len

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if self.job._cancel.is_set():
            raise ReplayCancelled("cancelled")
        self.job.token = int(input_ids.shape[-1]) - self.prompt_len
        return scores

    def __repr__(self) -> str:
        return "ReplayProgress"


class ProgressDecoder:
    """The decoder a job replays with: the real one (behind its router), reporting its stages to the job.

    Every answer is the wrapped decoder's, so replay classification is unchanged.
    """

    def __init__(self, inner: Decoder, job: ReplayJob) -> None:
        self._inner, self._job = routed(inner), job

    @property
    def registry(self) -> Registry:
        return self._inner.registry

    def _check(self) -> None:
        if self._job._cancel.is_set():
            raise ReplayCancelled("cancelled")

    def engine_for(self, req: DecodeRequest) -> EngineDecoder | None:
        return self._inner.engine_for(req) if isinstance(self._inner, Routing) else None

    def generate(self, req: DecodeRequest) -> DecodeResult:
        self._check()
        remote = self.engine_for(req)
        if remote is not None:  # a call to the engine: cancelled before it is sent, bounded by its timeout
            self._job.stage = f"waiting for engine {remote.spec.name}"
            result = remote.generate(req)
            self._job.stage = "scoring"
            return result
        local = self._inner.local if isinstance(self._inner, DecoderRouter) else self._inner
        loader = getattr(local, "loader", None)
        if loader is not None:
            self._job.stage = "loading models"
            loader.model(req.target_model, "target model")
            loader.tokenizer(req.tokenizer_version)
            if req.speculation is not None and local.registry.knows(req.speculation):
                loader.model(req.speculation, "draft model")
        self._job.stage, self._job.token, self._job.max_tokens = "decoding", 0, req.max_tokens
        if not isinstance(local, SteppedDecoder):
            return local.generate(req)
        prompt = len(local.prompt_ids(req))
        limit = local.positions(req.target_model)
        if limit is not None:  # decoding stops where the target's context ends, whatever max_tokens asks
            self._job.max_tokens = max(min(req.max_tokens, limit - prompt), 0)
        result = local.generate(req, watchers=(_TokenProgress(self._job, prompt),))
        self._job.stage = "scoring"
        return result

    def score(self, req: DecodeRequest, output_token_ids: Sequence[int]) -> TokenScores:
        self._check()
        self._job.stage = "scoring"
        return self._inner.score(req, output_token_ids)

    def can_score(self, req: DecodeRequest) -> bool:
        return self._inner.can_score(req)

    def fits(self, req: DecodeRequest, output_tokens: int = 0) -> None:
        self._inner.fits(req, output_tokens)

    def encode_output(self, req: DecodeRequest, text: str) -> list[int]:
        return self._inner.encode_output(req, text)

    def decode(self, req: DecodeRequest, token_ids: Sequence[int]) -> str:
        return self._inner.decode(req, token_ids)

    def environment(self, req: DecodeRequest) -> dict[str, Any]:
        return self._inner.environment(req)


@runtime_checkable
class SteppedDecoder(Protocol):
    """An in-process decoder that calls logits processors once per decoding step (SpecDecoder)."""

    def prompt_ids(self, req: DecodeRequest) -> list[int]: ...

    def positions(self, model_name: str) -> int | None: ...

    def generate(self, req: DecodeRequest, *, watchers: Sequence[Any] = ()) -> DecodeResult: ...


def _work(job: ReplayJob, store: Store, decoder_factory: Callable[[], Decoder], prompt: str | None) -> None:
    from specdec_core.analysis import request_record
    from specdec_core.replay.engine_batch import run_batch

    def engine_of(request_id: str) -> EngineSpec | None:
        record = request_record(store, request_id)
        return decoder.registry.engine_of(record["target_model"]) if record is not None else None

    def one(request_id: str) -> ReplayResult:
        job.current = request_id
        # Through the module, so one stored result per replay, whatever replaces `replay` in tests.
        return replay_run.replay(store, request_id, decoder, prompt=prompt)

    def on_error(request_id: str, exc: BaseException) -> None:
        if isinstance(exc, ReplayCancelled):
            raise exc
        job.errors[request_id] = str(exc)  # one request that can't replay does not stop the batch

    try:
        job.stage = "loading models"
        decoder = ProgressDecoder(decoder_factory(), job)
        job.engine_failures = run_batch(job.request_ids, engine_of, one, job.results.append, on_error,
                                        job._cancel.is_set)
        job.cancelled = job._cancel.is_set() and job.done < job.total
    except ReplayCancelled:
        job.cancelled = True
    except Exception as exc:
        job.errors.setdefault(job.current or "(start)", str(exc))
    finally:
        job.stage = "cancelled" if job.cancelled else "finished"
        job.finished = True
        job._done.set()


def start_job(store: Store, request_ids: Sequence[str], decoder_factory: Callable[[], Decoder] | None = None, *,
              prompt: str | None = None) -> ReplayJob:
    """Replay the requests one by one in a background thread; each result is stored as it finishes."""
    ids = tuple(dict.fromkeys(request_ids))
    new = ReplayJob(ids)
    with _JOBS_LOCK:
        _prune_finished()
        _JOBS[new.job_id] = new
    factory = decoder_factory or (lambda: replay_run.default_decoder())
    threading.Thread(target=_work, args=(new, store, factory, prompt), daemon=True,
                     name=f"replay-{new.job_id[:8]}").start()
    return new


@dataclass
class Preload:
    """Models of the registry loaded ahead of the first replay."""

    stage: str = "starting"
    loaded: list[str] = field(default_factory=list)
    error: str | None = None
    finished: bool = False


PRELOAD_ENV = "SPECDEC_PRELOAD"


def preload_enabled() -> bool:
    """Whether the dashboard loads the store's models when it opens it: $SPECDEC_PRELOAD unset or 1 (true, yes,
    on) says so, 0 (false, no, off) leaves them to the first replay (a machine short of memory, a dashboard
    nobody replays from). Anything else: a ValueError of one line."""
    text = os.environ.get(PRELOAD_ENV, "").strip().lower()
    if text in ("", "1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"${PRELOAD_ENV}: expected 0 or 1, got {text[:40]!r}; the models are preloaded")


NOTHING_NAMED = "ready (no request names a model of the registry)"
# The longest a preload waits for what it starts after (preload_models): a first page that never ends its run.
# The dashboard's preload starts after its first page has run: started with it, torch's import and the weights
# shared the interpreter and the two cores with that page's queries: the demo's first Overview, in a fresh
# browser, was drawn after 5.6-7.4 s (median 6.1) against 5.3-6.6 s (median 5.5) now, 4.8-5.3 s with no preload;
# the models were ready about as soon (11.5-14.1 s against 11.3-16.8 s; docs/benchmarks.md).
AFTER_WAIT_S = 30.0


def _to_load(registry: Registry, named: set[str] | None, keep: int) -> list[str]:
    """The registry's models with weights here (not on an engine) that `named` holds (None: any), at most `keep`."""
    return [n for n in registry.model_names
            if registry.is_available(n) and getattr(registry, "engine_of", lambda _: None)(n) is None
            and (named is None or n in named)][:keep]


def preload_models(decoder_factory: Callable[[], Decoder] | None = None,
                   wanted: Callable[[], Iterable[str]] | None = None,
                   after: threading.Event | None = None) -> Preload:
    """Load the registry's available models (up to what the loader keeps) in a background thread.

    `wanted` (called in the thread): the models worth loading, those the store's requests name. A registry
    model no request names is left alone (a replay of this store never asks for it), and with none left
    neither are the tokenizers: a dashboard on a store of other models loads nothing. `after`: the thread
    starts its work once this is set (the dashboard's first page is drawn), or after AFTER_WAIT_S.
    """
    state = Preload()

    def work() -> None:
        try:
            if after is not None:
                after.wait(AFTER_WAIT_S)
            named = None if wanted is None else set(wanted())
            # The default decoder's registry is read first (a TOML file): when it has none of the named models
            # here, torch is never imported (0.85 s of CPU and some hundreds of MB a dashboard then keeps).
            if decoder_factory is None and named is not None and not _to_load(Registry.load(), named, 1):
                state.stage = NOTHING_NAMED
                return
            state.stage = "loading the decoder"
            decoder = (decoder_factory or replay_run.default_decoder)()
            local = decoder.local if isinstance(decoder, DecoderRouter) else decoder
            registry, loader = decoder.registry, local.loader
            names = _to_load(registry, named, getattr(loader, "capacity", 4))
            if named is not None and not names:
                state.stage = NOTHING_NAMED
                return
            for name in names:
                state.stage = f"loading {name}"
                loader.model(name)
                state.loaded.append(name)
            for name in registry.tokenizer_names:
                if registry.is_available(name):
                    loader.tokenizer(name)
            state.stage = "ready"
        except Exception as exc:  # replays then load what they need, and say why if they can't
            state.error = str(exc)
            state.stage = "not preloaded"
        finally:
            state.finished = True

    threading.Thread(target=work, daemon=True, name="replay-preload").start()
    return state
