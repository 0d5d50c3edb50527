"""$SPECDEC_THREADS caps the threads of every DuckDB instance specdec opens: reads, writes and a lake's."""

from __future__ import annotations

import os

import pytest
from helpers import rec, run_cli, write_jsonl

from specdec_core.ingestion import ingest
from specdec_core.store import Store
from specdec_core.store.connection import release_snapshots


def _threads(con) -> int:
    return con.execute("SELECT current_setting('threads')").fetchall()[0][0]


@pytest.mark.parametrize("where", ["s.duckdb", "ducklake:s.sqlite"])
def test_each_instance_runs_at_most_the_threads_asked_for(tmp_path, monkeypatch, where):
    monkeypatch.chdir(tmp_path)
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K")])
    for threads in ("1", "3"):
        monkeypatch.setenv("SPECDEC_THREADS", threads)
        release_snapshots()
        store = Store(where)
        ingest(store, [str(log)])
        with store.write() as con:
            assert _threads(con) == int(threads)
        with store.read() as con:
            assert _threads(con) == int(threads)


@pytest.mark.parametrize("value", ["many", "0", "-2", "\u00b2", "\u0663"])  # int() refuses "²", reads "٣" as 3
def test_a_bad_thread_count_is_one_line_naming_the_variable(tmp_path, value):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K")])
    db = tmp_path / "s.duckdb"
    done = run_cli("ingest", str(log), "--db", str(db), env={**os.environ, "SPECDEC_THREADS": value})
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == f"specdec ingest: $SPECDEC_THREADS: expected a whole number >= 1, got {value!r}"
    assert not db.exists()
