"""`specdec ingest --follow`: appended lines, partial lines, new files, rotation by rename, gzip files once
complete; positions committed with the rows, so a follower killed with SIGKILL at any point resumes with
nothing lost and nothing twice (the store equals a clean ingest of the same files)."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from helpers import rec, write_csv

from specdec_core.ingestion.follow import Follower
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

ROOT = Path(__file__).resolve().parents[2]


def line(n: int, **overrides) -> str:
    """Request n; every fifth is a cache hit on one of seven keys (so later batches judge hits on earlier misses)."""
    fields = {"ts": f"2026-03-01T{10 + n // 3600:02d}:{(n // 60) % 60:02d}:{n % 60:02d}Z", "cache_key": f"k{n % 7}",
              "cache_hit": n % 5 == 0 and n >= 7, **overrides}
    return json.dumps(rec(f"r{n:05d}", **fields)) + "\n"


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def rows(db: Path) -> list[tuple]:
    """What a store holds, whichever way it was loaded: each request with where it was logged."""
    with Store(db).read() as con:
        return con.execute("SELECT request_id, ts, output_text, fingerprint, source_line FROM requests "
                           "ORDER BY request_id").fetchall()


def query(db: Path, sql: str) -> list[tuple]:
    with Store(db).read() as con:
        return con.execute(sql).fetchall()


def test_appended_lines_are_loaded_once_partial_lines_wait(tmp_path):
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, line(1) + line(2) + line(3))
    follower = Follower(Store(db), [str(log)])
    assert follower.poll().result.accepted == 3
    assert follower.poll() is None
    append(log, line(4) + line(5)[:40])  # the writer is half-way through line 5
    assert follower.poll().result.accepted == 1
    append(log, line(5)[40:] + line(6))
    batch = follower.poll()
    assert (batch.result.accepted, batch.result.quarantined) == (2, 0)
    assert "+2 rows" in batch.status_line() and "lag" in batch.status_line()
    follower.close()
    got = rows(db)
    assert [r[0] for r in got] == [f"r{n:05d}" for n in range(1, 7)]
    assert [r[-1] for r in got] == [1, 2, 3, 4, 5, 6]  # line numbers of the log, not of each batch
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0] == 0


def test_new_files_rotation_by_rename_and_gzip_once_complete(tmp_path):
    folder, db = tmp_path / "logs", tmp_path / "s.duckdb"
    folder.mkdir()
    log = folder / "app.jsonl"
    append(log, line(1) + line(2))
    follower = Follower(Store(db), [str(log), str(folder / "*.gz")], batch_rows=2)
    assert follower.poll().result.accepted == 2
    # Rotation: two more lines land in the old file, which is renamed away; a new file takes the name.
    append(log, line(3) + line(4))
    log.rename(folder / "app.jsonl.1")
    append(log, line(5))
    first = follower.poll()
    second = follower.poll()
    assert first.result.accepted + second.result.accepted == 3
    assert (first.result.read, second.result.read) == (2, 1), "a batch holds at most batch_rows lines"
    assert follower.poll() is None
    # A gzip file is read once it is complete and its size held still between two polls.
    with gzip.open(folder / "old.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(line(6) + line(7))
    assert follower.poll() is None
    assert follower.poll().result.accepted == 2
    assert follower.poll() is None
    follower.close()
    assert [r[0] for r in rows(db)] == [f"r{n:05d}" for n in range(1, 8)]


def test_a_csv_file_is_read_whole_once_complete_not_as_json_lines(tmp_path):
    folder, db = tmp_path / "logs", tmp_path / "s.duckdb"
    folder.mkdir()
    write_csv(folder / "export.csv", [json.loads(line(n)) for n in (1, 2, 3)])
    follower = Follower(Store(db), [str(folder)])
    assert follower.poll() is None  # its size has not held still yet
    batch = follower.poll()
    assert (batch.result.accepted, batch.result.quarantined) == (3, 0)
    assert follower.poll() is None
    follower.close()


def test_a_file_named_twice_is_read_once(tmp_path):
    folder, db = tmp_path / "logs", tmp_path / "s.duckdb"
    folder.mkdir()
    append(folder / "app.jsonl", line(1) + line(2))
    # The glob matches nothing yet, so the paths are resolved one by one, the file through both others.
    follower = Follower(Store(db), [str(folder), str(folder / "app.jsonl"), str(folder / "*.gz")])
    batch = follower.poll()
    follower.close()
    assert (batch.files, batch.result.read, batch.result.accepted, batch.result.duplicates) == (1, 2, 2, 0)


def test_a_new_follower_resumes_where_the_last_batch_ended(tmp_path):
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, line(1) + line(2))
    Follower(Store(db), [str(log)]).poll()
    append(log, line(3))
    again = Follower(Store(db), [str(log)])
    batch = again.poll()
    assert (batch.result.read, batch.result.accepted, batch.result.duplicates) == (1, 1, 0)
    assert [r[-1] for r in rows(db)] == [1, 2, 3]


def _follow(db: Path, log: Path, *extra: str, output: int = subprocess.PIPE) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "specdec_core", "ingest", "--follow", str(log), "--db", str(db),
                             "--every", "0.2", "--batch-rows", "200", *extra],
                            cwd=ROOT, stdout=output, stderr=subprocess.STDOUT, text=True)


def _batches(db: Path | str) -> int:
    return query(db, "SELECT count(*) FROM ingests")[0][0] if Store(db).exists else 0


@pytest.mark.parametrize("kind", ["file", "lake"])
def test_sigkill_at_several_points_then_resume_equals_a_clean_ingest(tmp_path, kind):
    log = tmp_path / "app.jsonl"
    if kind == "file":
        db, clean = tmp_path / "s.duckdb", tmp_path / "clean.duckdb"
    else:  # a DuckLake: the batch and its offsets are one transaction of its catalog
        db, clean = f"ducklake:{tmp_path / 's.sqlite'}", f"ducklake:{tmp_path / 'clean.sqlite'}"
    n = 0

    def write_some() -> None:
        nonlocal n
        append(log, "".join(line(n + i, max_tokens=8 + i % 3) for i in range(25)))
        n += 25
        time.sleep(0.1)

    # Each follower is killed while the writer appends: once it has committed a batch of its own, at
    # once, a little later, or later still (between batches, or in the middle of one).
    killed = []
    for delay in (0.0, 0.3, 0.8):
        follower = _follow(db, log, output=subprocess.DEVNULL)
        committed = _batches(db)
        deadline = time.monotonic() + 120
        while _batches(db) == committed and time.monotonic() < deadline:
            write_some()
        assert _batches(db) > committed, "the follower never committed a batch"
        kill_at = time.monotonic() + delay
        while time.monotonic() < kill_at:
            write_some()
        follower.send_signal(signal.SIGKILL)
        follower.wait()
        write_some()
        killed.append(follower.pid)
    drained = _follow(db, log, "--idle-exit", "1.5")
    out, _ = drained.communicate(timeout=300)
    assert drained.returncode == 0, out
    # What the killed followers left in the temporary folder (a lake writer's spill folder, always; a batch's
    # copied lines, when killed inside one) went with the next follower's first batch.
    assert [p for pid in killed for p in Path(tempfile.gettempdir()).glob(f"specdec-*-{pid}-*")] == []
    ingest(Store(clean), [str(log)])
    assert rows(db) == rows(clean), "nothing lost, nothing twice"
    judged = "SELECT request_id, source_request_id, contaminated FROM hit_sources ORDER BY 1"
    assert query(db, judged) == query(clean, judged)
    assert query(db, "SELECT count(*) FILTER (WHERE contaminated) > 0 FROM hit_sources") == [(True,)]
    assert query(db, "SELECT count(*) FROM quarantine") == [(0,)]
    # Every line was read by exactly one committed batch: none read again after a kill.
    assert query(db, "SELECT sum(n_read)::BIGINT, sum(n_duplicates)::BIGINT FROM ingests") == [(n, 0)]


_LEAVE_SCRATCH = """
import os, signal, sys
from specdec_core import scratch
print(scratch.make("follow"), scratch.make("spill"), flush=True)
if sys.argv[1] == "killed":
    os.kill(os.getpid(), signal.SIGKILL)
sys.stdin.read()
"""


def test_a_killed_processs_scratch_folders_go_with_the_next_follower_and_lake_writer(tmp_path, monkeypatch):
    """Copied log lines and spill files of a follower killed with SIGKILL (no cleanup runs) do not stay in /tmp
    for good; a live process's are left alone."""
    # A temporary folder of the test's own: the other test processes' followers and lake writers sweep /tmp too.
    scratch_root = tmp_path / "tmp"
    scratch_root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch_root))
    env = {**os.environ, "TMPDIR": str(scratch_root)}

    def start(how: str) -> tuple[subprocess.Popen, list[Path]]:
        proc = subprocess.Popen([sys.executable, "-c", _LEAVE_SCRATCH, how], cwd=ROOT, text=True, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        return proc, [Path(p) for p in proc.stdout.readline().split()]

    live, (live_follow, live_spill) = start("live")
    killed, (dead_follow, dead_spill) = start("killed")  # after the live one, whose make() would sweep them
    assert killed.wait(timeout=60) == -signal.SIGKILL
    try:
        assert dead_follow.parent == scratch_root and dead_follow.is_dir() and dead_spill.is_dir(), \
            "the kill left them, as a real one does"
        log = tmp_path / "app.jsonl"
        append(log, line(1))
        assert Follower(Store(tmp_path / "s.duckdb"), [str(log)]).poll() is not None
        assert not dead_follow.exists(), "the next follower's batch removed the dead one's copied lines"
        assert dead_spill.is_dir(), "a follower on a file store has no spill folder: that kind is the lake's"
        assert live_follow.is_dir() and live_spill.is_dir()
        ingest(Store(f"ducklake:{tmp_path / 'lake.sqlite'}"), [str(log)])
        assert not dead_spill.exists(), "the next lake writer removed the dead one's spill folder"
        assert live_follow.is_dir() and live_spill.is_dir()
    finally:
        live.communicate(timeout=60)
        for p in (live_follow, live_spill):
            p.rmdir()


def test_follow_prints_a_status_line_per_batch(tmp_path):
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, line(1) + line(2))
    proc = _follow(db, log, "--idle-exit", "1")
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    status = [x for x in out.splitlines() if "rows (read" in x]
    assert len(status) == 1 and "+2 rows (read 2, duplicates 0, quarantined 0) from 1 file" in status[0]


def test_a_follow_of_a_large_file_store_that_is_copied_whole_is_told_of_the_lake(tmp_path):
    from specdec_core.store.working_copy import copies_share_blocks, copy_cost_note, filesystem_type

    db = tmp_path / "s.duckdb"
    (tmp_path / "a.jsonl").write_text("".join(line(n) for n in range(20)))
    ingest(Store(db), [str(tmp_path / "a.jsonl")])
    # The probe agrees with the filesystem's kind, and leaves nothing behind.
    reflinks = copies_share_blocks(tmp_path)
    kind = filesystem_type(tmp_path)
    assert kind != "?"  # Linux names it
    if kind in ("ext4", "ext3", "tmpfs", "overlay"):
        assert not reflinks
    assert not [p for p in tmp_path.iterdir() if "reflink" in p.name]
    note = copy_cost_note(Store(db), min_bytes=1)
    if reflinks:
        assert note is None
    else:
        assert f"copies {db}" in note and f"specdec migrate --db {db} --to ducklake:{tmp_path / 's.sqlite'}" in note
        assert f"this filesystem ({kind}) makes no reflinks" in note
        assert "\n" not in note
    # Below the size that matters, or a lake (which appends): nothing to say.
    assert copy_cost_note(Store(db)) is None
    assert copy_cost_note(Store(f"ducklake:{tmp_path / 'l.sqlite'}"), min_bytes=1) is None


def test_lines_longer_than_a_poll_reads_are_copied_from_the_file_and_cut_past_the_limit(tmp_path, monkeypatch):
    from specdec_core.ingestion import follow as following
    from specdec_core.ingestion.staging import IngestLimits

    monkeypatch.setattr(following, "_WINDOW", 1 << 20)  # what a poll reads at once; 64 MiB otherwise
    limits = IngestLimits(max_record_bytes=2 << 20)
    log, db, clean = tmp_path / "app.jsonl", tmp_path / "s.duckdb", tmp_path / "clean.duckdb"
    huge = line(2, output_text="h" * (3 << 20))  # past the record limit: quarantined, cut
    long = line(3, output_text="l" * (3 << 19))  # under it, over the window: loaded whole
    append(log, line(1) + huge[: 2 << 20])  # the writer is part-way through the huge line
    follower = Follower(Store(db), [str(log)], limits=limits)
    assert follower.poll().result.accepted == 1
    assert follower.poll() is None  # no end to it yet
    append(log, huge[2 << 20:] + long + line(4))
    batches = [follower.poll() for _ in range(3)]
    follower.close()
    assert sum(b.result.accepted for b in batches if b) == 2 and sum(b.result.quarantined for b in batches if b) == 1
    ingest(Store(clean), [str(log)], limits=limits)
    assert rows(db) == rows(clean) and [r[0] for r in rows(db)] == ["r00001", "r00003", "r00004"]
    with Store(db).read() as con:
        [(n, reason, raw)] = con.execute("SELECT source_line, reason, raw FROM quarantine").fetchall()
    size = len(huge.encode()) - 1
    assert (n, reason) == (2, f"record too large: {size:,} bytes (limit 2 MiB)") and len(raw) < 65 * 1024
