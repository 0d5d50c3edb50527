"""Stage a log file's lines, as they were, into a temp table for the one SQL pass that checks them.

Contract JSON Lines go through DuckDB's own line reader (in parallel, in file order); anything it
can't take, CSV, Parquet and the other log formats go through the Python readers. Records that the
JSON checks must not see (too large, too wide, already rejected while reading) are set aside first.
"""

from __future__ import annotations

import ctypes
import functools
import gzip
import os
import zlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa

from specdec_core.formats.containers import read_file
from specdec_core.formats.files import JSONL_SUFFIXES, MAX_RECORD_BYTES, duckdb_literal_path, too_large
from specdec_core.formats.jsonl import FOREIGN_CHUNK_ROWS, read_foreign
from specdec_core.store.connection import WRITER_MEMORY_LIMIT
from specdec_core.store.sql import literal


@dataclass(frozen=True)
class IngestLimits:
    """What one record may cost; a record past either limit is quarantined with why, and the rest loads.

    Without them one record can take the whole ingest down: checking a 40 MB line runs DuckDB out
    of memory, as does one with thousands of fields. 16 MiB and 1,000 fields sit far above any
    real request log line and far below what the checks need 1 GB for.
    """

    max_record_bytes: int = MAX_RECORD_BYTES
    max_fields: int = 1000

    @classmethod
    def from_env(cls) -> IngestLimits:
        """The defaults, or $SPECDEC_MAX_RECORD_BYTES and $SPECDEC_MAX_FIELDS where set."""
        values = {}
        for field, var in (("max_record_bytes", "SPECDEC_MAX_RECORD_BYTES"), ("max_fields", "SPECDEC_MAX_FIELDS")):
            text = os.environ.get(var)
            if text:
                try:
                    values[field] = int(text)
                except ValueError:
                    raise ValueError(f"${var}: expected a whole number, got {text!r}") from None
                if values[field] < 1:
                    raise ValueError(f"${var}: expected a number >= 1, got {text!r}")
        return cls(**values)


# DuckDB reads JSON Lines as raw lines, in parallel and in file order (insertion order is kept, so a
# row's rowid is its line number - 1); the separator is a control character, so a line holding one
# fails the strict read and the file is read by the Python reader instead, which takes anything.
# So does a line past the size limit: the Python reader hands it over for quarantine. The buffer is twice
# the longest line, not DuckDB's default of sixteen times: 256 MB buffers read a 1M-line file at half speed.
def _raw_lines_sql(table: str, path: str, max_line_size: int) -> str:
    """Read the file `path` into `table`, a line a row."""
    return (f"CREATE OR REPLACE TEMP TABLE {table} AS SELECT raw FROM read_csv({literal(path)}, columns = {{'raw': 'VARCHAR'}}, "
            "delim = chr(1), quote = '', escape = '', header = false, auto_detect = false, strict_mode = true, "
            f"max_line_size = {int(max_line_size)}, buffer_size = {2 * int(max_line_size)})")


@dataclass(frozen=True)
class Lines:
    """One file's lines in a temp table, listed by `sql` as (seq, source_line, raw, pre_reason)."""

    table: str
    first_seq: int
    count: int  # rows in the table, blank lines included: the seq values this file uses
    sql: str
    # For another log format, where each record's input is (readers.read_foreign's origin index): a
    # rejected record is quoted as that input, read again from the file; NULL: quoted as its raw line.
    origin_sql: str = "NULL::INTEGER"
    skipped: int = 0  # entries of another log format that are not model requests
    row_base: int = 0  # the table's first rowid: its row i has rowid row_base + i

    @property
    def row_index(self) -> str:
        """SQL for a row's place in the table, from 0."""
        return f"(rowid - {self.row_base})"


def _staged(con: duckdb.DuckDBPyConnection, table: str, first_seq: int,
            source_line: Callable[[str], str] | None = None,
            pre_reason: str = "pre_reason", **rest: Any) -> Lines:
    """The Lines of a filled temp table; `source_line` None: the table's own column, else the SQL of a row's line
    from the SQL of its place in the table (from 0)."""
    # A table made inside an open transaction (a DuckLake write is one) numbers its rows from a large base
    # until it commits, not from 0.
    count, base = con.execute(f"SELECT count(*), coalesce(min(rowid), 0) FROM {table}").fetchall()[0]
    lines = Lines(table, first_seq, count, "", row_base=base, **rest)
    line_sql = "source_line" if source_line is None else source_line(lines.row_index)
    return replace(lines, sql=f"SELECT {first_seq} + {lines.row_index} AS seq, {line_sql} AS source_line, raw, "
                              f"{pre_reason} AS pre_reason FROM {table}")


def _lines_end_in_newlines(path: Path) -> bool:
    """Whether DuckDB's line reader would split this file where we do, at LF only.

    DuckDB takes a lone CR for the line end when the file shows no LF early on; where it has
    both, the strict read fails and the Python reader takes over, as it should.
    """
    try:
        with (gzip.open(path, "rb") if path.name.lower().endswith(".gz") else open(path, "rb")) as fh:
            sample = fh.read(1 << 20)
    except (OSError, EOFError, zlib.error):
        return True  # DuckDB's read fails as well, and the Python reader says what is wrong
    return b"\n" in sample or b"\r" not in sample


def stage_file(con: duckdb.DuckDBPyConnection, path: Path, table: str, first_seq: int,
               limits: IngestLimits, reader: Callable[[str], Any] | None = None, line_offset: int = 0) -> Lines:
    """Load a file's lines or records, as they were, into the temp table `table`.

    `reader`: the line reader of another log format (formats.line_reader); None: the contract's own.
    `line_offset`: lines of the log before this file's first (a followed log read in parts).
    """
    con.execute("SET preserve_insertion_order = true")  # a row's rowid is its place in the file
    lines = _stage(con, path, table, first_seq, limits, reader)
    if not line_offset:
        return lines
    return replace(lines, sql=f"SELECT seq, source_line + {int(line_offset)} AS source_line, raw, pre_reason "
                              f"FROM ({lines.sql})")


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(None).malloc_trim  # glibc's; elsewhere (musl, macOS) freed memory is left as it is
    except (OSError, AttributeError):
        return None


def give_back_freed() -> None:
    """Hand the C heap's freed pages back to the system.

    A Python reader's chunks are strings of a few hundred bytes, made and dropped by the million, many of
    them in the threads that receive the workers' slices (each thread has its own heap): glibc keeps what
    they freed, scattered among live objects, and the process kept 600 MB it no longer used through the
    checks that follow (a 1M-span OTel ingest peaked at 2.2 GB, 1.5 GB with this after each chunk).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _python_reads(con: duckdb.DuckDBPyConnection) -> None:
    """A Python reader is about to stage lines: its memory counts against the ingest's 2 GB too, and stays
    with the process once freed, so DuckDB keeps to the lower limit from here on."""
    con.execute(f"SET memory_limit = '{WRITER_MEMORY_LIMIT}'")


def _stage(con: duckdb.DuckDBPyConnection, path: Path, table: str, first_seq: int,
           limits: IngestLimits, reader: Callable[[str], Any] | None) -> Lines:
    name = str(path.resolve())
    if reader is not None:
        _python_reads(con)
        return _stage_foreign(con, path, name, table, first_seq, reader, limits.max_record_bytes)
    if path.name.lower().endswith(JSONL_SUFFIXES) and _lines_end_in_newlines(path):
        try:
            with duckdb_literal_path(path) as readable:
                con.execute(_raw_lines_sql(table, readable, limits.max_record_bytes))
        except duckdb.InterruptException:
            raise
        except duckdb.Error:
            pass  # not clean UTF-8 text, a control character in a line, a huge line: the Python reader copes
        else:
            if _read_short(con, path, table):
                con.execute(f"DROP TABLE {table}")  # the Python reader says where the stream ends
                return _stage_in_python(con, path, name, table, first_seq, limits.max_record_bytes)
            return _staged(con, table, first_seq, lambda index: f"{index} + 1", "NULL::VARCHAR")
    return _stage_in_python(con, path, name, table, first_seq, limits.max_record_bytes)


def _read_short(con: duckdb.DuckDBPyConnection, path: Path, table: str) -> bool:
    """Whether the lines DuckDB read are not the file's whole text. DuckDB reads a gzip stream cut off mid-way
    without an error, and a file whose only line is past the line size limit as no lines at all. The text's
    size (a plain file's, or the gzip trailer's, mod 2^32) that does not match what was read (that, or a file
    DuckDB split otherwise: CRLF lines, several gzip members) sends the file to the Python reader, which reads
    it exactly."""
    try:
        if path.name.lower().endswith(".gz"):
            with open(path, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                stated, modulo = int.from_bytes(fh.read(4), "little"), 2**32
        else:
            stated, modulo = path.stat().st_size, None
    except OSError:
        return True
    read, lines = con.execute(f"SELECT coalesce(sum(coalesce(strlen(raw), 0) + 1), 0)::BIGINT, count(*) "
                              f"FROM {table}").fetchall()[0]
    if modulo is not None:
        return stated not in (read % modulo, (read - 1) % modulo)  # the last line may lack its newline
    # DuckDB drops each line's CR of a CRLF file: one byte more a line, two fewer when the last has no end.
    return stated not in (read, read - 1, read + lines, read + lines - 2)


def _stage_in_python(con: duckdb.DuckDBPyConnection, path: Path, name: str, table: str, first_seq: int,
                     max_record_bytes: int) -> Lines:
    _python_reads(con)
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (source_line BIGINT, raw VARCHAR, pre_reason VARCHAR)")
    for chunk in read_file(path, resolved_name=name, max_record_bytes=max_record_bytes):
        reasons = chunk.reasons if chunk.reasons is not None else [None] * len(chunk.raws)
        con.register("chunk_arrow", pa.table({"source_line": pa.array(chunk.line_numbers, pa.int64()),
                                              "raw": pa.array(chunk.raws, pa.string()),
                                              "pre_reason": pa.array(reasons, pa.string())}))
        con.execute(f"INSERT INTO {table} SELECT * FROM chunk_arrow")
        con.unregister("chunk_arrow")
        give_back_freed()
    return _staged(con, table, first_seq)


# What one batch of another format's records may hold in their constants (a --map value = {...}).
FOREIGN_CHUNK_BYTES = 64 << 20


def foreign_chunk_rows(reader: Callable[[str], Any]) -> int:
    """Records per batch: fewer when a mapping copies a large constant into every record. A 20 MB constant in
    20,000 records a batch would be 400 GB; here a batch of them holds about FOREIGN_CHUNK_BYTES."""
    per_record = getattr(getattr(reader, "__self__", None), "constant_bytes", 0)
    if not per_record:
        return FOREIGN_CHUNK_ROWS
    return max(1, min(FOREIGN_CHUNK_ROWS, FOREIGN_CHUNK_BYTES // per_record))


def _stage_foreign(con: duckdb.DuckDBPyConnection, path: Path, name: str, table: str, first_seq: int,
                   reader: Callable[[str], Any], max_record_bytes: int) -> Lines:
    con.execute(f"CREATE OR REPLACE TEMP TABLE {table} (source_line BIGINT, raw VARCHAR, pre_reason VARCHAR, "
                "origin INTEGER)")
    skipped = 0
    for chunk in read_foreign(path, name, reader, chunk_rows=foreign_chunk_rows(reader),
                              max_record_bytes=max_record_bytes):
        skipped += chunk.skipped
        con.register("chunk_arrow", pa.table({"source_line": pa.array(chunk.line_numbers, pa.int64()),
                                              "raw": pa.array(chunk.raws, pa.string()),
                                              "pre_reason": pa.array(chunk.reasons, pa.string()),
                                              "origin": pa.array(chunk.origins, pa.int32())}))
        con.execute(f"INSERT INTO {table} SELECT * FROM chunk_arrow")
        con.unregister("chunk_arrow")
        give_back_freed()
    return _staged(con, table, first_seq, origin_sql="origin", skipped=skipped)


def set_aside(con: duckdb.DuckDBPyConnection, lines: Lines, source_file: str, limits: IngestLimits, checked: str
              ) -> tuple[Lines, int]:
    """Reject, into `checked`, the records the JSON checks must not see: too large, too wide, or already judged.

    Returns the file's lines without those, and how many there were. Only lines long enough to
    hold more fields than allowed (each takes at least 5 bytes, `"":0,`) are parsed here.
    """
    wide_from = 5 * limits.max_fields
    rows = con.execute(f"""
        SELECT seq, source_line, pre_reason, size, n_fields FROM (
            SELECT seq, source_line, pre_reason, strlen(raw) AS size,
                   CASE WHEN pre_reason IS NOT NULL OR strlen(raw) > {limits.max_record_bytes} THEN NULL
                        WHEN strlen(raw) > {wide_from} AND json_valid(raw) AND json_type(raw) = 'OBJECT'
                        THEN len(json_keys(raw)) END AS n_fields
            FROM ({lines.sql}) WHERE raw IS NOT NULL
        ) WHERE pre_reason IS NOT NULL OR size > {limits.max_record_bytes} OR n_fields > {limits.max_fields}
    """).fetchall()
    if not rows:
        return lines, 0
    reasons = [pre or (too_large(size, limits.max_record_bytes) if size > limits.max_record_bytes
                       else f"too many fields: {n_fields} (limit {limits.max_fields})")
               for _, _, pre, size, n_fields in rows]
    aside = f"{lines.table}_aside"
    con.register("aside_arrow", pa.table({"seq": pa.array([r[0] for r in rows], pa.int64()),
                                          "source_line": pa.array([r[1] for r in rows], pa.int64()),
                                          "reason": pa.array(reasons, pa.string())}))
    con.execute(f"CREATE OR REPLACE TEMP TABLE {aside} AS SELECT * FROM aside_arrow")
    con.unregister("aside_arrow")
    con.execute(f"INSERT INTO {checked} (seq, source_file, source_line, reason) "
                f"SELECT seq, {literal(source_file)}, source_line, reason FROM {aside}")
    rest = replace(lines, sql=f"SELECT * FROM ({lines.sql}) WHERE seq NOT IN (SELECT seq FROM {aside})")
    return rest, len(rows)


NO_LINES = Lines("", 0, 0, "SELECT NULL::BIGINT AS seq, NULL::BIGINT AS source_line, NULL::VARCHAR AS raw, "
                             "NULL::VARCHAR AS pre_reason LIMIT 0")


