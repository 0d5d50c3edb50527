"""JSON Lines (gzipped or not) and the other log formats' lines, cut into records with their line numbers."""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from specdec_core.formats import parallel
from specdec_core.formats.files import (
    CHUNK_ROWS,
    INVALID_UTF8,
    KEPT_OF_A_LONG_LINE,
    MAX_RECORD_BYTES,
    READ_BYTES,
    UTF8_BOM,
    CutLine,
    LogReadError,
    RawBatch,
    is_json_document,
    open_binary,
    shown_bytes,
    too_large,
)


def _lines(path: Path, max_bytes: int = MAX_RECORD_BYTES) -> Iterator[tuple[bytes | CutLine, bool]]:
    """The file's lines, ending at LF only (a CR inside a line is part of it), each with whether it is complete.

    A line longer than `max_bytes` is not held: it comes as a CutLine. A gzip stream that stops early (or turns
    to garbage) yields what it held before the cut as one incomplete last line, rather than losing the file:
    read in chunks, since a line read would drop its partial buffer. Linear in the line's length, however long.
    """
    parts: list[bytes] = []
    held = 0
    digest = None  # the MD5 of a line past max_bytes, from its first byte

    def line() -> bytes | CutLine:
        if digest is None:
            return b"".join(parts)
        return CutLine(b"".join(parts), held, digest.hexdigest())

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

    document = is_json_document(path)
    with open_binary(path) as fh:
        try:
            while True:
                chunk = fh.read1(READ_BYTES)
                if not chunk:
                    break
                if document:  # a JSON document is one record: a line end outside a string is whitespace
                    chunk = chunk.replace(b"\n", b" ")
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
            if isinstance(data, CutLine):
                text, reason = data.shown(), too_large(data.size, max_record_bytes)
            else:
                if number == 1 and data.startswith(UTF8_BOM):
                    data = data[len(UTF8_BOM):]  # as Windows tools write it: not part of the first record
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
                raws.append(data.shown() if isinstance(data, CutLine) else shown_bytes(data))
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
    try:
        for data, _ in _lines(path):
            if isinstance(data, CutLine):
                data = data.head
            text = data.removeprefix(UTF8_BOM).decode("utf-8", "replace")
            if text.strip():
                return text
    except OSError as exc:  # a .gz that is not gzip: said as read_jsonl says it, naming the file
        raise LogReadError(f"{path}: cannot be read: {exc}") from exc
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
