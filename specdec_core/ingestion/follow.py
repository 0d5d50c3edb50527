"""`specdec ingest --follow`: keep loading the lines a service appends to its logs, in small batches.

Files are followed by identity (device and inode), not by name: a log renamed away by rotation is read
to its end through the handle kept open on it, its rows credited to its new name, and the new file under
the old name starts at line 1. A followed file whose first bytes changed (truncated in place and written
again, or deleted and recreated on the same inode) holds new content: it is read again from line 1.
Only complete lines are read; a gzip, CSV or Parquet file is read whole once its size holds still
between two polls.
Each batch's read positions are written in the same transaction as its rows (`follow_offsets`), so a
follower killed at any point resumes where the last committed batch ended: nothing lost, nothing twice.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import time
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import IO

import duckdb
import pyarrow as pa

from specdec_core import formats, scratch
from specdec_core.formats.files import JSONL_SUFFIXES, LogReadError, resolve_paths
from specdec_core.ingestion.load import IngestResult, ingest
from specdec_core.ingestion.staging import IngestLimits
from specdec_core.store.connection import Store
from specdec_core.store.ddl import create_tables
from specdec_core.store.sql import has_table
from specdec_core.store.working_copy import copy_bytes

OFFSETS_DDL = """
CREATE TABLE IF NOT EXISTS follow_offsets (
    file_id VARCHAR PRIMARY KEY,  -- device:inode of the file followed
    path VARCHAR,                 -- where it was last read
    byte_offset BIGINT,           -- bytes consumed: complete lines only
    line_count BIGINT,            -- lines consumed
    done BOOLEAN,                 -- a file read whole (gzip, CSV, Parquet)
    head VARCHAR                  -- SHA-256 of its first bytes read (at most HEAD_BYTES): its content's identity
)
"""
_OFFSET_COLUMNS = ("file_id", "path", "byte_offset", "line_count", "done", "head")
# Less than one record: a file rewritten in place is told from the one read before by its first record.
HEAD_BYTES = 512


@dataclass
class Position:
    path: str
    byte_offset: int = 0
    line_count: int = 0
    done: bool = False
    head: str | None = None  # None: not known (a position saved before heads were)


@dataclass(frozen=True)
class Batch:
    """One committed batch: what the ingest counted, the newest request it holds, and its lag."""

    result: IngestResult
    files: int
    newest: datetime | None
    lag_seconds: float | None

    def status_line(self) -> str:
        r = self.result
        newest = "–" if self.newest is None else self.newest.strftime("%Y-%m-%d %H:%M:%S UTC")
        lag = "–" if self.lag_seconds is None else f"{self.lag_seconds:.1f} s"
        return (f"+{r.accepted} rows (read {r.read}, duplicates {r.duplicates}, quarantined {r.quarantined}) "
                f"from {self.files} file{'s' if self.files != 1 else ''}; newest {newest}; lag {lag}")


@dataclass
class _Part:
    file_id: str
    path: Path
    data: bytes | None  # the new complete lines; None: the whole file (gzip, CSV, Parquet), or `span`
    lines_before: int
    new_position: Position
    span: tuple[int, int] | None = None  # one line too long to hold: its bytes' range in the followed file

    @property
    def lines(self) -> int:
        return self.new_position.line_count - self.lines_before


def _file_id(st: os.stat_result) -> str:
    return f"{st.st_dev}:{st.st_ino}"


def _is_gzip(path: Path) -> bool:
    return path.name.lower().endswith(".gz")


def _grows_by_lines(path: Path) -> bool:
    """Plain JSON Lines are followed line by line; a gzip, CSV or Parquet file is read whole, once complete."""
    return path.name.lower().endswith(JSONL_SUFFIXES) and not _is_gzip(path)


# Lines one batch reads at most unless the caller says otherwise (`specdec ingest --follow --batch-rows`).
DEFAULT_BATCH_ROWS = 10_000



def has_offsets(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the store has followed anything yet (its table of positions exists)."""
    return has_table(con, "follow_offsets")

class Follower:
    """Polls the paths and commits what is new as one ingest batch per poll (at most `batch_rows` lines)."""

    def __init__(self, store: Store, paths: list[str], *, log_format: str = "auto",
                 mapping: formats.Mapping | None = None, limits: IngestLimits | None = None,
                 batch_rows: int = DEFAULT_BATCH_ROWS, on_problem: Callable[[str], None] | None = None) -> None:
        self.store, self.paths, self.log_format, self.mapping = store, paths, log_format, mapping
        self.limits, self.batch_rows = limits, batch_rows
        store.write_repeatedly()
        # A file that can't be read is said once (one line each), and the follower goes on with the others.
        self.problems: list[str] = []
        self._on_problem = on_problem or self.problems.append
        self._failed: dict[str, int] = {}  # file id -> its size when it could not be read: tried again once changed
        self._still: dict[str, int] = {}  # file id -> polls its size held still (a gzip that never completes)
        self.positions = self._load_positions()
        self._handles: dict[str, IO[bytes]] = {}  # file id -> an open handle, kept across renames
        self._whole_sizes: dict[str, int] = {}  # file id -> size at the last poll (files read whole)
        # file id -> (a line's start, how far it is known to run on without its end): a long line still
        # being written is searched for its end from there at the next poll, not from its start again.
        self._searched: dict[str, tuple[int, int]] = {}
        self._said: set[str] = set()

    def _load_positions(self) -> dict[str, Position]:
        if not self.store.exists:
            return {}
        with self.store.read() as con:
            if not has_offsets(con):
                return {}
            has_head = con.execute("SELECT count(*) FROM duckdb_columns() WHERE table_name = 'follow_offsets' "
                                   "AND column_name = 'head'").fetchall()[0][0]
            rows = con.execute(f"SELECT file_id, path, byte_offset, line_count, done, "
                               f"{'head' if has_head else 'NULL'} FROM follow_offsets").fetchall()
        return {fid: Position(*row) for fid, *row in rows}

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()
        self._handles.clear()
        self.store.drop_spare()

    def _files(self) -> list[Path]:
        try:
            return resolve_paths(self.paths)
        except LogReadError:
            # A followed folder may be empty, a file not yet created: take what exists now.
            found = []
            for spec in self.paths:
                try:
                    found.extend(resolve_paths([spec]))
                except LogReadError:
                    continue
            return found

    def _parts(self) -> list[_Part]:
        """What this poll reads: whole files found complete, and new lines up to the batch's row budget."""
        parts: list[_Part] = []
        budget = self.batch_rows
        for source in self._sources():
            if isinstance(source, _Part):  # a whole file: read once, outside the line budget
                parts.append(source)
                continue
            fid, path, pos, renamed_away = source
            part = self._read_new(fid, path, pos, budget)
            if part is None:
                if renamed_away:
                    self._handles.pop(fid).close()  # read to its end: nothing more will come
                continue
            parts.append(part)
            budget -= part.lines
            if budget <= 0:
                break
        return parts

    def _sources(self) -> Iterator[_Part | tuple[str, str, Position, bool]]:
        """In order: each followed file (a whole file once complete, else its handle's id, name and position),
        then the files no longer under any followed name (renamed away by rotation), to be read to their end."""
        seen: set[str] = set()
        for path in self._files():
            try:
                st = path.stat()
            except OSError:
                continue
            fid = _file_id(st)
            if fid in seen:
                continue  # named twice (a folder and a file in it): read once
            seen.add(fid)
            if path.is_symlink():
                # Credited to the file it points at now (a link swapped later must not take this file's rows).
                real = path.resolve()
                try:
                    if _file_id(real.stat()) != fid:
                        continue  # swapped between the two looks: next poll
                except OSError:
                    continue
                path = real
            pos = self.positions.get(fid, Position(str(path)))
            if not _grows_by_lines(path):
                # Complete when its size held still since the last poll (and a gzip file reads to its end).
                still = self._whole_sizes.get(fid) == st.st_size
                self._still[fid] = self._still.get(fid, 0) + 1 if still else 0
                # A gzip whose size holds still for GZIP_PATIENCE polls and still ends mid-stream is truncated
                # for good: read as a plain ingest reads it, the readable lines loaded, the tail quarantined.
                if (not pos.done and st.st_size and still and self._failed.get(fid) != st.st_size
                        and (not _is_gzip(path) or self._still[fid] >= GZIP_PATIENCE or _gzip_whole(path))):
                    yield _Part(fid, path, None, 0, Position(str(path), st.st_size, 0, True))
                self._whole_sizes[fid] = st.st_size
                continue
            if fid not in self._handles:
                try:
                    self._handles[fid] = open(path, "rb")  # noqa: SIM115 - kept open across polls
                except OSError as exc:
                    self._say(fid, f"{path}: cannot be read: {exc.strerror or exc}; followed once it can be")
                    continue
            yield fid, str(path), pos, False
        for fid in [f for f in self._handles if f not in seen]:
            pos = self.positions.get(fid, Position(""))
            handle = self._handles[fid]
            yield fid, _where_now(fid, pos.path or handle.name, handle), pos, True

    def _say(self, fid: str, message: str) -> None:
        key = f"{fid} {message}"
        if key not in self._said:
            self._said.add(key)
            self._on_problem(message)

    def _ingest(self, parts: list[_Part], paths: list[str], names: dict, newest: list) -> tuple[IngestResult, list]:
        """Ingest the batch; a file read whole that can't be read is said once and left out, the rest goes on."""
        while True:
            batch = parts

            def save(con: duckdb.DuckDBPyConnection, ingest_id: int, batch: list[_Part] = batch) -> None:
                newest.append(self._save_positions(con, batch, ingest_id))

            try:
                return ingest(self.store, paths, limits=self.limits, log_format=self.log_format,
                              mapping=self.mapping, parts=names, before_commit=save), parts
            except LogReadError as exc:
                whole = [n for n, p in enumerate(parts) if p.data is None and p.span is None
                         and str(exc).startswith(f"{p.path}:")]
                if not whole:
                    raise
                bad = parts[whole[0]]
                self._failed[bad.file_id] = bad.new_position.byte_offset
                self._say(bad.file_id, f"{exc}; left out, the follower goes on")
                newest.clear()
                parts = parts[:whole[0]] + parts[whole[0] + 1:]
                paths = paths[:whole[0]] + paths[whole[0] + 1:]
                if not parts:
                    return IngestResult(0, 0, 0, 0, 0, 0), parts

    def _read_new(self, fid: str, path: str, pos: Position, budget: int) -> _Part | None:
        handle = self._handles[fid]
        size = os.fstat(handle.fileno()).st_size
        offset = pos.byte_offset
        if size < offset or (offset and pos.head is not None and _head(handle, offset) != pos.head):
            offset = 0  # truncated, or written again from its start: what it holds is new
        if size == offset or budget <= 0:
            return None
        handle.seek(offset)
        data = handle.read(min(size - offset, _WINDOW))
        end = data.rfind(b"\n")
        if end < 0:
            if len(data) < _WINDOW:
                return None  # no complete line yet
            # A line longer than what a poll reads at once (past any sensible record size): its end is found
            # without holding it, and the ingest reads it from the file as one line (cut there, and quarantined).
            del data
            line_end = self._line_end(fid, handle, offset, size)
            if line_end is None:
                return None
            before = pos.line_count if offset == pos.byte_offset else 0
            return _Part(fid, Path(path), None, before,
                         Position(path, line_end, before + 1, head=_head(handle, line_end)), (offset, line_end))
        data = data[: end + 1]
        lines = data.count(b"\n")
        if lines > budget:
            cut = -1
            for _ in range(budget):
                cut = data.index(b"\n", cut + 1)
            data, lines = data[: cut + 1], budget
        before = pos.line_count if offset == pos.byte_offset else 0
        end = offset + len(data)
        return _Part(fid, Path(path), data, before, Position(path, end, before + lines, head=_head(handle, end)))

    def _line_end(self, fid: str, handle: IO[bytes], start: int, size: int) -> int | None:
        """Where the line from `start` ends (just past its newline); None while the file holds no end yet."""
        searched_start, searched_to = self._searched.get(fid, (start, start))
        at = searched_to if searched_start == start else start
        handle.seek(at)
        while at < size:
            block = handle.read(min(1 << 20, size - at))
            if not block:
                break
            found = block.find(b"\n")
            if found >= 0:
                self._searched.pop(fid, None)
                return at + found + 1
            at += len(block)
        self._searched[fid] = (start, at)
        return None

    def poll(self) -> Batch | None:
        """Commit what is new since the last poll as one batch; None when nothing is."""
        parts = self._parts()
        if not parts:
            return None
        with scratch.folder("follow") as tmp:
            paths, names = [], {}
            for n, part in enumerate(parts):
                if part.data is None and part.span is None:
                    paths.append(str(part.path))
                    continue
                chunk = Path(tmp) / f"part-{n}.jsonl"
                if part.span is not None:
                    _copy_range(self._handles[part.file_id], part.span, chunk)
                else:
                    chunk.write_bytes(part.data)
                paths.append(str(chunk))
                names[chunk.resolve()] = (str(Path(part.path).resolve()), part.lines_before)
            newest: list[datetime | None] = []
            result, parts = self._ingest(parts, paths, names, newest)
        if not parts:
            return None
        for part in parts:
            self.positions[part.file_id] = part.new_position
        lag = (datetime.now(timezone.utc) - newest[-1]).total_seconds() if newest[-1] is not None else None
        return Batch(result, len(parts), newest[-1], lag)

    def _save_positions(self, con: duckdb.DuckDBPyConnection, parts: list[_Part], ingest_id: int
                        ) -> datetime | None:
        """Write the batch's read positions beside its rows; returns the newest request the batch holds."""
        create_tables(con, OFFSETS_DDL)
        con.execute("ALTER TABLE follow_offsets ADD COLUMN IF NOT EXISTS head VARCHAR")  # a store of before heads
        con.register("positions_arrow", pa.table({
            "file_id": [p.file_id for p in parts],
            "path": [p.new_position.path for p in parts],
            "byte_offset": pa.array([p.new_position.byte_offset for p in parts], pa.int64()),
            "line_count": pa.array([p.new_position.line_count for p in parts], pa.int64()),
            "done": [p.new_position.done for p in parts],
            "head": pa.array([p.new_position.head for p in parts], pa.string()),
        }))
        # Another follower of the same file may have committed it further on: a position of the same content
        # never moves back (its lines would be read a third time); one of new content (another head) replaces it.
        con.execute("""
            DELETE FROM follow_offsets WHERE file_id IN (
                SELECT f.file_id FROM follow_offsets f JOIN positions_arrow p USING (file_id)
                WHERE NOT (f.head IS NOT DISTINCT FROM p.head AND f.byte_offset > p.byte_offset))
        """)
        columns = ", ".join(_OFFSET_COLUMNS)
        con.execute(f"INSERT INTO follow_offsets ({columns}) SELECT {columns} FROM positions_arrow "
                    "WHERE file_id NOT IN (SELECT file_id FROM follow_offsets)")
        con.unregister("positions_arrow")
        return con.execute("SELECT max(ts) FROM requests WHERE ingest_id = ?", [ingest_id]).fetchall()[0][0]


# Polls a gzip file's size must hold still, still ending mid-stream, before it is taken as truncated for good.
GZIP_PATIENCE = 3

# What a poll reads of a file at once: its complete lines in there are the batch's; a line longer than this
# is copied to the batch from the file (_copy_range) instead.
_WINDOW = 64 << 20


def _head(handle: IO[bytes], consumed: int) -> str:
    """The identity of a file's content: the SHA-256 of its first bytes consumed, HEAD_BYTES at most."""
    return hashlib.sha256(os.pread(handle.fileno(), min(consumed, HEAD_BYTES), 0)).hexdigest()


def _where_now(fid: str, last_path: str, handle: IO[bytes]) -> str:
    """The name of a followed file renamed away: in the folder it was in, else where the kernel says, else
    its last name marked deleted (its rows must not take the place of the new file's under that name)."""
    folder = Path(last_path).parent
    try:
        for entry in os.scandir(folder):
            try:
                if _file_id(entry.stat(follow_symlinks=False)) == fid:
                    return str(folder / entry.name)
            except OSError:
                continue
    except OSError:
        pass
    try:
        target = os.readlink(f"/proc/self/fd/{handle.fileno()}")
        if target.startswith("/") and not target.endswith(" (deleted)"):
            return target
    except OSError:
        pass
    return f"{last_path} (deleted)"


def _copy_range(handle: IO[bytes], span: tuple[int, int], dest: Path) -> None:
    """Bytes [start, end) of an open file into a new file, through the kernel, never all in memory."""
    start, end = span
    with open(dest, "wb") as out:
        if copy_bytes(handle.fileno(), out.fileno(), start, end) < end - start:
            raise LogReadError(f"{dest}: the followed file ended before byte {end:,}")


def _gzip_whole(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as fh:
            while fh.read(1 << 20):
                pass
        return True
    except (OSError, EOFError, zlib.error):
        return False  # still being written (or broken: the ingest says so once it holds still)


def follow(follower: Follower, *, every: float = 1.0, idle_exit: float | None = None,
           on_batch: Callable[[Batch], None] | None = None, stop: Callable[[], bool] | None = None) -> int:
    """Poll every `every` seconds until `stop()` says so, or nothing new came for `idle_exit` seconds.

    Returns how many batches were committed. A poll that fills a batch is followed at once by the next.
    """
    batches = 0
    idle_since = time.monotonic()
    while not (stop and stop()):
        started = time.monotonic()
        batch = follower.poll()
        if batch is not None:
            batches += 1
            idle_since = time.monotonic()
            if on_batch:
                on_batch(batch)
            if batch.result.read >= follower.batch_rows:
                continue
        elif idle_exit is not None and time.monotonic() - idle_since >= idle_exit:
            break
        time.sleep(max(0.0, every - (time.monotonic() - started)))
    return batches
