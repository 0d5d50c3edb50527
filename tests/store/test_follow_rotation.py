"""`specdec ingest --follow` across what rotation does to a file: truncated in place and written again,
deleted and recreated on the same inode, renamed away, a symlink swapped; and two followers of one store.
Every line is loaded, once, credited to the file and line it is in."""

from __future__ import annotations

import json
import os
from pathlib import Path

from helpers import rec

from specdec_core.ingestion.follow import Follower
from specdec_core.store.connection import Store


def line(n: int) -> str:
    return json.dumps(rec(f"r{n:05d}", cache_key=f"k{n}")) + "\n"


def lines(first: int, last: int) -> str:
    return "".join(line(n) for n in range(first, last + 1))


def append(path: Path, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(text)


def stored(db: Path) -> list[tuple[str, str, int]]:
    """Each request with the name of the file and the line it was credited to."""
    with Store(db).read() as con:
        return con.execute("SELECT request_id, regexp_extract(source_file, '[^/]+$'), source_line FROM requests "
                           "ORDER BY request_id").fetchall()


def drain(follower: Follower) -> int:
    accepted = 0
    while (batch := follower.poll()) is not None:
        accepted += batch.result.accepted
    return accepted


# --- item 4: new content under the same inode is read from line 1 -------------------------------------------

def test_a_file_truncated_in_place_and_written_past_its_old_size_is_read_from_line_1(tmp_path):
    log, db = tmp_path / "live.jsonl", tmp_path / "s.duckdb"
    append(log, lines(1, 3))
    follower = Follower(Store(db), [str(log)])
    assert drain(follower) == 3
    inode = log.stat().st_ino
    with open(log, "w", encoding="utf-8") as fh:  # copytruncate, or `: > log; cat more >> log`
        fh.write(lines(11, 16))
    assert log.stat().st_ino == inode and log.stat().st_size > 3 * len(line(1))
    assert drain(follower) == 6
    follower.close()
    assert [r for r in stored(db) if r[0] >= "r00011"] == [(f"r{n:05d}", "live.jsonl", n - 10) for n in range(11, 17)]


def test_a_file_rewritten_on_the_same_inode_while_no_follower_ran_is_read_from_line_1(tmp_path):
    log, db = tmp_path / "live.jsonl", tmp_path / "s.duckdb"
    append(log, lines(1, 3))
    Follower(Store(db), [str(log)]).poll()
    with open(log, "w", encoding="utf-8") as fh:  # rm + cp that got the same inode back, seen at the next start
        fh.write(lines(21, 30))
    again = Follower(Store(db), [str(log)])
    assert drain(again) == 10
    again.close()
    assert len(stored(db)) == 13


def test_lines_appended_to_the_same_content_are_not_taken_for_new_content(tmp_path):
    log, db = tmp_path / "live.jsonl", tmp_path / "s.duckdb"
    append(log, line(1)[:100])  # the writer is mid-way through its first record
    follower = Follower(Store(db), [str(log)])
    assert follower.poll() is None
    append(log, line(1)[100:] + lines(2, 3))
    assert drain(follower) == 3
    append(log, lines(4, 5))
    batch = follower.poll()
    assert (batch.result.read, batch.result.duplicates) == (2, 0)
    follower.close()


# --- item 5: rows after a rotation are credited to the file they are in ----------------------------------------

def test_lines_of_a_file_renamed_away_are_credited_to_its_new_name(tmp_path):
    log, db = tmp_path / "live.jsonl", tmp_path / "s.duckdb"
    append(log, lines(1, 3))
    follower = Follower(Store(db), [str(log)])
    assert drain(follower) == 3
    append(log, lines(4, 5))  # written just before the rotation
    log.rename(tmp_path / "live.jsonl.1")
    append(log, lines(6, 10))
    assert drain(follower) == 7
    follower.close()
    got = {r[0]: r[1:] for r in stored(db)}
    assert [got[f"r{n:05d}"] for n in (4, 5)] == [("live.jsonl.1", 4), ("live.jsonl.1", 5)]
    assert [got[f"r{n:05d}"] for n in range(6, 11)] == [("live.jsonl", n) for n in range(1, 6)]
    pairs = [r[1:] for r in stored(db)]
    assert len(set(pairs)) == len(pairs) - 3  # only lines 1-3, loaded under the name they had then, repeat


def test_a_symlink_swapped_to_another_file_does_not_take_the_old_file_s_lines(tmp_path):
    a, b, link, db = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "current.jsonl", tmp_path / "s.duckdb"
    append(a, lines(1, 2))
    link.symlink_to(a)
    follower = Follower(Store(db), [str(link)])
    assert drain(follower) == 2
    append(a, lines(3, 4))
    append(b, lines(11, 12))
    tmp = tmp_path / "next.jsonl"
    tmp.symlink_to(b)
    os.replace(tmp, link)  # the swap: atomic, as a deploy script does it
    assert drain(follower) == 4
    follower.close()
    got = {r[0]: r[1:] for r in stored(db)}
    assert [got["r00003"], got["r00004"]] == [("a.jsonl", 3), ("a.jsonl", 4)]
    assert [got["r00011"], got["r00012"]] == [("b.jsonl", 1), ("b.jsonl", 2)]


def test_a_deleted_file_s_last_lines_are_not_credited_to_the_new_file_under_its_name(tmp_path):
    log, db = tmp_path / "live.jsonl", tmp_path / "s.duckdb"
    append(log, lines(1, 2))
    follower = Follower(Store(db), [str(log)])
    assert drain(follower) == 2
    append(log, lines(3, 4))
    log.unlink()  # the handle kept open still reads it
    append(log, lines(5, 8))
    assert drain(follower) == 6
    follower.close()
    got = {r[0]: r[1:] for r in stored(db)}
    assert got["r00003"] == ("live.jsonl (deleted)", 3)
    assert got["r00007"] == ("live.jsonl", 3)


# --- item 10: two followers of one store never move a position back -----------------------------------------

def test_a_follower_behind_another_does_not_move_the_committed_position_back(tmp_path):
    log, db = tmp_path / "live.jsonl", tmp_path / "s.duckdb"
    append(log, lines(1, 4))
    ahead, behind = Follower(Store(db), [str(log)]), Follower(Store(db), [str(log)], batch_rows=1)
    assert drain(ahead) == 4
    batch = behind.poll()  # reads line 1 again: a duplicate; its position (line 1) is behind the store's
    assert (batch.result.read, batch.result.duplicates) == (1, 1)
    ahead.close()
    behind.close()
    with Store(db).read() as con:
        assert con.execute("SELECT line_count, byte_offset FROM follow_offsets").fetchall() == [(4, log.stat().st_size)]
    append(log, line(5))
    resumed = Follower(Store(db), [str(log)])
    batch = resumed.poll()
    resumed.close()
    assert (batch.result.read, batch.result.accepted, batch.result.duplicates) == (1, 1, 0)
