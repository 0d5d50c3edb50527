"""The DuckDB file behind triage: schema, and connections that never see a half-written batch.

Writers work on a copy of the database and swap it in with an atomic rename, under an
exclusive lock file; readers use a read-only view of one state of the file, kept per
thread until the file changes. A dashboard process can therefore read while
`specdec ingest` writes in another process, and sees either the state before the
batch or after it, never a part of it. A file written by an older version has its
derived tables (hit_sources, summaries) rebuilt the first time it is read.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from .contamination import judge_hits
from .summary import SUMMARY_VERSION, build_summaries

DEFAULT_DB = "data/specdec.duckdb"
SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key VARCHAR PRIMARY KEY, value VARCHAR);
CREATE TABLE IF NOT EXISTS requests (
    -- Unique by ingest's own dedupe; no index: an ART index over 1M ids costs more than it saves.
    request_id VARCHAR NOT NULL,
    ts TIMESTAMPTZ NOT NULL,
    prompt VARCHAR,
    prompt_hash VARCHAR NOT NULL,
    target_model VARCHAR NOT NULL,
    draft_model VARCHAR,
    num_speculative_tokens BIGINT,
    temperature DOUBLE NOT NULL,
    top_p DOUBLE NOT NULL,
    top_k BIGINT,
    max_tokens BIGINT NOT NULL,
    seed HUGEINT,
    stop VARCHAR[],
    tokenizer_version VARCHAR NOT NULL,
    deployment VARCHAR,
    cache_key VARCHAR NOT NULL,
    cache_hit BOOLEAN NOT NULL,
    cached_fingerprint JSON,
    output_text VARCHAR NOT NULL,
    output_tokens BIGINT NOT NULL,
    finish_reason VARCHAR,
    latency_ms DOUBLE,
    draft_tokens BIGINT,
    accepted_tokens BIGINT,
    extra JSON,
    fingerprint VARCHAR NOT NULL,
    cached_identity_fingerprint VARCHAR,
    source_file VARCHAR NOT NULL,
    source_line BIGINT NOT NULL,
    ingest_id BIGINT NOT NULL
);
CREATE TABLE IF NOT EXISTS identities (
    fingerprint VARCHAR PRIMARY KEY,
    identity JSON NOT NULL,
    greedy BOOLEAN NOT NULL,
    prompt VARCHAR, target_model VARCHAR, draft_model VARCHAR, num_speculative_tokens BIGINT,
    temperature DOUBLE, top_p DOUBLE, top_k BIGINT, max_tokens BIGINT, seed HUGEINT,
    stop VARCHAR, tokenizer_version VARCHAR
);
CREATE TABLE IF NOT EXISTS quarantine (
    ingest_id BIGINT NOT NULL,
    source_file VARCHAR NOT NULL,
    source_line BIGINT NOT NULL,
    request_id VARCHAR,
    reason VARCHAR NOT NULL,
    raw VARCHAR NOT NULL,
    raw_hash VARCHAR NOT NULL
);
CREATE TABLE IF NOT EXISTS ingests (
    ingest_id BIGINT PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    paths VARCHAR[] NOT NULL,
    n_read BIGINT, n_accepted BIGINT, n_duplicates BIGINT, n_quarantined BIGINT
);
-- One row per cache hit: the miss that populated its entry, and whether it served another identity.
CREATE TABLE IF NOT EXISTS hit_sources (
    request_id VARCHAR NOT NULL,
    source_request_id VARCHAR,
    contaminated BOOLEAN NOT NULL,
    fingerprint_mismatch BOOLEAN NOT NULL,
    differing_fields VARCHAR,
    first_sight BOOLEAN,  -- a hit on an identity its deployment had not seen before in the log
    source_ts TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS replays (
    replay_id VARCHAR PRIMARY KEY,
    request_id VARCHAR NOT NULL,
    replayed_at TIMESTAMPTZ NOT NULL,
    classification VARCHAR NOT NULL,
    replay_text VARCHAR,
    token_ids BIGINT[],
    production_text VARCHAR,
    first_divergent_token BIGINT,
    first_divergent_char BIGINT,
    common_prefix_tokens BIGINT,
    similarity DOUBLE,
    draft_tokens BIGINT,
    accepted_tokens BIGINT,
    source_request_id VARCHAR,
    evidence JSON,
    environment JSON
);
"""


# Columns added after a table first shipped: databases written by an older version gain them on
# their next write (hit_sources is rebuilt by every ingest).
_MIGRATIONS = """
ALTER TABLE hit_sources ADD COLUMN IF NOT EXISTS first_sight BOOLEAN;
ALTER TABLE hit_sources ADD COLUMN IF NOT EXISTS source_ts TIMESTAMPTZ;
"""


class StoreError(RuntimeError):
    """The database can't be opened or written; the message says which file and why."""


def resolve_db(path: str | os.PathLike[str] | None = None) -> Path:
    return Path(path or os.environ.get("SPECDEC_DB") or DEFAULT_DB)


# A 1M-row ingest stays well under 2 GB: DuckDB spills to disk beyond this.
WRITER_MEMORY_LIMIT = "1GB"


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
    con = duckdb.connect(":memory:")
    try:
        con.execute(f"ATTACH ? AS {_SNAPSHOT_ALIAS} (READ_ONLY)", [key])
    except duckdb.Error as exc:
        con.close()
        raise StoreError(f"{path}: cannot open for reading: {exc}") from exc
    if held is not None:
        held.current = False
        if held.in_use == 0:
            held.con.close()
    views[key] = view = _View(version, con)
    return view


def _derived_current(con: duckdb.DuckDBPyConnection, path: Path, alias: str = _SNAPSHOT_ALIAS) -> bool:
    """Whether the tables derived from `requests` were built by this version (or there is nothing to derive)."""
    try:
        version = con.execute(f"SELECT value FROM {alias}.meta WHERE key = 'summary_version'").fetchall()
        if version and version[0][0] == SUMMARY_VERSION:
            return True
        return not con.execute(f"SELECT count(*) FROM (SELECT 1 FROM {alias}.requests LIMIT 1)").fetchall()[0][0]
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


class Store:
    """A triage database file. Cheap to construct; connections are opened per use."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = resolve_db(path)

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r})"

    @property
    def exists(self) -> bool:
        return self.path.exists()

    def version(self) -> tuple[int, int]:
        """Changes whenever a writer swaps a new state in: a cache key for readers."""
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
        """
        self.ensure()
        view = _snapshot(self.path, self.version())
        if not view.checked:
            view.checked = True
            if not _derived_current(view.con, self.path) and self._rebuild_derived():
                view = _snapshot(self.path, self.version())
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

    def _rebuild_derived(self) -> bool:
        """Bring a database written by an older version up to date: rejudge its hits, rebuild its summaries.

        Readers cannot migrate a read-only view, and an old `hit_sources` lacks columns the
        pages read. Returns whether it was done; a file that can't be written stays as it is.
        """
        try:
            with self.write() as con:
                if not _derived_current(con, self.path, alias="main"):
                    judge_hits(con)
                    build_summaries(con)
        except (StoreError, OSError, duckdb.Error) as exc:
            log.warning("%s: written by an older specdec and could not be brought up to date: %s", self.path, exc)
            return False
        log.info("%s: rejudged hits and rebuilt summaries for this version", self.path)
        return True

    @contextmanager
    def write(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection whose changes become visible all at once when the block exits cleanly."""
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a folder, not a database file")
        lock_path = self.path.with_name(self.path.name + ".lock")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            lock = open(lock_path, "w")  # noqa: SIM115 - closed by the with below
        except OSError as exc:
            raise StoreError(f"{self.path}: cannot write here: {exc.strerror or exc}") from exc
        with lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
            tmp.unlink(missing_ok=True)
            try:
                if self.path.exists():
                    shutil.copyfile(self.path, tmp)
                con = duckdb.connect(str(tmp))
            except (OSError, duckdb.Error) as exc:
                tmp.unlink(missing_ok=True)
                # DuckDB names the working copy; the user knows the file they passed.
                reason = str(exc).replace(str(tmp.resolve()), str(self.path))
                raise StoreError(f"{self.path}: cannot open for writing: {reason}") from exc
            try:
                _configure(con)
                con.execute(f"SET memory_limit = '{WRITER_MEMORY_LIMIT}'")
                con.execute(f"SET temp_directory = '{_sql_literal(str(tmp) + '.spill')}'")
                con.execute(_SCHEMA)
                con.execute(_MIGRATIONS)
                con.execute(
                    "INSERT OR REPLACE INTO meta VALUES ('schema_version', ?)", [str(SCHEMA_VERSION)]
                )
                yield con
                con.execute("CHECKPOINT")
                con.close()
                os.replace(tmp, self.path)
            except BaseException:
                con.close()
                tmp.unlink(missing_ok=True)
                raise
            finally:
                Path(str(tmp) + ".wal").unlink(missing_ok=True)
                shutil.rmtree(str(tmp) + ".spill", ignore_errors=True)


def _sql_literal(text: str) -> str:
    return text.replace("'", "''")


def scalar(con: duckdb.DuckDBPyConnection, sql: str, params: list | None = None):
    """The single value a query returns (fetched fully: DuckDB keeps a half-read result pending)."""
    rows = con.execute(sql, params or []).fetchall()
    return rows[0][0] if rows else None
