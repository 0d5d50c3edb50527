"""Log files as containers: which files a path, folder or glob names, and how their bytes are opened.

The readers beside this module (jsonl.py, csv_file.py, parquet.py; containers.read_file picks one)
turn each file into raw records with their positions: one JSON text per record with the file and
line (or row) it came from, so validation is one SQL pass whatever the format, and a rejected record
can be quoted back exactly as it was.
"""

from __future__ import annotations

import fnmatch
import gzip
import io
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# The contract's JSON Lines suffixes (and .ndjson, the other common name); a .json file is not a log.
JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".ndjson", ".ndjson.gz")
CSV_SUFFIXES = (".csv", ".csv.gz")
PARQUET_SUFFIXES = (".parquet",)
SUPPORTED_SUFFIXES = JSONL_SUFFIXES + CSV_SUFFIXES + PARQUET_SUFFIXES
# One JSON document (an API's answer saved as it came: Phoenix's span export, Langfuse's observations), read as
# one record however it is laid out. Taken when named or matched by a pattern that names it, never from a
# folder: a folder's .json files are more often settings than logs.
JSON_DOCUMENT_SUFFIXES = (".json",)


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


def is_json_document(path: Path | str) -> bool:
    return str(path).lower().endswith(JSON_DOCUMENT_SUFFIXES)


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
            matched = sorted(m for m in expand_pattern(spec) if m.is_file()
                             and (_supported(m) or (is_json_document(m) and is_json_document(spec))))
            if not matched:
                raise LogReadError(f"{spec}: no supported log file matches this pattern")
            files.extend(matched)
        elif p.is_dir():
            found = sorted(f for f in _walk(p, with_files=True, hidden=True) if f.is_file() and _supported(f))
            if not found:
                raise LogReadError(f"{spec}: folder holds no .jsonl, .jsonl.gz, .csv or .parquet file")
            files.extend(found)
        elif p.is_file():
            if not (_supported(p) or is_json_document(p)):
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


def open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig: a byte order mark (as Windows tools write) is not part of the first record or header.
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", errors="surrogateescape", newline="")
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")


def safe_text(line: str) -> str:
    # Undecodable bytes survive as surrogates; store them as U+FFFD so the raw text is keepable.
    return line.encode("utf-8", "replace").decode("utf-8")


INVALID_UTF8 = "invalid UTF-8"


def shown_bytes(data: bytes) -> str:
    r"""Text with each byte that is not UTF-8 written as \xNN, so a quarantined line keeps every byte."""
    return data.decode("utf-8", "backslashreplace")


def has_surrogates(text: str) -> bool:
    return any("\udc80" <= ch <= "\udcff" for ch in text)


CHUNK_ROWS = 250_000  # bounds memory; two row groups, so DuckDB works on both cores
READ_BYTES = 1 << 20
UTF8_BOM = b"\xef\xbb\xbf"


def open_binary(path: Path) -> io.BufferedIOBase:
    if path.name.lower().endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


# The byte order marks of the Unicode encodings other than UTF-8, longest first (UTF-32 LE's begins as UTF-16 LE's).
# Windows writes UTF-16 where a log is saved by PowerShell 5's `>` or Excel's "Unicode Text": read as UTF-8, each
# of its lines was quarantined as bad JSON or invalid UTF-8, and the reason said nothing of why.
_WIDE_BOMS = ((b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe\x00\x00", "UTF-32"), (b"\xfe\xff", "UTF-16"),
              (b"\xff\xfe", "UTF-16"))


def refuse_wide_text(path: Path) -> None:
    """Raise LogReadError, in one line with the command that converts it, for a text log (gzipped or not) that
    opens with a UTF-16 or UTF-32 byte order mark: specdec reads UTF-8. A file it can't open is left to its reader."""
    try:
        with open_binary(path) as f:
            head = f.read(4)
    except (OSError, EOFError):
        return
    encoding = next((name for bom, name in _WIDE_BOMS if head.startswith(bom)), None)
    if encoding is not None:
        read = "zcat FILE | iconv" if path.name.lower().endswith(".gz") else "iconv"
        raise LogReadError(f"{path}: {encoding} text (its byte order mark says so); specdec reads UTF-8: convert "
                           f"it first, e.g. {read} -f {encoding} -t UTF-8 FILE > FILE.utf8")


# A record longer than this is quarantined (IngestLimits.max_record_bytes, ingestion/staging.py, by default).
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
class CutLine:
    """A line past the limit: its first bytes, its size and its MD5."""

    head: bytes
    size: int
    md5: str

    def shown(self) -> str:
        return (shown_bytes(self.head) + f" [cut by specdec: the first {len(self.head):,} of {self.size:,} bytes; "
                f"MD5 of the whole record {self.md5}]")
