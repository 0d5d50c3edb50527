"""Replays run in the background with stages a page can show (loading models, decoding token n of N,
scoring) and a cancel that stops them between tokens; models can be loaded ahead of the first replay.

A job lives in this process, not in a browser session: each finished replay is stored at once, so
its page can be reopened however the job ends.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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
    """The decoder a job replays with: the real one, reporting its stages to the job.

    Anything it does not override is the wrapped decoder's, so replay classification is unchanged.
    """

    def __init__(self, inner: Any, job: ReplayJob) -> None:
        self._inner, self._job = inner, job

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _check(self) -> None:
        if self._job._cancel.is_set():
            raise ReplayCancelled("cancelled")

    def generate(self, req: Any) -> Any:
        self._check()
        remote = self._inner.engine_for(req) if hasattr(self._inner, "engine_for") else None
        if remote is not None:  # a call to the engine: cancelled before it is sent, bounded by its timeout
            self._job.stage = f"waiting for engine {remote.spec.name}"
            result = self._inner.generate(req)
            self._job.stage = "scoring"
            return result
        loader = getattr(self._inner, "loader", None)
        if loader is not None:
            self._job.stage = "loading models"
            loader.model(req.target_model, "target model")
            loader.tokenizer(req.tokenizer_version)
            if req.speculation is not None and self._inner.registry.knows(req.speculation):
                loader.model(req.speculation, "draft model")
        self._job.stage, self._job.token, self._job.max_tokens = "decoding", 0, req.max_tokens
        processors = getattr(self._inner, "logits_processors", None)
        if processors is None:
            return self._inner.generate(req)
        prompt = len(self._inner.prompt_ids(req))
        positions = getattr(self._inner, "positions", None)
        limit = positions(req.target_model) if positions is not None else None
        if limit is not None:  # decoding stops where the target's context ends, whatever max_tokens asks
            self._job.max_tokens = max(min(req.max_tokens, limit - prompt), 0)
        hook = _TokenProgress(self._job, prompt)
        with self._inner._lock:
            self._inner.logits_processors = (*processors, hook)
            try:
                result = self._inner.generate(req)
            finally:
                self._inner.logits_processors = processors
        self._job.stage = "scoring"
        environment = dict(result.environment)
        environment["logits_processors"] = [p for p in environment.get("logits_processors", []) if p != repr(hook)]
        return dataclasses.replace(result, environment=environment)

    def score(self, req: Any, token_ids: Any) -> Any:
        self._check()
        self._job.stage = "scoring"
        return self._inner.score(req, token_ids)


def _work(job: ReplayJob, store: Store, decoder_factory: Callable[[], Any], prompt: str | None) -> None:
    from specdec_core.analysis import request_record
    from specdec_core.replay.engine_batch import run_batch

    def engine_of(request_id: str) -> Any:
        record = request_record(store, request_id)
        registry = getattr(decoder, "registry", None)
        return registry.engine_of(record["target_model"]) if record is not None and registry is not None else None

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


def start_job(store: Store, request_ids: Sequence[str], decoder_factory: Callable[[], Any] | None = None, *,
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


def preload_models(decoder_factory: Callable[[], Any] | None = None) -> Preload:
    """Load the registry's available models (up to what the loader keeps) in a background thread."""
    state = Preload()

    def work() -> None:
        try:
            state.stage = "loading the decoder"
            decoder = (decoder_factory or replay_run.default_decoder)()
            registry, loader = decoder.registry, decoder.loader
            keep = getattr(loader, "capacity", 4)
            # model_names is a property; a model on an engine has no weights here to load
            names = [n for n in registry.model_names
                     if registry.is_available(n) and getattr(registry, "engine_of", lambda _: None)(n) is None][:keep]
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
