"""CSV logs: typed cells, and a record past the size limit read past exactly as the csv module would."""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specdec_core.contract import fields as contract
from specdec_core.formats.common import loads, number_text
from specdec_core.formats.files import (
    CHUNK_ROWS,
    INVALID_UTF8,
    MAX_RECORD_BYTES,
    LogReadError,
    RawBatch,
    bytes_text,
    has_surrogates,
    open_text,
    safe_text,
    shown_bytes,
)


# How CSV cells (always text) become typed JSON values; a cell that does not parse is
# passed on as text so validation rejects it with the field's name.
@dataclass(frozen=True)
class _CellKinds:
    integer: frozenset[str]
    number: frozenset[str]
    boolean: frozenset[str]
    json: frozenset[str]


@contract.derived
def _cell_kinds(table: contract.Contract) -> _CellKinds:
    return _CellKinds(frozenset(f.name for f in table.fields if f.is_integer),
                      frozenset(f.name for f in table.fields if f.is_number),
                      frozenset(f.name for f in table.fields if f.kind == "bool"),
                      frozenset(f.name for f in table.fields if f.kind in ("str_list", "object")))


def _csv_integer(cell: str) -> object:
    """An integer cell; `4.0` stays a number, as in JSON, for the checks to accept as integral.

    pandas writes an integer column holding a missing value as floats (`4.0`), so a CSV of a real
    log often spells integers that way. Anything else that is not an integer stays text, to be
    quarantined with its own spelling.
    """
    if number_text(cell, integer=True):
        return int(cell)
    if not number_text(cell):
        return cell  # a date-time, for `ts`; other text is quarantined with its own spelling
    number = float(cell)
    return number if math.isfinite(number) else cell


def _csv_cell(name: str, cell: str, kinds: _CellKinds) -> object:
    if cell == "":
        return None
    try:
        if name in kinds.integer or name == "ts":
            return _csv_integer(cell)  # a ts that is a number is epoch milliseconds; RFC 3339 text stays text
        if name in kinds.number:
            return float(cell) if number_text(cell) else cell
        if name in kinds.boolean:
            lowered = cell.strip().lower()
            if lowered in ("true", "1", "t", "yes"):
                return True
            if lowered in ("false", "0", "f", "no"):
                return False
            return cell
        if name in kinds.json:
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


# What spreadsheets separate cells with where a comma is the decimal mark (Excel in most of Europe: ';'), and
# "Unicode Text" or a TSV (a tab): read as commas, such a file's header is one column, and every row was
# quarantined as missing its request_id.
_OTHER_SEPARATORS = (";", "\t", "|")


def _refuse_other_separators(path: Path, header: list[str]) -> None:
    """LogReadError, in one line, for a header that is one column naming the contract's fields between another
    separator than a comma."""
    if len(header) != 1:
        return
    for separator in _OTHER_SEPARATORS:
        names = {h.strip().strip('"') for h in header[0].split(separator)}
        if "request_id" in names and len(names) > 1:
            raise LogReadError(f"{path}: cannot be read as CSV: its header is one column, its field names "
                               f"separated by {separator!r}; specdec reads comma-separated CSV: save it with commas")


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
        with open_text(path) as fh:
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
            _refuse_other_separators(path, header)
            kinds = _cell_kinds()
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
                elif any(has_surrogates(cell) for cell in row):
                    obj = {h: shown_bytes(cell.encode("utf-8", "surrogateescape")) for h, cell in zip(header, row,
                                                                                                    strict=True)}
                    reason = INVALID_UTF8
                else:
                    obj = {h: _csv_cell(h, cell, kinds) for h, cell in zip(header, row, strict=True)}
                numbers.append(row_number)
                raws.append(safe_text(json.dumps(obj, ensure_ascii=False)))
                reasons.append(reason)
                reason = None
                if len(raws) >= chunk_rows:
                    yield RawBatch(name, numbers, raws, reasons)
                    numbers, raws, reasons = [], [], []
    except LogReadError:
        raise  # said already, naming the file once
    except (OSError, EOFError, gzip.BadGzipFile, csv.Error, UnicodeError) as exc:
        raise LogReadError(f"{path}: cannot be read as CSV: {exc}") from exc
    finally:
        csv.field_size_limit(before)
    yield RawBatch(name, numbers, raws, reasons)
