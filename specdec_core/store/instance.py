"""What every DuckDB instance specdec opens starts with."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import TypeVar

import duckdb

from specdec_core.store.errors import StoreError
from specdec_core.text import ascii_digits


def instance_config() -> dict[str, int]:
    """At most $SPECDEC_THREADS threads where it is set, else DuckDB's default (one per core).

    For several specdec processes sharing a machine: a follower beside the service it watches, or the
    test suite's workers. On small batches a second thread mostly waits and wakes: one thread per ingest
    of 100 lines used 27% less CPU for the same work.
    """
    text = os.environ.get("SPECDEC_THREADS", "").strip()
    if not text:
        return {}
    if not ascii_digits(text) or int(text) < 1:
        raise StoreError(f"$SPECDEC_THREADS: expected a whole number >= 1, got {text!r}")
    return {"threads": int(text)}


def restore_threads(con: duckdb.DuckDBPyConnection) -> None:
    """Back to the instance's threads after a write that asked for fewer: $SPECDEC_THREADS where it is
    set (RESET alone would give every core), else DuckDB's default."""
    threads = instance_config().get("threads")
    con.execute(f"SET threads = {threads}" if threads else "RESET threads")


class SharedInstance:
    """A read-only DuckDB instance the threads of a process share, each read through a cursor of its own and
    counted while it runs (`in_use`, changed under the owner's `lock`). Retired (replaced, or let go of), it
    closes when its last read ends, not in the middle of one."""

    def __init__(self, con: duckdb.DuckDBPyConnection, lock: threading.Lock) -> None:
        self.con, self.lock, self.in_use, self.current = con, lock, 0, True

    def release(self) -> None:
        """A read's end."""
        with self.lock:
            self.in_use -= 1
            if not self.current:
                self.retire()

    def retire(self) -> None:
        """No longer what new reads get (under `lock`): closed now if idle, else by its last read."""
        self.current = False
        if self.in_use == 0:
            self.con.close()


S = TypeVar("S", bound=SharedInstance)


def take_shared(held: dict[str, S], key: str, lock: threading.Lock, current: Callable[[S], bool],
                open_new: Callable[[], S]) -> S:
    """The process's instance under `key` in `held`, counted as in use (release() it when the read ends): a new
    one from `open_new` where there is none or `current` says the one held is stale, which is then retired."""
    with lock:
        instance = held.get(key)
        if instance is None or not current(instance):
            fresh = open_new()
            if instance is not None:
                instance.retire()
            held[key] = instance = fresh
        instance.in_use += 1
        return instance
