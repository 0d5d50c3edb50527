"""The threads of a process read a store through one view (a file's, per state) or attachment (a lake's): a
Streamlit rerun (a thread of its own) finds the store open, and one replaced or let go of closes when its last
read ends, not before."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest
from helpers import rec, write_jsonl

from specdec_core.ingestion.load import ingest
from specdec_core.store import connection, views
from specdec_core.store.connection import Store


def _in_thread(work):
    out: list = []
    thread = threading.Thread(target=lambda: out.append(work()))
    thread.start()
    thread.join()
    return out[0]


def test_threads_share_one_view_and_a_replaced_one_closes_after_its_last_read(tmp_path, monkeypatch):
    store = Store(tmp_path / "views.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a", cache_key="k-a")]))])
    connection.release_snapshots()
    opened = []
    real = connection.attached
    monkeypatch.setattr(connection, "attached", lambda *a: opened.append(a) or real(*a))

    def count() -> int:
        with store.read() as con:
            return con.execute("SELECT count(*) FROM requests").fetchall()[0][0]

    assert [_in_thread(count) for _ in range(4)] == [1, 1, 1, 1]
    assert len(opened) == 1, "each thread opened the store anew"

    with store.read() as old:  # a read in progress while a writer replaces the file
        replaced = views._views[str(store.path.resolve())]
        ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b", cache_key="k-b")]))])
        assert _in_thread(count) == 2 and len(opened) == 2
        assert old.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 1, "the old state, whole"
        assert replaced.con.execute("SELECT 1").fetchall() == [(1,)], "closed while a read still used it"
    with pytest.raises(duckdb.ConnectionException):
        replaced.con.execute("SELECT 1")
    assert count() == 2 and len(opened) == 2


def test_threads_share_one_lake_attachment_and_one_let_go_of_closes_after_its_last_read(tmp_path, monkeypatch):
    from specdec_core.store import lake as lakes

    store = Store(f"ducklake:{tmp_path / 'views.sqlite'}")
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a", cache_key="k-a")]))])
    lakes.forget_readers()
    opened = []
    real = lakes.open_lake

    def counted(location, read_only=False, **kwargs):
        if read_only:
            opened.append(location)
        return real(location, read_only=read_only, **kwargs)

    monkeypatch.setattr(lakes, "open_lake", counted)

    def count() -> int:
        with store.read() as con:
            return con.execute("SELECT count(*) FROM requests").fetchall()[0][0]

    assert [_in_thread(count) for _ in range(4)] == [1, 1, 1, 1]
    assert len(opened) == 1, "each thread attached the lake anew"
    assert _in_thread(store.version) == store.version() and len(opened) == 1

    with store.read() as old:  # a read in progress while a writer commits and the attachment is let go of
        held = lakes._readers[str(store.lake)]
        ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b", cache_key="k-b")]))])
        assert _in_thread(count) == 2 and len(opened) == 1, "a new snapshot needs no new attachment"
        lakes.forget_readers()
        assert old.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 1, "the read's snapshot, whole"
        assert held.con.execute("SELECT 1").fetchall() == [(1,)], "closed while a read still used it"
    with pytest.raises(duckdb.ConnectionException):
        held.con.execute("SELECT 1")
    assert count() == 2 and len(opened) == 2


def test_the_view_of_a_replaced_file_is_let_go_of_before_the_next_read(tmp_path):
    """Between two reads (the dashboard's Live view reads every 5 s) the view of a file a writer replaced is let
    go of within a second, for a follow's write wants that file (spare.py); one in use closes when its read ends."""
    store = Store(tmp_path / "views.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a", cache_key="k-a")]))])
    key = str(store.path.resolve())

    def replace(name: str) -> None:
        ingest(store, [str(write_jsonl(tmp_path / f"{name}.jsonl", [rec(name, cache_key=f"k-{name}")]))])

    def let_go(view) -> bool:
        deadline = time.monotonic() + 10
        while views._views.get(key) is view and time.monotonic() < deadline:
            time.sleep(0.05)
        return views._views.get(key) is not view

    with store.read() as con:
        con.execute("SELECT 1")
    idle, idle_file = views._views[key], store.version()[1]
    replace("b")
    assert let_go(idle) and not views.reading_file(idle_file)
    with pytest.raises(duckdb.ConnectionException):
        idle.con.execute("SELECT 1")
    with store.read() as con:
        busy, busy_file = views._views[key], store.version()[1]
        replace("c")
        assert let_go(busy) and views.reading_file(busy_file)
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(2,)], "its state, whole"
    assert not views.reading_file(busy_file)
    with pytest.raises(duckdb.ConnectionException):
        busy.con.execute("SELECT 1")
