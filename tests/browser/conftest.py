"""Settings and fixtures shared by the browser tests: one Chromium per test process, a fresh page per test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import Page, expect, sync_playwright
from served import CHROMIUM, CHROMIUM_ARGS, ROOT, SERVING, dashboard, new_page

from specdec_core.ingestion import ingest
from specdec_core.store import Store

# A dashboard served beside a loaded test run can take seconds to draw the last part of a page: an
# assertion waits up to 30 s for it (and returns as soon as it holds) instead of Playwright's 5 s.
expect.set_options(timeout=30_000)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A browser test that failed shows the last lines each dashboard serving it logged: a flake under load
    (CI's) is seen from the server's side too."""
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        for url, log in list(SERVING.items()):
            try:
                tail = log.read_text(errors="replace")[-3000:]
            except OSError as exc:
                tail = f"(unreadable: {exc})"
            report.sections.append((f"dashboard at {url}: {log.name}, its last lines", tail))


# One per test process, not per module: its tabs share one renderer and one HTTP cache (served.new_page), which
# keep Streamlit's scripts compiled for the next module's dashboards at the same addresses (served.dashboard_port).
@pytest.fixture(scope="session")
def browser():
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser) -> Iterator[Page]:
    page = new_page(browser, 1500, 1100)  # an alert() from log text would land in page.dialogs
    yield page
    page.close()


@pytest.fixture(scope="module")
def demo_url(tmp_path_factory, browser):
    """The demo incident served once per module, for the tests that walk it."""
    folder = tmp_path_factory.mktemp("glance")
    db = folder / "demo.duckdb"
    ingest(Store(db), [str(ROOT / "data" / "demo" / "requests.jsonl.gz")])
    with dashboard(db, folder / "streamlit.log") as url:
        yield url
