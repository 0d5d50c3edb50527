"""The store behind triage: connections that never see a half-written batch (the tables are ddl.py's).

Writers work on a copy of the database and swap it in with an atomic rename, under an
exclusive lock file; readers use a read-only view of one state of the file, one per process (each
thread reads through a cursor of its own) until the file changes. A dashboard process can therefore read while
`specdec ingest` writes in another process, and sees either the state before the
batch or after it, never a part of it. Reads never write: a file written by an older
version is brought up to date by `migrate` (`specdec migrate`, and every ingest).
"""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

import duckdb

from specdec_core import interrupts
from specdec_core.store import lake as lakes
from specdec_core.store import views
from specdec_core.store.convert import (
    SIDE_VERSION,
    ConversionError,
    convert_into,
    no_database_said,
    written_by_newer_duckdb,
)
from specdec_core.store.ddl import ensure_schema
from specdec_core.store.errors import ForeignDatabaseError, StoreError
from specdec_core.store.lake_files import damage_message
from specdec_core.store.leftovers import remove_dead_writers_files
from specdec_core.store.location import LocationError, lake_location, mask_secrets, resolve_db
from specdec_core.store.schema import READ_EDGES, READ_SUMMARIES, current_version_sql
from specdec_core.store.spare import keep_replaced, spare_path, take_spare
from specdec_core.store.sql import literal
from specdec_core.store.working_copy import (
    STORE_ALIAS,
    WORKING_COPY_SUFFIX,
    _compaction_asked,
    _copy_database,
    _keep_metadata,
    _open_working_copy,
    _out_of_space,
    _own_words,
    _remove_working_copy,
    _write_fresh,
    attached,
    copies_share_blocks,
)

T = TypeVar("T")


# What DuckDB may hold while writing; beyond it, it spills to disk. An ingest stays under 2 GB: where a
# Python reader stages the lines (another log format, CSV, Parquet), its own memory counts too and DuckDB
# keeps to the lower figure (ingestion/staging.py); DuckDB's own line reader leaves it the higher one. DuckDB 1.5
# goes further past its limit than 2.0 did (figures: docs/benchmarks.md, "Figures behind the code's choices").
WRITER_MEMORY_LIMIT = "1GB"
WRITER_MEMORY_LIMIT_NATIVE = "1400MB"


def _configure(con: duckdb.DuckDBPyConnection) -> None:
    con.execute("SET TimeZone = 'UTC'")
    con.execute("SET enable_progress_bar = false")  # it would write into --json output


log = logging.getLogger(__name__)


def _snapshot(path: Path, version: tuple[int, int]) -> views.View:
    """A read-only view of `path` as of `version` (its mtime and inode), counted as in use: release() it.

    The file is ATTACHed to a private in-memory database rather than opened by path:
    DuckDB hands every `connect(path)` the instance already open for that path, which
    would keep showing a state the writer has since replaced. A stale view closes once
    its last read ends.
    """
    key = str(path.resolve())

    def open_view() -> duckdb.DuckDBPyConnection:
        try:
            return attached(key, "READ_ONLY")
        except duckdb.Error as exc:
            if written_by_newer_duckdb(path):
                raise StoreError(f"{path}: written by DuckDB {SIDE_VERSION} (an older specdec); convert it "
                                 f"with `specdec migrate --db {path}`") from None
            said = no_database_said(path)
            if said:
                raise StoreError(said) from None
            raise StoreError(f"{path}: cannot open for reading: {exc}") from exc

    return views.take(key, version, open_view)


def derived_state(con: duckdb.DuckDBPyConnection, path: Path | str | None = None,
                  alias: str | None = STORE_ALIAS) -> tuple[bool, bool]:
    """(Whether the tables derived from `requests` may be read: built by this version, or there is nothing to
    derive; whether they were built by this version, the summaries with them).

    `alias` None: the connection's own database (a writer's)."""
    alias = f"{alias}." if alias else ""
    try:
        version = con.execute(current_version_sql(f"{alias}meta")).fetchall()
        if version and version[0][0]:
            return True, True
        return not con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {alias}requests LIMIT 1)").fetchall()[0][0], False
    except duckdb.CatalogException:
        raise StoreError(f"{path}: a DuckDB file, but not a specdec database (no meta or requests table)") from None


def derived_current(con: duckdb.DuckDBPyConnection, path: Path | None = None, alias: str | None = STORE_ALIAS
                    ) -> bool:
    """Whether the tables derived from `requests` were built by this version (or there is nothing to derive)."""
    return derived_state(con, path, alias)[0]


def _older_specdec(store: object) -> StoreError:
    return StoreError(f"{store}: written by an older specdec; bring it up to date with `specdec migrate --db {store}`")


@contextmanager
def _told_summaries(con: duckdb.DuckDBPyConnection, summarized: bool) -> Iterator[duckdb.DuckDBPyConnection]:
    """`con` for the read's block, with what its state's summaries were found to be (schema.READ_SUMMARIES)."""
    token = READ_SUMMARIES.set((con, summarized))
    try:
        yield con
    finally:
        READ_SUMMARIES.reset(token)


def release_snapshots() -> None:
    """Close the idle read-only views, letting go of their files (e.g. before writing one in place); one in use
    closes when its read ends."""
    views.let_go_of_all()
    lakes.forget_readers()


class Store:
    """A triage store: a DuckDB file, or a DuckLake (`ducklake:CATALOG`). Cheap to construct; connections are
    opened per use."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        try:
            self.name = resolve_db(path)
            self.lake = lake_location(self.name)
        except LocationError as exc:
            raise StoreError(mask_secrets(str(exc))) from None
        self.path = Path(self.name)
        self.keep_spare = False  # write_repeatedly()

    def __repr__(self) -> str:
        return f"Store({str(self)!r})"

    def __str__(self) -> str:
        """The store's name as messages show it: a catalog's password masked (`name` is what connects)."""
        return self.mask(self.name)

    def mask(self, text: str) -> str:
        """`text` with the password of this store's catalog (and any other) masked."""
        return self.lake.mask(text) if self.lake is not None else mask_secrets(text)

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
            with self._lake_reading() as held, held.con.cursor() as con:
                return (lakes.snapshot_id(con), 0)
        return views.file_version(self.path)

    def ensure(self) -> None:
        """Create the database with its schema when it does not exist yet."""
        if not self.path.exists():
            with self.write():
                pass

    @contextmanager
    def read(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection to a consistent state of the database.

        Opening one costs about 20 ms, more than a summary query, so the process keeps
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
        try:
            summarized = view.summarized
            if summarized is None:
                with view.con.cursor() as check:
                    current, summarized = derived_state(check, self.path)
                if not current:
                    raise _older_specdec(self.path)
                view.summarized = summarized
            con = view.con.cursor()
            try:
                con.execute(f"USE {STORE_ALIAS}")
                _configure(con)
                edges = READ_EDGES.set((con, view.edges, view.edges_lock))
                try:
                    with _told_summaries(con, summarized):
                        yield con
                finally:
                    READ_EDGES.reset(edges)
            finally:
                con.close()
        finally:
            view.release()

    @contextmanager
    def _lake_reading(self) -> Iterator[lakes._Reader]:
        """lakes.reading, a lake that can't be attached said as a StoreError."""
        try:
            with lakes.reading(self.lake) as held:
                yield held
        except lakes.LakeError as exc:
            raise StoreError(str(exc)) from None

    @contextmanager
    def _read_lake(self) -> Iterator[duckdb.DuckDBPyConnection]:
        if not self.exists:
            raise StoreError(f"{self}: no such store; load logs with `specdec ingest PATH --db {self}`")
        with self._lake_reading() as held:
            con = held.con.cursor()
            try:
                con.execute(f"USE {lakes.ALIAS}")
                _configure(con)
                con.execute("BEGIN TRANSACTION")
                snapshot = lakes.snapshot_id(con)
                checked_at, summarized = held.checked
                if checked_at != snapshot:
                    current, summarized = derived_state(con, str(self))
                    if not current:
                        raise _older_specdec(self)
                    held.checked = (snapshot, summarized)
                with _told_summaries(con, summarized):
                    yield con
            except duckdb.Error as exc:
                said = damage_message(exc, str(self))
                if said is None:
                    raise
                raise StoreError(self.mask(said)) from None
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

    def _spare_taken(self, target: Path, tmp: Path) -> bool:
        """Whether this process's spare became the working copy `tmp` (spare.take_spare): not while a read of
        this process holds it. Its view of an older state of the store, idle, is let go of first."""
        views.let_go_if_replaced(str(target))
        spare = spare_path(target)
        try:
            if views.reading_file(os.stat(spare).st_ino):
                return False
        except OSError:
            return False
        return take_spare(spare, target, tmp)

    def write_repeatedly(self) -> None:
        """Said by a writer that will write again and again (a follow): where a write copies the file whole (no
        reflinks), each keeps the file it replaced, to make the next one's working copy out of it (spare.py).
        drop_spare() when done."""
        self.keep_spare = self.lake is None and not copies_share_blocks(Path(os.path.realpath(self.path)).parent)

    def drop_spare(self) -> None:
        """Remove the file a repeated writer kept (keep_spare), and keep none from now on."""
        self.keep_spare = False
        if self.lake is None:
            spare_path(Path(os.path.realpath(self.path))).unlink(missing_ok=True)

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
            except BaseException as exc:
                said = translate(exc, self)
                if said is None:
                    raise
                raise said from said.__cause__
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
                if original is not None and not convert and not (
                        self.keep_spare and self._spare_taken(target, tmp)):
                    _copy_database(target, tmp)
                con = _open_working_copy(tmp, appending=original is not None)
                if convert:
                    os.chmod(tmp, 0o600)  # the converted rows are as private as the copy would be
            except BaseException as exc:
                _remove_working_copy(tmp)
                said = translate(exc, self, opening=tmp)
                if said is None:
                    raise
                raise said from said.__cause__
            try:
                _configure(con)
                con.execute(f"SET memory_limit = '{WRITER_MEMORY_LIMIT}'")
                con.execute(f"SET temp_directory = {literal(str(tmp) + '.spill')}")
                ensure_schema(con, new_file=original is None)
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
                interrupts.check()  # a Ctrl-C a library swallowed during the block: the store stays as it was
                kept = self.keep_spare and original is not None and not convert and keep_replaced(
                    target, spare_path(target))
                try:
                    os.replace(written, target)
                except BaseException:
                    if kept:
                        spare_path(target).unlink(missing_ok=True)
                    raise
            except BaseException as exc:
                con.close()
                _remove_working_copy(tmp)
                said = translate(exc, self)
                if said is None:
                    raise
                raise said from said.__cause__
            finally:
                _remove_working_copy(tmp)


def translate(exc: BaseException, store: Store, *, opening: Path | None = None) -> BaseException | None:
    """What a failed `Store.write` says in place of `exc`: one line naming the store. None lets `exc` through
    as it is (a lake's write conflict, which the caller retries; an error of the caller's own block).

    `opening`: the working copy a file store's write was opening when `exc` came, before the block ran.
    """
    if store.lake is not None:
        if isinstance(exc, lakes.WriteConflict):
            return None
        if isinstance(exc, lakes.LakeError):
            return _instead(StoreError(store.mask(str(exc))))
        if isinstance(exc, duckdb.Error):
            said = damage_message(exc, str(store))
            return None if said is None else _instead(StoreError(store.mask(said)))
        if isinstance(exc, ForeignDatabaseError):
            return _instead(ForeignDatabaseError(f"{store}: {exc}"))
        return None
    if opening is not None:
        said = no_database_said(Path(store.path)) if isinstance(exc, duckdb.Error) else None
        if said:
            return _instead(StoreError(said))
        if isinstance(exc, (OSError, duckdb.Error)):
            words = _own_words(exc, opening, store.path)
            return _instead(StoreError(f"{store.path}: cannot open for writing: {words}"), cause=exc)
        return None
    if isinstance(exc, ConversionError):
        return _instead(StoreError(str(exc)))
    if isinstance(exc, ForeignDatabaseError):
        return _instead(ForeignDatabaseError(f"{store.path}: {exc}"))
    full = _out_of_space(exc)
    if full:
        return _instead(StoreError(f"{store.path}: cannot write: {full} (the working copy needs about the "
                                   "database's size again); the database is unchanged"), cause=exc)
    return None


def _instead(said: BaseException, cause: BaseException | None = None) -> BaseException:
    """`said`, to be raised as `raise said from cause` would (no cause: the original is not shown)."""
    said.__cause__ = cause
    said.__suppress_context__ = True
    return said


def _prepare_lake_write(con: duckdb.DuckDBPyConnection) -> None:
    _configure(con)
    ensure_schema(con)
