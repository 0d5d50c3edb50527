"""A store in a DuckLake (SQLite catalog here; PostgreSQL + S3 in test_shared_store.py) holds what a DuckDB file
holds, batch after batch; specdec.toml's [store] names it; a store written by the last release (DuckDB 2.0.1)
is converted by `specdec migrate` and by the first ingest."""

from __future__ import annotations

import csv
import gzip
import json
import os
import shutil
import stat
import struct
from pathlib import Path

import pytest
from helpers import DROP, contents, rec, run_cli, write_jsonl

from specdec_core.derived import migrate
from specdec_core.ingestion import ingest
from specdec_core.store import Store, StoreError
from specdec_core.store.convert import side_install

FIXTURES = Path(__file__).parents[1] / "fixtures"
OLD_STORE = FIXTURES / "store-duckdb-2.0.1"


def _batches(tmp_path: Path) -> list[Path]:
    # Some rows log no deployment, some a name holding NUL: each judged in a partition of its own, which the
    # lake stores and its later writes join on (a NUL there broke the second write's catalog query).
    deployments = (DROP, "prod", "prod", "p\x00\x01")
    early = [rec(f"e{i}", ts=f"2026-03-01T10:{i // 60:02d}:{i % 60:02d}Z", cache_key=f"K{i % 9}",
                 cache_hit=i % 3 != 0, max_tokens=(32, 64)[i % 2], output_tokens=(20, 50)[i % 3 % 2],
                 deployment=deployments[i % 12 // 3]) for i in range(120)]
    later = [rec(f"l{i}", ts=f"2026-03-01T11:{i // 60:02d}:{i % 60:02d}Z", cache_key=f"K{i % 9}",
                 cache_hit=True, draft_model=("d1", "none")[i % 2], deployment=deployments[i % 12 // 3])
             for i in range(60)]
    # A late file: rows older than those stored, whose misses change the verdicts of stored hits.
    late = [rec(f"x{i}", ts=f"2026-03-01T09:59:{i:02d}Z", cache_key=f"K{i % 9}", temperature=0.7, seed=i)
            for i in range(30)]
    bad = ['{"request_id": "torn", ', '[1, 2]', json.dumps(rec("e1")), json.dumps(rec("e2", max_tokens=1))]
    return [write_jsonl(tmp_path / "early.jsonl", early), write_jsonl(tmp_path / "later.jsonl", later + bad),
            write_jsonl(tmp_path / "late.jsonl", late)]


def test_a_lake_holds_what_a_file_holds_after_every_batch(tmp_path):
    file_store, lake = str(tmp_path / "s.duckdb"), f"ducklake:{tmp_path / 'lake' / 's.sqlite'}"
    for batch in _batches(tmp_path):
        results = [ingest(Store(name), [str(batch)]) for name in (file_store, lake)]
        assert results[0].read == results[1].read and results[0].accepted == results[1].accepted
        assert results[0].quarantined == results[1].quarantined
        assert contents(lake) == contents(file_store)
    assert contents(lake)["quarantine"], "the bad lines were quarantined alike"
    # The rows are Parquet files beside the catalog.
    assert list((tmp_path / "lake" / "s.sqlite.files").glob("**/*.parquet"))


def test_a_lake_moved_whole_still_opens(tmp_path):
    first = f"ducklake:{tmp_path / 'a' / 's.sqlite'}"
    ingest(Store(first), [str(_batches(tmp_path)[0])])
    before = contents(first)
    shutil.move(tmp_path / "a", tmp_path / "b")
    moved = f"ducklake:{tmp_path / 'b' / 's.sqlite'}"
    assert contents(moved) == before
    ingest(Store(moved), [str(_batches(tmp_path)[1])])
    assert len(contents(moved)["requests"]) > len(before["requests"])
    assert not (tmp_path / "a").exists(), "the moved store writes beside its new catalog"


def test_the_store_table_of_specdec_toml_names_the_store_when_no_db_is_given(tmp_path, monkeypatch):
    config = tmp_path / "specdec.toml"
    config.write_text(f'[store]\ncatalog = "{tmp_path / "team.sqlite"}"\ndata_path = "{tmp_path / "files"}"\n',
                      encoding="utf-8")
    monkeypatch.setenv("SPECDEC_CONFIG", str(config))
    monkeypatch.delenv("SPECDEC_DB", raising=False)
    monkeypatch.delenv("SPECDEC_STORE", raising=False)
    # Enough rows that DuckLake writes them as Parquet files instead of inlining them in the catalog.
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K"), rec("h", cache_key="K", cache_hit=True,
                                                                             max_tokens=8, output_tokens=12)]
                      + [rec(f"r{i}", cache_key=f"k{i}") for i in range(500)])
    done = run_cli("ingest", str(log))
    assert done.returncode == 0, done.stderr
    assert f"db ducklake:{tmp_path / 'team.sqlite'}" in done.stdout
    stats = run_cli("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    assert json.loads(stats.stdout)["length_violations"] == 1
    assert list((tmp_path / "files").glob("**/*.parquet")) and not (tmp_path / "team.sqlite.files").exists()
    # --db still wins over the configured store.
    other = tmp_path / "other.duckdb"
    assert run_cli("ingest", str(log), "--db", str(other)).returncode == 0 and other.exists()


def test_a_misspelled_store_setting_is_a_one_line_error(tmp_path, monkeypatch):
    config = tmp_path / "specdec.toml"
    config.write_text('[store]\ncatalgo = "x.sqlite"\n', encoding="utf-8")
    monkeypatch.setenv("SPECDEC_CONFIG", str(config))
    monkeypatch.delenv("SPECDEC_DB", raising=False)
    done = run_cli("stats")
    assert done.returncode != 0
    assert done.stderr.strip().count("\n") == 0 and "catalgo" in done.stderr and str(config) in done.stderr


def _old_store(tmp_path: Path, mode: int = 0o640) -> Path:
    db = tmp_path / "old.duckdb"
    with gzip.open(OLD_STORE / "store.duckdb.gz", "rb") as src, open(db, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.chmod(db, mode)
    return db


def _storage_version(db: Path) -> int:
    return struct.unpack("<Q", db.read_bytes()[12:20])[0]


def test_a_store_of_the_last_release_is_refused_by_reads_and_converted_by_migrate(tmp_path):
    assert (side_install() / "duckdb").is_dir(), "make install puts DuckDB 2.0.1 in .venv/duckdb-2.0.1"
    db = _old_store(tmp_path)
    assert _storage_version(db) == 999
    refused = run_cli("stats", "--db", str(db))
    assert refused.returncode == 1 and len(refused.stderr.splitlines()) == 1
    assert f"specdec migrate --db {db}" in refused.stderr
    done = run_cli("migrate", "--db", str(db))
    assert done.returncode == 0, done.stderr
    assert _storage_version(db) < 999 and stat.S_IMODE(db.stat().st_mode) == 0o640
    # The report equals the one the last release wrote from this store.
    out = tmp_path / "report.csv"
    assert run_cli("report", "--db", str(db), "--out", str(out)).returncode == 0
    # Columns added since (replay_id, replay_link) come after the release's: its columns hold its values.
    old_header, *old_rows = (OLD_STORE / "report.csv").read_text(encoding="utf-8").splitlines()
    new_header, *new_rows = out.read_text(encoding="utf-8").splitlines()
    width = len(next(csv.reader([old_header])))
    assert next(csv.reader([new_header]))[:width] == next(csv.reader([old_header]))
    assert [row[:width] for row in csv.reader(new_rows)] == list(csv.reader(old_rows))
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(400,)]
        assert con.execute("SELECT count(*) FROM quarantine").fetchall() == [(2,)]


def test_the_first_ingest_converts_a_store_of_the_last_release(tmp_path):
    db = _old_store(tmp_path, 0o600)
    log = write_jsonl(tmp_path / "more.jsonl", [rec("new-1", ts="2026-11-20T10:00:00Z", cache_key="fresh")])
    result = ingest(Store(db), [str(log)])
    assert (result.read, result.accepted) == (1, 1)
    assert _storage_version(db) < 999 and stat.S_IMODE(db.stat().st_mode) == 0o600
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(401,)]


def test_without_the_side_install_conversion_says_how_to_get_it(tmp_path, monkeypatch):
    db = _old_store(tmp_path)
    monkeypatch.setenv("SPECDEC_DUCKDB_2", str(tmp_path / "nowhere"))
    with pytest.raises(StoreError) as err:
        ingest(Store(db), [str(write_jsonl(tmp_path / "l.jsonl", [rec("a")]))])
    assert "\n" not in str(err.value) and "duckdb==2.0.1" in str(err.value)
    assert _storage_version(db) == 999, "the store is left as it was"


def test_the_dashboard_shows_a_lake_as_it_shows_a_file(tmp_path, monkeypatch):
    from apptest import metrics_of, open_app, texts
    from dashboard_data import incident_records

    log = write_jsonl(tmp_path / "incident.jsonl", incident_records())
    file_store, lake = str(tmp_path / "s.duckdb"), f"ducklake:{tmp_path / 's.sqlite'}"
    for name in (file_store, lake):
        ingest(Store(name), [str(log)])
    seen = {}
    for name in (file_store, lake):
        pages = {page: open_app(monkeypatch, name, page) for page in (None, "mismatches", "keys")}
        seen[name] = {page: (metrics_of(at.main), texts(at, "markdown"), texts(at, "caption"))
                      for page, at in pages.items()}
    assert seen[lake] == seen[file_store]
    assert seen[lake][None][0]["Contaminated hits"] == "2"


def test_a_private_lake_stays_private_and_a_symlinked_catalog_keeps_working(tmp_path):
    real = tmp_path / "real"
    first = f"ducklake:{real / 's.sqlite'}"
    batches = _batches(tmp_path)
    old_umask = os.umask(0o022)  # the usual one: files others may read
    try:
        ingest(Store(first), [str(batches[0])])
        data = real / "s.sqlite.files"
        assert stat.S_IMODE(data.stat().st_mode) & 0o055, "a catalog others may read leaves its files so"
        os.chmod(real / "s.sqlite", 0o600)
        link = tmp_path / "link.sqlite"
        link.symlink_to(real / "s.sqlite")
        ingest(Store(f"ducklake:{link}"), [str(batches[1])])
    finally:
        os.umask(old_umask)
    assert link.is_symlink(), "the link stays a link"
    assert stat.S_IMODE((real / "s.sqlite").stat().st_mode) == 0o600
    for sidecar in real.glob("s.sqlite-*"):  # SQLite's WAL files take the catalog's mode
        assert stat.S_IMODE(sidecar.stat().st_mode) == 0o600
    # The rows themselves: Parquet files written with the umask, in a folder others can't enter.
    assert list(data.glob("**/*.parquet"))
    assert stat.S_IMODE(data.stat().st_mode) & 0o077 == 0
    assert contents(f"ducklake:{link}") == contents(first)
    assert len(contents(first)["requests"]) > 120


def test_migrate_to_copies_a_local_store_into_a_new_lake_and_refuses_one_that_holds_rows(tmp_path):
    file_store, lake = str(tmp_path / "s.duckdb"), f"ducklake:{tmp_path / 'shared.sqlite'}"
    batches = _batches(tmp_path)
    for batch in batches[:2]:
        ingest(Store(file_store), [str(batch)])
    done = run_cli("migrate", "--db", file_store, "--to", lake)
    assert done.returncode == 0, done.stderr
    assert "copied 180 requests" in done.stdout
    assert contents(lake) == contents(file_store)
    # The copy goes on as a store of its own: the next batch lands alike in both.
    for name in (file_store, lake):
        ingest(Store(name), [str(batches[2])])
    assert contents(lake) == contents(file_store)
    again = run_cli("migrate", "--db", file_store, "--to", lake)
    assert again.returncode == 1 and "already holds requests" in again.stderr and len(again.stderr.splitlines()) == 1


def test_a_copy_takes_the_derived_tables_as_they_are(tmp_path, monkeypatch):
    # A store that reads holds this version's: rebuilt in the copy's one transaction, a 20M-row store's ran a
    # lake's writer out of memory.
    import importlib

    migration = importlib.import_module("specdec_core.derived.migrate")  # the package's `migrate` is the function
    file_store, lake = tmp_path / "s.duckdb", f"ducklake:{tmp_path / 'shared.sqlite'}"
    for batch in _batches(tmp_path)[:2]:
        ingest(Store(file_store), [str(batch)])
    judged = []
    judge = migration.judge_hits
    monkeypatch.setattr(migration, "judge_hits", lambda con: judged.append(1) or judge(con))
    assert migration.copy_store(Store(file_store), Store(lake)) == 180
    assert judged == []
    assert contents(lake) == contents(file_store)
    with Store(lake).read() as con:  # read, not refused as an older store's
        assert con.execute("SELECT count(*) FROM hit_sources WHERE contaminated").fetchall()[0][0] > 0


def test_a_reader_sees_a_lake_made_again_under_the_same_name(tmp_path):
    name = f"ducklake:{tmp_path / 's.sqlite'}"
    batches = _batches(tmp_path)
    ingest(Store(name), [str(batches[0])])
    assert len(contents(name)["requests"]) == 120  # this thread's reader is attached now
    for old in [tmp_path / "s.sqlite", *tmp_path.glob("s.sqlite-*")]:
        old.unlink()
    shutil.rmtree(tmp_path / "s.sqlite.files", ignore_errors=True)
    ingest(Store(name), [str(batches[2])])
    assert [r[0] for r in contents(name)["requests"]][:1] == ["x0"] and len(contents(name)["requests"]) == 30


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except OSError:
            pass
        pid += 1


def test_what_killed_writers_left_is_removed_and_nothing_else(tmp_path):
    """A Parquet file no snapshot names (a writer killed before its commit) is deleted by the next maintenance
    once a day old, a younger one (perhaps a live writer's) is kept; a catalog a killed writer was making is
    removed by the next one that makes it, a live writer's is not. The lake was moved whole first: its files
    are matched as where it now is, and every file it holds, however old, is kept."""
    ingest(Store(f"ducklake:{tmp_path / 'a' / 's.sqlite'}"), [str(_batches(tmp_path)[0])])
    shutil.move(tmp_path / "a", tmp_path / "b")
    lake = f"ducklake:{tmp_path / 'b' / 's.sqlite'}"
    before = contents(lake)
    live = list((tmp_path / "b").glob("**/*.parquet"))
    assert live
    old = live[0].stat().st_mtime - 3 * 86400
    orphan, young = live[0].with_name("ducklake-killed.parquet"), live[0].with_name("ducklake-writing.parquet")
    for path in (orphan, young):
        shutil.copyfile(live[0], path)
    for path in (*live, orphan):
        os.utime(path, (old, old))
    migrate(Store(lake))
    assert not orphan.exists() and young.exists()
    assert all(path.exists() for path in live) and contents(lake) == before

    dead, alive = _dead_pid(), os.getppid()
    catalog = tmp_path / "new" / "s.sqlite"
    catalog.parent.mkdir()
    leftovers = [catalog.with_name(f"s.sqlite.{dead}.new"), catalog.with_name(f"s.sqlite.{dead}.new-wal")]
    writing = catalog.with_name(f"s.sqlite.{alive}.new")
    for path in (*leftovers, writing):
        path.write_bytes(b"half a catalog")
    ingest(Store(f"ducklake:{catalog}"), [str(_batches(tmp_path)[1])])
    assert not any(path.exists() for path in leftovers) and writing.exists()
    assert contents(f"ducklake:{catalog}")["requests"]
