"""A process's read-only views of file stores: one per file and state, shared by the process's threads.

Every thread reads through its own cursor of one DuckDB instance, whose buffers outlive the thread. Kept per
thread, each Streamlit rerun (a thread of its own) opened the store anew and read its blocks again: the Impact
page's first render at 20M rows, twice in one process, took 2.1 s both times so, 1.9 s and then 1.4 s shared.
A writer's swap gives the next read a new view; the one it replaces closes when its last read ends.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import duckdb

from specdec_core.store.instance import SharedInstance, take_shared

_lock = threading.Lock()
# Under _lock: the current view of each file (its resolved path), and the inodes of the files open views read,
# current or not. A repeated writer's spare is written only when no view of this process reads it (spare.py):
# DuckDB's lock on a file, which says so for other processes, is lost when this process closes any handle of
# the file (POSIX), as every write's copy does.
_views: dict[str, View] = {}
_reading: dict[int, int] = {}
# A view of a file since replaced is let go of by the process's next read of the store; the dashboard's Live
# view reads every 5 s, and a follow's next write but one wants that file (spare.py) within a second or two.
# So a thread lets go of such views every half second: an idle one closes then, one in use when its read ends.
LET_GO_EVERY_S = 0.5
_letting_go: threading.Thread | None = None


class View(SharedInstance):
    """One read-only state of a file, shared by the process's reads."""

    def __init__(self, version: tuple[int, int], con: duckdb.DuckDBPyConnection, files: set[int]) -> None:
        super().__init__(con, _lock)
        self.version, self.files = version, files
        self.summarized: bool | None = None  # whether its summaries are this code's (None: not checked yet)
        self.edges: dict[object, str] = {}  # schema.READ_EDGES
        self.edges_lock = threading.Lock()
        self.closed = False
        for inode in files:
            _reading[inode] = _reading.get(inode, 0) + 1

    def retire(self) -> None:
        super().retire()
        if self.in_use == 0 and not self.closed:
            self.closed = True
            for inode in self.files:
                left = _reading.pop(inode) - 1
                if left:
                    _reading[inode] = left


def take(key: str, version: tuple[int, int], open_con: Callable[[], duckdb.DuckDBPyConnection]) -> View:
    """The view of the file `key` as of `version` (its mtime and inode), opened by `open_con` where there is none
    of that state, counted as in use: release() it."""

    def open_view() -> View:
        con = open_con()
        try:  # the file opened is the one stat()ed before it or, replaced in between, the one now there
            files = {version[1], os.stat(key).st_ino}
        except OSError:
            files = {version[1]}
        return View(version, con, files)

    global _letting_go
    with _lock:
        if _letting_go is None or not _letting_go.is_alive():  # not yet, or not in a forked child
            _letting_go = threading.Thread(target=_let_go_of_replaced, name="specdec-views", daemon=True)
            _letting_go.start()
    return take_shared(_views, key, _lock, lambda held: held.version == version, open_view)


def file_version(path: str | os.PathLike[str]) -> tuple[int, int]:
    """The state of the file at `path` as views are kept by (Store.version): its mtime and inode; (0, 0) where
    there is none."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0)
    return (st.st_mtime_ns, st.st_ino)


def let_go_if_replaced(key: str) -> None:
    """Let go of the view of the file `key` unless its file is still the one there. stat()ed under the lock: a
    view of the state it finds can't have been taken meanwhile."""
    with _lock:
        view = _views.get(key)
        if view is not None and view.version != file_version(key):
            view.retire()
            del _views[key]


def let_go_of_all() -> None:
    with _lock:
        for view in _views.values():
            view.retire()
        _views.clear()


def reading_file(inode: int) -> bool:
    """Whether a view of this process, current or not, reads the file with this inode."""
    with _lock:
        return inode in _reading


def _let_go_of_replaced() -> None:
    while True:
        time.sleep(LET_GO_EVERY_S)
        with _lock:
            held = list(_views)
        for key in held:
            try:
                let_go_if_replaced(key)
            except OSError:  # a folder no longer readable: the view stays until its next read
                pass
