"""Ctrl-C that a library swallowed is still Ctrl-C.

DuckDB imports pandas the first time it converts a Python value (a bound parameter), and a KeyboardInterrupt
raised inside that import is taken for pandas being missing and dropped: a `specdec ingest` interrupted then
(its first tenth of a second of work, longer on a loaded machine) ran on and changed the store. The command
line's SIGINT handler notes each interrupt here as well as raising it, and a write checks the note before it
makes its changes visible (Store.write, lake.writing): an interrupted command never changes the store.

Only `specdec` installs the handler, and only over Python's own: a program that set its own keeps it, and a
process started with SIGINT ignored (a background job) keeps ignoring it.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

_noted = False


def _interrupt(_signum: int, _frame: FrameType | None) -> None:
    global _noted
    _noted = True
    raise KeyboardInterrupt


def install() -> None:
    """Note every Ctrl-C from now on, where Python's default handler would have raised it."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, _interrupt)


def check() -> None:
    """Raise KeyboardInterrupt if one was noted, whatever became of the one raised then."""
    if _noted:
        raise KeyboardInterrupt


@contextmanager
def deferred() -> Iterator[None]:
    """A Ctrl-C (or SIGTERM) within the block takes effect as it ends, once its work is done and counted; a second
    one at once.

    For work that a server does but whose answer the process must see to say what it did (a purge's batch of
    deletes: interrupted between the server's work and its reply, the run said it deleted none of them). Only
    the main thread receives signals, and a signal the process ignores or leaves to the system stays so: there
    the block runs as it is."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: handler for sig in (signal.SIGINT, signal.SIGTERM) if callable(handler := signal.getsignal(sig))}
    held: list[signal.Signals] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if held:
            previous[sig](signum, frame)  # a second one: now, as the handler before would have
        held.append(sig)

    for sig in previous:
        signal.signal(sig, hold)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held:
        previous[held[0]](held[0], None)
