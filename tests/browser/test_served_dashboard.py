"""The dashboard served by `streamlit run` and driven in a real headless Chromium (the system's, never a download)."""

from __future__ import annotations

import re

import pytest
from dashboard_data import HTML_OUTPUT, SCRIPT, build_db, build_incident_db
from helpers import rec
from playwright.sync_api import expect
from served import ROOT, dashboard, metric

SCREENSHOTS = ROOT / "test-output"

pytestmark = pytest.mark.browser


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


