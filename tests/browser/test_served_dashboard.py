"""The dashboard served by `streamlit run` and driven in a real headless Chromium (the system's, never a download)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from helpers import rec
from playwright.sync_api import Page, expect, sync_playwright
from test_pages import HTML_OUTPUT, SCRIPT, build_db, build_incident_db
from test_replay_page import TINY

from specdec_core.demo.models import registry_dict

ROOT = Path(__file__).resolve().parents[2]
SCREENSHOTS = ROOT / "test-output"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update"]

pytestmark = pytest.mark.browser


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def dashboard(db: Path, log: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """`streamlit run app.py -- --db DB` on a free local port, until the block ends."""
    port = free_port()
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.address", "127.0.0.1",
             "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
             "--", "--db", str(db)],
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})},
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as health:
                    if health.read() == b"ok":
                        break
            except OSError:
                pass
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the dashboard did not come up; its log: {log.read_text()[-2000:]}")
            time.sleep(0.3)
        yield url
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


@pytest.fixture(scope="module")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1500, "height": 1100})
    page = context.new_page()
    dialogs: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.dialogs = dialogs  # an alert() from log text would land here
    yield page
    context.close()


def metric(page: Page, label: str):
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def test_overview_then_mismatches_in_a_browser(tmp_path, page):
    db = build_incident_db(tmp_path)
    with dashboard(db, tmp_path / "streamlit.log") as url:
        page.goto(url)
        expect(page.get_by_role("heading", level=1, name="Overview")).to_be_visible()
        expect(metric(page, "Contaminated hits").first).to_have_text("2")
        expect(metric(page, "Requests")).to_have_text("6")
        expect(page.get_by_text("contaminated hits, since").first).to_contain_text("2026-03-01 10:02:00 UTC")
        expect(page.get_by_text("Few unique cache keys for many unique identities")).to_be_visible()
        SCREENSHOTS.mkdir(exist_ok=True)
        page.screenshot(path=SCREENSHOTS / "overview.png", full_page=True)

        page.get_by_test_id("stSidebar").get_by_role("link", name="Mismatches", exact=True).click()
        expect(page.get_by_role("heading", level=1, name="Mismatches")).to_be_visible()
        table = page.get_by_test_id("stDataFrame").first
        expect(table).to_be_visible()
        # The grid draws on a canvas; the table behind it, for screen readers, holds the cell text.
        cells = table.locator("td[role=gridcell]")
        expect(cells.filter(has_text=re.compile(r"^r3$"))).to_have_count(1)
        expect(cells.filter(has_text=re.compile(r"^draft_model;max_tokens$"))).to_have_count(1)
        page.screenshot(path=SCREENSHOTS / "mismatches.png", full_page=True)
        assert page.dialogs == []


def test_a_link_straight_to_a_page_of_a_fresh_server_has_the_sidebar(tmp_path, page):
    db = build_incident_db(tmp_path)
    with dashboard(db, tmp_path / "streamlit.log") as url:
        page.goto(f"{url}/replay?request_id=r3")
        expect(page.get_by_role("heading", level=1, name="Replay")).to_be_visible()
        expect(page.get_by_test_id("stSidebar").get_by_role("textbox", name="Database")).to_have_value(str(db))
        expect(page.get_by_role("textbox", name="Request id")).to_have_value("r3")
        expect(page.get_by_test_id("stCode").first).to_contain_text("Summarise the incident.")


def test_html_in_logs_shows_as_text_in_a_browser(tmp_path, page):
    db = build_db(tmp_path, [
        rec("x1", ts="2026-03-01T10:00:00Z", prompt=SCRIPT, output_text=HTML_OUTPUT),
        rec("x2", ts="2026-03-01T10:01:00Z", prompt=SCRIPT, output_text=HTML_OUTPUT, cache_hit=True, max_tokens=2),
    ])
    with dashboard(db, tmp_path / "streamlit.log") as url:
        page.goto(f"{url}/replay?request_id=x2")
        codes = page.get_by_test_id("stCode")
        expect(codes.first).to_contain_text(SCRIPT)
        expect(codes.nth(1)).to_contain_text(HTML_OUTPUT)
        assert page.locator("main img[src='x']").count() == 0
        assert page.locator("main b", has_text="bold").count() == 0
        assert page.locator("main script", has_text="alert(1)").count() == 0
        page.get_by_test_id("stSidebar").get_by_role("link", name="Overview", exact=True).click()
        expect(metric(page, "Contaminated hits").first).to_have_text("1")
        expect(page.get_by_text("Few unique cache keys for many unique identities")).to_be_visible()
        page.screenshot(path=SCREENSHOTS / "html-in-logs.png", full_page=True)
        assert page.dialogs == [], "log text ran as script"


def registry_toml(tiny_registry) -> str:
    """A specdec.toml that knows only the tiny family the tests built, for the server process."""
    models_root = tiny_registry.model(TINY["target_model"]).path.parents[1]
    lines = []
    for table, entries in registry_dict(models_root, families=("tiny",)).items():
        for name, settings in entries.items():
            lines.append(f'[{table}."{name}"]')
            lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"
