"""One entry for every container a log comes in: the reader chosen by the file's suffix."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from specdec_core.formats.csv_file import read_csv
from specdec_core.formats.files import CSV_SUFFIXES, MAX_RECORD_BYTES, PARQUET_SUFFIXES, RawBatch
from specdec_core.formats.jsonl import read_jsonl
from specdec_core.formats.parquet import read_parquet


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
