"""A follow's writes into a DuckDB file make their working copy out of the file the last write replaced (its
spare), writing only the bytes that differ from the store, instead of copying the store whole.

The store a follow leaves equals the store written by copies, batch for batch; the spare is used only when no
reader holds it (in another process or this one) and no other name shares its file (a hard link), and it is
removed when the follow ends or, left by a killed one, by the next writer."""

from __future__ import annotations

import hashlib
import json
import os
import random
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import contents, rec, write_jsonl

from specdec_core.ingestion import ingest
from specdec_core.ingestion.follow import Follower
from specdec_core.store.connection import Store
from specdec_core.store.spare import _lock_alone, _make_equal, spare_path

ROOT = Path(__file__).resolve().parents[2]


def lines(start: int, count: int) -> str:
    out = []
    for n in range(start, start + count):
        fields = {"ts": f"2026-03-01T10:{n // 60 % 60:02d}:{n % 60:02d}Z", "cache_key": f"k{n % 11}",
                  "cache_hit": n % 4 == 0 and n >= 11, "output_text": f"output {n % 13} " * (n % 40)}
        out.append(json.dumps(rec(f"r{n:06d}", **fields)) + "\n")
    return "".join(out)


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def inode(path: Path) -> int:
    return os.stat(path).st_ino


def every_block_read(db: Path) -> int:
    """Read every table whole (DuckDB checks each block's checksum as it reads it); the rows read."""
    with Store(db).read() as con:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = 'store'"
                                            " AND NOT temporary").fetchall()]
        return sum(len(con.execute(f'SELECT * FROM "{t}"').fetchall()) for t in tables)


def test_each_write_of_a_follow_is_made_out_of_the_file_the_last_one_replaced(tmp_path):
    log, db, copied = tmp_path / "app.jsonl", tmp_path / "s.duckdb", tmp_path / "copied.duckdb"
    append(log, lines(0, 3000))
    spared, by_copies = Follower(Store(db), [str(log)]), Follower(Store(copied), [str(log)])
    by_copies.store.keep_spare = False
    spared.poll(), by_copies.poll()
    spare, replaced = spare_path(db), []
    for batch in range(1, 6):
        replaced.append(inode(db))
        append(log, lines(3000 + 2000 * batch, 700 + 300 * batch))
        spared.poll(), by_copies.poll()
        # The file the write replaced is kept, under this process's name for it, and only there.
        assert inode(spare) == replaced[-1] and os.stat(spare).st_nlink == 1
        if batch > 1:  # the store is the file the write before replaced, brought up to date
            assert inode(db) == replaced[-2]
        if batch % 2 == 0:  # a read between writes (this process's view of the state the next write replaces)
            assert contents(str(db)) == contents(str(copied))
    assert contents(str(db)) == contents(str(copied))
    assert every_block_read(db) == every_block_read(copied) > 6000
    spared.close(), by_copies.close()
    assert not spare.exists()


COUNT = "SELECT count(*), sum(length(output_text)) FROM requests"


def reader_elsewhere(db: Path, within: tuple[str, ...] = (), after: tuple[str, ...] = ()) -> subprocess.Popen:
    """A process that reads the store, prints its count (read the line before going on), runs the lines
    `within` in that read, then the lines `after` it (the view kept: the process's next read would use it)."""
    script = ("import sys, time; from specdec_core.store.connection import Store, release_snapshots\n"
              f"with Store({str(db)!r}).read() as con:\n"
              f"    print(con.execute({COUNT!r}).fetchall(), flush=True)\n"
              + "".join(f"    {line}\n" for line in within) + "".join(f"{line}\n" for line in after))
    return subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)


@contextmanager
def reading_elsewhere(db: Path) -> Iterator[Callable[[], list]]:
    """A read of the store's present state in another process, held open: each call reads again within it."""
    reader = reader_elsewhere(db, within=("for _ in sys.stdin:", f"    print(con.execute({COUNT!r}).fetchall(), flush=True)"))
    reader.stdout.readline()

    def read() -> str:
        reader.stdin.write("\n")
        reader.stdin.flush()
        return reader.stdout.readline()

    try:
        yield read
    finally:
        reader.stdin.close()
        assert reader.wait(30) == 0


@contextmanager
def reading_here(db: Path) -> Iterator[Callable[[], list]]:
    with Store(db).read() as con:
        yield lambda: con.execute(COUNT).fetchall()


@pytest.mark.parametrize("reading", [reading_elsewhere, reading_here])
def test_a_reader_holding_the_replaced_state_keeps_it_whole(tmp_path, reading):
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, lines(0, 2000))
    follower = Follower(Store(db), [str(log)])
    follower.poll()
    read_file = inode(db)
    with reading(db) as read:
        held = read()
        for start in (2000, 2600):  # the first write keeps the read file as its spare, the second finds it held
            replaced = inode(db)
            append(log, lines(start, 600))
            follower.poll()
        # The second write copied the store instead, and keeps the file it replaced, which no one reads.
        assert inode(db) != read_file and inode(spare_path(db)) == replaced != read_file
        assert read() == held
    assert "2000" in str(held)
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(3200,)]
    follower.close()


def test_a_reader_elsewhere_gone_idle_lets_go_of_the_replaced_file_for_the_next_write(tmp_path):
    """A dashboard that read the store keeps its view for its next read (the Live view: 5 s later); the file a
    write replaced is let go of before it, so the follow's next write but one need not copy the store."""
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, lines(0, 1000))
    follower = Follower(Store(db), [str(log)])
    follower.poll()
    reader = reader_elsewhere(db, after=("sys.stdin.readline()",))
    assert reader.stdout.readline().startswith("[(1000,")
    read_file = inode(db)
    append(log, lines(1000, 300))
    follower.poll()
    assert inode(spare_path(db)) == read_file
    deadline = time.monotonic() + 10
    while not free(spare_path(db)) and time.monotonic() < deadline:
        time.sleep(0.05)
    append(log, lines(1300, 300))
    follower.poll()
    assert inode(db) == read_file, "the write copied the store: the reader held the file it replaced"
    reader.stdin.close()
    assert reader.wait(30) == 0
    follower.close()


def free(path: Path) -> bool:
    """Whether no process holds a lock on the file (a DuckDB reader holds a shared one)."""
    fd = os.open(path, os.O_RDWR)
    try:
        return _lock_alone(fd)
    finally:
        os.close(fd)


def test_a_follow_beside_another_writer_and_a_reader_in_a_loop(tmp_path):
    """Another process's writes replace the store between the follow's (its spare is then further behind), and a
    reader reads in a loop all along: every state it sees is whole, and the store equals the logs loaded one
    after the other."""
    from writers import READER, WRITER, batch, content

    db, log, stop_file = tmp_path / "s.duckdb", tmp_path / "live.jsonl", tmp_path / "done"
    seed, other = (write_jsonl(tmp_path / f"{name}.jsonl", batch(name, n, 0)) for name, n in (("seed", 200),
                                                                                               ("other", 1500)))
    ingest(Store(db), [str(seed)])
    reader = subprocess.Popen([sys.executable, "-c", READER, str(db), str(stop_file)], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    assert reader.stdout.readline().strip() == "reading"
    follower = Follower(Store(db), [str(log)])
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(db), str(other)], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    records, reused = batch("live", 1600, 1), 0
    for start in range(0, 1600, 200):
        append(log, "".join(json.dumps(r) + "\n" for r in records[start:start + 200]))
        spare = inode(spare_path(db)) if spare_path(db).exists() else None
        follower.poll()
        reused += inode(db) == spare
        time.sleep(0.2)  # the follow's poll interval (--every)
    out, err = writer.communicate(timeout=300)
    assert writer.returncode == 0 and int(out) == 1500, err
    stop_file.touch()
    read = json.loads(reader.communicate(timeout=120)[0])
    follower.close()
    assert read["errors"] == [] and len(read["seen"]) > 20
    # Each state whole: its minute summaries count every request it holds.
    assert all(requests == summarized for requests, summarized, *_ in read["seen"])
    assert reused >= 4, "the follow copied the store at most of its writes"
    clean = tmp_path / "clean.duckdb"
    for path in (seed, other, log):
        ingest(Store(clean), [str(path)])
    assert content(db) == content(clean)


def test_a_write_waits_a_moment_for_a_read_of_the_spare_to_end(tmp_path, monkeypatch):
    """A reader elsewhere in the middle of a read of the file a write replaced: the next write but one waits for
    it to end (up to the copy's cost, here made a second), and then makes its copy out of that file."""
    from specdec_core.store import spare

    monkeypatch.setattr(spare, "_WAIT_BYTES_PER_S", 1e6)
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, lines(0, 1000))
    follower = Follower(Store(db), [str(log)])
    follower.poll()
    assert db.stat().st_size / 1e6 > 1
    reader = reader_elsewhere(db, within=("sys.stdin.readline()", "time.sleep(0.3)"),
                              after=("release_snapshots()", "time.sleep(30)"))
    assert reader.stdout.readline().startswith("[(1000,")
    read_file = inode(db)
    append(log, lines(1000, 300))
    follower.poll()
    reader.stdin.write("\n")
    reader.stdin.flush()  # its read ends in 0.3 s
    append(log, lines(1300, 300))
    follower.poll()
    assert inode(db) == read_file
    reader.kill()
    reader.wait(30)
    follower.close()


def test_a_spare_another_name_shares_is_never_written(tmp_path):
    log, db, backup = tmp_path / "app.jsonl", tmp_path / "s.duckdb", tmp_path / "backup.duckdb"
    append(log, lines(0, 1500))
    follower = Follower(Store(db), [str(log)])
    follower.poll()
    os.link(db, backup)  # a backup made by hard link before the next write
    kept = hashlib.sha256(backup.read_bytes()).hexdigest()
    for start in (1500, 2000, 2500):
        append(log, lines(start, 500))
        follower.poll()
    assert hashlib.sha256(backup.read_bytes()).hexdigest() == kept
    assert inode(db) != inode(backup)
    with Store(backup).read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(1500,)]
    follower.close()


def test_a_killed_followers_spare_is_removed_by_the_next_write(tmp_path):
    log, db = tmp_path / "app.jsonl", tmp_path / "s.duckdb"
    append(log, lines(0, 200))
    follower = subprocess.Popen(
        [sys.executable, "-m", "specdec_core", "ingest", "--follow", str(log), "--db", str(db), "--every", "0.2"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    spare = db.with_name(f"{db.name}.{follower.pid}.tmp.spare")
    deadline = time.monotonic() + 60
    while not db.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    append(log, lines(200, 10))  # its second write keeps the file it replaced; then it waits for more lines
    while not spare.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    follower.kill()
    follower.wait(30)
    assert spare.exists()
    Store(db).ensure()
    with Store(db).write():
        pass
    assert not spare.exists()


def test_a_follow_on_a_full_disk_says_so_in_a_line_and_leaves_the_store_and_no_spare(tiny_disk, tmp_path):
    log, db = tmp_path / "app.jsonl", tiny_disk / "t.duckdb"
    append(log, lines(0, 200))
    follower = subprocess.Popen(
        [sys.executable, "-m", "specdec_core", "ingest", "--follow", str(log), "--db", str(db), "--every", "0.2"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    spare = db.with_name(f"{db.name}.{follower.pid}.tmp.spare")
    deadline = time.monotonic() + 60
    while not db.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    append(log, lines(200, 10))  # the second write keeps the file it replaced: the store twice on the disk
    while not spare.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    before = db.read_bytes()
    stat = os.statvfs(tiny_disk)
    (tiny_disk / "filler").write_bytes(b"\0" * (stat.f_bavail * stat.f_frsize - (64 << 10)))
    with open(log, "a", encoding="utf-8") as fh:  # random text: DuckDB would compress a repeated one to nothing
        fh.write("".join(json.dumps(rec(f"big{i}", output_text=os.urandom(1000).hex())) + "\n" for i in range(4000)))
    _, err = follower.communicate(timeout=120)
    assert follower.returncode == 1 and err.count("\n") == 1 and "No space left on device" in err, err
    assert db.read_bytes() == before
    assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler", "t.duckdb", "t.duckdb.lock"]


def test_the_spare_becomes_the_store_byte_for_byte(tmp_path):
    rng = random.Random(7)
    store, spare = tmp_path / "store", tmp_path / "spare"
    base = rng.randbytes(9 << 20)
    for size, changes in ((9 << 20, [0, 5 << 20]), (13 << 20, [(9 << 20) - 1]), ((3 << 20) + 5, [17]),
                          (9 << 20, []), (0, []), (1, [0])):
        data = bytearray((base * 2)[:size])
        for at in changes:
            data[at] ^= 0xFF
        store.write_bytes(bytes(data))
        spare.write_bytes(base)
        with open(store, "rb") as src, open(spare, "r+b") as dst:
            _make_equal(src.fileno(), dst.fileno())
        assert spare.read_bytes() == bytes(data), (size, changes)
