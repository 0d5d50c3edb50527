"""Issue #17 in a real headless Chromium (the system's): stored replay pages, Replay selected starting the
replays, progress and cancel, ticks by request id, drag-to-zoom and click-for-rows, filters in the URL and
browser back, readable metrics and plots at 1024x768 and on a phone; screenshots of every page."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from dashboard_data import build_foreign_db, build_incident_db
from playwright.sync_api import Page, expect
from served import ROOT, dashboard, heading, metric, new_page, open_by_link, registry_toml, settle

from specdec_core.ingestion.load import ingest
from specdec_core.replay import run as replay
from specdec_core.store.connection import Store

pytestmark = pytest.mark.browser
# Where the screenshots go: test-output/ by default, so a test run leaves the tree clean; `make screenshots`
# points this at data/screenshots/ (committed, shown in the README).
SCREENSHOTS = Path(os.environ.get("SPECDEC_SCREENSHOTS", ROOT / "test-output" / "screenshots"))
PAGES = {"overview": ("", "Overview"), "cache": ("cache", "Cache"), "output_length": ("output_length", "Output length"),
         "mismatches": ("mismatches", "Mismatches"), "impact": ("impact", "Impact"), "keys": ("keys", "Keys"), "replay": ("replay", "Replay"),
         "search": ("search", "Search"), "export": ("export", "Export")}


@pytest.fixture(scope="module")
def foreign_server(tmp_path_factory, tiny_registry, engine, browser):
    folder = tmp_path_factory.mktemp("foreign-browser")
    db, outputs = build_foreign_db(folder, engine)
    # A replay run outside the dashboard (as `specdec replay` does): its page must open without decoding.
    stored = replay.replay(Store(db), "h1", engine)
    config = folder / "specdec.toml"
    config.write_text(registry_toml(tiny_registry))
    with dashboard(db, folder / "streamlit.log", env={"SPECDEC_CONFIG": str(config)},
                   preload=True) as url:
        yield url, db, outputs, stored


def test_a_stored_replay_has_a_permanent_page_in_any_tab(browser, foreign_server):
    url, _, outputs, stored = foreign_server
    page = new_page(browser)
    page.goto(f"{url}/replay?replay_id={stored.replay_id}")
    heading(page, "Replay")
    expect(metric(page, "Classification")).to_have_text("foreign")
    expect(page.get_by_text("Replay of the source request m1", exact=True)).to_be_visible()
    expect(page.get_by_text(re.compile(r"^Word diff: production against the replay with the request's own identity "
                                       r"\(production equals the replay of the source request m1 exactly\)"))
           ).to_be_visible()
    expect(page.get_by_text("Why:")).to_be_visible()
    # The evidence reads as words and short numbers, not JSON with 17-digit floats.
    assert not re.search(r"\d\.\d{10,}", page.get_by_test_id("stMain").inner_text())
    page.reload()
    expect(metric(page, "Classification")).to_have_text("foreign")
    page.close()


@pytest.fixture(scope="module")
def incident_server(tmp_path_factory, browser):
    """One dashboard on the incident database for the tests that only read it, each in its own session."""
    folder = tmp_path_factory.mktemp("incident-browser")
    db = build_incident_db(folder)
    with dashboard(db, folder / "streamlit.log") as url:
        yield url, db


def test_filters_live_in_the_url_reload_keeps_them_and_back_goes_back(browser, incident_server):
    url, db = incident_server
    page = new_page(browser)
    page.goto(url)
    expect(metric(page, "Requests")).to_have_text("6")
    page.goto(f"{url}/?deployment=staging")
    expect(metric(page, "Requests")).to_have_text("2")
    page.goto(f"{url}/cache?deployment=prod")
    heading(page, "Cache")
    page.goto(f"{url}/?deployment=prod")
    expect(metric(page, "Requests")).to_have_text("4")
    sidebar = page.get_by_test_id("stSidebar")
    sidebar.get_by_text("prod", exact=True).locator("xpath=..").get_by_role("button").first.click()
    expect(metric(page, "Requests")).to_have_text("6")
    page.go_back()
    expect(metric(page, "Requests")).to_have_text("4")
    pasted = new_page(browser)
    pasted.goto(f"{url}/?deployment=staging&db={db}")
    expect(metric(pasted, "Requests")).to_have_text("2")
    pasted.reload()
    expect(metric(pasted, "Requests")).to_have_text("2")
    expect(pasted.get_by_test_id("stSidebar").get_by_role("textbox", name="Database")).to_have_value(str(db))
    pasted.close()
    page.close()


def _cut(page: Page) -> list[str]:
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid=stMetricValue]')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 || e.innerText.includes('…')).map(e => e.innerText)""")


def test_metrics_and_plots_are_readable_at_1024_and_on_a_phone(browser, incident_server):
    url, _ = incident_server
    page = new_page(browser, 1024, 768)
    page.goto(url)
    expect(metric(page, "Requests")).to_have_text("6")
    assert _cut(page) == []
    page.close()
    phone = new_page(browser, 390, 844)
    phone.goto(f"{url}/cache")
    heading(phone, "Cache")
    plot = phone.locator(".js-plotly-plot").nth(1).locator(".nsewdrag").first
    expect(plot).to_be_visible()
    assert plot.bounding_box()["width"] > 250, "the hit-rate plot is not squeezed by its legend"
    phone.close()


@pytest.fixture(scope="module")
def demo_db(tmp_path_factory) -> Path:
    """The bundled demo incident, as `make run` shows it."""
    db = tmp_path_factory.mktemp("demo") / "demo.duckdb"
    ingest(Store(db), [str(ROOT / "data" / "demo" / "requests.jsonl.gz")])
    return db


@pytest.fixture(scope="module")
def demo_server(demo_db, tmp_path_factory):
    with dashboard(demo_db, tmp_path_factory.mktemp("demo-browser") / "streamlit.log") as url:
        yield url


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (390, 844)])
def test_screenshots_of_every_page(browser, demo_server, width, height):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page = new_page(browser, width, height)
    # The first page is loaded, the others opened by their links: what a screenshot shows is the same.
    page.goto(demo_server)
    for name, (path, title) in PAGES.items():
        if path:
            open_by_link(page, title)
        heading(page, title)
        expect(page).to_have_url(re.compile(rf"^{re.escape(demo_server)}/{path}(\?|$)"))
        settle(page)
        expect(page.get_by_test_id("stException")).to_have_count(0)
        if name not in ("replay", "search", "export"):
            # The pages with charts drew them, not their placeholders.
            expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible()
        shoot(page, SCREENSHOTS / f"{name}-{width}x{height}.png")
    # A contaminated hit's own page, as a link from any table of requests opens it.
    page.goto(f"{demo_server}/request?request_id={DEMO_CONTAMINATED_HIT}")
    heading(page, "Request")
    expect(page.get_by_text("A contaminated hit: production served the output cached by")).to_be_visible()
    settle(page)
    shoot(page, SCREENSHOTS / f"request-{width}x{height}.png")
    assert page.dialogs == []
    page.close()


DEMO_CONTAMINATED_HIT = "req-000134"


def shoot(page: Page, path: Path) -> None:
    """A screenshot with the Database box's text hidden: it holds this machine's path to the test's store."""
    page.add_style_tag(content='[data-testid="stSidebar"] input[aria-label="Database"] {color: transparent}')
    page.screenshot(path=path)


def test_a_replay_puts_its_permanent_link_in_the_address_bar_and_results_show_first(browser, foreign_server):
    url, _, _, _ = foreign_server
    page = new_page(browser)
    page.goto(f"{url}/replay?request_id=h1")
    heading(page, "Replay")
    button = page.get_by_role("button", name="Replay with the full identity")
    button.click()
    expect(metric(page, "Classification")).to_have_text("foreign", timeout=60_000)
    expect(page).to_have_url(re.compile(r"replay_id=[0-9a-f]{32}"))
    replay_id = re.search(r"replay_id=([0-9a-f]{32})", page.url).group(1)
    page.reload()
    expect(metric(page, "Classification")).to_have_text("foreign")
    expect(page.get_by_text(f"replay id {replay_id}")).to_be_visible()

    page.goto(f"{url}/replay?request_id=h1")
    heading(page, "Replay")
    page.get_by_role("spinbutton", name="How many suspicious requests").fill("2")
    page.get_by_role("button", name="Replay batch").click()
    expect(metric(page, "Classification")).to_have_text("foreign", timeout=90_000)
    # What a run found (a batch of one shows its replay in full) comes before the forms that start one.
    done = metric(page, "Classification")
    request_box = page.get_by_role("textbox", name="Request id")
    assert done.bounding_box()["y"] < request_box.bounding_box()["y"]
    assert page.get_by_role("heading", name="Results").bounding_box()["y"] < request_box.bounding_box()["y"]
    page.close()
