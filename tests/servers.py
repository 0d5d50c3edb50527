"""Real servers for the shared-store tests: PostgreSQL (Debian's package) and an S3 (moto's server), each
on a free port of this machine, stopped when the test module ends."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from helpers import free_port


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise RuntimeError(f"PostgreSQL's {name} is not installed: `make test` installs Debian's postgresql")
    return found[-1]


def _as_postgres(cmd: list[str]) -> list[str]:
    # PostgreSQL refuses to run as root; Debian's package made the `postgres` user.
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


@contextmanager
def postgres() -> Iterator[str]:
    """A fresh PostgreSQL cluster with a database `specdec`; yields its libpq connection string."""
    home = tempfile.mkdtemp(prefix="specdec-pg-")  # outside pytest's root-only tmp: postgres must reach it
    data, sockets = Path(home) / "data", Path(home) / "sockets"
    sockets.mkdir()
    if os.geteuid() == 0:
        shutil.chown(home, "postgres")
        shutil.chown(sockets, "postgres")
    port = free_port()
    subprocess.run(_as_postgres([_pg_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust",
                                 "-E", "UTF8"]), check=True, capture_output=True)
    server = subprocess.Popen(_as_postgres([_pg_bin("postgres"), "-D", str(data), "-p", str(port),
                                            "-c", "listen_addresses=127.0.0.1", "-k", str(sockets),
                                            "-c", "fsync=off"]),
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while subprocess.run([_pg_bin("pg_isready"), "-h", "127.0.0.1", "-p", str(port)],
                             capture_output=True).returncode != 0:
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("PostgreSQL did not start")
            time.sleep(0.2)
        subprocess.run([_pg_bin("createdb"), "-h", "127.0.0.1", "-p", str(port), "-U", "postgres", "specdec"],
                       check=True, capture_output=True)
        yield f"dbname=specdec host=127.0.0.1 port={port} user=postgres"
    finally:
        # A fast shutdown by pg_ctl, not a signal to runuser: runuser kills its child 2 s after passing on a
        # SIGTERM, and a postmaster killed so leaves its shared memory segments in /dev/shm.
        subprocess.run(_as_postgres([_pg_bin("pg_ctl"), "stop", "-D", str(data), "-m", "fast", "-w"]),
                       capture_output=True, timeout=60)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        shutil.rmtree(home, ignore_errors=True)


def create_database(dsn: str, name: str) -> None:
    """A new database on the server of `dsn` (host=... port=...)."""
    settings = dict(part.split("=", 1) for part in dsn.split())
    subprocess.run([_pg_bin("createdb"), "-h", settings["host"], "-p", settings["port"], "-U", settings["user"], name],
                   check=True, capture_output=True)


@contextmanager
def s3() -> Iterator[str]:
    """moto's S3 server with a bucket `incident-logs`; yields its endpoint, host:port."""
    port = free_port()
    server = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=1).close()
                break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.2)
        bucket = urllib.request.Request(f"http://127.0.0.1:{port}/incident-logs", method="PUT")
        urllib.request.urlopen(bucket, timeout=10).close()
        yield f"127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=30)


def s3_keys(endpoint: str, bucket: str = "incident-logs") -> list[str]:
    """The object keys in `bucket` (S3's ListObjectsV2, read without a client library)."""
    import re

    with urllib.request.urlopen(f"http://{endpoint}/{bucket}?list-type=2&max-keys=1000", timeout=10) as r:
        return re.findall(r"<Key>([^<]+)</Key>", r.read().decode())
