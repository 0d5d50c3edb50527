"""The dashboard ships in the wheel and `specdec dashboard` serves it from any folder (issue #55, item 10).

The wheel is built offline from a copy of the files it is made of (no build folder left in the checkout),
installed into a folder of its own, and served from another folder by the `specdec` of that install."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from pathlib import Path

import pytest
from helpers import rec, run_cli, write_jsonl
from served import dashboard_port, wait_until_healthy

from specdec_core.ingestion.load import ingest
from specdec_core.settings_file import tomllib
from specdec_core.store.connection import Store

ROOT = Path(__file__).resolve().parents[2]
WHEEL_SOURCES = ("pyproject.toml", "README.md", "app.py", "pages", "ui", ".streamlit", "specdec_core")
sys.path.insert(0, str(ROOT))  # the ui package sits beside app.py, which is not a package
import ui  # noqa: E402


def test_every_package_of_specdec_core_is_listed_for_the_wheel():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts) for init in (ROOT / "specdec_core").rglob("__init__.py")}
    assert found - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in WHEEL_SOURCES:
        copy = shutil.copytree if (ROOT / name).is_dir() else shutil.copy2
        copy(ROOT / name, source / name, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                            if (ROOT / name).is_dir() else {}))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source),
                    "-w", str(out)], check=True, capture_output=True, timeout=300)
    [built] = out.glob("*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("installed")
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    return target


def test_the_wheel_holds_the_dashboard(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    inside = "specdec_core/dashboard/"
    assert {inside + "app.py", inside + ".streamlit/config.toml", inside + "ui/click_bridge.js"} <= names
    assert {inside + path for path in ui.PAGE_FILES.values()} <= names
    assert {inside + "ui/" + p.name for p in (ROOT / "ui").glob("*.py")} <= names
    assert not [n for n in names if n.startswith(("pages/", "ui/", "app.py"))], "nothing outside the package"


def test_specdec_dashboard_refuses_a_bad_port_in_one_line(tmp_path):
    # From another folder, this checkout's specdec (not whichever the environment installed).
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for port in ("0", "99999", "٨٥٠١", "http"):
        done = run_cli("dashboard", "--port", port, cwd=tmp_path, env=env)
        assert done.returncode == 2 and done.stderr.count("\n") == 1, (port, done.stderr)
        assert done.stderr.startswith(f"specdec dashboard: port {port!r} is not a number from 1 to 65535")


@pytest.mark.browser
def test_specdec_dashboard_serves_the_installed_pages_from_another_folder(installed, browser, tmp_path):
    from playwright.sync_api import expect
    from served import heading, new_page

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = Store(elsewhere / "triage.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [rec("a"), rec("b", ts="2026-03-01T10:01:00Z",
                                                                       cache_hit=True)]))])
    env = {**os.environ, "PYTHONPATH": str(installed)}
    env.pop("SPECDEC_DB", None)
    where = subprocess.run([sys.executable, "-c", "from specdec_core.dashboard_launch import dashboard_app; "
                            "print(dashboard_app())"], cwd=elsewhere, env=env, capture_output=True, text=True)
    assert where.stdout.strip() == str(installed / "specdec_core" / "dashboard" / "app.py"), where.stderr
    port = dashboard_port()
    log = (tmp_path / "dashboard.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "specdec_core", "dashboard", "--db", "triage.duckdb",
                               "--port", str(port)], cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until_healthy(url, server, tmp_path / "dashboard.log")
        page = new_page(browser)
        page.goto(url)
        heading(page, "Overview")
        requests = page.get_by_test_id("stMetric").filter(has_text="Requests").get_by_test_id("stMetricValue")
        expect(requests).to_have_text("2")
        page.goto(f"{url}/request?request_id=b")
        heading(page, "Request")
        page.close()
    finally:
        server.terminate()  # SIGTERM to `specdec dashboard` alone, as a service manager stops it
        server.wait(timeout=20)
        log.close()
    # The Streamlit server it started went with it: nothing answers on the port.
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/_stcore/health", timeout=2)
