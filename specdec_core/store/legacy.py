"""Convert a store of schema 1 (one DuckDB database file) into a DuckLake store at the same path.

The old file is kept beside the new store as PATH.v1.duckdb. Its tables are read in this process
when this DuckDB can read the file; a file written by a newer DuckDB (the previous release used
DuckDB 2.0, whose files 1.5 cannot open) is exported to Parquet by that DuckDB in a child process,
from the side install named by $SPECDEC_LEGACY_DUCKDB (default .venv/legacy-duckdb, made by
`make install`). Conversion is restartable: a kill at any point leaves either the old file or a
finished store, and the next write finishes or restarts it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from specdec_core.store import lake

if TYPE_CHECKING:
    from specdec_core.store.connection import Store

# Rows of these are copied; the derived tables (hit_sources, summaries) are rebuilt by `migrate`.
KEPT_TABLES = ("requests", "identities", "quarantine", "ingests", "replays")
LEGACY_ENV = "SPECDEC_LEGACY_DUCKDB"
_REPO = Path(__file__).resolve().parents[2]
_EXPORT = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
for t in sys.argv[3:]:
    if t in have:
        con.execute(f"COPY {t} TO '{sys.argv[2]}/{t}.parquet' (FORMAT parquet)")
"""


def legacy_side_install() -> Path:
    return Path(os.environ.get(LEGACY_ENV) or _REPO / ".venv" / "legacy-duckdb")


def _export(old: Path, folder: Path) -> None:
    """Each kept table of `old` as folder/<table>.parquet, by whichever DuckDB can read the file."""
    try:
        con = duckdb.connect(str(old), read_only=True)
    except duckdb.Error as exc:
        if "newer version of DuckDB" not in str(exc) and "version number" not in str(exc):
            raise
        _export_in_child(old, folder)
        return
    try:
        exec(compile(_EXPORT.replace("duckdb.connect(sys.argv[1], read_only=True)", "con"), "export", "exec"),
             {"sys": type("A", (), {"argv": ["", str(old), str(folder), *KEPT_TABLES]}), "duckdb": duckdb,
              "con": con})
    finally:
        con.close()


def _export_in_child(old: Path, folder: Path) -> None:
    side = legacy_side_install()
    if not (side / "duckdb").is_dir():
        raise RuntimeError(f"{old}: written by DuckDB 2.0; install it aside with `pip install --target {side} "
                           "duckdb==2.0.1` (make install does) and run `specdec migrate` again")
    env = {**os.environ, "PYTHONPATH": str(side)}
    done = subprocess.run([sys.executable, "-c", _EXPORT, str(old), str(folder), *KEPT_TABLES], env=env,
                          capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{old}: cannot export with DuckDB 2.0: {(done.stderr.strip().splitlines() or ['?'])[-1]}")


def convert_legacy(store: Store) -> None:
    """Called under the store's writer lock when its catalog path holds a schema-1 DuckDB file."""
    from specdec_core.store.connection import StoreError, ensure_schema, release_snapshots

    target = Path(store.location.catalog)
    backup = target.with_name(target.name + ".v1.duckdb")
    staging = target.with_name(target.name + ".converting")
    _discard(staging, store.location)
    with tempfile.TemporaryDirectory(prefix="specdec-migrate-", dir=target.parent) as tmp:
        try:
            _export(target, Path(tmp))
        except (RuntimeError, duckdb.Error) as exc:
            raise StoreError(str(exc).splitlines()[0]) from None
        building = lake.Location(str(staging), store.location.data_path)
        con = lake.open_lake(building)
        try:
            con.execute(f"USE {lake.ALIAS}")
            ensure_schema(con)
            for table in KEPT_TABLES:
                part = Path(tmp) / f"{table}.parquet"
                if part.exists():
                    con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM read_parquet(?)", [str(part)])
        finally:
            con.close()
    mode = os.stat(target).st_mode & 0o777
    release_snapshots()
    os.replace(target, backup)
    os.chmod(staging, mode)
    os.replace(staging, target)


def _discard(staging: Path, location: lake.Location) -> None:
    """A conversion killed before its last rename: start it again from the old file."""
    if not staging.exists():
        return
    for leftover in (staging, Path(str(staging) + "-wal"), Path(str(staging) + "-shm")):
        leftover.unlink(missing_ok=True)
    shutil.rmtree(location.data_path, ignore_errors=True)
