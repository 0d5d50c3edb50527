"""The multi-machine setup: a DuckLake whose catalog is PostgreSQL and whose data files are on S3, named by
specdec.toml's [store] table. Real servers on free ports (tests/servers.py); "machines" are processes that
share nothing but the two servers (no lock file: a lost commit race is retried on the new state)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import run_cli, write_jsonl
from servers import create_database, postgres, s3, s3_keys
from writers import batch, content, two_writers_and_a_reader

from specdec_core.ingestion import ingest
from specdec_core.store import Store, StoreError
from specdec_core.store import lake as lakes

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def servers():
    with postgres() as dsn, s3() as endpoint:
        yield dsn, endpoint


@pytest.fixture
def shared(servers, tmp_path, monkeypatch):
    """specdec.toml naming the shared store, and the environment every machine of it runs with."""
    dsn, endpoint = servers
    prefix = f"specdec-{tmp_path.name}/"  # each test its own store: its own database and S3 prefix
    database = "t_" + "".join(c if c.isalnum() else "_" for c in tmp_path.name.lower())
    config = tmp_path / "specdec.toml"
    config.write_text(f"""
[store]
catalog = "postgres:{dsn.replace('dbname=specdec', f'dbname={database}')}"
data_path = "s3://incident-logs/{prefix}"
s3_endpoint = "{endpoint}"
s3_url_style = "path"
s3_use_ssl = false
s3_region = "us-east-1"
""", encoding="utf-8")
    create_database(dsn, database)
    env = {"SPECDEC_CONFIG": str(config), "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("SPECDEC_DB", raising=False)
    return {**os.environ, **env}, endpoint, prefix


def test_two_machines_and_a_reader_on_postgres_and_s3(shared, tmp_path):
    env, endpoint, prefix = shared
    store = Store()
    assert store.lake is not None and store.lake.postgres and store.lake.on_s3
    counts = two_writers_and_a_reader(store.name, tmp_path, 3000, env=env)
    assert 6200 in counts, "the reader saw both machines' batches land"
    # The rows are Parquet files on S3, not on this machine's disk.
    keys = s3_keys(endpoint)
    assert any(k.startswith(prefix + "main/requests/") and k.endswith(".parquet") for k in keys)
    assert not list(tmp_path.glob("**/*.parquet"))
    # The store's maintenance deletes files no snapshot names: on S3 too, every file the store holds is named.
    con = lakes.open_lake(store.lake)
    try:
        live = {Path(p).name for (p,) in con.execute(
            "SELECT path FROM __ducklake_metadata_store.ducklake_data_file WHERE end_snapshot IS NULL").fetchall()}
        would_delete = {Path(p).name for (p,) in con.execute(
            "CALL ducklake_delete_orphaned_files('store', dry_run => true, older_than => now() + INTERVAL 1 DAY)"
        ).fetchall()}
    finally:
        con.close()
    assert live and not live & would_delete


def test_the_cli_reads_and_writes_the_configured_store_without_db(shared, tmp_path):
    env, _, _ = shared
    log = write_jsonl(tmp_path / "app.jsonl", batch("c", 300, 0))

    def specdec(*args: str) -> subprocess.CompletedProcess:
        return run_cli(*args, cwd=ROOT, env=env)

    loaded = specdec("ingest", str(log), "--json")
    assert loaded.returncode == 0, loaded.stderr
    assert json.loads(loaded.stdout)["accepted"] == 300
    stats = specdec("stats", "--json")
    assert stats.returncode == 0, stats.stderr
    local = str(tmp_path / "local.duckdb")
    ingest(Store(local), [str(log)])
    expected = run_cli("stats", "--json", "--db", local, cwd=ROOT, env=env)
    assert json.loads(stats.stdout) == json.loads(expected.stdout)
    report = specdec("report", "--out", str(tmp_path / "report.csv"))
    assert report.returncode == 0, report.stderr
    assert (tmp_path / "report.csv").read_text().count("\n") > 1


def test_a_shared_store_that_cannot_be_reached_is_a_one_line_error(tmp_path, monkeypatch):
    config = tmp_path / "specdec.toml"
    config.write_text('[store]\ncatalog = "postgres:dbname=specdec host=127.0.0.1 port=1 user=nobody"\n'
                      'data_path = "s3://nowhere/specdec/"\n', encoding="utf-8")
    monkeypatch.setenv("SPECDEC_CONFIG", str(config))
    monkeypatch.delenv("SPECDEC_DB", raising=False)
    with pytest.raises(StoreError) as err:
        with Store().read():
            pass
    message = str(err.value)
    assert "\n" not in message and message.startswith("ducklake:postgres:dbname=specdec") and "cannot open" in message


def test_a_writer_that_loses_the_commit_race_loads_its_batch_again_on_the_new_state(shared, tmp_path):
    import threading

    seed = write_jsonl(tmp_path / "seed.jsonl", batch("s", 100, 0))
    a = write_jsonl(tmp_path / "a.jsonl", batch("a", 500, 1))
    b = write_jsonl(tmp_path / "b.jsonl", batch("b", 500, 1))
    ingest(Store(), [str(seed)])
    attempts: list[int] = []

    def meanwhile_another_machine_commits(con, ingest_id):
        attempts.append(ingest_id)
        if len(attempts) == 1:  # a's first try: b starts after it and commits before it
            other = threading.Thread(target=ingest, args=(Store(), [str(b)]))
            other.start()
            other.join()

    result = ingest(Store(), [str(a)], before_commit=meanwhile_another_machine_commits)
    assert result.accepted == 500
    assert attempts == [2, 3], "the first try lost to b's commit (ingest 2) and ran again as ingest 3"
    one_by_one = str(tmp_path / "sequential.duckdb")
    for f in (seed, b, a):
        ingest(Store(one_by_one), [str(f)])
    assert content(Store().name) == content(one_by_one)
