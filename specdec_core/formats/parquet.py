"""Parquet logs: each row becomes one JSON record, numbered from 1."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb

from specdec_core.formats.files import (
    CHUNK_ROWS,
    KEPT_OF_A_LONG_LINE,
    MAX_RECORD_BYTES,
    CutLine,
    LogReadError,
    RawBatch,
    duckdb_literal_path,
    too_large,
)
from specdec_core.store.sql import identifier


def _columns(con: duckdb.DuckDBPyConnection, literal: str) -> str:
    """The file's columns, a 32-bit float as the decimal it was written as: to_json writes a FLOAT's binary value
    in full, so a temperature of 0.7 stored as float32 (numpy's, Arrow's float) read 0.699999988079071, in the
    store, the report and the replay, where the same request logged as JSON reads 0.7."""
    floats = [name for name, kind, *_ in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [literal]).fetchall()
              if kind == "FLOAT"]
    return "*" + (" REPLACE (" + ", ".join(f"{identifier(c)}::VARCHAR::DOUBLE AS {identifier(c)}" for c in floats) + ")"
                  if floats else "")


def read_parquet(path: Path, name: str, chunk_rows: int = CHUNK_ROWS, max_record_bytes: int = MAX_RECORD_BYTES
                 ) -> Iterator[RawBatch]:
    con = duckdb.connect()
    # A row past the size limit is cut here, in the reader's own connection, as a JSON line is: its first
    # characters, its size and its MD5 come out, not the whole text (a Parquet of a few MB can hold a cell of
    # hundreds, which took the ingest down with it).
    sql = (f"SELECT CASE WHEN n > {int(max_record_bytes)} THEN left(j, {KEPT_OF_A_LONG_LINE}) ELSE j END, "
           f"CASE WHEN n > {int(max_record_bytes)} THEN n END, CASE WHEN n > {int(max_record_bytes)} THEN md5(j) END "
           "FROM (SELECT j, strlen(j) AS n FROM (SELECT to_json(t)::VARCHAR AS j FROM (SELECT {columns} "
           "FROM read_parquet(?)) AS t))")
    try:
        with duckdb_literal_path(path) as literal:
            cur = con.execute(sql.format(columns=_columns(con, literal)), [literal])
            row_number = 0
            while True:
                rows = cur.fetchmany(chunk_rows)
                if not rows:
                    break
                raws = [text if size is None else CutLine(text.encode()[:KEPT_OF_A_LONG_LINE], size, digest).shown()
                        for text, size, digest in rows]
                reasons = [None if size is None else too_large(size, max_record_bytes) for _, size, _ in rows]
                yield RawBatch(name, list(range(row_number + 1, row_number + len(rows) + 1)), raws, reasons)
                row_number += len(rows)
    except duckdb.Error as exc:
        raise LogReadError(f"{path}: cannot be read as Parquet: {str(exc).splitlines()[0]}") from exc
    finally:
        con.close()
