"""Issue #17 in a real headless Chromium (the system's): stored replay pages, Replay selected starting the
replays, progress and cancel, ticks by request id, drag-to-zoom and click-for-rows, filters in the URL and
browser back, readable metrics and plots at 1024x768 and on a phone; screenshots of every page."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from test_pages import build_incident_db
from test_replay_page import build_foreign_db
from test_served_dashboard import ROOT, browser, dashboard, metric, registry_toml  # noqa: F401

from specdec_core.replay import run as replay
from specdec_core.store.connection import Store
from specdec_core.store.ingest import ingest

pytestmark = pytest.mark.browser
# Where the screenshots go: test-output/ by default, so a test run leaves the tree clean; `make screenshots`
# points this at data/screenshots/ (committed, shown in the README).
SCREENSHOTS = Path(os.environ.get("SPECDEC_SCREENSHOTS", ROOT / "test-output" / "screenshots"))
PAGES = {"overview": ("", "Overview"), "cache": ("cache", "Cache"), "output_length": ("output_length", "Output length"),
         "mismatches": ("mismatches", "Mismatches"), "keys": ("keys", "Keys"), "replay": ("replay", "Replay"),
         "search": ("search", "Search"), "export": ("export", "Export")}


def new_page(browser, width: int = 1440, height: int = 900) -> Page:
    page = browser.new_context(viewport={"width": width, "height": height}).new_page()
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    return page


def heading(page: Page, title: str) -> None:
    expect(page.get_by_role("heading", level=1, name=title)).to_be_visible()


@pytest.fixture(scope="module")
def foreign_server(tmp_path_factory, tiny_registry, engine, browser):
    folder = tmp_path_factory.mktemp("foreign-browser")
    db, outputs = build_foreign_db(folder, engine)
    # A replay run outside the dashboard (as `specdec replay` does): its page must open without decoding.
    stored = replay.replay(Store(db), "h1", engine)
    config = folder / "specdec.toml"
    config.write_text(registry_toml(tiny_registry))
    with dashboard(db, folder / "streamlit.log", env={"SPECDEC_CONFIG": str(config)}) as url:
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
    page.context.close()


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
    pasted.context.close()
    page.context.close()


def _cut(page: Page) -> list[str]:
    return page.evaluate("""() => [...document.querySelectorAll('[data-testid=stMetricValue]')]
        .filter(e => e.scrollWidth > e.clientWidth + 1 || e.innerText.includes('…')).map(e => e.innerText)""")


def test_metrics_and_plots_are_readable_at_1024_and_on_a_phone(browser, incident_server):
    url, _ = incident_server
    page = new_page(browser, 1024, 768)
    page.goto(url)
    expect(metric(page, "Requests")).to_have_text("6")
    assert _cut(page) == []
    page.context.close()
    phone = new_page(browser, 390, 844)
    phone.goto(f"{url}/cache")
    heading(phone, "Cache")
    plot = phone.locator(".js-plotly-plot").nth(1).locator(".nsewdrag").first
    expect(plot).to_be_visible()
    assert plot.bounding_box()["width"] > 250, "the hit-rate plot is not squeezed by its legend"
    phone.context.close()


# Drawn: the script run is over with nothing of the last one left (stale) or still loading (skeleton), the
# fonts are in, every plotly chart has laid itself out, no transition is under way, and the layout held
# still over two animation frames (the check runs once a frame). Waited for, not slept on: a fixed second
# per page cost the browser tests about 25 s a run and was still a guess on a busy machine.
SETTLED_JS = """() => {
    const app = document.querySelector('[data-testid="stApp"]');
    const main = document.querySelector('[data-testid="stMain"]');
    const plots = [...document.querySelectorAll('.js-plotly-plot')];
    const drawn = app && main && app.dataset.testScriptState === 'notRunning'
        && app.dataset.testConnectionState === 'CONNECTED'
        && !document.querySelector('[data-testid="stSkeleton"], [data-stale="true"]')
        && !document.querySelector('[data-testid="stStatusWidget"] img, [data-testid="stStatusWidget"] svg')
        && document.fonts.status === 'loaded'
        && plots.every(gd => gd._fullLayout && gd.querySelector('.main-svg'))
        && !document.getAnimations().some(a => a.playState === 'running' && a.effect
                                          && a.effect.getComputedTiming().iterations !== Infinity);
    const layout = drawn && JSON.stringify([main.scrollHeight, main.scrollWidth,
        document.querySelectorAll('[data-testid="stElementContainer"]').length,
        plots.map(gd => { const r = gd.getBoundingClientRect(); return [r.x, r.y, r.width, r.height]; })]);
    window.__settledFrames = layout && layout === window.__settledLayout ? (window.__settledFrames || 0) + 1 : 0;
    window.__settledLayout = layout;
    return window.__settledFrames >= 2;
}"""


def settle(page: Page) -> None:
    """Wait until the page has drawn its content (SETTLED_JS): no script running, nothing stale or loading,
    charts laid out, nothing moving."""
    page.evaluate("() => { window.__settledFrames = 0; window.__settledLayout = null; }")
    page.wait_for_function(SETTLED_JS, timeout=60_000, polling="raf")


def open_by_link(page: Page, title: str) -> None:
    """Switch pages by the sidebar's link, in the page (no reload: the same session reruns the script).
    Clicked where it is: on a phone the sidebar is folded away, and a pointer left on a link would show as
    hovered in a screenshot."""
    page.get_by_test_id("stSidebar").get_by_role("link", name=title, exact=True).dispatch_event("click")
    heading(page, title)


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
    page.context.close()


DEMO_CONTAMINATED_HIT = "req-000134"


def shoot(page: Page, path: Path) -> None:
    """A screenshot with the Database box's text hidden: it holds this machine's path to the test's store."""
    page.add_style_tag(content='[data-testid="stSidebar"] input[aria-label="Database"] {color: transparent}')
    page.screenshot(path=path)


def test_a_replay_puts_its_permanent_link_in_the_address_bar_and_a_batch_shows_first(browser, foreign_server):
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
    # The batch (a batch of one shows its replay in full) comes before the single-request form.
    done = metric(page, "Classification")
    request_box = page.get_by_role("textbox", name="Request id")
    assert done.bounding_box()["y"] < request_box.bounding_box()["y"]
    assert page.get_by_role("heading", name="Batch replay").bounding_box()["y"] < request_box.bounding_box()["y"]
    page.context.close()
