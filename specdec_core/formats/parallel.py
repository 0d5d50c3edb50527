"""Another log format's lines read by worker processes: its readers are Python, one line at a time.

A LiteLLM payload takes about 30 µs: an ingest of 1M of them spent most of its time there, on one core,
while DuckDB waited. A large file's lines go to one worker per core in slices, in order, and this
process loads the records already read meanwhile. The workers are plain child processes fed over pipes,
not multiprocessing's: a fork would copy DuckDB's threads' locks in whatever state they are, and a spawn
runs the caller's main module again (a script that ingests at its top level would ingest in each worker).

What crosses the pipes is JSON: the reader by name (a module's function, or a mapping's rules),
then each slice and its answer as a JSON frame whose texts (lines, records: most of the bytes) follow it
as one UTF-8 blob, cut by their lengths, so they are not escaped and parsed again on their way.
"""

from __future__ import annotations

import builtins
import importlib
import json
import logging
import os
import queue
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, BinaryIO

from specdec_core.formats.common import TOO_DEEP

log = logging.getLogger(__name__)

# Files smaller than this are read here: starting the workers costs about a fifth of what reading a file
# this size does (--follow batches are far smaller).
PARALLEL_FROM_BYTES = 32 << 20
# Lines handed to a worker at a time, and slices in flight per worker: an OTLP line may hold hundreds of
# spans, so a slice's records, not the file, are what is held at once.
SLICE_LINES = 2_000
IN_FLIGHT_PER_WORKER = 3

# (line numbers, records' JSON, reasons, origins, skipped): one slice's records, as read_foreign lists them.
Read = tuple[list[int], list[str], list["str | None"], list["int | None"], int]
Slice = tuple[list[int], list[str], list["str | None"]]


def read_lines(reader: Callable[[str], Any], numbers: list[int], texts: list[str], reasons: list[str | None]
               ) -> Read:
    """Each line through the format's reader: its records as JSON, or the line with the reader's reason."""
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
    return cores if describe_reader(reader) is not None else 0  # one the workers can't be sent is used here


def describe_reader(reader: Callable[[str], Any]) -> dict[str, Any] | None:
    """The reader as a worker finds it again: a mapping's rules, or a module's function by its name; None for
    anything else (a lambda, a closure, a function of the caller's main module), which is used here."""
    from specdec_core.formats.mapping import Mapping

    owner = getattr(reader, "__self__", None)
    if isinstance(owner, Mapping) and getattr(reader, "__func__", None) is Mapping.read_line:
        return {"mapping": {"source": owner.source, "rules": [
            [r.field, list(r.path), r.unit, r.value, r.constant] for r in owner.rules]}}
    module, name = getattr(reader, "__module__", None), getattr(reader, "__qualname__", None)
    if not module or not name or module == "__main__" or "<" in name:
        return None
    try:
        if _named(module, name) is not reader:
            return None
    except (ImportError, AttributeError):
        return None
    return {"function": [module, name]}


def _named(module: str, qualname: str) -> Any:
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def _reader_from(description: dict[str, Any]) -> Callable[[str], Any]:
    if "mapping" in description:
        from specdec_core.formats.mapping import FieldRule, Mapping

        spec = description["mapping"]
        return Mapping(source=spec["source"], rules=tuple(
            FieldRule(field=f, path=tuple(path), unit=unit, value=value, constant=constant)
            for f, path, unit, value, constant in spec["rules"])).read_line
    return _named(*description["function"])


# A frame: the length of its JSON head, the head, the length of its blob, the blob. The head's "lengths" cut
# the blob, decoded, into its strings, counted in characters (lone surrogates and all: a line read from bytes
# that are not UTF-8 holds them, and 'surrogatepass' carries any string as it is).
_LENGTH = 8


def _send(pipe: BinaryIO, head: dict[str, Any], texts: list[str] | None = None) -> None:
    texts = texts or []
    blob = "".join(texts).encode("utf-8", "surrogatepass")
    head_bytes = json.dumps({**head, "lengths": [len(t) for t in texts]}).encode("ascii")
    pipe.write(len(head_bytes).to_bytes(_LENGTH, "little") + head_bytes + len(blob).to_bytes(_LENGTH, "little"))
    pipe.write(blob)
    pipe.flush()


def _exactly(pipe: BinaryIO, size: int) -> bytes:
    data = pipe.read(size)
    if len(data) != size:
        raise EOFError("the pipe closed mid-frame" if data else "the pipe closed")
    return data


def _receive(pipe: BinaryIO) -> tuple[dict[str, Any], list[str]]:
    head = json.loads(_exactly(pipe, int.from_bytes(_exactly(pipe, _LENGTH), "little")))
    whole = _exactly(pipe, int.from_bytes(_exactly(pipe, _LENGTH), "little")).decode("utf-8", "surrogatepass")
    texts, at = [], 0
    for length in head.pop("lengths"):
        texts.append(whole[at:at + length])
        at += length
    return head, texts


def _error_head(exc: BaseException) -> dict[str, Any]:
    """An error as JSON: a built-in one is raised again as itself, with its arguments where JSON holds them."""
    try:
        args = json.loads(json.dumps(list(exc.args)))
    except (TypeError, ValueError):
        args = [str(exc)]
    return {"error": type(exc).__name__, "args": args, "text": repr(exc)}


def _raised(head: dict[str, Any]) -> BaseException:
    kind = getattr(builtins, head["error"], None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(*head["args"])
        except TypeError:
            pass
    return RuntimeError(f"a log-reading worker failed: {head['text']}")


def _slices(slices: Iterable[Slice]) -> Iterator[Slice]:
    for numbers, texts, reasons in slices:
        for start in range(0, len(texts), SLICE_LINES):
            end = start + SLICE_LINES
            yield numbers[start:end], texts[start:end], reasons[start:end]


_BOOT = ("import sys; sys.path[:0] = {path!r}; "
         "from specdec_core.formats.parallel import serve; serve(int(sys.argv[1]), int(sys.argv[2]))")


def serve(inbox: int, outbox: int) -> None:
    """A worker: a reader, then slices until the pipe closes; each slice's Read (or its error) sent back."""
    with os.fdopen(inbox, "rb") as inp, os.fdopen(outbox, "wb") as out:
        reader = _reader_from(_receive(inp)[0])
        _send(out, {"ready": True})
        while True:
            try:
                head, texts = _receive(inp)
            except EOFError:
                return
            try:
                numbers, raws, reasons, origins, skipped = read_lines(reader, head["numbers"], texts, head["reasons"])
            except Exception as exc:  # noqa: BLE001 - raised again in the ingest, which says what it is
                _send(out, _error_head(exc))
                continue
            _send(out, {"numbers": numbers, "reasons": reasons, "origins": origins, "skipped": skipped}, raws)


class _Worker:
    def __init__(self, reader: Callable[[str], Any]) -> None:
        description = describe_reader(reader)
        if description is None:  # workers_for sends no such reader
            raise ValueError(f"{reader!r} can't be sent to a worker")
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
        try:
            _send(self.send, description)
        except BrokenPipeError:
            pass  # the worker is already gone: ready() says so

    def ready(self) -> bool:
        """Whether the worker started and took the reader (an interpreter that can't import this package
        can't)."""
        try:
            return _receive(self.recv)[0].get("ready") is True
        except (EOFError, ValueError):
            return False

    def read(self, piece: Slice) -> Read:
        numbers, texts, reasons = piece
        try:
            _send(self.send, {"numbers": numbers, "reasons": reasons}, texts)
            head, raws = _receive(self.recv)
        except (EOFError, BrokenPipeError):
            raise RuntimeError(f"a log-reading worker process ended (exit status {self.proc.wait()})") from None
        if "error" in head:
            raise _raised(head)
        return head["numbers"], raws, head["reasons"], head["origins"], head["skipped"]

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
