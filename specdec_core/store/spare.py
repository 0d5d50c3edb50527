"""A repeated writer's spare: the file its last write replaced, kept to become its next write's working copy.

Where copies share no blocks (ext4), each write into a DuckDB file copies the whole file first (working_copy.py):
6 s for the 2.5 GB of 20M rows, a follow's lag. But the file a write replaced differs from the file it wrote only
where that write changed it (DuckDB checkpoints into free blocks and the file's end, then rewrites its header).
So a writer that writes again and again (`--follow`, `specdec collect`) keeps the replaced file under a private
name, and its next write makes it the store's copy by writing only the chunks that differ from the store, found
by reading both (0.6 s at 20M rows on two cores). The result is the store byte for byte, whatever DuckDB wrote.

The spare is written only when nothing else reads it. A reader of the old state in another process (a
dashboard) holds DuckDB's shared lock on the file, and an open-file-description write lock, which conflicts with
it, is asked first (again for a moment, where the store is large: such a reader is most often in the middle of a
read). This process's own reads are counted by views.py: its DuckDB locks are lost when it closes any handle of
the file. Refused, or where the spare is another name's file too (a hard link), it is dropped and the store
copied as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from specdec_core.store.working_copy import copy_bytes

# Compared and written in chunks of this size: a chunk that differs is written whole.
_CHUNK = 4 << 20


def spare_path(target: Path) -> Path:
    """This process's spare of the store file `target` (removed with a dead writer's leftovers)."""
    return target.with_name(f"{target.name}.{os.getpid()}.tmp.spare")


def keep_replaced(target: Path, spare: Path) -> bool:
    """Before a write's rename: keep the file `target` names now as `spare`; whether it could."""
    try:
        spare.unlink(missing_ok=True)
        os.link(target, spare)
    except OSError:
        return False
    return True


# A reader holding the spare is most often in the middle of a read (a page at 20M rows: up to 2 s), and the
# copy the write makes instead costs about 2 s a GB here: the lock is asked again for at most the copy's cost
# at 500 MB/s, and at most a second.
_WAIT_BYTES_PER_S, _WAIT_AT_MOST_S = 500e6, 1.0


def _lock_alone(fd: int, wait: float = 0.0) -> bool:
    """Whether no one else holds a lock on the file (a DuckDB reader holds a shared one), asked again for up to
    `wait` seconds; held until fd closes. False where there are no open-file-description locks (Linux has them
    since 3.15; macOS has none)."""
    ofd_lock = getattr(fcntl, "F_OFD_SETLK", None)
    if ofd_lock is None:
        return False
    until = time.monotonic() + wait
    while True:
        try:
            fcntl.fcntl(fd, ofd_lock, struct.pack("hhqqixxxx", fcntl.F_WRLCK, os.SEEK_SET, 0, 0, 0))
            return True
        except OSError as exc:
            if exc.errno not in (errno.EAGAIN, errno.EACCES) or time.monotonic() >= until:
                return False
        time.sleep(0.01)


def take_spare(spare: Path, target: Path, tmp: Path) -> bool:
    """Make `tmp` a copy of `target` out of `spare` (see the module); False where there is none or it can't be
    used (it is then dropped), and the caller copies the store."""
    try:
        fd = os.open(spare, os.O_RDWR | os.O_NOFOLLOW)
    except OSError:
        spare.unlink(missing_ok=True)
        return False
    try:
        own, store = os.fstat(fd), os.stat(target)
        usable = (own.st_nlink == 1 and own.st_dev == store.st_dev and own.st_ino != store.st_ino
                  and _lock_alone(fd, min(_WAIT_AT_MOST_S, store.st_size / _WAIT_BYTES_PER_S)))
        if usable:
            os.fchmod(fd, 0o600)  # private while written, as a copy is
            with open(target, "rb") as src:
                _make_equal(src.fileno(), fd)
            os.rename(spare, tmp)
            return True
    except OSError:
        pass
    finally:
        os.close(fd)
    spare.unlink(missing_ok=True)
    return False


def _make_equal(src: int, dst: int) -> None:
    """Write into `dst` the chunks of `src` it differs in, and its length: `dst` becomes `src` byte for byte."""
    size, old = os.fstat(src).st_size, os.fstat(dst).st_size
    common = min(size, old)
    workers = max(1, min(4, os.cpu_count() or 1))
    span = max(1, -(-common // (workers * _CHUNK))) * _CHUNK  # each worker's share, in whole chunks

    def part(start: int) -> None:
        mine, theirs = bytearray(_CHUNK), bytearray(_CHUNK)
        for at in range(start, min(common, start + span), _CHUNK):
            length = min(_CHUNK, common - at)
            if length < _CHUNK:
                mine, theirs = bytearray(length), bytearray(length)
            if os.preadv(src, [mine], at) != length or os.preadv(dst, [theirs], at) != length:
                raise OSError(f"short read at {at}")
            if mine != theirs:
                view = memoryview(mine)
                while view:
                    view = view[os.pwrite(dst, view, at + length - len(view)):]

    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(part, range(0, common, span)))
    if old > size:
        os.ftruncate(dst, size)
    elif size > old:
        os.lseek(dst, old, os.SEEK_SET)
        copy_bytes(src, dst, old)
