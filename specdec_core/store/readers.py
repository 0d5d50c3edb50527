"""Turn log files (JSON Lines, gzipped or not, CSV, Parquet) into raw records with their positions.

Every record becomes one JSON text with the file and line (or row) it came from, so
validation is one SQL pass whatever the format, and a rejected record can be
quoted back exactly as it was.
"""

from __future__ import annotations

import csv
import glob
import gzip
import io
import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb

from specdec_core.contract import fields as contract

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


def _supported(path: Path) -> bool:
    return path.name.lower().endswith(SUPPORTED_SUFFIXES)


def resolve_paths(paths: list[str]) -> list[Path]:
    """Files named by paths, folders and globs, in a stable order; raise on anything unreadable."""
    files: list[Path] = []
    for spec in paths:
        p = Path(spec)
        if any(ch in spec for ch in "*?["):
            matches = sorted(Path(m) for m in glob.glob(spec, recursive=True))
            matched = [m for m in matches if m.is_file() and _supported(m)]
            if not matched:
                raise LogReadError(f"{spec}: no supported log file matches this pattern")
            files.extend(matched)
        elif p.is_dir():
            found = sorted(f for f in p.rglob("*") if f.is_file() and _supported(f))
            if not found:
                raise LogReadError(f"{spec}: folder holds no .jsonl, .jsonl.gz, .csv or .parquet file")
            files.extend(found)
        elif p.is_file():
            if not _supported(p):
                raise LogReadError(f"{spec}: unsupported file type (expected {', '.join(SUPPORTED_SUFFIXES)})")
            if not os.access(p, os.R_OK):
                raise LogReadError(f"{spec}: permission denied")
            files.append(p)
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


def _open_text(path: Path) -> io.TextIOBase:
    # utf-8-sig: a byte order mark (as Windows tools write) is not part of the first record or header.
    if path.name.lower().endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "rb"), encoding="utf-8-sig", errors="surrogateescape", newline="")
    return open(path, encoding="utf-8-sig", errors="surrogateescape", newline="")


def _safe_text(line: str) -> str:
    # Undecodable bytes survive as surrogates; store them as U+FFFD so the raw text is keepable.
    return line.encode("utf-8", "replace").decode("utf-8")


CHUNK_ROWS = 250_000  # bounds memory; two row groups, so DuckDB works on both cores


def read_jsonl(path: Path, name: str, chunk_rows: int = CHUNK_ROWS) -> Iterator[RawBatch]:
    numbers: list[int] = []
    raws: list[str] = []
    try:
        with _open_text(path) as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip():
                    numbers.append(number)
                    raws.append(_safe_text(line.rstrip("\r\n")))
                    if len(raws) >= chunk_rows:
                        yield RawBatch(name, numbers, raws)
                        numbers, raws = [], []
    except (OSError, EOFError, gzip.BadGzipFile, UnicodeError) as exc:
        raise LogReadError(f"{path}: cannot be read: {exc}") from exc
    yield RawBatch(name, numbers, raws)


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
            return json.loads(cell)
    except ValueError:
        return cell
    return cell


def read_csv(path: Path, name: str, chunk_rows: int = CHUNK_ROWS) -> Iterator[RawBatch]:
    numbers: list[int] = []
    raws: list[str] = []
    try:
        with _open_text(path) as fh:
            reader = csv.reader(fh)
            header = next(reader, None)
            if header is None:
                yield RawBatch(name, [], [])
                return
            header = [h.strip() for h in header]
            repeated = sorted({h for h in header if header.count(h) > 1})
            for row_number, row in enumerate(reader, start=1):
                if not any(cell.strip() for cell in row):
                    continue
                if repeated:
                    # Which of the two columns holds the value? Each row says so, rather than guessing.
                    obj: object = {"__csv_error__": f"the header names {', '.join(repeated)} more than once",
                                   "__raw__": row}
                elif len(row) != len(header):
                    # Rejected by the SQL pass with this reason; the row is kept as it was read.
                    obj = {"__csv_error__": f"row has {len(row)} cells, header has {len(header)}", "__raw__": row}
                else:
                    obj = {h: _csv_cell(h, _safe_text(cell)) for h, cell in zip(header, row, strict=True)}
                numbers.append(row_number)
                raws.append(json.dumps(obj, ensure_ascii=False))
                if len(raws) >= chunk_rows:
                    yield RawBatch(name, numbers, raws)
                    numbers, raws = [], []
    except (OSError, EOFError, gzip.BadGzipFile, csv.Error, UnicodeError) as exc:
        raise LogReadError(f"{path}: cannot be read as CSV: {exc}") from exc
    yield RawBatch(name, numbers, raws)


def read_parquet(path: Path, name: str, chunk_rows: int = CHUNK_ROWS) -> Iterator[RawBatch]:
    con = duckdb.connect()
    try:
        cur = con.execute("SELECT to_json(t)::VARCHAR FROM read_parquet(?) AS t", [str(path)])
        row_number = 0
        while True:
            rows = cur.fetchmany(chunk_rows)
            if not rows:
                break
            yield RawBatch(name, list(range(row_number + 1, row_number + len(rows) + 1)), [r[0] for r in rows])
            row_number += len(rows)
    except duckdb.Error as exc:
        raise LogReadError(f"{path}: cannot be read as Parquet: {str(exc).splitlines()[0]}") from exc
    finally:
        con.close()


def read_file(path: Path, resolved_name: str | None = None) -> Iterator[RawBatch]:
    """The file's records in chunks, each named `resolved_name` (default: the path as given)."""
    name = resolved_name or str(path)
    lowered = path.name.lower()
    if lowered.endswith(CSV_SUFFIXES):
        return read_csv(path, name)
    if lowered.endswith(PARQUET_SUFFIXES):
        return read_parquet(path, name)
    return read_jsonl(path, name)
