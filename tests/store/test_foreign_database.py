"""`--db` at another application's DuckDB: every writing command refuses it in one line and leaves it as it
was, byte for byte; an empty DuckDB file is no one's and becomes a store."""

from __future__ import annotations

import hashlib
from pathlib import Path

import duckdb
import pytest
from helpers import free_port, rec, run_cli, write_jsonl

from specdec_core.cli import main as cli_main
from specdec_core.ingestion import ingest
from specdec_core.store.connection import Store

FOREIGN = {
    "unrelated tables": "CREATE TABLE users (id INT, name VARCHAR); CREATE TABLE orders (id INT, total DOUBLE)",
    "a requests table of its own": "CREATE TABLE requests (id INT, body VARCHAR)",
    "its requests with rows": "CREATE TABLE requests (id INT, body VARCHAR); INSERT INTO requests VALUES (1, 'x')",
}


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("command", ["migrate", "ingest"])
@pytest.mark.parametrize("kind", list(FOREIGN))
def test_a_foreign_database_is_refused_in_one_line_and_left_as_it_was(tmp_path, capsys, kind, command):
    db = tmp_path / "other.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(FOREIGN[kind])
    before = digest(db)
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a")])
    argv = ["migrate", "--db", str(db)] if command == "migrate" else ["ingest", str(log), "--db", str(db)]
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1 and "not a specdec store" in err and str(db) in err, err
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "other.duckdb", "other.duckdb.lock"]


def test_an_empty_duckdb_file_becomes_a_store_and_a_store_stays_one(tmp_path, capsys):
    db = tmp_path / "empty.duckdb"
    duckdb.connect(str(db)).close()
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a")])
    assert cli_main(["ingest", str(log), "--db", str(db)]) == 0
    assert cli_main(["migrate", "--db", str(db)]) == 0
    assert cli_main(["ingest", str(write_jsonl(tmp_path / "more.jsonl", [rec("b")])), "--db", str(db)]) == 0
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(2,)]


@pytest.mark.parametrize("kind", list(FOREIGN))
def test_metrics_serve_refuses_a_foreign_database_up_front(tmp_path, kind):
    """Before, it started serving and answered every scrape with a 500 and a traceback."""
    db = tmp_path / "other.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute(FOREIGN[kind])
    before = digest(db)
    done = run_cli("metrics", "serve", "--db", str(db), "--listen", f"127.0.0.1:{free_port()}", timeout=60)
    assert done.returncode == 1 and done.stdout == "", done.stderr
    assert done.stderr.count("\n") == 1 and "not a specdec" in done.stderr and str(db) in done.stderr, done.stderr
    assert digest(db) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.duckdb"]


def _target(folder: Path, kind: str) -> Path:
    folder.mkdir()
    db = folder / "target.duckdb"
    if kind == "a text file":
        db.write_text("not a database\n")
    elif kind == "a store holding requests":
        ingest(Store(db), [str(write_jsonl(folder.parent / "held.jsonl", [rec("held")]))])
        (folder / "target.duckdb.lock").unlink()  # what its own ingest left: not the refusal's
    else:
        with duckdb.connect(str(db)) as con:
            con.execute(FOREIGN[kind])
    return db


@pytest.mark.parametrize("kind", [*FOREIGN, "a text file", "a store holding requests"])
def test_a_refused_copy_target_is_left_as_it_was_with_nothing_beside_it(tmp_path, capsys, kind):
    source = tmp_path / "source.duckdb"
    ingest(Store(source), [str(write_jsonl(tmp_path / "log.jsonl", [rec("a")]))])
    dest = _target(tmp_path / "dest", kind)
    before = digest(dest)
    assert cli_main(["migrate", "--db", str(source), "--to", str(dest)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(dest) in err, err
    assert digest(dest) == before
    assert sorted(p.name for p in dest.parent.iterdir()) == ["target.duckdb"]


def test_a_served_store_replaced_by_a_foreign_database_answers_one_line_not_a_traceback(tmp_path, capfd):
    import urllib.error
    import urllib.request

    from specdec_core.monitoring.exporter import Listen, serve

    db = tmp_path / "s.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "log.jsonl", [rec("a")]))])
    running = serve(Store(db), Listen("127.0.0.1", free_port()))
    url = f"http://127.0.0.1:{running.port}/metrics"
    try:
        with urllib.request.urlopen(url, timeout=30) as resp:
            assert b"specdec_requests_total" in resp.read()
        foreign = tmp_path / "foreign.duckdb"
        with duckdb.connect(str(foreign)) as con:
            con.execute(FOREIGN["unrelated tables"])
        foreign.replace(db)
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(url, timeout=30)
        body = err.value.read().decode()
    finally:
        running.stop()
    assert err.value.code == 500 and body.count("\n") == 1 and "not a specdec" in body and str(db) in body, body
    said = capfd.readouterr().err
    assert "Traceback" not in said and said.count("\n") == 1 and "a scrape failed" in said, said


@pytest.mark.parametrize("command", ["stats", "report", "ingest", "migrate"])
def test_a_log_given_as_the_store_is_named_as_one_in_one_line_and_left_as_it_was(tmp_path, capsys, command):
    """`--db requests.jsonl` (a log where the store goes): reading said DuckDB's "Cannot launch in-memory database
    in read-only mode!", writing "not a valid DuckDB database file!"; both now say what to do with a log."""
    log = write_jsonl(tmp_path / "requests.jsonl", [rec("a"), rec("b")])
    before = digest(log)
    argv = {"stats": ["stats"], "report": ["report", "--out", str(tmp_path / "r.csv")],
            "ingest": ["ingest", str(log)], "migrate": ["migrate"]}[command] + ["--db", str(log)]
    code = cli_main(argv)
    err = capsys.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert f"{log}: not a specdec store (no DuckDB database)" in err and f"`specdec ingest {log} --db" in err, err
    assert digest(log) == before and not (tmp_path / "r.csv").exists()
