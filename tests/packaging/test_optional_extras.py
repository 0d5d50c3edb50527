"""`pip install specdec-triage` without extras: the core works, and a feature that needs an extra says which.

Each check runs in a fresh interpreter whose import system refuses every module an extra
installs, as a bare install would lack them (the real bare install is measured in the report
that introduced this; building a venv from PyPI in a test would need the network).
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import rec, run_cli, write_jsonl

from specdec_core.extras import EXTRAS, MissingExtra, require

_BLOCKED = sorted({module for modules in EXTRAS.values() for module in modules})

# A finder ahead of every other that answers "not installed" for the extras' modules.
_BLOCKER = f"""
import importlib.abc, sys
_BLOCKED = {set(_BLOCKED)!r}
class _NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in _BLOCKED:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, _NotInstalled())
"""

_CLI = _BLOCKER + """
from specdec_core.cli import main
sys.exit(main(sys.argv[1:]))
"""

# The modules that are an extra's own code: importing them without it says so.
_NEED_REPLAY = {"specdec_core.decoding.engine"}
_NEED_METRICS = {"specdec_core.monitoring.exporter"}


def bare_python(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)


def bare_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return bare_python(_CLI, *args)


@pytest.fixture(scope="module")
def small_log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("bare")
    records = [
        rec("r1", cache_key="k-1", ts="2026-03-01T10:00:00Z"),
        rec("r2", cache_key="k-1", ts="2026-03-01T10:00:01Z", cache_hit=True, temperature=0.7),
        rec("r3", cache_key="k-2", ts="2026-03-01T10:00:02Z", max_tokens=2, output_tokens=3),
    ]
    return write_jsonl(folder / "requests.jsonl", records)


def test_every_core_module_imports_without_the_extras() -> None:
    code = _BLOCKER + """
import importlib, json, pkgutil, specdec_core
from specdec_core.extras import MissingExtra
outcome = {}
for info in pkgutil.walk_packages(specdec_core.__path__, "specdec_core."):
    if info.name.endswith("__main__"):
        continue
    try:
        importlib.import_module(info.name)
        outcome[info.name] = "ok"
    except MissingExtra as exc:
        outcome[info.name] = str(exc)
print(json.dumps(outcome))
"""
    done = bare_python(code)
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout)
    assert len(outcome) > 50
    failed = {name: why for name, why in outcome.items() if why != "ok"}
    assert set(failed) == _NEED_REPLAY | _NEED_METRICS
    for name, why in failed.items():
        extra, module = ("metrics", "prometheus_client") if name in _NEED_METRICS else ("replay", "torch")
        assert why == f"needs the {extra} extra ({module} is not installed): pip install 'specdec-triage[{extra}]'"


def test_key_and_guarded_cache_work_without_the_extras() -> None:
    code = _BLOCKER + """
import json
from specdec_core import DecodeRequest, DecodeResult, MemoryCache, cache_key, identity
req = DecodeRequest(prompt="p", target_model="t", draft_model="d", temperature=0.0, max_tokens=8, tokenizer_version="v1")
other = DecodeRequest(prompt="p", target_model="t", draft_model="d", temperature=0.7, max_tokens=8, tokenizer_version="v1")
cache = MemoryCache()
key = cache_key(req, namespace="prod")
cache.set(key, DecodeResult(text="out", token_ids=(1,), finish_reason="stop"), identity(req))
print(json.dumps({"key": key, "same": cache.get(key, identity(req)).status,
                  "other": cache.get(key, identity(other)).status, "torch": "torch" in sys.modules}))
"""
    done = bare_python(code)
    assert done.returncode == 0, done.stderr
    from specdec_core import DecodeRequest, cache_key

    full = cache_key(DecodeRequest(prompt="p", target_model="t", draft_model="d", temperature=0.0,
                                   max_tokens=8, tokenizer_version="v1"), namespace="prod")
    assert json.loads(done.stdout) == {"key": full, "same": "hit", "other": "fingerprint_mismatch", "torch": False}


def test_ingest_stats_and_report_without_the_extras_equal_a_full_install(small_log: Path, tmp_path: Path) -> None:
    bare_db, full_db = tmp_path / "bare.duckdb", tmp_path / "full.duckdb"
    for run, db in ((bare_cli, bare_db), (run_cli, full_db)):
        done = run("ingest", str(small_log), "--db", str(db))
        assert done.returncode == 0, done.stderr
        assert "read 3, accepted 3" in done.stdout
    bare_stats = bare_cli("stats", "--db", str(bare_db), "--json")
    full_stats = run_cli("stats", "--db", str(full_db), "--json")
    assert bare_stats.returncode == 0, bare_stats.stderr
    assert json.loads(bare_stats.stdout) == json.loads(full_stats.stdout)
    for run, db in ((bare_cli, bare_db), (run_cli, full_db)):
        done = run("report", "--db", str(db), "--out", str(db.with_suffix(".csv")))
        assert done.returncode == 0, done.stderr
    bare_rows = list(csv.reader(bare_db.with_suffix(".csv").open()))
    assert len(bare_rows) > 1
    assert bare_rows == list(csv.reader(full_db.with_suffix(".csv").open()))


@pytest.mark.parametrize("command", ["", "ingest", "stats", "report", "migrate", "replay", "demo", "audit-key",
                                     "models", "collect"])
def test_help_works_without_the_extras(command: str) -> None:
    done = bare_cli(*command.split(), "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: specdec")


@pytest.mark.parametrize("args", [
    ("replay", "--request-id", "r2"),
    ("demo", "--family", "tiny", "--requests", "4"),
    ("models", "fetch", "--family", "tiny"),
])
def test_a_command_needing_the_replay_extra_says_so_in_one_line(args: tuple[str, ...], small_log: Path,
                                                                  tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    if args[0] == "replay":  # a store to replay from: the one command that reads one
        assert bare_cli("ingest", str(small_log), "--db", str(db)).returncode == 0
    extra = {"replay": ["--db", str(db)], "demo": ["--out", str(tmp_path / "demo.jsonl")],
             "models": ["--models-dir", str(tmp_path / "models")]}[args[0]]
    done = bare_cli(*args, *extra)
    assert done.returncode == 2
    command = "models fetch" if args[0] == "models" else args[0]  # a group's subcommand is named too
    assert done.stderr == (f"specdec {command}: needs the replay extra (torch is not installed): "
                           "pip install 'specdec-triage[replay]'\n")
    assert not (tmp_path / "models").exists() and not (tmp_path / "demo.jsonl").exists()


def test_collect_without_its_extra_says_which_to_install(tmp_path: Path) -> None:
    done = bare_cli("collect", "--db", str(tmp_path / "s.duckdb"), "--listen", "127.0.0.1:0")
    assert done.returncode == 2
    assert done.stderr == ("specdec collect: needs the collect extra (opentelemetry is not installed): "
                           "pip install 'specdec-triage[collect]'\n")


def test_a_redis_cache_without_the_extra_says_which_to_install() -> None:
    code = _BLOCKER + """
from specdec_core.cache import open_cache
from specdec_core.extras import MissingExtra
try:
    open_cache("redis://127.0.0.1:1/0")
except MissingExtra as exc:
    print(exc)
"""
    done = bare_python(code)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "needs the redis extra (redis is not installed): pip install 'specdec-triage[redis]'\n"


def test_a_ducklake_store_without_the_extra_says_which_to_install(small_log: Path, tmp_path: Path) -> None:
    done = bare_cli("ingest", str(small_log), "--db", f"ducklake:{tmp_path / 'lake.sqlite'}")
    assert done.returncode in (1, 2)
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].endswith("needs the lake extra (duckdb_extension_ducklake is not installed): "
                             "pip install 'specdec-triage[lake]'")


def test_require_names_the_extra_only_for_the_missing_module_itself(tmp_path: Path, monkeypatch) -> None:
    broken = tmp_path / "gguf"
    broken.mkdir()
    (broken / "__init__.py").write_text("import a_module_gguf_itself_imports\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "gguf", raising=False)
    with pytest.raises(ModuleNotFoundError) as caught:
        require("replay", "gguf")
    assert not isinstance(caught.value, MissingExtra)
    assert caught.value.name == "a_module_gguf_itself_imports"
    with pytest.raises(ValueError):
        require("replay", "redis")
