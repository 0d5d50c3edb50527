"""The store tests' own fixtures."""

from __future__ import annotations

import subprocess

import pytest


@pytest.fixture
def tiny_disk(tmp_path):
    """A 16 MB tmpfs, to be filled: a full disk under a store."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mnt)], capture_output=True,
                             text=True)
    # The suite runs as root (make test, CI): a disk that can't be made full is a failure, not a skip.
    assert mounted.returncode == 0, f"cannot mount a 16 MB tmpfs for the full-disk test: {mounted.stderr.strip()}"
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
