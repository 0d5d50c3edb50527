"""The collector's spool: append-only files where each acknowledged export is on disk (fsynced) before its
answer, read by the follow path. Group commit: appends that arrive while one fsync runs share the next."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from pathlib import Path


class SpoolInUse(OSError):
    """Another collector holds the spool."""


SPOOL_PREFIX = "spool-"
# A spool file is closed for a new one past this size, so what has been ingested can be deleted.
ROTATE_BYTES = 64 << 20


class Spool:
    """Append-only spool files in one folder, written with group commit: each append returns once it is
    fsynced, and appends that arrive while one fsync runs share the next."""

    def __init__(self, folder: Path, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.folder = folder
        self.rotate_bytes = rotate_bytes
        folder.mkdir(parents=True, exist_ok=True)
        # One collector a spool: a second would cut the first's line under way as a dead one's partial tail.
        self._lock_fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise SpoolInUse(f"{folder}: another specdec collect is using this spool") from None
        _cut_partial_tails(folder)
        self._lock = threading.Lock()
        self._synced = threading.Condition(self._lock)
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._written = 0  # bytes appended by this process, in order
        self._synced_to = 0  # of those, bytes known durable
        self._syncing = False
        self._failed: OSError | None = None

    @property
    def current(self) -> Path | None:
        return self._path

    @property
    def written(self) -> int:
        return self._written

    def _open_new(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._synced_to = self._written
        name = f"{SPOOL_PREFIX}{time.time_ns():020d}-{os.getpid()}.jsonl"
        path = self.folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        header = json.dumps({"resourceSpans": [], "specdec_spool": name}).encode() + b"\n"
        os.write(fd, header)
        os.fsync(fd)
        dir_fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the file's name is durable too, not only its bytes
        finally:
            os.close(dir_fd)
        self._fd, self._path, self._size = fd, path, len(header)

    def append(self, line: bytes) -> None:
        """Write one line and return once it is on disk; OSError if it could not be made durable."""
        with self._lock:
            if self._failed is not None:
                raise OSError(f"spool {self.folder}: {self._failed}")
            if self._fd is None or self._size >= self.rotate_bytes:
                self._open_new()
            os.write(self._fd, line)
            self._size += len(line)
            self._written += len(line)
            mine = self._written
            while self._synced_to < mine:
                if self._syncing:
                    self._synced.wait()
                    if self._failed is not None:
                        raise OSError(f"spool {self.folder}: {self._failed}")
                    continue
                self._syncing, target, fd = True, self._written, self._fd
                self._lock.release()
                try:
                    os.fsync(fd)
                except OSError as exc:
                    self._failed = exc
                finally:
                    self._lock.acquire()
                    self._syncing = False
                    if self._failed is None:
                        self._synced_to = max(self._synced_to, target)
                    self._synced.notify_all()
                if self._failed is not None:
                    raise OSError(f"spool {self.folder}: {self._failed}")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd, self._path = None, None

    def release(self) -> None:
        """Let another collector use the spool (after close, once what it holds is ingested)."""
        os.close(self._lock_fd)


def _cut_partial_tails(folder: Path) -> None:
    """A spool file left by a collector killed mid-write ends in a part of a line it never acknowledged:
    cut it, so the file ends in whole lines (a new collector writes to a new file)."""
    for path in sorted(folder.glob(f"{SPOOL_PREFIX}*.jsonl")):
        with open(path, "rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if not size:
                continue
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                continue
            at = size
            while at > 0:
                step = min(1 << 16, at)
                fh.seek(at - step)
                block = fh.read(step)
                end = block.rfind(b"\n")
                if end >= 0:
                    at = at - step + end + 1
                    break
                at -= step
            fh.truncate(at)
            os.fsync(fh.fileno())
