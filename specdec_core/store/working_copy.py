"""A file store's writes go to a working copy that replaces the file at once: making, copying and removing it.

The copy shares the file's blocks where the filesystem makes reflinks (btrfs, XFS); elsewhere it costs
the file's size in time and space, which copy_cost_note says before a long follow.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any, Protocol

import duckdb

from specdec_core.store.instance import instance_config
from specdec_core.store.sql import has_table, literal

log = logging.getLogger(__name__)
# The name a connection gives the store's file it attaches (readers and writers alike).
STORE_ALIAS = "store"

# Rows per row group that a write into a store holding rows makes (DuckDB's default, 122,880, for a new store).
# A batch's rows go into the last row group; at the default size the checkpoint of such a group grows as it
# fills, and was bench_follow's lag; smaller groups keep each checkpoint short (figures: docs/benchmarks.md,
# "Figures behind the code's choices").
APPEND_ROW_GROUP_SIZE = 16_384

# The storage format a write leaves the file in: DuckDB 1.5's, not the 1.0 format DuckDB writes by default for
# older readers (only 1.5.5 reads these stores, pinned). It stores a column of repeated texts as a dictionary of
# FSST-compressed strings (a cache hit repeats its source's output): the 20M-row store is 15% smaller and
# Search's scan of every output a quarter faster; and an append's checkpoint, which recompresses each table's
# last row group, takes a third of the time (figures: docs/benchmarks.md).
STORAGE_VERSION = "v1.5.0"


# A writer's working copy of `<db>` is `<db>.<pid>.tmp` (with its WAL and spill folder; a repeated writer's
# spare: spare.py). Leftovers of killed writers are removed under the exclusive lock, so no live writer other
# than one whose pid is alive is between its copy and its rename.
WORKING_COPY_SUFFIX = r"\.tmp(?:\.wal|\.spill|\.fresh|\.spare)?"

# A write that rebuilt every derived table (a migration, a copy into a store) leaves their old blocks free in
# the file, and the new ones in an append's small row groups: the file grows and every later append's
# checkpoint slows (figures: docs/benchmarks.md). Such a write asks for its tables to be written into a
# fresh file, which it commits instead, once.
_COMPACT_MARK = "specdec_write_fresh_file"


def compact_after_write(con: duckdb.DuckDBPyConnection) -> None:
    """Within a write: commit the store's tables as a fresh file (a file store holding rows; a lake ignores it)."""
    con.execute(f"CREATE OR REPLACE TEMP TABLE {_COMPACT_MARK} (asked BOOLEAN)")


def _compaction_asked(con: duckdb.DuckDBPyConnection) -> bool:
    return has_table(con, f"temp.{_COMPACT_MARK}")


def _write_fresh(con: duckdb.DuckDBPyConnection, tmp: Path) -> Path:
    """The working copy's tables written into a new file beside it (in a private folder until renamed);
    the working copy itself where that fails (a full disk): the write is kept, only not compacted."""
    folder = Path(str(tmp) + ".fresh")
    fresh = folder / "store.duckdb"
    try:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(mode=0o700)
        con.execute(f"ATTACH {literal(str(fresh))} AS fresh_store (STORAGE_VERSION '{STORAGE_VERSION}')")
        con.execute(f"COPY FROM DATABASE {STORE_ALIAS} TO fresh_store")
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
    rows = f"ROW_GROUP_SIZE {APPEND_ROW_GROUP_SIZE}, " if appending else ""
    con = attached(str(tmp), f"{rows}STORAGE_VERSION '{STORAGE_VERSION}'")
    con.execute(f"USE {STORE_ALIAS}")
    return con


def attached(path: str, options: str) -> duckdb.DuckDBPyConnection:
    """A private in-memory database with the file at `path` attached as `store` (`options`: ATTACH's)."""
    con = duckdb.connect(":memory:", config=instance_config())
    try:
        con.execute(f"ATTACH {literal(path)} AS {STORE_ALIAS}{f' ({options})' if options else ''}")
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


class _StoreFile(Protocol):
    """What the note reads of a store (connection.Store, which imports this module)."""

    path: Path
    lake: Any


def copy_cost_note(store: _StoreFile, min_bytes: int = COPY_NOTE_BYTES) -> str | None:
    """One line for a writer that will write again and again (--follow), when its writes copy a large store file
    (spare.py: the first one whole); None for a lake, a small file, or a filesystem whose copies share blocks."""
    if store.lake is not None or not store.path.is_file():
        return None
    size = store.path.stat().st_size
    if size < min_bytes or copies_share_blocks(store.path.resolve().parent):
        return None
    lake = store.path.with_suffix(".sqlite")
    kind = filesystem_type(store.path.resolve().parent)
    named = f" ({kind})" if kind != "?" else ""
    return (f"note: the first batch copies {store.path} ({size / 2**20:,.0f} MiB) whole, since this filesystem{named} "
            f"makes no reflinks (XFS and btrfs do), and later ones keep a second copy beside it while the follow "
            f"runs; a DuckLake store appends instead: "
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
