"""`specdec ingest --follow`: killed at any point and started again, the store equals a clean ingest."""

from __future__ import annotations

import gzip
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from specdec_core.store import Store, ingest
from specdec_core.store.follow import Follower

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "data" / "demo" / "requests.jsonl.gz"


def demo_lines() -> list[str]:
    with gzip.open(DEMO, "rt", encoding="utf-8") as fh:
        return [line + "\n" for line in fh.read().splitlines() if line.strip()]


def stored(store: Store) -> list[tuple]:
    with store.read() as con:
        return sorted(con.execute("SELECT request_id, fingerprint, cache_key FROM requests").fetchall())


def test_appends_rotation_and_a_finished_gzip_are_followed_once_each(tmp_path):
    lines = demo_lines()
    logs = tmp_path / "logs"
    logs.mkdir()
    live = logs / "app.jsonl"
    live.write_text("".join(lines[:300]) + lines[300][:40])  # the last line is half written
    store = Store(tmp_path / "f.duckdb")
    follower = Follower(store, [str(logs)])
    assert follower.step().result.accepted == 300
    with open(live, "a") as fh:
        fh.write(lines[300][40:] + "".join(lines[301:600]))
    os.rename(live, logs / "app.jsonl.1")  # rotation: the old file's tail is read under its first name
    live.write_text("".join(lines[600:900]))
    partial = gzip.compress("".join(lines[900:1200]).encode())
    (logs / "old.jsonl.gz").write_bytes(partial[: len(partial) // 2])  # still being written
    follower.step()
    assert len(stored(store)) == 900
    (logs / "old.jsonl.gz").write_bytes(partial)
    follower.step()
    assert follower.step() is None, "nothing new: no batch"
    clean = Store(tmp_path / "clean.duckdb")
    ingest(clean, [str(write(tmp_path / "all.jsonl", lines[:1200]))])
    assert stored(store) == stored(clean)


def write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(lines))
    return path


def test_sigkill_at_several_points_then_resume_equals_a_clean_ingest(tmp_path):
    lines = demo_lines()
    logs = tmp_path / "logs"
    logs.mkdir()
    live = logs / "app.jsonl"
    db = tmp_path / "k.duckdb"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [str(Path(sys.executable).with_name("specdec")), "ingest", "--follow", str(logs), "--db", str(db),
           "--batch-rows", "150"]
    written = 0
    for kill_after in (2.0, 4.0, 6.5):
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + kill_after
        while time.monotonic() < deadline:
            with open(live, "a") as fh:
                fh.write("".join(lines[written:written + 40]))
            written = min(written + 40, len(lines))
            time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    store = Store(db)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not store.exists or len(stored(store)) < written):
        time.sleep(1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    clean = Store(tmp_path / "clean.duckdb")
    ingest(clean, [str(write(tmp_path / "all.jsonl", lines[:written]))])
    assert written > 300
    assert stored(store) == stored(clean)
    with store.read() as con:
        assert con.execute("SELECT count(*) - count(DISTINCT request_id) FROM requests").fetchall() == [(0,)]
