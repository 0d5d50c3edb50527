"""`s3://` paths for `specdec ingest` and `--follow`, read through DuckDB's httpfs from a real S3 API (moto's
server): a prefix, a glob, gzip and other formats; credentials from the environment only, the endpoint from
specdec.toml's [logs] table; a followed prefix loads each new object once, after it holds still."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from helpers import rec, run_cli
from servers import s3

from specdec_core.store.connection import Store

FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"


@pytest.fixture(scope="module")
def bucket(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[object, dict[str, str]]]:
    """moto's S3 with a bucket `incident-logs`: a boto3 client, and the environment a specdec command needs."""
    with s3() as endpoint:
        config = tmp_path_factory.mktemp("cfg") / "specdec.toml"
        config.write_text(f'[logs]\ns3_endpoint = "{endpoint}"\ns3_region = "us-east-1"\n'
                          's3_url_style = "path"\ns3_use_ssl = false\n')
        env = {**os.environ, "SPECDEC_CONFIG": str(config), "AWS_ACCESS_KEY_ID": "testing",
               "AWS_SECRET_ACCESS_KEY": "testing"}
        client = boto3.client("s3", endpoint_url=f"http://{endpoint}", aws_access_key_id="testing",
                               aws_secret_access_key="testing", region_name="us-east-1")
        yield client, env


def put(client, key: str, body: bytes) -> None:
    client.put_object(Bucket="incident-logs", Key=key, Body=body)


def jsonl(*records: dict) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def ingest(env: dict[str, str], db: Path, *paths: str) -> tuple[int, dict, str]:
    done = run_cli("ingest", *paths, "--db", str(db), "--json", env=env)
    return done.returncode, json.loads(done.stdout) if done.returncode == 0 else {}, done.stderr


def ids(db: Path) -> list[tuple[str, str]]:
    with Store(db).read() as con:
        return con.execute("SELECT request_id, source_file FROM requests ORDER BY 1").fetchall()


def test_a_prefix_and_a_glob_read_in_place_under_their_urls(bucket, tmp_path: Path) -> None:
    client, env = bucket
    put(client, "read/2026-03-01/a.jsonl", jsonl(rec("a1"), rec("a2")))
    put(client, "read/2026-03-01/b.jsonl.gz", gzip.compress(jsonl(rec("b1"))))
    put(client, "read/2026-03-02/spans.jsonl", (FIXTURES / "openinference_spans.jsonl").read_bytes())
    put(client, "read/notes.txt", b"not a log")
    code, counts, err = ingest(env, tmp_path / "all.duckdb", "s3://incident-logs/read/")
    assert code == 0, err
    assert (counts["accepted"], counts["files"]) == (8, 3)
    assert counts["formats"]["s3://incident-logs/read/2026-03-02/spans.jsonl"] == "openinference"
    assert ("b1", "s3://incident-logs/read/2026-03-01/b.jsonl.gz") in ids(tmp_path / "all.duckdb")
    code, counts, err = ingest(env, tmp_path / "glob.duckdb", "s3://incident-logs/read/*/a.jsonl")
    assert (code, counts.get("accepted")) == (0, 2), err
    code, counts, _ = ingest(env, tmp_path / "all.duckdb", "s3://incident-logs/read/")  # again: nothing new
    assert (counts["accepted"], counts["duplicates"]) == (0, 8)


def test_credentials_come_from_the_environment_only(bucket, tmp_path: Path) -> None:
    client, env = bucket
    put(client, "creds/a.jsonl", jsonl(rec("c1")))
    config = tmp_path / "specdec.toml"
    config.write_text(Path(env["SPECDEC_CONFIG"]).read_text() + 's3_secret_access_key = "in-a-file"\n')
    code, _, err = ingest({**env, "SPECDEC_CONFIG": str(config)}, tmp_path / "s.duckdb", "s3://incident-logs/creds/")
    assert code == 1 and "[logs] has no setting 's3_secret_access_key'" in err
    code, _, err = ingest(env, tmp_path / "s.duckdb", "s3://incident-logs/no-such-prefix/")
    assert code == 1 and err.strip().startswith("specdec ingest: s3://incident-logs/no-such-prefix/:")
    assert len(err.strip().splitlines()) == 1


def test_follow_a_prefix_loads_each_new_object_once(bucket, tmp_path: Path) -> None:
    client, env = bucket
    db = tmp_path / "s.duckdb"
    put(client, "follow/a.jsonl", jsonl(rec("f1"), rec("f2")))
    follower = subprocess.Popen([sys.executable, "-m", "specdec_core", "ingest", "s3://incident-logs/follow/",
                                 "--db", str(db), "--follow", "--every", "0.2", "--json"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        first = json.loads(follower.stdout.readline())
        assert first["accepted"] == 2
        put(client, "follow/b.jsonl", jsonl(rec("f3")))
        second = json.loads(follower.stdout.readline())
        assert (second["accepted"], second["read"]) == (1, 1)  # a.jsonl is not read again
    finally:
        follower.terminate()
        out, err = follower.communicate(timeout=60)
    assert follower.returncode == 0, err
    assert [r[0] for r in ids(db)] == ["f1", "f2", "f3"]
    # Restarted, it loads nothing it loaded before: each object's version was committed with its rows.
    again = run_cli("ingest", "s3://incident-logs/follow/", "--db", str(db), "--follow", "--every", "0.2",
                    "--idle-exit", "1.5", "--json", env=env)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == ""
