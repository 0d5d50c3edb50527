"""The CLI at its edges: an empty request id, poll intervals that are no time, a reader that closes the pipe.
Each refusal is one line with exit 2; a closed pipe is a reader that has what it wanted: exit 0, nothing said."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import rec, run_cli, write_jsonl

from specdec_core.cli import main as cli_main
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def loaded_db(tmp_path_factory) -> Path:
    """A store the refusals below must leave as it is (none of them writes)."""
    folder = tmp_path_factory.mktemp("store")
    db = folder / "s.duckdb"
    ingest(Store(db), [str(write_jsonl(folder / "log.jsonl", [rec("a"), rec("b", cache_hit=True)]))])
    return db


def one_line_usage_error(capsys, argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        cli_main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and err.count("\n") == 1, err
    return err


def test_replay_of_an_empty_request_id_is_a_usage_error_not_every_suspicious_request(capsys, loaded_db):
    err = one_line_usage_error(capsys, ["replay", "--db", str(loaded_db), "--request-id", ""])
    assert "--request-id" in err and "empty" in err
    assert err.startswith("specdec replay: error: "), "named by its command, as the command's other errors are"


@pytest.mark.parametrize("every", ["inf", "nan", "0"])
def test_follow_every_that_is_no_interval_is_refused_in_one_line(capsys, tmp_path, loaded_db, every):
    code = cli_main(["ingest", "--db", str(loaded_db), "--follow", "--every", every, str(tmp_path / "log.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--every" in err, err


def test_follow_idle_exit_of_nan_is_refused_in_one_line(capsys, tmp_path, loaded_db):
    code = cli_main(["ingest", "--db", str(loaded_db), "--follow", "--idle-exit", "nan", str(tmp_path / "log.jsonl")])
    assert code == 2 and "--idle-exit" in capsys.readouterr().err


@pytest.mark.parametrize("argv, says", [
    (["report", "--out", "{db}"], "specdec report: --out {db} is the database itself"),
    (["ingest", "--metrics", "127.0.0.1:1", "{log}"], "specdec ingest: --metrics serves a follower's figures"),
    (["ingest", "--max-fields", "0", "{log}"], "specdec ingest: --max-fields: expected a number >= 1, got 0"),
    # 0 said the log held no contaminated hit, and a negative count ended in DuckDB's traceback.
    (["replay", "--suspicious", "0"], "specdec replay: --suspicious 0: expected a number of requests >= 1"),
    (["replay", "--suspicious", "-3"], "specdec replay: --suspicious -3: expected a number of requests >= 1"),
])
def test_a_usage_error_is_one_line_naming_the_command_and_exit_2(capsys, tmp_path, loaded_db, argv, says):
    before = loaded_db.read_bytes()
    names = {"db": str(loaded_db), "log": str(write_jsonl(tmp_path / "log.jsonl", [rec("c")]))}
    code = cli_main([argv[0], "--db", str(loaded_db), *(a.format(**names) for a in argv[1:])])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(says.format(**names)), err
    assert loaded_db.read_bytes() == before  # nothing was read into it


def test_audit_key_with_an_example_that_is_no_object_is_a_usage_error(capsys, tmp_path):
    example = tmp_path / "example.json"
    example.write_text("[1, 2]")
    code = cli_main(["audit-key", "json:dumps", "--example", str(example)])
    err = capsys.readouterr().err
    assert code == 2 and err == f"specdec audit-key: example {example} must be one JSON object, got list\n"


def test_stats_into_a_pipe_closed_early_exits_0_and_says_nothing(loaded_db):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head -1` that has read its line and gone
    done = subprocess.run([sys.executable, "-m", "specdec_core", "stats", "--db", str(loaded_db)], cwd=ROOT,
                          stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert (done.returncode, done.stderr) == (0, "")


def test_each_command_is_registered_by_the_module_the_cli_imports_for_it():
    import argparse
    import importlib

    from specdec_core import cli

    for module in cli.COMMAND_MODULES:
        parser = argparse.ArgumentParser()
        importlib.import_module(module).register(parser.add_subparsers())
        registered = set(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)
        assert registered == {c for c, m in cli.COMMANDS.items() if m == module}, module
    whole = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(whole.choices) == list(cli.COMMANDS)


def test_a_command_starts_with_its_own_module_only():
    # What `specdec metrics rules` imported: no other command's module, and no pyarrow (the ingest's).
    probe = ("import sys; from specdec_core.cli import main; code = main(['metrics', 'rules']); "
             "print(code, sorted(m for m in sys.modules if m.startswith('specdec_core.cli.')), "
             "'pyarrow' in sys.modules, file=sys.stderr)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.stdout.startswith("groups:"), done.stdout[:200]
    assert done.stderr.strip() == "0 ['specdec_core.cli.common', 'specdec_core.cli.metrics_cmd'] False", done.stderr


def test_a_dashboard_server_that_ignores_the_stop_is_killed_after_the_grace() -> None:
    """A service manager's stop (SIGTERM to `specdec dashboard`): a server that does not stop within STOP_GRACE_S
    (Streamlit's waits for requests in flight, without a limit) is killed, and the port never stays held."""
    server = ("import os, signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
              "print(os.getpid(), flush=True); time.sleep(60)")
    script = f"""
import sys, types
from specdec_core.cli import dashboard_cmd as d
d.STOP_GRACE_S = 0.5
d.streamlit_command = lambda *args: [sys.executable, "-c", {server!r}]
sys.exit(d.cmd_dashboard(types.SimpleNamespace(db=None, host="127.0.0.1", port="8999")))
"""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=15) == 137, proc.stderr.read()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_report_to_standard_output_and_an_unwritable_out_in_one_line(loaded_db, tmp_path):
    from helpers import run_cli

    piped = run_cli("report", "--db", str(loaded_db), "--out", "-")
    assert piped.returncode == 0, piped.stderr
    header, *rows = piped.stdout.splitlines()
    assert header.startswith("request_id,ts,kind,")
    assert piped.stderr.strip() == f"wrote {len(rows)} rows to standard output"
    assert not Path("-").exists() and not (tmp_path / "-").exists()
    for command, out in (("report", "r.csv"), ("incident-report", "r.md")):
        done = run_cli(command, "--db", str(loaded_db), "--out", str(tmp_path / "no-such-folder" / out))
        assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
        assert done.stderr.startswith(f"specdec {command}: --out {tmp_path / 'no-such-folder' / out}: cannot write: ")


def _on_a_terminal(*args: str) -> str:
    """`specdec ARGS...` with its standard output a terminal (a pseudo-terminal's): what the terminal received."""
    import pty

    main, attached = pty.openpty()
    done = subprocess.run([sys.executable, "-m", "specdec_core", *args], stdout=attached, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(attached)
    received = b""
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the terminal's other end is closed and everything was read
            break
        if not data:
            break
        received += data
    os.close(main)
    assert done.returncode == 0, done.stderr
    return received.decode("utf-8")


def test_a_csv_on_a_terminal_shows_log_texts_escape_sequences_as_escapes(tmp_path):
    """`--out -` to a terminal: a cache key, a consumer or an output holding an escape sequence is shown as its
    escapes (as every other line specdec prints), not run; piped, the CSV keeps the bytes as logged."""
    sequence = "\x1b]0;owned\x07\x1b[2J"
    log = write_jsonl(tmp_path / "log.jsonl", [
        rec("a", cache_key=f"k{sequence}", consumer=f"c{sequence}", output_text=f"Hi {sequence} there"),
        rec("b", cache_hit=True, temperature=0.1, cache_key=f"k{sequence}", consumer=f"c{sequence}",
            output_text=f"Hi {sequence} there"),
        rec("c", cache_key="k-2", consumer="d\u202eabc")])
    db = tmp_path / "s.duckdb"
    ingest(Store(db), [str(log)])
    shown = "\\x1b]0;owned\\x07\\x1b[2J"
    report = _on_a_terminal("report", "--db", str(db), "--out", "-")
    assert f",contaminated_hit,k{shown},a,temperature," in report, report
    impact = _on_a_terminal("impact", "--db", str(db), "--out", "-")
    assert f",contaminated_hit,c{shown},,prod,k{shown},a," in impact and f"Hi {shown} there" in impact, impact
    for text in (report, impact):
        assert "\x1b" not in text and "\x07" not in text and text.count("\n") == 2, text
    piped = run_cli("report", "--db", str(db), "--out", "-")
    assert f",contaminated_hit,k{sequence},a,temperature," in piped.stdout
    # The impact table: a consumer's control characters, and an override that reverses what follows, as spaces.
    table = run_cli("impact", "--db", str(db)).stdout
    assert "c ]0;owned  [2J " in table and "d abc " in table, table
    assert "\x1b" not in table and "\u202e" not in table


def test_a_log_file_named_with_an_escape_sequence_is_named_with_escapes(tmp_path):
    """Files found in a folder or a bucket are named as they are called: a name holding an escape sequence
    can't clear the terminal or retitle it."""
    folder = tmp_path / "logs"
    folder.mkdir()
    write_jsonl(folder / "a\x1b]0;owned\x07\x1b[2J.jsonl", [rec("a1")])
    done = run_cli("ingest", str(folder), "--db", str(tmp_path / "s.duckdb"))
    assert done.returncode == 0, done.stderr
    assert "a\\x1b]0;owned\\x07\\x1b[2J.jsonl: contract (the format --format auto chose)" in done.stderr
    assert "\x1b" not in done.stdout + done.stderr and "\x07" not in done.stdout + done.stderr
    (folder / "b\x1b[2J.jsonl.gz").write_bytes(b"not gzip")
    bad = run_cli("ingest", str(folder), "--db", str(tmp_path / "s.duckdb"))
    assert bad.returncode == 1 and "b\\x1b[2J.jsonl.gz" in bad.stderr and "\x1b" not in bad.stderr, bad.stderr


def test_a_gz_file_that_is_not_gzip_is_named_in_the_one_line_error(tmp_path):
    """The default --format auto reads each file's first line to choose its format: a broken .gz failed there
    with gzip's own words and no file name, where --format contract named it."""
    bad = tmp_path / "requests.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    for extra in ([], ["--format", "contract"]):
        done = run_cli("ingest", str(bad), "--db", str(tmp_path / "s.duckdb"), *extra)
        assert done.returncode == 1
        assert done.stderr == f"specdec ingest: {bad}: cannot be read: Not a gzipped file (b'no')\n", extra
    assert not (tmp_path / "s.duckdb").exists(), "nothing was written"
