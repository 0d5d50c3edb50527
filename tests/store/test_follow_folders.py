"""A followed folder with a file that can't be read, or never completes: each is said once, in one line, and
the follower goes on with the others; a truncated gzip is loaded as a plain ingest loads it."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from helpers import rec

from specdec_core.ingestion import follow as follow_module
from specdec_core.ingestion.follow import GZIP_PATIENCE, Follower
from specdec_core.ingestion.load import ingest
from specdec_core.ingestion.staging import IngestLimits
from specdec_core.store.connection import Store


def line(n: int) -> str:
    return json.dumps(rec(f"r{n:05d}", cache_key=f"k{n}")) + "\n"


def drain(follower: Follower, polls: int = 2 * GZIP_PATIENCE + 2) -> tuple[int, int]:
    accepted = quarantined = 0
    for _ in range(polls):
        batch = follower.poll()
        if batch is not None:
            accepted, quarantined = accepted + batch.result.accepted, quarantined + batch.result.quarantined
    return accepted, quarantined


def test_a_truncated_gzip_in_a_followed_folder_loads_what_a_plain_ingest_loads(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    whole = gzip.compress("".join(line(n) for n in range(1, 300)).encode())
    (logs / "old.jsonl.gz").write_bytes(whole[: len(whole) - 40])  # the writer died mid-stream
    plain = ingest(Store(tmp_path / "plain.duckdb"), [str(logs)])
    follower = Follower(Store(tmp_path / "s.duckdb"), [str(logs)])
    assert drain(follower) == (plain.accepted, plain.quarantined)
    assert plain.accepted > 250 and plain.quarantined == 1
    assert follower.poll() is None and follower.problems == []
    follower.close()


def test_a_gzip_still_growing_is_not_taken_for_a_truncated_one(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    whole = gzip.compress("".join(line(n) for n in range(1, 50)).encode())
    gz = logs / "live.jsonl.gz"
    follower = Follower(Store(tmp_path / "s.duckdb"), [str(logs)])
    for size in range(100, len(whole), max(1, len(whole) // (GZIP_PATIENCE + 2))):
        gz.write_bytes(whole[:size])  # grows at every poll
        assert follower.poll() is None
    gz.write_bytes(whole)
    assert drain(follower) == (49, 0)
    follower.close()


def test_an_unreadable_csv_is_said_once_and_the_follower_goes_on(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    limits = IngestLimits(max_record_bytes=4096)
    (logs / "bad.csv").write_text("request_id," + "x" * 5000 + "\nr1,1\n", encoding="utf-8")  # its header: too long
    (logs / "app.jsonl").write_text(line(1) + line(2), encoding="utf-8")
    follower = Follower(Store(tmp_path / "s.duckdb"), [str(logs)], limits=limits)
    assert drain(follower) == (2, 0)
    (logs / "app.jsonl").open("a", encoding="utf-8").write(line(3))
    assert drain(follower) == (1, 0)
    follower.close()
    assert len(follower.problems) == 1 and "bad.csv" in follower.problems[0] and "\n" not in follower.problems[0]
    again = Follower(Store(tmp_path / "s.duckdb"), [str(logs)], limits=limits)  # a restart says it again, and goes on
    (logs / "app.jsonl").open("a", encoding="utf-8").write(line(4))
    assert drain(again) == (1, 0)
    again.close()
    assert len(again.problems) == 1


def test_an_unreadable_json_lines_file_is_said_once_and_the_others_load(tmp_path, monkeypatch):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "locked.jsonl").write_text(line(1), encoding="utf-8")
    (logs / "app.jsonl").write_text(line(2), encoding="utf-8")
    real_open = open

    def refusing_open(path, *args, **kwargs):  # what chmod 000 does for a user other than root
        if Path(path).name == "locked.jsonl":
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(follow_module, "open", refusing_open, raising=False)
    follower = Follower(Store(tmp_path / "s.duckdb"), [str(logs)])
    assert drain(follower) == (1, 0)
    follower.close()
    assert follower.problems == [f"{logs / 'locked.jsonl'}: cannot be read: Permission denied; "
                                 "followed once it can be"]
