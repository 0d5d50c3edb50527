"""Files a killed writer leaves beside a store: its working copy, a new catalog it had not renamed yet.

Each carries the writer's pid in its name, so a later writer removes those whose process is gone and
leaves a live one's alone.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
from pathlib import Path

log = logging.getLogger(__name__)


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):
        return True  # it exists, owned by someone else (or is no pid this system could have: never taken for dead)
    return True


def remove_dead_writers_files(target: Path, suffix: str) -> list[Path]:
    """Remove the files and folders named `<target's name>.<pid><suffix>` (suffix: a regex) whose pid is no
    live process's, nor this one's."""
    return remove_dead_processes_entries(target.parent, re.compile(re.escape(target.name) + r"\.(\d+)" + suffix))


def remove_dead_processes_entries(folder: Path, pattern: re.Pattern[str]) -> list[Path]:
    """Remove the entries of `folder` whose whole name `pattern` matches, its first group a pid that is no live
    process's, nor this one's; returns them."""
    removed: list[Path] = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match or int(match.group(1)) == os.getpid() or process_alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)  # all it can, then said below if anything is left
            else:
                os.unlink(entry.path)
        except OSError as exc:
            log.warning("%s: cannot remove a killed process's leftover: %s", entry.path, exc.strerror or exc)
            continue
        if os.path.lexists(entry.path):
            log.warning("%s: cannot remove all of a killed process's leftover folder", entry.path)
        else:
            removed.append(Path(entry.path))
    return removed
