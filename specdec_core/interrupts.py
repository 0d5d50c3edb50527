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
