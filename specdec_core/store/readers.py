"""Turn log files (JSON Lines, gzipped or not, CSV, Parquet) into raw records with their positions.

Every record becomes one JSON text with the file and line (or row) it came from, so
validation is one SQL pass whatever the format, and a rejected record can be
quoted back exactly as it was.
"""

from __future__ import annotations

import csv
import fnmatch
import gzip
import hashlib
import io
import json
import math
import os
import re
import tempfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb

from specdec_core.contract import fields as contract
from specdec_core.formats.common import loads
from specdec_core.store import parallel

# The contract's JSON Lines suffixes (and .ndjson, the other common name); a .json file is not a log.
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
CSV_SUFFIXES = (".csv", ".csv.gz")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + CSV_SUFFIXES + PARQUET_SUFFIXES

# How CSV cells (always text) become typed JSON values; a cell that does not parse is
# passed on as text so validation rejects it with the field's name.
_CSV_INTEGER = {f.name for f in contract.FIELDS if f.is_integer}
_CSV_NUMBER = {f.name for f in contract.FIELDS if f.is_number}
_CSV_BOOLEAN = {f.name for f in contract.FIELDS if f.kind == "bool"}
_CSV_JSON = {f.name for f in contract.FIELDS if f.kind in ("str_list", "object")}


class LogReadError(OSError):
    """A path that can't be read at all; the message names it and says why."""


@dataclass(frozen=True)
class RawBatch:
    """Records of one file: parallel lists of line numbers and JSON texts."""

    source_file: str
    line_numbers: list[int]
    raws: list[str]
    # Why a record is rejected before any JSON check (bytes that are not UTF-8, a cut-off stream); None: no reason.
    reasons: list[str | None] | None = None
    # For another log format: where each record's input is on its line (the raw is its contract record):
    # the index of its origin in the reader's LineResult, -1 for the whole line, None when the raw is the
    # line itself; and how many entries of these lines are not model requests.
    origins: list[int | None] | None = None
    skipped: int = 0


def _supported(path: Path) -> bool:
    return path.name.lower().endswith(SUPPORTED_SUFFIXES)


_GLOB_CHARS = "*?["


def _is_pattern(spec: str) -> bool:
    return any(ch in spec for ch in _GLOB_CHARS)


def _entries(folder: Path) -> list[os.DirEntry]:
    try:
        with os.scandir(folder) as it:
            return list(it)
    except OSError:
        return []


def _walk(top: Path, with_files: bool, hidden: bool) -> Iterator[Path]:
    """`top` and every folder below it (and their files with `with_files`), in no set order.

    Symlinked folders are listed but never entered: a link back up would make the walk endless.
    Folders already seen by device and inode are skipped too, for loops that links don't explain (bind mounts).
    """
    seen: set[tuple[int, int]] = set()
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            st = folder.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        yield folder
        for entry in _entries(folder):
            if not hidden and entry.name.startswith("."):
                continue
            try:
                is_real_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if is_real_dir:
                stack.append(folder / entry.name)
            elif with_files:
                yield folder / entry.name


def expand_pattern(pattern: str) -> list[Path]:
    """The paths a glob names, each exactly once; `**` is any depth of folders, never through a symlinked one.

    Python's glob follows folder links under `**`, so a link loop expands without end.
    Names starting with a dot match only a pattern part that starts with one, as in the shell.
    """
    path = Path(pattern)
    parts = path.parts[1:] if path.anchor else path.parts
    current = [Path(path.anchor or ".")]
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        found: list[Path] = []
        for base in current:
            if part == "**":
                found.extend(_walk(base, with_files=last, hidden=False))
            elif _is_pattern(part):
                found.extend(base / e.name for e in _entries(base)
                             if fnmatch.fnmatchcase(e.name, part) and (part[0] == "." or e.name[0] != "."))
            else:
                found.append(base / part)
        current = sorted(set(found))
    return [p for p in current if p.exists()]


def resolve_paths(paths: list[str]) -> list[Path]:
    """Files named by paths, folders and globs, in a stable order; raise on anything unreadable.

    A path that exists is taken as it is, even with glob characters in its name; a pattern is
    expanded once, and what it yields is never expanded again.
    """
    files: list[Path] = []
    for spec in paths:
        p = Path(spec)
        if not os.path.lexists(spec) and _is_pattern(spec):
            matched = sorted(m for m in expand_pattern(spec) if m.is_file() and _supported(m))
            if not matched:
                raise LogReadError(f"{spec}: no supported log file matches this pattern")
            files.extend(matched)
        elif p.is_dir():
            found = sorted(f for f in _walk(p, with_files=True, hidden=True) if f.is_file() and _supported(f))
            if not found:
                raise LogReadError(f"{spec}: folder holds no .jsonl, .jsonl.gz, .csv or .parquet file")
            files.extend(found)
        elif p.is_file():
            if not _supported(p):
                raise LogReadError(f"{spec}: unsupported file type (expected {', '.join(SUPPORTED_SUFFIXES)})")
            if not os.access(p, os.R_OK):
                raise LogReadError(f"{spec}: permission denied")
            files.append(p)
        elif p.exists():  # a FIFO, a device (/dev/zero), a socket: no end to read to, or no file at all
            raise LogReadError(f"{spec}: not a regular file or folder")
        else:
            raise LogReadError(f"{spec}: no such file or folder")
    seen: set[Path] = set()
    unique = []
    for f in files:
        key = f.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(f)
    return unique


# DuckDB expands glob characters in every file name its readers get, a list's items included, and has no escape.
_DUCKDB_GLOB_CHARS = "*?[]{}"


@contextmanager
def duckdb_literal_path(path: Path) -> Iterator[str]:
    """A name for `path` that DuckDB's readers take as that one file: a link in a fresh folder, where needed.

    The link keeps the file's suffix, from which DuckDB tells a gzip stream.
    """
    text = str(path)
    if not any(ch in text for ch in _DUCKDB_GLOB_CHARS):
        yield text
        return
    lowered = path.name.lower()
    suffix = max((s for s in SUPPORTED_SUFFIXES if lowered.endswith(s)), key=len, default="")
    with tempfile.TemporaryDirectory(prefix="specdec-") as folder:
        alias = os.path.join(folder, "log" + suffix)
        os.symlink(os.path.abspath(path), alias)
        yield alias


def _open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig: a byte order mark (as Windows tools write) is not part of the first record or header.
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", errors="surrogateescape", newline="")
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")


def _safe_text(line: str) -> str:
    # Undecodable bytes survive as surrogates; store them as U+FFFD so the raw text is keepable.
    return line.encode("utf-8", "replace").decode("utf-8")


INVALID_UTF8 = "invalid UTF-8"


def shown_bytes(data: bytes) -> str:
    r"""Text with each byte that is not UTF-8 written as \xNN, so a quarantined line keeps every byte."""
    return data.decode("utf-8", "backslashreplace")


def _has_surrogates(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


CHUNK_ROWS = 250_000  # bounds memory; two row groups, so DuckDB works on both cores
_READ_BYTES = 1 << 20
_BOM = b"\xef\xbb\xbf"


def _open_binary(path: Path) -> io.BufferedIOBase:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


# A record longer than this is quarantined (IngestLimits.max_record_bytes, store/staging.py, by default).
MAX_RECORD_BYTES = 16 * 1024 * 1024
# Of a line longer than the limit, the quarantine keeps this much, with its size and its whole text's MD5: a
# log (or a gzip of a few KB) can hold a line of gigabytes, which no reader and no store should hold whole.
# The record itself stays in its file, at the line the quarantine names.
KEPT_OF_A_LONG_LINE = 64 * 1024


def bytes_text(n: int) -> str:
    """A byte count as a limit is spelled: 16 MiB, 4 KiB, or 1,000 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    return f"{n:,} bytes"


def too_large(size: int, limit: int) -> str:
    """Why a record past the size limit is quarantined."""
    return f"record too large: {size:,} bytes (limit {bytes_text(limit)})"


@dataclass(frozen=True)
class _Cut:
    """A line past the limit: its first bytes, its size and its MD5."""

    head: bytes
    size: int
    md5: str

    def shown(self) -> str:
        return (shown_bytes(self.head) + f" [cut by specdec: the first {len(self.head):,} of {self.size:,} bytes; "
                f"MD5 of the whole record {self.md5}]")


def _lines(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[bytes | _Cut, bool]]:
    """The file's lines, ending at LF only (a CR inside a line is part of it), each with whether it is complete.

    A line longer than `max_bytes` is not held: it comes as a _Cut. A gzip stream that stops early (or turns
    to garbage) yields what it held before the cut as one incomplete last line, rather than losing the file:
    read in chunks, since a line read would drop its partial buffer. Linear in the line's length, however long.
    """
    parts: list[bytes] = []
    held = 0
    digest = None  # the MD5 of a line past max_bytes, from its first byte

    def line() -> bytes | _Cut:
        if digest is None:
            return b"".join(parts)
        return _Cut(b"".join(parts), held, digest.hexdigest())

    def add(piece: bytes) -> None:
        nonlocal held, digest
        if digest is None and held + len(piece) > max_bytes:
            digest = hashlib.md5(usedforsecurity=False)
            for part in parts:
                digest.update(part)
            head = b"".join(parts)[:KEPT_OF_A_LONG_LINE]
            parts[:] = [head]
        if digest is not None:
            digest.update(piece)
            room = KEPT_OF_A_LONG_LINE - len(parts[0])
            if room > 0:
                parts[0] += piece[:room]
        else:
            parts.append(piece)
        held += len(piece)

    with _open_binary(path) as fh:
        try:
            while True:
                chunk = fh.read1(_READ_BYTES)
                if not chunk:
                    break
                pieces = chunk.split(b"\n")
                if len(pieces) > 1:
                    add(pieces[0])  # the end of the line under way
                    yield line(), True
                    parts, held, digest = [], 0, None
                    for piece in pieces[1:-1]:  # whole lines within the chunk, as they are unless too long
                        if len(piece) > max_bytes:
                            add(piece)
                            yield line(), True
                            parts, held, digest = [], 0, None
                        else:
                            yield piece, True
                if pieces[-1]:
                    add(pieces[-1])
        except (EOFError, zlib.error):
            yield line(), False
            return
    if held:
        yield line(), True


def read_jsonl(path: Path, name: str, chunk_rows: int = CHUNK_ROWS, max_record_bytes: int = MAX_RECORD_BYTES
               ) -> Iterator[RawBatch]:
    numbers: list[int] = []
    raws: list[str] = []
    reasons: list[str | None] = []
    try:
        for number, (data, complete) in enumerate(_lines(path, max_record_bytes), start=1):
            if isinstance(data, _Cut):
                text, reason = data.shown(), too_large(data.size, max_record_bytes)
            else:
                if number == 1 and data.startswith(_BOM):
                    data = data[len(_BOM):]  # as Windows tools write it: not part of the first record
                if data.endswith(b"\r"):
                    data = data[:-1]  # a CRLF line end
                if complete:
                    try:
                        text = data.decode("utf-8")
                        reason = None
                    except UnicodeDecodeError:
                        text, reason = shown_bytes(data), INVALID_UTF8
                    if not text.strip():
                        continue
            if not complete:
                numbers.append(number)
                raws.append(data.shown() if isinstance(data, _Cut) else shown_bytes(data))
                reasons.append(f"truncated gzip: file ends mid-stream after line {number - 1}")
                break
            numbers.append(number)
            raws.append(text)
            reasons.append(reason)
            if len(raws) >= chunk_rows:
                yield RawBatch(name, numbers, raws, reasons)
                numbers, raws, reasons = [], [], []
    except (OSError, gzip.BadGzipFile) as exc:
        raise LogReadError(f"{path}: cannot be read: {exc}") from exc
    yield RawBatch(name, numbers, raws, reasons)


# Records of another format carry their converted record and their input: smaller chunks keep memory flat.
FOREIGN_CHUNK_ROWS = 20_000


def first_line(path: Path) -> str | None:
    """The first non-blank line of a JSON Lines file (decoded leniently: it only decides the format)."""
    for data, _ in _lines(path):
        if isinstance(data, _Cut):
            data = data.head
        text = data.removeprefix(_BOM).decode("utf-8", "replace")
        if text.strip():
            return text
    return None


def read_foreign(path: Path, name: str, reader: Callable[[str], Any], chunk_rows: int = FOREIGN_CHUNK_ROWS,
                 max_record_bytes: int = MAX_RECORD_BYTES) -> Iterator[RawBatch]:
    """Lines of another log format (OTel, LiteLLM, a mapping) as contract records, each with its input.

    A line the format can't read is a record rejected with the reader's reason, quoted as it was.
    Chunks are cut by records, not lines: one OTLP line may hold hundreds of spans. A record's input is
    not kept, only where it is (`foreign_inputs` reads it again for the few that are quarantined).
    """
    try:
        size = path.stat().st_size
    except OSError:
        size = 0  # read_jsonl says why it can't be read
    workers = parallel.workers_for(size, reader)
    slices = ((b.line_numbers, b.raws, b.reasons or [None] * len(b.raws))
              for b in read_jsonl(path, name, chunk_rows=chunk_rows, max_record_bytes=max_record_bytes))
    reads = (parallel.read_in_workers(reader, slices, workers) if workers
             else (parallel.read_lines(reader, *piece) for piece in slices))
    numbers: list[int] = []
    raws: list[str] = []
    reasons: list[str | None] = []
    origins: list[int | None] = []
    skipped = 0
    for got_numbers, got_raws, got_reasons, got_origins, got_skipped in reads:
        numbers += got_numbers
        raws += got_raws
        reasons += got_reasons
        origins += got_origins
        skipped += got_skipped
        if len(raws) >= chunk_rows:
            yield RawBatch(name, numbers, raws, reasons, origins, skipped)
            numbers, raws, reasons, origins, skipped = [], [], [], [], 0
    yield RawBatch(name, numbers, raws, reasons, origins, skipped)


def foreign_inputs(path: Path, name: str, reader: Callable[[str], Any], wanted: dict[int, list[int]]
                   ) -> dict[tuple[int, int], str]:
    """The inputs of some records of another log format, read again: {(line, origin index): text}.

    `wanted`: line number -> the origin indices read_foreign gave its records there (-1: the line).
    """
    found: dict[tuple[int, int], str] = {}
    for batch in read_jsonl(path, name):
        for number, text in zip(batch.line_numbers, batch.raws, strict=True):
            if number not in wanted:
                continue
            origins = reader(text).origins if any(i >= 0 for i in wanted[number]) else ()
            for index in wanted[number]:
                found[(number, index)] = text if index < 0 else origins[index]
    return found


def _csv_integer(cell: str) -> object:
    """An integer cell; `4.0` stays a number, as in JSON, for the checks to accept as integral.

    pandas writes an integer column holding a missing value as floats (`4.0`), so a CSV of a real
    log often spells integers that way. Anything else that is not an integer stays text, to be
    quarantined with its own spelling.
    """
    try:
        return int(cell)
    except ValueError:
        number = float(cell)  # ValueError: the caller keeps the text (a date-time, for `ts`)
        return number if math.isfinite(number) else cell


def _csv_cell(name: str, cell: str) -> object:
    if cell == "":
        return None
    try:
        if name in _CSV_INTEGER or name == "ts":
            return _csv_integer(cell)  # a ts that is a number is epoch milliseconds; RFC 3339 text stays text
        if name in _CSV_NUMBER:
            return float(cell)
        if name in _CSV_BOOLEAN:
            lowered = cell.strip().lower()
            if lowered in ("true", "1", "t", "yes"):
                return True
            if lowered in ("false", "0", "f", "no"):
                return False
            return cell
        if name in _CSV_JSON:
            return loads(cell)  # past the depth allowed: kept as text, which validation judges
    except ValueError:
        return cell
    return cell


# Where the csv module (the excel dialect, not strict) stands after some text: at a cell's start, in an unquoted
# cell (or after a quoted one closed), in a quoted cell, or just after a quote inside one (which the next character
# makes an escaped quote, or the cell's end). A line end outside a quoted cell ends the record.
_START, _CELL, _QUOTED, _QUOTE = range(4)
_CELL_ENDS = re.compile(r"[,\r\n]")
_LINE_ENDS = ("\n", "\r")
_SKIP_PART = 1 << 20  # what is read at a time of a record being skipped


def _csv_state_after(text: str, state: int) -> int:
    """The csv module's state after reading `text` from `state` (above); only its changes are stepped through."""
    i, n = 0, len(text)
    while i < n:
        if state == _QUOTED:
            j = text.find('"', i)
            if j < 0:
                return _QUOTED
            i, state = j + 1, _QUOTE
            continue
        if state == _CELL:
            found = _CELL_ENDS.search(text, i)
            if found is None:
                return _CELL
            i = found.start()
        c = text[i]
        if c == "," or c in _LINE_ENDS:
            state = _START
        elif c == '"' and state in (_START, _QUOTE):
            state = _QUOTED
        else:
            state = _CELL
        i += 1
    return state


class _LineTooLong(Exception):
    """A physical line of a CSV longer than a record may be: its record has been read past, not kept."""


class _CsvLines:
    """A CSV file's physical lines for the csv module, keeping those of the record being read.

    A cell past the size limit stops the csv module in the middle of its record, and it starts again at the
    next physical line: inside the record when the cell was quoted and held line breaks, so that the rest of
    the cell came out as rows, and a line of it that starts with a quote opened a cell that swallowed the
    records after it. `skip_record` reads on to where that record truly ends. A physical line longer than a
    record may be is not handed over at all (the csv module would hold it whole): its record is read past in
    bounded parts and _LineTooLong raised. What is kept is bounded: past it, where the record ends is no longer
    known and reading starts again at the next line."""

    KEEP = 64 << 20

    def __init__(self, fh: io.TextIOBase, max_line: int, keep: int = KEEP) -> None:
        self._fh, self._max_line, self._keep = fh, max_line, keep
        self._record: list[str] | None = []
        self._kept = 0

    def __iter__(self) -> _CsvLines:
        return self

    def __next__(self) -> str:
        line = self._fh.readline(self._max_line + 1)
        if not line:
            raise StopIteration
        if len(line) > self._max_line and not line.endswith(_LINE_ENDS):
            state = self._record_state()
            self.record_read()
            self._read_past(line, _START if state is None else state)
            raise _LineTooLong
        if self._record is not None:
            self._kept += len(line)
            if self._kept <= self._keep:
                self._record.append(line)
            else:
                self._record = None  # where this record ends is no longer known
        return line

    def _record_state(self) -> int | None:
        """The state at the end of the record's lines read so far; None when they were not kept."""
        if self._record is None:
            return None
        state = _START
        for line in self._record:
            state = _csv_state_after(line, state)
        return state

    def _read_past(self, text: str, state: int) -> None:
        """Read on from `text` (from `state`) to the end of its record, a bounded part at a time."""
        while True:
            state = _csv_state_after(text, state)
            if text.endswith(_LINE_ENDS) and state != _QUOTED:
                return
            text = self._fh.readline(_SKIP_PART)
            if not text:
                return

    def record_read(self) -> None:
        """The csv module has read a whole record: the next line starts one."""
        if self._record is None:
            self._record = []
        self._record.clear()
        self._kept = 0

    def skip_record(self) -> None:
        """Read on to the end of the record the csv module gave up on (see the class)."""
        state = self._record_state()
        self.record_read()
        if state == _QUOTED:
            self._read_past("", _QUOTED)


def _csv_rows(reader: Any, lines: _CsvLines) -> Iterator[list[str] | str]:
    """The reader's rows; for a row past the size limit, what is too long in it (read past to its record's end)."""
    while True:
        try:
            row = next(reader)
        except StopIteration:
            return
        except _LineTooLong:
            yield "line"
            continue
        except csv.Error as exc:
            if "field larger than field limit" not in str(exc):
                raise
            lines.skip_record()
            yield "cell"
            continue
        lines.record_read()
        yield row


def read_csv(path: Path, name: str, chunk_rows: int = CHUNK_ROWS, max_record_bytes: int = MAX_RECORD_BYTES
             ) -> Iterator[RawBatch]:
    numbers: list[int] = []
    raws: list[str] = []
    reasons: list[str | None] = []
    reason: str | None = None
    # A cell may be as long as a record may (the csv module's own limit, 128 KiB, failed a whole file for one
    # long output); a longer one rejects its row alone.
    before = csv.field_size_limit(max_record_bytes)
    try:
        with _open_text(path) as fh:
            lines = _CsvLines(fh, max_record_bytes)
            reader = csv.reader(lines)
            try:
                header = next(reader, None)
            except _LineTooLong:
                raise LogReadError(f"{path}: cannot be read as CSV: its header line is longer than "
                                   f"{bytes_text(max_record_bytes)}") from None
            lines.record_read()
            if header is None:
                yield RawBatch(name, [], [])
                return
            header = [h.strip() for h in header]
            repeated = sorted({h for h in header if header.count(h) > 1})
            for row_number, row in enumerate(_csv_rows(reader, lines), start=1):
                if isinstance(row, str):  # "cell" or "line": what is longer than a record may be
                    numbers.append(row_number)
                    raws.append(f"[not kept by specdec: a {row} of CSV row {row_number} is longer than "
                                f"{bytes_text(max_record_bytes)}; the row is in the file]")
                    reasons.append(f"record too large: a {row} longer than the limit ({bytes_text(max_record_bytes)})")
                    continue
                if not any(cell.strip() for cell in row):
                    continue
                if repeated:
                    # Which of the two columns holds the value? Each row says so, rather than guessing.
                    obj: object = {"__csv_error__": f"the header names {', '.join(repeated)} more than once",
                                   "__raw__": row}
                elif len(row) != len(header):
                    # Rejected by the SQL pass with this reason; the row is kept as it was read.
                    obj = {"__csv_error__": f"row has {len(row)} cells, header has {len(header)}", "__raw__": row}
                elif any(_has_surrogates(cell) for cell in row):
                    obj = {h: shown_bytes(cell.encode("utf-8", "surrogateescape")) for h, cell in zip(header, row,
                                                                                                    strict=True)}
                    reason = INVALID_UTF8
                else:
                    obj = {h: _csv_cell(h, cell) for h, cell in zip(header, row, strict=True)}
                numbers.append(row_number)
                raws.append(_safe_text(json.dumps(obj, ensure_ascii=False)))
                reasons.append(reason)
                reason = None
                if len(raws) >= chunk_rows:
                    yield RawBatch(name, numbers, raws, reasons)
                    numbers, raws, reasons = [], [], []
    except (OSError, EOFError, gzip.BadGzipFile, csv.Error, UnicodeError) as exc:
        raise LogReadError(f"{path}: cannot be read as CSV: {exc}") from exc
    finally:
        csv.field_size_limit(before)
    yield RawBatch(name, numbers, raws, reasons)


def read_parquet(path: Path, name: str, chunk_rows: int = CHUNK_ROWS, max_record_bytes: int = MAX_RECORD_BYTES
                 ) -> Iterator[RawBatch]:
    con = duckdb.connect()
    # A row past the size limit is cut here, in the reader's own connection, as a JSON line is: its first
    # characters, its size and its MD5 come out, not the whole text (a Parquet of a few MB can hold a cell of
    # hundreds, which took the ingest down with it).
    sql = (f"SELECT CASE WHEN n > {int(max_record_bytes)} THEN left(j, {KEPT_OF_A_LONG_LINE}) ELSE j END, "
           f"CASE WHEN n > {int(max_record_bytes)} THEN n END, CASE WHEN n > {int(max_record_bytes)} THEN md5(j) END "
           "FROM (SELECT j, strlen(j) AS n FROM (SELECT to_json(t)::VARCHAR AS j FROM read_parquet(?) AS t))")
    try:
        with duckdb_literal_path(path) as literal:
            cur = con.execute(sql, [literal])
            row_number = 0
            while True:
                rows = cur.fetchmany(chunk_rows)
                if not rows:
                    break
                raws = [text if size is None else _Cut(text.encode()[:KEPT_OF_A_LONG_LINE], size, digest).shown()
                        for text, size, digest in rows]
                reasons = [None if size is None else too_large(size, max_record_bytes) for _, size, _ in rows]
                yield RawBatch(name, list(range(row_number + 1, row_number + len(rows) + 1)), raws, reasons)
                row_number += len(rows)
    except duckdb.Error as exc:
        raise LogReadError(f"{path}: cannot be read as Parquet: {str(exc).splitlines()[0]}") from exc
    finally:
        con.close()


def read_file(path: Path, resolved_name: str | None = None, max_record_bytes: int = MAX_RECORD_BYTES
              ) -> Iterator[RawBatch]:
    """The file's records in chunks, each named `resolved_name` (default: the path as given); a JSON line
    longer than `max_record_bytes` comes cut, with its reason."""
    name = resolved_name or str(path)
    lowered = path.name.lower()
    if lowered.endswith(CSV_SUFFIXES):
        return read_csv(path, name, max_record_bytes=max_record_bytes)
    if lowered.endswith(PARQUET_SUFFIXES):
        return read_parquet(path, name, max_record_bytes=max_record_bytes)
    return read_jsonl(path, name, max_record_bytes=max_record_bytes)
