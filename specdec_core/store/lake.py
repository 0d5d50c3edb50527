"""A store several machines share: DuckLake, a catalog database plus a folder (or S3 prefix) of Parquet files.

Named by `--db ducklake:CATALOG`, or by $SPECDEC_STORE or the `[store]` table of specdec.toml when no
--db is given (store/location.py). The catalog is a SQLite file (one machine, several processes: its
writers queue on a lock file beside it) or PostgreSQL (several machines: writers conflict at commit
and the loser retries on the new state). Readers attach it read-only and read one snapshot per
transaction: never blocked, never half a batch. Every extension is LOADed from the wheel pip
installed; nothing is downloaded at run time.
"""

from __future__ import annotations

import atexit
import fcntl
import logging
import os
import re
import shutil
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import TypeVar

import duckdb

from specdec_core import interrupts, scratch
from specdec_core.store.errors import LakeError
from specdec_core.store.instance import SharedInstance, restore_threads, take_shared
from specdec_core.store.lake_extensions import new_instance
from specdec_core.store.leftovers import remove_dead_writers_files
from specdec_core.store.location import LakeLocation
from specdec_core.store.sql import literal

ALIAS = "store"
log = logging.getLogger(__name__)
T = TypeVar("T")


class WriteConflict(LakeError):
    """Another writer committed first: the batch is retried on the state it left."""


def _create_sqlite_catalog(location: LakeLocation, setup: Callable[[duckdb.DuckDBPyConnection], None]) -> None:
    """A new SQLite catalog in WAL mode (readers never block the writer's commit, nor it them), with the
    store's tables, made under a temporary name and renamed into place: a catalog that exists is a whole
    store, and a writer killed while making it leaves none that readers fail on."""
    import sqlite3

    os.makedirs(os.path.dirname(location.catalog) or ".", exist_ok=True)
    tmp = f"{location.catalog}.{os.getpid()}.new"
    remove_dead_writers_files(Path(location.catalog), r"\.new(?:-wal|-shm)?")  # killed while making one
    for leftover in (tmp, tmp + "-wal", tmp + "-shm"):
        Path(leftover).unlink(missing_ok=True)
    try:
        db = sqlite3.connect(tmp)
        try:
            db.execute("PRAGMA journal_mode=WAL")
        finally:
            db.close()
        # A new catalog records this data path: nothing to override (beside stays False).
        con = _attach(LakeLocation(tmp, location.data_path, location.s3), read_only=False)
        try:
            con.execute(f"USE {ALIAS}")
            con.execute("BEGIN TRANSACTION")  # one snapshot for every table, not one each
            setup(con)
            con.execute("COMMIT")
        finally:
            con.close()
        os.replace(tmp, location.catalog)
    except BaseException as exc:
        for leftover in (tmp, tmp + "-wal", tmp + "-shm"):  # a catalog half made is no store: none is left
            Path(leftover).unlink(missing_ok=True)
        if isinstance(exc, (duckdb.Error, sqlite3.Error, OSError)):
            raise LakeError(location.mask(f"{location}: cannot create the store: {str(exc).splitlines()[0]}")) from exc
        raise


def open_lake(location: LakeLocation, read_only: bool = False,
              setup: Callable[[duckdb.DuckDBPyConnection], None] | None = None) -> duckdb.DuckDBPyConnection:
    """A fresh DuckDB instance with the store attached as `store`; a missing SQLite catalog is made first,
    its tables by `setup`, unless read_only."""
    if not location.postgres and not read_only and not os.path.exists(location.catalog):
        _create_sqlite_catalog(location, setup or (lambda con: None))
    return _attach(location, read_only)


def _attach(location: LakeLocation, read_only: bool) -> duckdb.DuckDBPyConnection:
    try:
        con = new_instance(location)
    except duckdb.Error as exc:  # an extension that won't load
        raise LakeError(location.mask(f"{location}: cannot open: {str(exc).splitlines()[0]}")) from exc
    try:
        options = []
        if location.data_path:
            options.append(f"DATA_PATH {literal(location.data_path)}")
        if location.beside:  # the catalog records where its files were: a store moved whole still opens
            options.append("OVERRIDE_DATA_PATH true")
        if read_only:
            options.append("READ_ONLY")
        options_sql = f" ({', '.join(options)})" if options else ""
        con.execute(f"ATTACH {literal('ducklake:' + location.attach_target)} AS {ALIAS}{options_sql}")
    except duckdb.Error as exc:
        con.close()
        raise LakeError(location.mask(f"{location}: cannot open: {str(exc).splitlines()[0]}")) from exc
    except BaseException:
        con.close()
        raise
    return con


def snapshot_id(con: duckdb.DuckDBPyConnection) -> int:
    """The store's newest snapshot: changes with every commit, a cache key for readers."""
    return int(con.execute(f"SELECT max(snapshot_id) FROM __ducklake_metadata_{ALIAS}.ducklake_snapshot"
                           ).fetchall()[0][0] or 0)


class _Reader(SharedInstance):
    """A read-only attachment of a lake, shared by the process's reads."""

    def __init__(self, con: duckdb.DuckDBPyConnection, catalog_file: tuple[int, int] | None) -> None:
        super().__init__(con, _readers_lock)
        self.catalog_file = catalog_file  # a SQLite catalog's (device, inode) when it was attached
        # The snapshot its derived tables were last found current at, and whether its summaries were this code's.
        self.checked: tuple[int, bool] = (-1, False)


# The process's read-only attachments, one per store: every thread reads through a cursor of its own. Kept
# per thread, each Streamlit rerun (a thread of its own) attached the lake anew: 0.08 s a page view on the demo's
# lake (a SQLite catalog), 0.011 s shared.
_readers: dict[str, _Reader] = {}
_readers_lock = threading.Lock()


def _catalog_file(location: LakeLocation) -> tuple[int, int] | None:
    if location.postgres:
        return None
    try:
        st = os.stat(location.catalog)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


@contextmanager
def reading(location: LakeLocation) -> Iterator[_Reader]:
    """The process's read-only attachment of the store, counted as in use while the block runs: read through
    a cursor of its own. Kept until the catalog file is another one (a store deleted and made again under the
    same name) or forget_readers; a replaced one closes when its last read ends."""
    current = _catalog_file(location)
    held = take_shared(_readers, str(location), _readers_lock, lambda reader: reader.catalog_file == current,
                       lambda: _Reader(open_lake(location, read_only=True), current))
    try:
        yield held
    finally:
        held.release()


def forget_readers() -> None:
    """Let go of the process's attachments (one in use closes when its read ends), and of the kept writers."""
    with _readers_lock:
        for held in _readers.values():
            held.retire()
        _readers.clear()
    forget_writers()


# Each batch adds small files (or rows inlined in the catalog) to every table it touches: a --follow adds
# thousands an hour, and reads slow down with each. Past this many small ones, the writer merges them after
# its commit.
MAINTAIN_ABOVE_FILES = 150
# A merge rewrites the files it merges. Files are merged by size tier, as a log-structured merge tree does:
# the small ones at every maintenance, each larger tier once some table holds MERGE_AT files below its size.
# A row is rewritten about once per tier, never at every maintenance: merging a follow's small files into a
# lake's one large file rewrote it each time and stalled the follow (figures: docs/benchmarks.md).
MERGE_TIERS: tuple[int, ...] = (16 << 20, 128 << 20, 512 << 20)  # bytes; the last is DuckLake's target file size
MERGE_AT = 8
# Files a merge replaced are deleted only this long after: a reader still on an older snapshot keeps them.
KEEP_REPLACED = "10 minutes"
# Data files no snapshot names (a writer killed before its commit) are deleted once this old: a live
# writer's files, not committed yet, are younger than any batch takes.
KEEP_ORPHANS = "1 day"


def live_files(con: duckdb.DuckDBPyConnection, below: int | None = None) -> int:
    """The store's data files in use (those smaller than `below` bytes)."""
    size = "" if below is None else f" AND file_size_bytes < {int(below)}"
    return int(con.execute(f"SELECT count(*) FROM __ducklake_metadata_{ALIAS}.ducklake_data_file "
                           f"WHERE end_snapshot IS NULL{size}").fetchall()[0][0])


def _most_in_one_table(con: duckdb.DuckDBPyConnection, at_least: int, below: int) -> int:
    return int(con.execute(f"SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM "
                           f"__ducklake_metadata_{ALIAS}.ducklake_data_file WHERE end_snapshot IS NULL "
                           f"AND file_size_bytes >= {int(at_least)} AND file_size_bytes < {int(below)} "
                           "GROUP BY table_id)").fetchall()[0][0])


def _merge(below: int) -> str:
    return f"CALL ducklake_merge_adjacent_files('{ALIAS}', max_file_size => {int(below)})"


# A writer kept for many writes (a --follow, the dashboard's loads) spreads the merging over them: each write
# past the threshold merges the tables holding the most small files until the store is back under it, and
# every CHORES_EVERY-th such write also does the rest (inlined rows, deletes, old snapshots and files).
# Merging every table at once paused a follow for seconds at a time: the lake's largest lags (figures:
# docs/benchmarks.md).
CHORES_EVERY = 8


def _tables_by_small_files(con: duckdb.DuckDBPyConnection, below: int) -> list[tuple[str, int]]:
    catalog = f"__ducklake_metadata_{ALIAS}"
    return con.execute(f"SELECT t.table_name, count(*) AS n FROM {catalog}.ducklake_data_file f "
                       f"JOIN {catalog}.ducklake_table t USING (table_id) WHERE f.end_snapshot IS NULL "
                       f"AND t.end_snapshot IS NULL AND f.file_size_bytes < {int(below)} "
                       "GROUP BY 1 HAVING count(*) > 1 ORDER BY n DESC, 1").fetchall()


def maintain(con: duckdb.DuckDBPyConnection, full: bool = False, spread: bool = False, chores: bool = True) -> None:
    """Merge small files and inlined rows into larger files, apply deletes, drop what no reader can need
    and what killed writers left. `full`: every tier of files, whatever each holds. `spread`: of the small
    files, only the busiest tables' until the store is back under MAINTAIN_ABOVE_FILES; `chores`: the rest
    (inlined rows, deletes, snapshots and files no reader needs) too.

    Each step commits on its own; a step that loses a race with another writer is left to the next time."""
    def step(sql: str) -> None:
        try:
            con.execute(sql).fetchall()
        except duckdb.Error as exc:
            log.warning("%s: left for the next write: %s", sql, str(exc).splitlines()[0])

    if chores:
        step(f"CALL ducklake_flush_inlined_data('{ALIAS}')")
    if not spread:
        step(_merge(MERGE_TIERS[0]))
    else:
        try:
            over = live_files(con, below=MERGE_TIERS[0]) - MAINTAIN_ABOVE_FILES
            busiest = _tables_by_small_files(con, MERGE_TIERS[0])
        except duckdb.Error as exc:
            log.warning("maintenance: the merges left for the next write: %s", str(exc).splitlines()[0])
            busiest = []
        for table, _ in busiest:
            if over <= 0:
                break
            step(f"CALL ducklake_merge_adjacent_files('{ALIAS}', '{table}', max_file_size => {int(MERGE_TIERS[0])})")
            # Counted again, not estimated: a table's merge may leave more than one file (files that are not
            # adjacent, or that deletes split), and the next table is merged only if the store is still over.
            try:
                over = live_files(con, below=MERGE_TIERS[0]) - MAINTAIN_ABOVE_FILES
            except duckdb.Error:
                break
    for smaller, size in pairwise(MERGE_TIERS):
        # A tier's files, once the tier below is merged (its merge may have added one to this tier).
        try:
            due = full or _most_in_one_table(con, smaller, size) >= MERGE_AT
        except duckdb.Error as exc:
            log.warning("maintenance: the merges of larger files left for the next write: %s",
                        str(exc).splitlines()[0])
            break
        if due:
            step(_merge(size))
    if not chores:
        return
    step(f"CALL ducklake_rewrite_data_files('{ALIAS}')")
    step(f"CALL ducklake_expire_snapshots('{ALIAS}', older_than => now() - INTERVAL '{KEEP_REPLACED}')")
    step(f"CALL ducklake_cleanup_old_files('{ALIAS}', older_than => now() - INTERVAL '{KEEP_REPLACED}')")
    step(f"CALL ducklake_delete_orphaned_files('{ALIAS}', older_than => now() - INTERVAL '{KEEP_ORPHANS}')")


_CONFLICT = re.compile(r"conflict|database is locked|could not serialize|deadlock", re.IGNORECASE)


def is_conflict(exc: BaseException) -> bool:
    return isinstance(exc, duckdb.Error) and bool(_CONFLICT.search(str(exc)))


@contextmanager
def _one_writer(location: LakeLocation) -> Iterator[None]:
    """Writers of one SQLite catalog queue on `CATALOG.lock`; PostgreSQL's writers race (see writing)."""
    if location.postgres:
        yield
        return
    try:
        os.makedirs(os.path.dirname(location.catalog) or ".", exist_ok=True)
        lock = open(location.catalog + ".lock", "w")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise LakeError(location.mask(f"{location}: cannot write here: {exc.strerror or exc}")) from exc
    with lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@contextmanager
def writing(location: LakeLocation, setup: Callable[[duckdb.DuckDBPyConnection], None],
            memory_limit: str) -> Iterator[duckdb.DuckDBPyConnection]:
    """One write transaction on the store: all of it committed when the block exits cleanly, or none.

    On PostgreSQL, each write rewrites the store's `meta` row (setup does), so two writers that overlap
    conflict at commit and the second one raises WriteConflict instead of committing a batch judged
    without the other's rows.
    """
    with _one_writer(location):
        held = _writer(location, setup)
        # The write's own connection to the kept instance: the batch's temp tables and views end with it.
        # (Listing them to drop them cost a query of the whole catalog at every small batch.)
        con = held.con.cursor()
        try:
            con.execute(f"USE {ALIAS}")
            con.execute(f"SET memory_limit = '{memory_limit}'")
            restore_threads(con)  # the write before may have asked for fewer (ingestion/load.py)
            con.execute("BEGIN TRANSACTION")
            setup(con)
            yield con
            interrupts.check()  # a Ctrl-C a library swallowed during the block: nothing is committed
            try:
                con.execute("COMMIT")
            except duckdb.Error as exc:
                if is_conflict(exc):
                    raise WriteConflict(f"{location}: another writer committed first") from exc
                raise
            con.close()
            held.writes += 1
            if live_files(held.con, below=MERGE_TIERS[0]) > MAINTAIN_ABOVE_FILES:
                restore_threads(held.con)  # a merge may rewrite large files, however small the batch
                if held.writes == 1:
                    maintain(held.con)  # a one-off write (`specdec ingest`): all of it now
                elif held.maintained % CHORES_EVERY == CHORES_EVERY - 1:
                    # Chores on a fresh instance: DuckLake 1.5.5's flush of inlined rows, run by one kept over
                    # many writes and expiries, now and then aborted the process ("corrupted double-linked list").
                    held.con.close()
                    held.con = _writing_instance(location, setup, held.spill)
                    maintain(held.con, spread=True, chores=True)
                else:
                    maintain(held.con, spread=True, chores=False)
                held.maintained += 1
            _keep_data_private(location)
        except BaseException:
            try:
                con.execute("ROLLBACK")
            except duckdb.Error:
                pass  # the commit that failed already ended the transaction (or the cursor is closed)
            con.close()
            _forget_writer(location)  # the next write starts from a fresh instance
            raise


def _keep_data_private(location: LakeLocation) -> None:
    """A SQLite catalog that only its owner may read keeps its rows so: DuckDB writes the Parquet files with
    the process's umask (others may read them), so their folder is closed to others (mode 0700 at most)."""
    if location.postgres or not location.data_path or location.on_s3:
        return
    try:
        if stat.S_IMODE(os.stat(location.catalog).st_mode) & 0o077:
            return
        mode = stat.S_IMODE(os.stat(location.data_path).st_mode)
        if mode & 0o077:
            os.chmod(location.data_path, mode & 0o700)
    except FileNotFoundError:
        return  # no data file written yet
    except OSError as exc:
        log.warning("%s: cannot keep the data files as private as the catalog: %s", location.data_path,
                    exc.strerror or exc)


@dataclass
class _Writer:
    con: duckdb.DuckDBPyConnection
    spill: str
    catalog_file: tuple[int, int] | None = None
    writes: int = 0  # committed by this instance
    maintained: int = 0  # writes after which it maintained the store


_writers = threading.local()
_spills: list[str] = []  # every kept instance's spill folder, removed when the process ends
atexit.register(lambda: [shutil.rmtree(spill, ignore_errors=True) for spill in _spills])


def _writer(location: LakeLocation, setup: Callable[[duckdb.DuckDBPyConnection], None]) -> _Writer:
    """This thread's writing instance of the store, kept between writes: loading the extensions and
    attaching cost about 0.25 s, which a --follow would pay every batch."""
    held: dict[str, _Writer] = _writers.__dict__.setdefault("held", {})
    key = str(location)
    if key in held and held[key].catalog_file != _catalog_file(location):
        _forget_writer(location)  # the store was deleted (and perhaps made again) since
    if key not in held:
        spill = scratch.make("spill")
        try:
            con = _writing_instance(location, setup, spill)
        except BaseException:
            shutil.rmtree(spill, ignore_errors=True)
            raise
        held[key] = _Writer(con, spill, _catalog_file(location))  # a new catalog exists only now
        _spills.append(spill)
    return held[key]


def _writing_instance(location: LakeLocation, setup: Callable[[duckdb.DuckDBPyConnection], None],
                      spill: str) -> duckdb.DuckDBPyConnection:
    con = open_lake(location, setup=setup)
    try:
        con.execute(f"USE {ALIAS}")
        con.execute(f"SET temp_directory = {literal(spill)}")
    except BaseException:
        con.close()
        raise
    return con


def _forget_writer(location: LakeLocation | str) -> None:
    held: dict[str, _Writer] = _writers.__dict__.setdefault("held", {})
    writer = held.pop(str(location), None)
    if writer is not None:
        writer.con.close()
        shutil.rmtree(writer.spill, ignore_errors=True)
        _spills.remove(writer.spill)


def forget_writers() -> None:
    for key in list(_writers.__dict__.get("held", {})):
        _forget_writer(key)


def compact(location: LakeLocation) -> None:
    """maintain() every tier now, whatever the store's files number (`specdec migrate` does this)."""
    with _one_writer(location):
        con = open_lake(location, read_only=False)
        try:
            maintain(con, full=True)
        finally:
            con.close()


def retrying(attempt: Callable[[], T], tries: int = 8) -> T:
    """attempt() again while it loses a commit race, with a growing, jittered pause."""
    for n in range(tries):
        try:
            return attempt()
        except WriteConflict:
            if n == tries - 1:
                raise
        except duckdb.Error as exc:
            if not is_conflict(exc) or n == tries - 1:
                raise
        time.sleep(min(2.0, 0.05 * 2 ** n) * (0.5 + (os.getpid() % 97) / 97))
    raise AssertionError("unreachable")
