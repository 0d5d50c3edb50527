"""Scratch folders in the system's temporary folder that outlive a killed process no longer than the next start.

A follower copies each batch's new lines into a folder of its own (ingestion/follow.py), and a kept lake writer
spills to one (store/lake.py). Both are removed when the work or the process ends, but a process killed with
SIGKILL (the kernel's OOM killer, `kill -9`, a container runtime's timeout) runs no cleanup: its folder, a
copy of log lines (prompts and outputs) in the follower's case, stayed in /tmp for good. Each folder's name
now carries its process id, and the next process to make one of that kind removes those whose process is gone
(store/leftovers.py, as a lake's writers do with a killed writer's files beside the store).
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specdec_core.store.leftovers import remove_dead_processes_entries


def make(kind: str) -> str:
    """A new private folder `specdec-<kind>-<pid>-XXXXXXXX`, after removing the leftovers of its kind (sweep):
    the caller removes it."""
    sweep(kind)
    return tempfile.mkdtemp(prefix=f"specdec-{kind}-{os.getpid()}-")


@contextmanager
def folder(kind: str) -> Iterator[str]:
    """make(kind), removed when the block ends."""
    path = make(kind)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def sweep(kind: str) -> list[Path]:
    """Remove the scratch folders of `kind` whose process is gone; returns them. A folder whose process id is in
    use (by its process, or by another since) is left alone, and one this user may not remove is said once in
    the log and left."""
    return remove_dead_processes_entries(Path(tempfile.gettempdir()),
                                         re.compile(rf"specdec-{re.escape(kind)}-(\d+)-[^/]+"))
