"""The triage store on DuckLake: readers see one committed snapshot, writers append what they add.

A store is a DuckLake catalog (a SQLite file locally, PostgreSQL when shared) and the Parquet files
its commits wrote. Every read runs in one transaction, so it sees the store as of one commit and never
half a batch; readers take no lock, so a writer never blocks them. Writers on one machine queue on a
lock file; writers on several machines (a PostgreSQL catalog) are ordered by DuckLake's own conflict
check, and `retrying` runs the loser again. Reads never write: a store written by an older version is
brought up to date by `migrate` (`specdec migrate`, and every ingest).
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import stat
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import duckdb

from specdec_core.store import lake
from specdec_core.store.lake import ALIAS, DEFAULT_DB, LakeError, Location
from specdec_core.store.schema import expected_columns, relax_not_null_sql, schema_sql
from specdec_core.store.summaries import SUMMARY_VERSION

SCHEMA_VERSION = 2  # 2: DuckLake (1: one DuckDB file)
__all__ = ["DEFAULT_DB", "SCHEMA_VERSION", "Store", "StoreError", "resolve_db", "retrying", "scalar"]
log = logging.getLogger(__name__)
T = TypeVar("T")


class StoreError(RuntimeError):
    """The store can't be opened or written; the message says which one and why."""


def resolve_db(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("SPECDEC_DB") or DEFAULT_DB)


# A 1M-row ingest stays well under 2 GB: DuckDB spills to disk beyond this.
WRITER_MEMORY_LIMIT = "1GB"
_DUCKDB_MAGIC = b"DUCK"


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # it would write into --json output


_instances: dict[tuple[Location, bool], duckdb.DuckDBPyConnection] = {}
_instances_lock = threading.Lock()


def _instance(location: Location, read_only: bool) -> duckdb.DuckDBPyConnection:
    """One DuckDB instance per store and mode for the whole process: attaching costs ~100 ms, a cursor nothing."""
    key = (location, read_only)
    with _instances_lock:
        con = _instances.get(key)
        if con is None:
            try:
                con = lake.open_lake(location, read_only=read_only)
            except LakeError as exc:
                raise StoreError(str(exc)) from None
            except duckdb.Error as exc:
                raise StoreError(f"{location.catalog}: cannot open the store: {_first_line(exc)}") from None
            _configure(con)
            _instances[key] = con
        return con


def release_snapshots() -> None:
    """Close every store instance this process holds (e.g. before a store's files are moved)."""
    with _instances_lock:
        for con in _instances.values():
            con.close()
        _instances.clear()


def derived_current(con: duckdb.DuckDBPyConnection, path: Path | str | None = None) -> bool:
    """Whether the tables derived from `requests` were built by this version (or there is nothing to derive)."""
    try:
        version = con.execute("SELECT value FROM meta WHERE key = 'summary_version'").fetchall()
        if version and version[0][0] == SUMMARY_VERSION:
            return True
        return not con.execute("SELECT count(*) FROM (SELECT 1 FROM requests LIMIT 1)").fetchall()[0][0]
    except duckdb.CatalogException:
        raise StoreError(f"{path}: a store without a meta or requests table; load logs with `specdec ingest`") from None


def is_legacy_file(path: Path) -> bool:
    """Whether `path` is a store of schema 1: one DuckDB database file."""
    try:
        with open(path, "rb") as f:
            return f.read(12)[8:12] == _DUCKDB_MAGIC
    except OSError:
        return False


class Store:
    """A triage store. Cheap to construct; connections come from a per-process instance."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        configured = None if path or os.environ.get("SPECDEC_DB") else _configured()
        if configured is not None:
            self.location = configured
            self.path = Path(configured.catalog)
        else:
            self.path = resolve_db(path)
            self.location = lake.local_location(self.path)

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    @property
    def exists(self) -> bool:
        return not self.location.local or os.path.isfile(self.location.catalog)

    @property
    def legacy(self) -> bool:
        return self.location.local and is_legacy_file(Path(self.location.catalog))

    def version(self) -> tuple[int, int]:
        """The latest committed snapshot: changes with every commit, a cache key for readers."""
        if not self.exists or self.legacy:
            return (0, 0)
        con = _instance(self.location, True).cursor()
        try:
            snapshot = scalar(con, f"SELECT max(snapshot_id) FROM __ducklake_metadata_{ALIAS}.ducklake_snapshot")
        except duckdb.Error:
            return (0, 0)
        finally:
            con.close()
        return (int(snapshot or 0), 0)

    def ensure(self) -> None:
        """Create the store with its schema when it does not exist yet."""
        if not self.exists:
            with self.write():
                pass

    @contextmanager
    def read(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection to the store as of its latest commit, held for the whole block."""
        if not self.exists:
            raise StoreError(f"{self.path}: no such database; load logs with `specdec ingest PATH --db {self.path}`")
        if self.legacy:
            raise StoreError(_legacy_refusal(self.path))
        con = _instance(self.location, True).cursor()
        try:
            con.execute(f"USE {ALIAS}")
            _configure(con)
            _retry_locked(lambda: con.execute("BEGIN TRANSACTION"))
            if not derived_current(con, self.path):
                raise StoreError(f"{self.path}: written by an older specdec; bring it up to date with "
                                 f"`specdec migrate --db {self.path}`")
            yield con
        finally:
            con.close()

    @contextmanager
    def write(self, begin: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection whose changes become visible all at once when the block exits cleanly.

        `begin` False: the caller prepares in temp tables first and calls `begin_batch` before it
        reads or writes the store (an error in a transaction aborts it, and staging tries readers
        that may fail). A store made private (chmod 600 on its catalog) keeps every file it writes private.
        """
        if self.location.local and os.path.isdir(self.location.catalog):
            raise StoreError(f"{self.path}: is a folder, not a database file")
        with self._writer_lock(), _private_files(self.location):
            if self.legacy:
                from specdec_core.store.legacy import convert_legacy

                convert_legacy(self)
            con = _instance(self.location, False).cursor()
            try:
                con.execute(f"USE {ALIAS}")
                _configure(con)
                con.execute(f"SET memory_limit = '{WRITER_MEMORY_LIMIT}'")
                ensure_schema(con)
                if begin:
                    begin_batch(con)
                yield con
                _commit(con)
            except BaseException as exc:
                _rollback(con)
                full = _out_of_space(exc)
                if full:
                    raise StoreError(f"{self.path}: cannot write: {full}; the store is unchanged") from exc
                raise
            finally:
                con.close()

    @contextmanager
    def _writer_lock(self) -> Iterator[None]:
        if not self.location.local:
            yield  # machines share no lock file: DuckLake's commit check orders them (see _claim)
            return
        catalog = Path(self.location.catalog)
        try:
            catalog.parent.mkdir(parents=True, exist_ok=True)
            lock = open(str(catalog) + ".lock", "w")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write here: {exc.strerror or exc}") from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield


def _configured() -> Location | None:
    try:
        return lake.configured_location()
    except LakeError as exc:
        raise StoreError(str(exc)) from None


def _legacy_refusal(path: Path) -> str:
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error:
        con = None  # written by a newer DuckDB: the previous release's
    if con is not None:
        try:
            tables = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
        finally:
            con.close()
        if not {"meta", "requests"} <= tables:
            return f"{path}: a DuckDB file, but not a specdec database (no meta or requests table)"
    return f"{path}: written by an older specdec; bring it up to date with `specdec migrate --db {path}`"


def begin_batch(con: duckdb.DuckDBPyConnection) -> None:
    """Open the write's transaction: from here on it sees the store as of one commit."""
    con.execute("BEGIN TRANSACTION")
    _claim(con)


def _commit(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("COMMIT")
    except duckdb.TransactionException as exc:
        if "no transaction is active" not in str(exc):
            raise


def _claim(con: duckdb.DuckDBPyConnection) -> None:
    """Delete and rewrite one row every writer touches: two writers at once conflict at commit, one retries.

    Appends alone never conflict in DuckLake, but an ingest reads what is stored (duplicates, ids,
    earlier misses) before it appends, so two must not interleave.
    """
    con.execute("DELETE FROM meta WHERE key = 'last_writer'")
    con.execute("INSERT INTO meta VALUES ('last_writer', ?)", [f"{os.uname().nodename}:{os.getpid()}"])


def _rollback(con: duckdb.DuckDBPyConnection) -> None:
    try:
        con.execute("ROLLBACK")
    except duckdb.Error:
        pass  # no transaction open, or it ended with the error


def _retryable(exc: BaseException) -> bool:
    text = str(exc).lower()
    return isinstance(exc, duckdb.Error) and ("database is locked" in text or "conflict" in text
                                              or "busy" in text)


def _retry_locked(action: Callable[[], T], attempts: int = 50) -> T:
    for attempt in range(attempts):
        try:
            return action()
        except duckdb.Error as exc:
            if not _retryable(exc) or attempt == attempts - 1:
                raise
            time.sleep(min(0.02 * (attempt + 1), 0.5))
    raise AssertionError("unreachable")


def retrying(action: Callable[[], T], attempts: int = 20) -> T:
    """Run a whole write again when the catalog was busy or another writer committed first."""
    return _retry_locked(action, attempts)


@contextmanager
def _private_files(location: Location) -> Iterator[None]:
    """Files written while the catalog grants others nothing grant them nothing either."""
    try:
        mode = stat.S_IMODE(os.stat(location.catalog).st_mode) if location.local else None
    except OSError:
        mode = None
    if mode is None or mode & 0o077:
        yield
        return
    old = os.umask(0o077)
    try:
        yield
    finally:
        os.umask(old)


def _out_of_space(exc: BaseException) -> str | None:
    """The OS's words when `exc` says the disk (or the user's quota) is full; None otherwise."""
    full = (errno.ENOSPC, errno.EDQUOT)
    if isinstance(exc, OSError):
        return os.strerror(exc.errno) if exc.errno in full else None
    if not isinstance(exc, duckdb.Error):
        return None
    text = str(exc)
    for code in full:
        if os.strerror(code) in text:
            return os.strerror(code)
    if isinstance(exc, duckdb.IOException) and "Could not write all bytes" in text:
        return os.strerror(errno.ENOSPC)
    return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0]


def ensure_schema(con: duckdb.DuckDBPyConnection) -> None:
    """Create missing tables and columns; one catalog query when nothing is missing, so every write does it."""
    have = con.execute("SELECT table_name, column_name, NOT is_nullable FROM duckdb_columns() "
                       "WHERE database_name = current_database()").fetchall()
    present = {(t, c) for t, c, _ in have}
    missing = not expected_columns() <= present
    relax = relax_not_null_sql({c: nn for t, c, nn in have if t == "requests"})
    if not missing and not relax:
        return
    # One commit for all of it: each statement alone is a catalog commit (~70 ms on SQLite).
    con.execute("BEGIN TRANSACTION")
    try:
        for statement in [*schema_sql().split(";"), relax] if missing else [relax]:
            if statement.strip():
                con.execute(statement)
        con.execute("DELETE FROM meta WHERE key = 'schema_version'")
        con.execute("INSERT INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)])
        con.execute("COMMIT")
    except BaseException:
        _rollback(con)
        raise


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    """The single value a query returns (fetched fully: DuckDB keeps a half-read result pending)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None
