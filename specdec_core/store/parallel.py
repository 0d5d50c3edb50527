"""Another log format's lines read by worker processes: its readers are Python, one line at a time.

A LiteLLM payload takes about 30 µs: an ingest of 1M of them spent most of its time there, on one core,
while DuckDB waited. A large file's lines go to one worker per core in slices, in order, and this
process loads the records already read meanwhile. The workers are plain child processes fed over pipes,
not multiprocessing's: a fork would copy DuckDB's threads' locks in whatever state they are, and a spawn
runs the caller's main module again (a script that ingests at its top level would ingest in each worker).
"""

from __future__ import annotations

import logging
import os
import pickle
import queue
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

log = logging.getLogger(__name__)

# Files smaller than this are read here: starting the workers costs about 0.2 s, a file this size
# about 1 s to read (--follow batches are far smaller).
PARALLEL_FROM_BYTES = 32 << 20
# Lines handed to a worker at a time, and slices in flight per worker: an OTLP line may hold hundreds of
# spans, so a slice's records, not the file, are what is held at once.
SLICE_LINES = 2_000
IN_FLIGHT_PER_WORKER = 3

# (line numbers, records' JSON, reasons, origins, skipped): one slice's records, as read_foreign lists them.
Read = tuple[list[int], list[str], list["str | None"], list["int | None"], int]
Slice = tuple[list[int], list[str], list["str | None"]]


TOO_DEEP = "bad JSON: nested too deeply to read"


def read_lines(reader: Callable[[str], Any], numbers: list[int], texts: list[str], reasons: list[str | None]
               ) -> Read:
    """Each line through the format's reader: its records as JSON, or the line with the reader's reason."""
    import json

    out_numbers: list[int] = []
    raws: list[str] = []
    out_reasons: list[str | None] = []
    origins: list[int | None] = []
    skipped = 0
    for number, text, reason in zip(numbers, texts, reasons, strict=True):
        result, records = None, []
        if reason is None:
            try:
                result = reader(text)
                records = [json.dumps(record, ensure_ascii=False) for record in result.records]
            except ValueError as exc:  # the format's one-line reason
                result, reason = None, str(exc)
            except RecursionError:  # Python's JSON reader and writer recurse once per level of nesting
                result, reason = None, TOO_DEEP
        if result is None:
            out_numbers.append(number)
            raws.append(text)
            out_reasons.append(reason)
            origins.append(None)
            continue
        skipped += result.skipped
        for i, record in enumerate(records):
            out_numbers.append(number)
            raws.append(record)
            out_reasons.append(None)
            origins.append(i if result.origin_values else -1)
    return out_numbers, raws, out_reasons, origins, skipped


def workers_for(size: int, reader: Callable[[str], Any]) -> int:
    """How many worker processes a file of `size` bytes is read with (0: read here)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if size < PARALLEL_FROM_BYTES or cores < 2:
        return 0
    try:
        pickle.dumps(reader)
    except (pickle.PicklingError, TypeError, AttributeError):
        return 0  # a reader the workers can't be sent is used here
    return cores


def _slices(slices: Iterable[Slice]) -> Iterator[Slice]:
    for numbers, texts, reasons in slices:
        for start in range(0, len(texts), SLICE_LINES):
            end = start + SLICE_LINES
            yield numbers[start:end], texts[start:end], reasons[start:end]


_BOOT = ("import sys; sys.path[:0] = {path!r}; "
         "from specdec_core.store.parallel import serve; serve(int(sys.argv[1]), int(sys.argv[2]))")


def serve(inbox: int, outbox: int) -> None:
    """A worker: a reader, then slices until the pipe closes; each slice's Read (or its error) sent back."""
    with os.fdopen(inbox, "rb") as inp, os.fdopen(outbox, "wb") as out:
        reader = pickle.load(inp)
        pickle.dump(("ready", None), out)
        out.flush()
        while True:
            try:
                piece = pickle.load(inp)
            except EOFError:
                return
            try:
                answer: tuple[str, Any] = ("read", read_lines(reader, *piece))
            except Exception as exc:  # noqa: BLE001 - raised again in the ingest, which says what it is
                answer = ("error", exc)
            try:
                pickle.dump(answer, out, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, TypeError, AttributeError):
                pickle.dump(("error", RuntimeError(repr(answer[1]))), out, protocol=pickle.HIGHEST_PROTOCOL)
            out.flush()


class _Worker:
    def __init__(self, reader: Callable[[str], Any]) -> None:
        inbox_r, inbox_w = os.pipe()
        outbox_r, outbox_w = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT.format(path=sys.path), str(inbox_r), str(outbox_w)],
                pass_fds=(inbox_r, outbox_w), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        finally:
            os.close(inbox_r)
            os.close(outbox_w)
        self.send: BinaryIO = os.fdopen(inbox_w, "wb")
        self.recv: BinaryIO = os.fdopen(outbox_r, "rb")
        pickle.dump(reader, self.send, protocol=pickle.HIGHEST_PROTOCOL)
        self.send.flush()

    def ready(self) -> bool:
        """Whether the worker started and took the reader (an interpreter that can't import this package
        can't)."""
        try:
            return pickle.load(self.recv)[0] == "ready"
        except (EOFError, pickle.UnpicklingError):
            return False

    def read(self, piece: Slice) -> Read:
        pickle.dump(piece, self.send, protocol=pickle.HIGHEST_PROTOCOL)
        self.send.flush()
        try:
            status, value = pickle.load(self.recv)
        except EOFError:
            raise RuntimeError(f"a log-reading worker process ended (exit status {self.proc.wait()})") from None
        if status == "error":
            raise value
        return value

    def close(self) -> None:
        for pipe in (self.send, self.recv):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def read_in_workers(reader: Callable[[str], Any], slices: Iterable[Slice], workers: int) -> Iterator[Read]:
    """read_lines over `slices` in `workers` processes, results in the slices' order."""
    idle: queue.Queue[_Worker] = queue.Queue()
    started: list[_Worker] = []
    try:
        try:
            for _ in range(workers):
                started.append(_Worker(reader))
            usable = all([worker.ready() for worker in started])
        except OSError:
            usable = False
        if not usable:
            log.warning("log-reading workers could not start: reading here, one line at a time")
            yield from (read_lines(reader, *piece) for piece in _slices(slices))
            return
        for worker in started:
            idle.put(worker)

        def on_a_worker(piece: Slice) -> Read:
            worker = idle.get()  # one thread per worker: each writes its slice, then reads the answer
            try:
                return worker.read(piece)
            finally:
                idle.put(worker)

        with ThreadPoolExecutor(max_workers=workers) as threads:
            pending: deque[Future] = deque()
            try:
                for piece in _slices(slices):
                    pending.append(threads.submit(on_a_worker, piece))
                    if len(pending) >= workers * IN_FLIGHT_PER_WORKER:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()
    finally:
        for worker in started:
            worker.close()
