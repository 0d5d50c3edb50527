"""The DuckDB file behind triage: schema, and connections that never see a half-written batch.

Writers work on a copy of the database and swap it in with an atomic rename, under an
exclusive lock file; readers use a read-only view of one state of the file, kept per
thread until the file changes. A dashboard process can therefore read while
`specdec ingest` writes in another process, and sees either the state before the
batch or after it, never a part of it. Reads never write: a file written by an older
version is brought up to date by `migrate` (`specdec migrate`, and every ingest).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import TypeVar

import duckdb

from specdec_core.store import lake as lakes
from specdec_core.store.convert import SIDE_VERSION, ConversionError, convert_into, written_by_newer_duckdb
from specdec_core.store.lake_files import damage_message
from specdec_core.store.leftovers import remove_dead_writers_files
from specdec_core.store.location import LocationError, lake_location, resolve_db
from specdec_core.store.schema import (
    DROP_IDENTITIES_KEY_SQL,
    column_migrations_sql,
    columns_to_relax,
    is_specdec_store,
    relax_not_null_sql,
    schema_sql,
)
from specdec_core.store.summaries import current_version_sql

SCHEMA_VERSION = 1
T = TypeVar("T")


class StoreError(RuntimeError):
    """The database can't be opened or written; the message says which file and why."""


# What DuckDB may hold while writing; beyond it, it spills to disk. An ingest stays under 2 GB: where a
# Python reader stages the lines (another log format, CSV, Parquet), its own memory counts too and DuckDB
# keeps to the lower figure (store/staging.py); DuckDB's own line reader leaves it the higher one. DuckDB 1.5
# goes further past its limit than 2.0 did: at 1600MB a 1M-record ingest peaked at 1.97 GB, at 1400MB 1.72 GB.
WRITER_MEMORY_LIMIT = "1GB"
WRITER_MEMORY_LIMIT_NATIVE = "1400MB"


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # it would write into --json output


log = logging.getLogger(__name__)
_SNAPSHOT_ALIAS = "store"
_snapshots = threading.local()


class _View:
    """One read-only state of a file, and how many reads of this thread are using it."""

    def __init__(self, version: tuple[int, int], con: duckdb.DuckDBPyConnection) -> None:
        self.version, self.con, self.in_use, self.current = version, con, 0, True
        self.checked = False  # whether its derived tables were checked against this code

    def release(self) -> None:
        self.in_use -= 1
        if not self.current and self.in_use == 0:
            self.con.close()


def _views() -> dict[str, _View]:
    return _snapshots.__dict__.setdefault("views", {})


def _snapshot(path: Path, version: tuple[int, int]) -> _View:
    """This thread's read-only view of `path` as of `version` (its mtime and inode).

    The file is ATTACHed to a private in-memory database rather than opened by path:
    DuckDB hands every `connect(path)` the instance already open for that path, which
    would keep showing a state the writer has since replaced. A thread's views are
    never used by another thread; a stale one closes once its last read ends.
    """
    key = str(path.resolve())
    views = _views()
    held = views.get(key)
    if held is not None and held.version == version:
        return held
    try:
        con = _attached(key, "READ_ONLY")
    except duckdb.Error as exc:
        if written_by_newer_duckdb(path):
            raise StoreError(f"{path}: written by DuckDB {SIDE_VERSION} (an older specdec); convert it with "
                             f"`specdec migrate --db {path}`") from None
        raise StoreError(f"{path}: cannot open for reading: {exc}") from exc
    if held is not None:
        held.current = False
        if held.in_use == 0:
            held.con.close()
    views[key] = view = _View(version, con)
    return view


def derived_current(con: duckdb.DuckDBPyConnection, path: Path | None = None, alias: str | None = _SNAPSHOT_ALIAS
                    ) -> bool:
    """Whether the tables derived from `requests` were built by this version (or there is nothing to derive).

    `alias` None: the connection's own database (a writer's)."""
    alias = f"{alias}." if alias else ""
    try:
        version = con.execute(current_version_sql(f"{alias}meta")).fetchall()
        if version and version[0][0]:
            return True
        return not con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {alias}requests LIMIT 1)").fetchall()[0][0]
    except duckdb.CatalogException:
        raise StoreError(f"{path}: a DuckDB file, but not a specdec database (no meta or requests table)") from None


def release_snapshots() -> None:
    """Close this thread's idle read-only views, letting go of their files (e.g. before writing one in place)."""
    views = _views()
    for key, view in list(views.items()):
        view.current = False
        if view.in_use == 0:
            view.con.close()
        del views[key]
    lakes.forget_readers()


class Store:
    """A triage store: a DuckDB file, or a DuckLake (`ducklake:CATALOG`). Cheap to construct; connections are
    opened per use."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        try:
            self.name = resolve_db(path)
            self.lake = lake_location(self.name)
        except LocationError as exc:
            raise StoreError(str(exc)) from None
        self.path = Path(self.name)

    def __repr__(self) -> str:
        return f"Store({self.name!r})"

    def __str__(self) -> str:
        return self.name

    @property
    def exists(self) -> bool:
        if self.lake is not None:
            return self.lake.postgres or os.path.exists(self.lake.catalog)
        return self.path.exists()

    def version(self) -> tuple[int, int]:
        """Changes whenever a writer swaps a new state in (a lake: commits a snapshot): a cache key for readers."""
        if self.lake is not None:
            if not self.exists:
                return (0, 0)
            return (lakes.snapshot_id(self._lake_reader().con), 0)
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return (0, 0)
        return (st.st_mtime_ns, st.st_ino)

    def ensure(self) -> None:
        """Create the database with its schema when it does not exist yet."""
        if not self.path.exists():
            with self.write():
                pass

    @contextmanager
    def read(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection to a consistent state of the database.

        Opening one costs about 20 ms, more than a summary query, so each thread keeps
        one per file and state (see `_snapshot`); a writer's swap gives the next read a new one.
        A lake is read in one transaction: one snapshot, whatever writers commit meanwhile.
        """
        if self.lake is not None:
            with self._read_lake() as con:
                yield con
            return
        if not self.path.exists():
            raise StoreError(f"{self.path}: no such database; load logs with `specdec ingest PATH --db {self.path}`")
        view = _snapshot(self.path, self.version())
        if not view.checked:
            if not derived_current(view.con, self.path):
                raise StoreError(f"{self.path}: written by an older specdec; bring it up to date with "
                                 f"`specdec migrate --db {self.path}`")
            view.checked = True
        view.in_use += 1
        try:
            con = view.con.cursor()
            try:
                con.execute(f"USE {_SNAPSHOT_ALIAS}")
                _configure(con)
                yield con
            finally:
                con.close()
        finally:
            view.release()

    def _lake_reader(self) -> lakes._Reader:
        try:
            return lakes.reader(self.lake)
        except lakes.LakeError as exc:
            raise StoreError(str(exc)) from None

    @contextmanager
    def _read_lake(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if not self.exists:
            raise StoreError(f"{self}: no such store; load logs with `specdec ingest PATH --db {self}`")
        held = self._lake_reader()
        con = held.con.cursor()
        try:
            con.execute(f"USE {lakes.ALIAS}")
            _configure(con)
            con.execute("BEGIN TRANSACTION")
            snapshot = lakes.snapshot_id(con)
            if held.checked_at != snapshot:
                if not derived_current(con, self.name):
                    raise StoreError(f"{self}: written by an older specdec; bring it up to date with "
                                     f"`specdec migrate --db {self}`")
                held.checked_at = snapshot
            yield con
        except duckdb.Error as exc:
            said = damage_message(exc, self.name)
            if said is None:
                raise
            raise StoreError(said) from None
        finally:
            try:
                con.execute("ROLLBACK")  # reads never write: nothing to commit
            except duckdb.Error:
                pass
            con.close()

    def transact(self, work: Callable[[duckdb.DuckDBPyConnection], T]) -> T:
        """work(con) in one write, run again on the new state when another machine's writer committed first."""
        def attempt() -> T:
            with self.write() as con:
                return work(con)

        try:
            return lakes.retrying(attempt) if self.lake is not None else attempt()
        except lakes.WriteConflict as exc:
            raise StoreError(f"{exc}, again and again: try the ingest again") from exc

    @contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection whose changes become visible all at once when the block exits cleanly.

        A lake: one transaction (lakes.writing). A file: a symlinked path is written through to its target, so the link stays a link, and the new
        state keeps the old file's mode and owner: the copy-and-rename must not undo a chmod 600.
        """
        if self.lake is not None:
            try:
                with lakes.writing(self.lake, _prepare_lake_write, WRITER_MEMORY_LIMIT) as con:
                    yield con
            except lakes.WriteConflict:
                raise
            except lakes.LakeError as exc:
                raise StoreError(str(exc)) from None
            except duckdb.Error as exc:
                said = damage_message(exc, self.name)
                if said is None:
                    raise
                raise StoreError(said) from None
            except ForeignDatabaseError as exc:
                raise ForeignDatabaseError(f"{self.name}: {exc}") from None
            return
        target = Path(os.path.realpath(self.path))
        if target.is_dir():
            raise StoreError(f"{self.path}: is a folder, not a database file")
        lock_path = target.with_name(target.name + ".lock")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            lock = open(lock_path, "w")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write here: {exc.strerror or exc}") from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            remove_dead_writers_files(target, WORKING_COPY_SUFFIX)
            tmp = target.with_name(f"{target.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            try:
                original = target.stat() if target.exists() else None
                convert = original is not None and written_by_newer_duckdb(target)
                if original is not None and not convert:
                    _copy_database(target, tmp)
                con = _open_working_copy(tmp, appending=original is not None)
                if convert:
                    os.chmod(tmp, 0o600)  # the converted rows are as private as the copy would be
            except BaseException as exc:
                _remove_working_copy(tmp)
                if isinstance(exc, (OSError, duckdb.Error)):
                    raise StoreError(f"{self.path}: cannot open for writing: {_own_words(exc, tmp, self.path)}"
                                     ) from exc
                raise
            try:
                _configure(con)
                con.execute(f"SET memory_limit = '{WRITER_MEMORY_LIMIT}'")
                con.execute(f"SET temp_directory = '{_sql_literal(str(tmp) + '.spill')}'")
                ensure_schema(con)
                if convert:
                    convert_into(target, con, str(self.path))
                yield con
                con.execute("CHECKPOINT")
                written = tmp
                if original is not None and _compaction_asked(con):
                    written = _write_fresh(con, tmp)
                con.close()
                if original is not None:
                    _keep_metadata(written, original)
                os.replace(written, target)
            except BaseException as exc:
                con.close()
                _remove_working_copy(tmp)
                if isinstance(exc, ConversionError):
                    raise StoreError(str(exc)) from None
                if isinstance(exc, ForeignDatabaseError):
                    raise ForeignDatabaseError(f"{self.path}: {exc}") from None
                full = _out_of_space(exc)
                if full:
                    raise StoreError(f"{self.path}: cannot write: {full} (the working copy needs about the "
                                     "database's size again); the database is unchanged") from exc
                raise
            finally:
                _remove_working_copy(tmp)


# Rows per row group that a write into a store holding rows makes (DuckDB's default, 122,880, for a new store).
# A batch's rows go into the last row group; at the default size the checkpoint of such a group took spikes
# of up to 2 s as it filled (0.1 s at 37,000 rows, 0.7 s at 77,000, 2 s at 97,000): bench_follow's lag. At
# 16,384, 26 batches of 10,000 rows into 1M rows checkpoint in 3.6 s against 7.4 s, the slowest 0.35 s.
APPEND_ROW_GROUP_SIZE = 16_384


# A writer's working copy of `<db>` is `<db>.<pid>.tmp` (with its WAL and spill folder). Leftovers of killed
# writers are removed under the exclusive lock, so no live writer other than one whose pid is alive is
# between its copy and its rename.
WORKING_COPY_SUFFIX = r"\.tmp(?:\.wal|\.spill|\.fresh)?"

# A write that rebuilt every derived table (a migration, a copy into a store) leaves their old blocks free in
# the file, and the new ones in an append's small row groups: a 5M-row store migrated in place grew from 1.1
# to 1.5 GB, and a 20,000-line append's checkpoint then took 288 ms against 116 ms. Such a write asks for
# its tables to be written into a fresh file, which it commits instead (5M rows: about 35 s, once).
_COMPACT_MARK = "specdec_write_fresh_file"


def compact_after_write(con: duckdb.DuckDBPyConnection) -> None:
    """Within a write: commit the store's tables as a fresh file (a file store holding rows; a lake ignores it)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_COMPACT_MARK} (asked BOOLEAN)")


def _compaction_asked(con: duckdb.DuckDBPyConnection) -> bool:
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'temp' "
                            f"AND table_name = '{_COMPACT_MARK}'").fetchall()[0][0])


def _write_fresh(con: duckdb.DuckDBPyConnection, tmp: Path) -> Path:
    """The working copy's tables written into a new file beside it (in a private folder until renamed);
    the working copy itself where that fails (a full disk): the write is kept, only not compacted."""
    folder = Path(str(tmp) + ".fresh")
    fresh = folder / "store.duckdb"
    try:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700)
        con.execute(f"ATTACH '{_sql_literal(str(fresh))}' AS fresh_store")
        con.execute(f"COPY FROM DATABASE {_SNAPSHOT_ALIAS} TO fresh_store")
        con.execute("CHECKPOINT fresh_store")
        con.execute("DETACH fresh_store")
    except (duckdb.Error, OSError) as exc:
        log.warning("%s: kept as written, not compacted: %s", tmp, (str(exc).splitlines() or [""])[0])
        try:
            con.execute("DETACH DATABASE IF EXISTS fresh_store")
        except duckdb.Error:
            pass
        shutil.rmtree(folder, ignore_errors=True)
        return tmp
    os.chmod(fresh, 0o600)
    return fresh


def _open_working_copy(tmp: Path, appending: bool) -> duckdb.DuckDBPyConnection:
    con = _attached(str(tmp), f"ROW_GROUP_SIZE {APPEND_ROW_GROUP_SIZE}" if appending else "")
    con.execute(f"USE {_SNAPSHOT_ALIAS}")
    return con


def _attached(path: str, options: str) -> duckdb.DuckDBPyConnection:
    """A private in-memory database with the file at `path` attached as `store` (`options`: ATTACH's)."""
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH '{_sql_literal(path)}' AS {_SNAPSHOT_ALIAS}{f' ({options})' if options else ''}")
    except BaseException:
        con.close()
        raise
    return con


# Errors of copy_file_range that say only that it can't copy here (another filesystem, an old kernel): then the
# bytes are copied as before. Any other error (a full disk) is the copy's error.
_NO_RANGE_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL}


def copy_bytes(src: int, dst: int, start: int = 0, end: int | None = None) -> int:
    """Bytes [start, end) of the file `src` (to its end: None) written at `dst`'s position; how many were.

    copy_file_range lets the filesystem make the copy: on one with reflinks (XFS, btrfs) it shares the blocks,
    elsewhere the kernel copies them, never through this process. Where it can't (_NO_RANGE_COPY) the rest is
    copied by blocks from where it stopped; any other error (a full disk) is raised."""
    at = start
    try:
        while end is None or at < end:
            copied = os.copy_file_range(src, dst, 1 << 30 if end is None else min(1 << 30, end - at), at)
            if not copied:
                break
            at += copied
    except OSError as exc:
        if exc.errno not in _NO_RANGE_COPY:
            raise
    while end is None or at < end:
        block = os.pread(src, 1 << 20 if end is None else min(1 << 20, end - at), at)
        if not block:
            break
        view = memoryview(block)
        while view:
            view = view[os.write(dst, view):]
        at += len(block)
    return at - start


def _copy_database(source: Path, dest: Path) -> None:
    """The writer's working copy (copy_bytes): on a filesystem with reflinks the write then costs what it
    changes, not the store's size (bench_append.py --work); elsewhere the kernel copies the bytes."""
    # Created private, so a restricted database is never readable by others through its copy.
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with open(source, "rb") as src:
            copy_bytes(src.fileno(), fd)
    finally:
        os.close(fd)


_FICLONE = 0x40049409  # Linux's ioctl that makes a file share another's blocks (what a reflink copy does)


def filesystem_type(folder: Path) -> str:
    """The type of the filesystem `folder` lies on, as /proc/mounts names it (its longest mount point above
    `folder`); "?" where there is no /proc/mounts."""
    best, kind, path = "", "?", str(folder.resolve()).rstrip("/") + "/"  # a mount point lies on itself
    try:
        with open("/proc/mounts", encoding="utf-8") as mounts:
            for line in mounts:
                point, fstype = line.split()[1:3]
                if path.startswith(point.rstrip("/") + "/") and len(point) > len(best):
                    best, kind = point, fstype
    except OSError:
        pass
    return kind


def copies_share_blocks(folder: Path) -> bool:
    """Whether a copy made in `folder` shares the original's blocks (XFS, btrfs): then a file store's write costs
    what it changes; elsewhere (ext4, tmpfs) each write copies the whole file. Tried on two small files there."""
    try:
        with tempfile.TemporaryDirectory(dir=folder, prefix=".specdec-reflink-") as tmp:
            src, dst = Path(tmp) / "a", Path(tmp) / "b"
            src.write_bytes(b"\0" * 4096)
            with open(src, "rb") as a, open(dst, "wb") as b:
                fcntl.ioctl(b.fileno(), _FICLONE, a.fileno())
    except OSError:
        return False
    return True


# A store this large costs a follow a noticeable copy at every batch where copies don't share blocks.
COPY_NOTE_BYTES = 256 << 20


def copy_cost_note(store: Store, min_bytes: int = COPY_NOTE_BYTES) -> str | None:
    """One line for a writer that will write again and again (--follow), when each of its writes copies a large
    store file whole; None for a lake, a small file, or a filesystem whose copies share blocks."""
    if store.lake is not None or not store.path.is_file():
        return None
    size = store.path.stat().st_size
    if size < min_bytes or copies_share_blocks(store.path.resolve().parent):
        return None
    lake = store.path.with_suffix(".sqlite")
    kind = filesystem_type(store.path.resolve().parent)
    named = f" ({kind})" if kind != "?" else ""
    return (f"note: every batch copies {store.path} ({size / 2**20:,.0f} MiB) whole, since this filesystem{named} "
            f"makes no reflinks (XFS and btrfs do); a DuckLake store appends instead: "
            f"specdec migrate --db {store.path} --to ducklake:{lake}, then --db ducklake:{lake}")


def _keep_metadata(tmp: Path, original: os.stat_result) -> None:
    try:
        os.chown(tmp, original.st_uid, original.st_gid)
    except OSError:
        pass  # only root may give a file away; the owner is then the writer, as before
    os.chmod(tmp, stat.S_IMODE(original.st_mode))


def _remove_working_copy(tmp: Path) -> None:
    tmp.unlink(missing_ok=True)
    Path(str(tmp) + ".wal").unlink(missing_ok=True)
    shutil.rmtree(str(tmp) + ".spill", ignore_errors=True)
    shutil.rmtree(str(tmp) + ".fresh", ignore_errors=True)


def _out_of_space(exc: BaseException) -> str | None:
    """The OS's words when `exc` says the disk (or the user's quota) is full; None otherwise."""
    full = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, OSError):
        return os.strerror(exc.errno) if exc.errno in full else None
    if not isinstance(exc, duckdb.Error):
        return None
    # DuckDB reports a full disk as an IO, transaction or other error, in the OS's words.
    text = str(exc)
    for code in full:
        if os.strerror(code) in text:
            return os.strerror(code)
    if isinstance(exc, duckdb.IOException) and "Could not write all bytes" in text:
        return os.strerror(errno.ENOSPC)
    return None


def _own_words(exc: BaseException, tmp: Path, path: Path) -> str:
    """The error's first line, naming the file the user passed instead of our working copy."""
    text = (exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)).splitlines()[0]
    return text.replace(str(tmp.resolve()), str(path)).replace(str(tmp), str(path))


def is_lake(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection's database is a DuckLake (which has no PRIMARY KEY or UNIQUE constraints)."""
    return scalar(con, "SELECT type FROM duckdb_databases() WHERE database_name = current_database()") == "ducklake"


def create_tables(con: duckdb.DuckDBPyConnection, ddl: str) -> None:
    """Run CREATE TABLE statements; in a lake without their keys, which its writers keep unique themselves."""
    con.execute(re.sub(r"\s+PRIMARY KEY\b", " NOT NULL", ddl) if is_lake(con) else ddl)


def _prepare_lake_write(con: duckdb.DuckDBPyConnection) -> None:
    _configure(con)
    ensure_schema(con)


# Where `specdec migrate` collects what the writes it runs changed in the store's shape (schema_changes()).
_SCHEMA_CHANGES: ContextVar[list[str] | None] = ContextVar("specdec_schema_changes", default=None)


@contextmanager
def schema_changes() -> Iterator[list[str]]:
    """The changes ensure_schema makes to a store's tables within this block, in words, once each."""
    changes: list[str] = []
    token = _SCHEMA_CHANGES.set(changes)
    try:
        yield changes
    finally:
        _SCHEMA_CHANGES.reset(token)


def _columns(con: duckdb.DuckDBPyConnection) -> dict[str, set[str]]:
    tables: dict[str, set[str]] = {}
    for table, column in con.execute("SELECT table_name, column_name FROM duckdb_columns() "
                                     "WHERE database_name = current_database()").fetchall():
        tables.setdefault(table, set()).add(column)
    return tables


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create missing tables and add the columns a newer version has: cheap, so every write does it.

    Every write to a lake rewrites meta's schema_version row: two overlapping writers then conflict at
    commit, so neither commits a batch judged without the other's rows."""
    report = _SCHEMA_CHANGES.get()
    before = _columns(con)
    refuse_foreign(con, before)
    create_tables(con, schema_sql())
    con.execute(column_migrations_sql())
    constraints = con.execute("SELECT table_name, constraint_type, unnest(constraint_column_names) "
                              "FROM duckdb_constraints() WHERE database_name = current_database() "
                              "AND table_name IN ('requests', 'identities')").fetchall()
    relaxed = columns_to_relax({c for t, kind, c in constraints if t == "requests" and kind == "NOT NULL"})
    keyed = ("identities", "PRIMARY KEY", "fingerprint") in constraints
    if relaxed:
        con.execute(relax_not_null_sql(relaxed))
    if keyed:
        con.execute(DROP_IDENTITIES_KEY_SQL)
    # A file's writers take turns (its lock): the row is only written when it changes.
    if is_lake(con) or scalar(con, "SELECT max(value) FROM meta WHERE key = 'schema_version'") != str(SCHEMA_VERSION):
        con.execute("DELETE FROM meta WHERE key = 'schema_version'")
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
    if report is not None and before:  # a store that had tables: what this write changed in them
        after = _columns(con)
        said = [f"added table {t}" for t in sorted(set(after) - set(before))]
        said += [f"added column {t}.{c}" for t in sorted(before) for c in sorted(after.get(t, set()) - before[t])]
        said += [f"let requests.{c} be unknown (NULL)" for c in relaxed]
        said += ["dropped the key of identities (kept unique by every ingest)"] if keyed else []
        report.extend(x for x in said if x not in report)


class ForeignDatabaseError(StoreError):
    """A database that holds tables but is no specdec store: no write may change it."""


def refuse_foreign(con: duckdb.DuckDBPyConnection, tables: dict[str, set[str]]) -> None:
    """Raise ForeignDatabaseError when the database holds tables and is not a specdec store (of any version)."""
    if tables and not is_specdec_store(con, tables):
        names = sorted(tables)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ForeignDatabaseError(f"not a specdec store (it holds other tables: {shown}); left as it was")


def _sql_literal(text: str) -> str:
    return text.replace("'", "''")


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    """The single value a query returns (fetched fully: DuckDB keeps a half-read result pending)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None
