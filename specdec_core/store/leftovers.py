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
    except OSError:
        return True  # it exists, owned by someone else
    return True


def remove_dead_writers_files(target: Path, suffix: str) -> None:
    """Remove the files and folders named `<target's name>.<pid><suffix>` (suffix: a regex) whose pid is no
    live process's, nor this one's."""
    pattern = re.compile(re.escape(target.name) + r"\.(\d+)" + suffix)
    try:
        entries = list(os.scandir(target.parent))
    except OSError:
        return
    for entry in entries:
        match = pattern.fullmatch(entry.name)
        if not match or int(match.group(1)) == os.getpid() or process_alive(int(match.group(1))):
            continue
        try:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                os.unlink(entry.path)
        except OSError as exc:
            log.warning("%s: cannot remove a killed writer's leftover: %s", entry.path, exc.strerror or exc)
