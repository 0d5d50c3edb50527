"""The suite's `run_cli` forks the CLI from a server that has imported its libraries (forked_cli.py): what a
command prints, exits with and writes must be what a new interpreter gives."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from forked_cli import run_forked
from helpers import rec, run_cli, write_jsonl


def fresh(*args: str, **kwargs) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "specdec_core", *args], capture_output=True, text=True,
                          timeout=120, **kwargs)


def test_a_forked_command_prints_exits_and_writes_as_a_new_interpreter(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a"), rec("b", cache_hit=True), "{not json"])
    env = {**os.environ, "SPECDEC_DB": "from-env.duckdb"}
    runs = [
        (("ingest", "log.jsonl", "--json"), {"cwd": tmp_path, "env": env}),  # a relative path, the store from env
        (("stats", "--db", "from-env.duckdb"), {"cwd": tmp_path}),
        (("stats", "--db", str(tmp_path / "none.duckdb")), {}),  # exits 1 with one line
        (("stats", "--no-such-option"), {}),  # argparse's usage and 2
        (("metrics", "rules"), {}),
    ]
    for args, kwargs in runs:
        forked = run_forked(list(args), 120, **kwargs)
        if args[0] == "ingest":  # the second run would find the lines loaded: a new store for it
            assert forked is not None and json.loads(forked.stdout)["accepted"] == 2, forked
            os.rename(tmp_path / "from-env.duckdb", tmp_path / "forked.duckdb")
        expected = fresh(*args, **kwargs)
        assert forked is not None
        assert (forked.returncode, forked.stdout, forked.stderr) == (expected.returncode, expected.stdout,
                                                                       expected.stderr), args
    assert log.exists() and (tmp_path / "forked.duckdb").stat().st_size > 0


def test_a_command_past_its_timeout_is_killed_and_the_next_runs(tmp_path):
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):  # a receiver runs until it is stopped
        run_forked(["collect", "--db", "s.duckdb", "--listen", "127.0.0.1:0"], 2, cwd=tmp_path)
    assert time.monotonic() - started < 30
    after = run_forked(["metrics", "rules"], 120)
    assert after is not None and after.returncode == 0 and after.stdout.startswith("groups:")


def test_an_environment_that_changes_how_python_starts_gets_a_new_interpreter():
    assert run_forked(["metrics", "rules"], 120, env={**os.environ, "PYTHONPATH": "/elsewhere"}) is None
    assert run_forked(["metrics", "rules"], 120, env={**os.environ, "SPECDEC_THREADS": "1"}) is not None


def test_a_folder_that_is_not_there_is_subprocess_s_error_and_the_server_goes_on(tmp_path):
    with pytest.raises(FileNotFoundError):
        run_cli("metrics", "rules", cwd=tmp_path / "gone")
    after = run_forked(["metrics", "rules"], 120, cwd=tmp_path)
    assert after is not None and after.returncode == 0
