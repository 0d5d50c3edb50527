"""Stores written by DuckDB 2.0, which specdec used before it moved to 1.5.5 (the last release DuckLake ships for).

DuckDB reads no file written by a newer version, so such a store is read by a DuckDB 2.0.1 installed
aside (`make install` puts one in .venv/duckdb-2.0.1; `pip install --no-deps --target DIR duckdb==2.0.1`
anywhere else, named by $SPECDEC_DUCKDB_2), in a child process: it writes every table as Parquet, and
the writer loads them into a file of today's format, under the store's lock like any other write.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb

SIDE_ENV = "SPECDEC_DUCKDB_2"
SIDE_VERSION = "2.0.1"
# The storage version DuckDB 2.0 writes in a file's header; 1.5.5 reads 64 to 68.
_NEWER_STORAGE = 999

# The child runs this very file's export_tables under DuckDB 2.0.1, loaded by path: importing the package
# would pull in the rest of specdec.
_EXPORT = r"""
import importlib.util, json, sys
import duckdb
here, source, out = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("specdec_convert", here)
convert = importlib.util.module_from_spec(spec)
spec.loader.exec_module(convert)
con = duckdb.connect(":memory:")
con.execute("ATTACH '" + source.replace("'", "''") + "' AS old (READ_ONLY)")
con.execute("USE old")
print(json.dumps(convert.export_tables(con, out)))
"""


class ConversionError(RuntimeError):
    """A DuckDB 2.0 store could not be converted; the message is one line and says what to do."""


def storage_number(path: Path) -> int | None:
    """The storage version in the header of the DuckDB file at `path` (64: DuckDB's 1.0 format, 68: 1.5's, 999 and
    up: 2.0's); None where it is no DuckDB file or can't be read."""
    try:
        with open(path, "rb") as f:
            header = f.read(20)
    except OSError:
        return None
    if len(header) < 20 or header[8:12] != b"DUCK":
        return None
    return struct.unpack("<Q", header[12:20])[0]


def no_database_said(path: Path) -> str | None:
    """What to say of a file given as a store that holds no DuckDB database at all (a log passed as --db, most
    often); None where it is one, is empty (a new store) or can't be read."""
    try:
        empty = os.path.getsize(path) == 0
    except OSError:
        return None
    if empty or storage_number(path) is not None:
        return None
    return (f"{path}: not a specdec store (no DuckDB database); a log is loaded into one with "
            f"`specdec ingest {path} --db STORE.duckdb`")


def written_by_newer_duckdb(path: Path) -> bool:
    """Whether the DuckDB file at `path` has the storage version DuckDB 2.0 writes."""
    number = storage_number(path)
    return number is not None and number >= _NEWER_STORAGE


def side_install() -> Path:
    """The folder holding DuckDB 2.0.1 for conversions."""
    chosen = os.environ.get(SIDE_ENV)
    return Path(chosen) if chosen else Path(sys.prefix) / f"duckdb-{SIDE_VERSION}"


def _how_to_install(folder: Path) -> str:
    return (f"install DuckDB {SIDE_VERSION} aside with `pip install --no-deps --target {folder} "
            f"duckdb=={SIDE_VERSION}` (or name its folder in ${SIDE_ENV}) and run `specdec migrate` again")


def convert_into(source: Path, con: duckdb.DuckDBPyConnection, shown: str) -> list[str]:
    """Load every table of the DuckDB 2.0 store `source` into `con` (a new file with today's schema).

    Tables the schema has take the rows by column name; others are created as they were. The derived
    tables are marked stale (their summary version removed), so the write that converts rebuilds them.
    Returns the tables converted.
    """
    folder = side_install()
    if not (folder / "duckdb").is_dir():
        raise ConversionError(f"{shown}: written by DuckDB {SIDE_VERSION} (specdec before its DuckLake store); "
                              + _how_to_install(folder))
    with tempfile.TemporaryDirectory(prefix="specdec-convert-") as out:
        os.chmod(out, 0o700)  # the rows of a private store stay private while they are Parquet
        env = {**os.environ, "PYTHONPATH": str(folder)}
        done = subprocess.run([sys.executable, "-c", _EXPORT, __file__, str(source), out], env=env,
                              capture_output=True, text=True, check=False)
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no message"])[-1]
            raise ConversionError(f"{shown}: DuckDB {SIDE_VERSION} could not read it: {last}")
        tables = json.loads(done.stdout.strip().splitlines()[-1])
        load_tables(con, out, tables)
    return tables


def load_tables(con: duckdb.DuckDBPyConnection, folder: str, tables: list[str], derived_current: bool = False
                ) -> None:
    """Load `folder`/i.parquet into table i of `tables`: by column name where the schema has the table, as it
    was otherwise; then, unless they are this version's (`derived_current`), mark the derived tables stale, so
    the write rebuilds them for this store."""
    existing = {r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()").fetchall()}
    for i, table in enumerate(tables):
        parquet = f"{folder}/{i}.parquet"
        if table in existing:
            con.execute(f'DELETE FROM "{table}"')
            con.execute(f"INSERT INTO \"{table}\" BY NAME SELECT * FROM read_parquet('{parquet}')")
        else:
            con.execute(f"CREATE TABLE \"{table}\" AS SELECT * FROM read_parquet('{parquet}')")
    if not derived_current:
        con.execute("DELETE FROM meta WHERE key = 'summary_version'")


def export_tables(con: duckdb.DuckDBPyConnection, folder: str) -> list[str]:
    """Write every table of the connection's database to `folder`/i.parquet; returns their names in order."""
    tables = [r[0] for r in con.execute(
        "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database() AND schema_name = 'main' "
        "AND NOT temporary ORDER BY table_name").fetchall()]
    for i, table in enumerate(tables):
        con.execute(f"COPY \"{table}\" TO '{folder}/{i}.parquet' (FORMAT parquet)")
    return tables
