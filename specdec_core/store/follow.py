"""`specdec ingest --follow`: tail files and folders into the store in small batches, resumable after a kill.

A file is known by its device and inode, so a rotated file (renamed, a new one created at its name) is
read to its end under the name it was opened by, and the new one from its start. Only complete lines
(ending in a newline) are taken; a gzip file is taken whole once it reads to its end. Each batch's
read offsets are written in the same transaction as its rows (`follow_offsets`), so a run killed at any
point resumes where the last commit left off: nothing lost, nothing twice.
"""

from __future__ import annotations

import gzip
import os
import re
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import duckdb

from specdec_core.store.connection import Store, scalar
from specdec_core.store.ingest import Chunk, IngestResult, ingest

BATCH_ROWS = 10_000
BATCH_SECONDS = 1.0


@dataclass
class _File:
    path: str  # the name it was first read under
    device: int
    inode: int
    offset: int = 0
    lines: int = 0
    handle: IO[bytes] | None = field(default=None, repr=False)


@dataclass(frozen=True)
class FollowBatch:
    """What one batch committed; lag: seconds from the newest row's own time to its commit."""

    result: IngestResult
    newest: datetime | None
    lag_s: float | None


# app.jsonl, and what rotation makes of it: app.jsonl.1, app.jsonl.2.gz.
_LOG_NAME = re.compile(r".*\.(jsonl|ndjson)(\.\d+)?(\.gz)?", re.IGNORECASE)


def _watched(paths: list[str]) -> list[Path]:
    found: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            found += sorted(f for f in p.iterdir() if f.is_file() and _LOG_NAME.fullmatch(f.name))
        elif p.is_file():
            found.append(p)
    return found


def _load_offsets(store: Store) -> dict[tuple[int, int], _File]:
    if not store.exists:
        return {}
    with store.read() as con:
        rows = con.execute("SELECT path, device, inode, offset_bytes, lines FROM follow_offsets").fetchall()
    return {(d, i): _File(p, d, i, o, n) for p, d, i, o, n in rows}


def _gzip_lines(path: Path) -> list[bytes] | None:
    """Every line of a gzip file, or None while it is still being written (it does not read to its end)."""
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read().splitlines(keepends=True)
    except (EOFError, OSError, zlib.error):
        return None


def _read_lines(f: _File, path: Path, limit: int) -> list[bytes]:
    if f.handle is None:
        f.handle = open(path, "rb")  # noqa: SIM115 - kept open across rotations, closed by _close_gone
        f.handle.seek(f.offset)
    out: list[bytes] = []
    while len(out) < limit:
        line = f.handle.readline()
        if not line.endswith(b"\n"):
            f.handle.seek(f.offset)  # a half-written line: read it again once it is whole
            break
        out.append(line)
        f.offset += len(line)
    return out


class Follower:
    """Tails `paths` into `store`; `step()` commits one batch (or nothing), `run()` loops until stopped."""

    def __init__(self, store: Store, paths: list[str], batch_rows: int = BATCH_ROWS,
                 on_batch: Callable[[FollowBatch], None] | None = None) -> None:
        self.store, self.paths, self.batch_rows, self.on_batch = store, paths, batch_rows, on_batch
        self.files = _load_offsets(store)
        self.stop = threading.Event()

    def _collect(self, folder: Path) -> tuple[list[Chunk], list[_File]]:
        chunks: list[Chunk] = []
        touched: list[_File] = []
        room = self.batch_rows
        current = {}
        for path in _watched(self.paths):
            try:
                st = path.stat()
            except OSError:
                continue
            current[(st.st_dev, st.st_ino)] = path
        # Files already open first: a rotated file's tail before the new file at its name.
        order = [k for k in self.files if self.files[k].handle is not None] + [k for k in current]
        for key in dict.fromkeys(order):
            if room <= 0:
                break
            path = current.get(key)
            if path is None and self.files[key].handle is None:
                continue
            f = self.files.setdefault(key, _File(str(path), *key)) if path else self.files[key]
            if path is not None and path.name.lower().endswith(".gz"):
                if f.offset:
                    continue
                lines = _gzip_lines(path)
                if lines is None:
                    continue
                f.offset = path.stat().st_size
            else:
                if path is not None and f.handle is None and path.stat().st_size < f.offset:
                    f.offset = f.lines = 0  # truncated in place: read it again from the start
                lines = _read_lines(f, path or Path(f.path), room)
            if not lines:
                continue
            chunk = folder / f"chunk{len(chunks)}.jsonl"
            chunk.write_bytes(b"".join(lines))
            chunks.append(Chunk(chunk, f.path, f.lines))
            f.lines += len(lines)
            touched.append(f)
            room -= len(lines)
        self._close_gone(current)
        return chunks, touched

    def _close_gone(self, current: dict) -> None:
        for key, f in self.files.items():
            if key not in current and f.handle is not None and f.handle.tell() == os.fstat(f.handle.fileno()).st_size:
                f.handle.close()
                f.handle = None

    def step(self) -> FollowBatch | None:
        with tempfile.TemporaryDirectory(prefix="specdec-follow-") as tmp:
            before = {id(f): (f.offset, f.lines) for f in self.files.values()}
            chunks, touched = self._collect(Path(tmp))
            if not chunks:
                return None

            def save_offsets(con: duckdb.DuckDBPyConnection) -> None:
                con.executemany("DELETE FROM follow_offsets WHERE device = ? AND inode = ?",
                                [[f.device, f.inode] for f in touched])
                con.executemany("INSERT INTO follow_offsets VALUES (?, ?, ?, ?, ?, now())",
                                [[f.path, f.device, f.inode, f.offset, f.lines] for f in touched])

            try:
                result = ingest(self.store, [str(c.path) for c in chunks], chunks=chunks,
                                log_format="contract", before_commit=save_offsets)
            except BaseException:
                for f in touched:  # nothing committed: read the same lines again next time
                    f.offset, f.lines = before[id(f)]
                    if f.handle is not None:
                        f.handle.seek(f.offset)
                raise
        return self._report(result)

    def _report(self, result: IngestResult) -> FollowBatch:
        with self.store.read() as con:
            newest = scalar(con, "SELECT max(ts) FROM requests WHERE ingest_id = ?", [result.ingest_id])
        lag = None if newest is None else (datetime.now(timezone.utc) - newest).total_seconds()
        batch = FollowBatch(result, newest, lag)
        if self.on_batch:
            self.on_batch(batch)
        return batch

    def run(self, interval: float = BATCH_SECONDS) -> None:
        """Batch at most every `interval` seconds, or at once while a full batch of rows waits."""
        while not self.stop.is_set():
            started = time.monotonic()
            batch = self.step()
            full = batch is not None and batch.result.read >= self.batch_rows
            if not full:
                self.stop.wait(max(0.0, interval - (time.monotonic() - started)))
