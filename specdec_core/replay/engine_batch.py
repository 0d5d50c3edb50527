"""A batch of replays: in-process ones one by one, those of a model on an engine side by side.

An engine takes up to its `max_concurrency` replays at once (its own batching does the rest). A call that
fails stores nothing; failures of one kind on one engine are said once per batch, in one line, and after an
engine proves dead (unreachable, past its timeout, no usable API key, still rate-limiting after its retries)
nothing more of the batch is sent to it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from specdec_core.decoding.engine_client import NO_KEY, RATE_LIMITED, TIMEOUT, UNREACHABLE, EngineError
from specdec_core.decoding.registry import EngineSpec

# A rate limit that outlasted every retry is as dead for this batch: each further request would wait out the
# same retries again.
DEAD = (UNREACHABLE, TIMEOUT, NO_KEY, RATE_LIMITED)
# Request ids a failure line names before it counts the rest.
NAMED_IDS = 5


@dataclass(frozen=True)
class EngineFailure:
    """One kind of failure on one engine in a batch: what it said, and the requests it left without a replay."""

    engine: str
    url: str
    reason: str
    failed: tuple[str, ...]
    sent: int
    not_sent: int = 0

    @property
    def not_replayed(self) -> int:
        return len(self.failed) + self.not_sent

    def line(self) -> str:
        """For a log or a terminal: the engine, its URL, the reason and the requests it hit, by id."""
        ids = self.failed
        named = ", ".join(ids[:NAMED_IDS]) + (f" and {len(ids) - NAMED_IDS} more" if len(ids) > NAMED_IDS else "")
        line = (f"engine {self.engine} ({self.url}): {self.reason} (on {len(ids)} of {self.sent} replays sent: "
                f"{named}); nothing stored for them")
        return line + (f"; {self.not_sent} more not sent to a dead engine" if self.not_sent else "")

    def summary(self) -> str:
        """For a page: what failed and what it cost, in a sentence."""
        n = self.not_replayed
        return f"engine {self.engine} failed: {self.reason} ({n} request{'' if n == 1 else 's'} not replayed)"


@dataclass
class _Failures:
    by_kind: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    first: dict[tuple[str, str, str], EngineError] = field(default_factory=dict)
    dead: dict[str, EngineError] = field(default_factory=dict)
    not_sent: dict[str, int] = field(default_factory=dict)
    sent: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request_id: str, exc: EngineError) -> None:
        key = (exc.engine.name, exc.kind, exc.detail)
        with self.lock:
            self.by_kind.setdefault(key, []).append(request_id)
            self.first.setdefault(key, exc)
            if exc.kind in DEAD:
                self.dead.setdefault(exc.engine.name, exc)

    def summaries(self) -> list[EngineFailure]:
        out = []
        for key, ids in self.by_kind.items():
            exc, engine = self.first[key], key[0]
            # The requests not sent after an engine died count against the failure that killed it.
            not_sent = self.not_sent.get(engine, 0) if self.dead.get(engine) is exc else 0
            out.append(EngineFailure(engine, exc.engine.url, exc.detail, tuple(ids), self.sent.get(engine, len(ids)),
                                     not_sent))
        return out


def run_batch(ids: Sequence[str], engine_of: Callable[[str], EngineSpec | None],
              replay_one: Callable[[str], Any], on_result: Callable[[Any], None],
              on_error: Callable[[str, BaseException], None] | None = None,
              cancelled: Callable[[], bool] = lambda: False) -> list[EngineFailure]:
    """Replay `ids`; `on_result` sees each result in this thread as it comes. Returns the engine failures.

    `on_error` takes any other exception of one replay (raising from it stops the batch); without it, it is raised.
    """
    failures = _Failures()
    groups: dict[str, tuple[EngineSpec, list[str]]] = {}
    for request_id in ids:
        spec = engine_of(request_id)
        if spec is None:
            if cancelled():
                break
            try:
                on_result(replay_one(request_id))
            except Exception as exc:
                _other(request_id, exc, on_error)
        else:
            groups.setdefault(spec.name, (spec, []))[1].append(request_id)
    for spec, members in groups.values():
        if cancelled():
            break
        _on_engine(spec, members, replay_one, on_result, on_error, cancelled, failures)
    return failures.summaries()


def _other(request_id: str, exc: BaseException, on_error: Callable[[str, BaseException], None] | None) -> None:
    if on_error is None:
        raise exc
    on_error(request_id, exc)


def _on_engine(spec: EngineSpec, members: list[str], replay_one: Callable[[str], Any],
               on_result: Callable[[Any], None], on_error: Callable[[str, BaseException], None] | None,
               cancelled: Callable[[], bool], failures: _Failures) -> None:
    def one(request_id: str) -> Any:
        if cancelled():
            return _SKIPPED
        if spec.name in failures.dead:
            with failures.lock:
                failures.not_sent[spec.name] = failures.not_sent.get(spec.name, 0) + 1
            return _SKIPPED
        with failures.lock:
            failures.sent[spec.name] = failures.sent.get(spec.name, 0) + 1
        try:
            return replay_one(request_id)
        except EngineError as exc:  # noted here, before this worker takes the next request
            failures.add(request_id, exc)
            return _SKIPPED

    pool = ThreadPoolExecutor(max_workers=spec.max_concurrency, thread_name_prefix=f"replay-{spec.name}")
    try:
        pending: dict[Future, str] = {pool.submit(one, rid): rid for rid in members}
        while pending:
            done, _ = wait(pending, return_when=FIRST_COMPLETED)
            for future in done:
                request_id = pending.pop(future)
                try:
                    result = future.result()
                except Exception as exc:
                    _other(request_id, exc, on_error)
                    continue
                if result is not _SKIPPED:
                    on_result(result)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


_SKIPPED = object()
