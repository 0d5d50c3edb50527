"""Issue #55 in a real headless Chromium on the demo incident: Back undoes a filter change, chart axes fit
their data, the request page, red flags before the first chart."""

from __future__ import annotations

import re

import pytest
from dashboard_data import HOSTILE_DEPLOYMENTS, build_db
from helpers import rec
from playwright.sync_api import Page, expect
from served import dashboard, heading, metric, new_page, settle

pytestmark = pytest.mark.browser


def choose(page: Page, label: str, option: str) -> None:
    """Pick an option of a sidebar multiselect, as a person does: type into it, click the option offered."""
    chosen(page, label).locator("input").click()
    page.keyboard.type(option)
    page.get_by_role("option").filter(has_text=option).first.click()
    page.keyboard.press("Escape")


def chosen(page: Page, label: str):
    return page.get_by_test_id("stSidebar").get_by_test_id("stMultiSelect").filter(has_text=label)


def test_back_after_a_filter_change_restores_the_view_before_it(browser, demo_url):
    page = new_page(browser)
    page.goto(demo_url)
    heading(page, "Overview")
    settle(page)
    requests = metric(page, "Requests").inner_text()
    start = page.evaluate("history.length")
    choose(page, "Deployments", "edge-a")
    expect(page).to_have_url(f"{demo_url}/?deployment=edge-a")
    settle(page)
    edge_a = metric(page, "Requests").inner_text()
    assert edge_a != requests
    choose(page, "Draft models", "ngram-3")
    expect(page).to_have_url(f"{demo_url}/?deployment=edge-a&draft_model=ngram-3")
    settle(page)
    assert page.evaluate("history.length") == start + 2, "each filter change is one history entry"

    page.go_back()
    expect(page).to_have_url(f"{demo_url}/?deployment=edge-a")
    expect(metric(page, "Requests")).to_have_text(edge_a)
    settle(page)
    # The view before it stays: the app does not write the later filters back into the address bar.
    page.wait_for_timeout(1500)
    assert page.url == f"{demo_url}/?deployment=edge-a"
    expect(chosen(page, "Draft models")).not_to_contain_text("ngram-3")

    page.go_back()
    expect(page).to_have_url(f"{demo_url}/")
    expect(metric(page, "Requests")).to_have_text(requests)
    settle(page)
    page.wait_for_timeout(1500)
    assert page.url == f"{demo_url}/"
    expect(chosen(page, "Deployments")).not_to_contain_text("edge-a")
    heading(page, "Overview")
    page.close()


def test_red_flags_and_the_status_strip_come_before_the_first_chart(browser, demo_url):
    for size in ((1440, 900), (390, 844)):
        page = new_page(browser, *size)
        page.goto(demo_url)
        heading(page, "Overview")
        chart = page.locator(".js-plotly-plot").first
        expect(chart).to_be_visible()
        flags = page.get_by_role("heading", name="Red flags")
        first_flag = page.get_by_text("Identical outputs although parameters differ")
        assert flags.bounding_box()["y"] < first_flag.bounding_box()["y"] < chart.bounding_box()["y"], size
        if size[0] == 1440:
            assert first_flag.bounding_box()["y"] < 900, "a red flag in view without scrolling"
        strip = page.get_by_text("since 2026-11-20 11:52:57 UTC", exact=True)
        assert strip.bounding_box()["y"] < flags.bounding_box()["y"]
        page.close()


@pytest.fixture(scope="module")
def hostile_url(tmp_path_factory, browser):
    folder = tmp_path_factory.mktemp("hostile")
    records = []
    for n, deployment in enumerate(HOSTILE_DEPLOYMENTS):
        key = f"k-{n}"
        records += [rec(f"h{n}a", ts=f"2026-03-01T10:{n:02d}:00Z", deployment=deployment, cache_key=key),
                    rec(f"h{n}b", ts=f"2026-03-01T10:{n:02d}:30Z", deployment=deployment, cache_key=key,
                        cache_hit=True, max_tokens=2)]
    db = build_db(folder, records, "hostile")
    with dashboard(db, folder / "streamlit.log") as url:
        yield url


def test_log_text_makes_no_link_in_the_contamination_window_or_the_red_flags(browser, hostile_url):
    page = new_page(browser)
    page.goto(hostile_url)
    heading(page, "Overview")
    main = page.get_by_test_id("stMain")
    # Wait for the last section drawn (the contamination window's table) before counting links.
    expect(main.get_by_text("See every contaminated hit")).to_be_visible()
    settle(page)
    text = main.inner_text()
    for deployment in HOSTILE_DEPLOYMENTS:
        assert deployment in text.replace("\u2060", ""), deployment
    hrefs = main.locator("a[href]").evaluate_all("links => links.map(a => a.getAttribute('href'))")
    assert not [h for h in hrefs if "evil" in h or h.startswith(("http", "mailto"))], hrefs
    assert main.locator("img").count() == 0
    assert page.dialogs == []
    page.close()


def test_back_after_a_dragged_range_restores_the_range_before_it(browser, demo_url):
    page = new_page(browser)
    page.goto(f"{demo_url}/?deployment=edge-a")
    heading(page, "Overview")
    settle(page)
    start = page.evaluate("history.length")
    caption = page.get_by_test_id("stSidebar").get_by_text(" UTC to ")
    whole = caption.inner_text()
    chart = page.locator(".js-plotly-plot").first
    chart.scroll_into_view_if_needed()
    drag = chart.locator(".nsewdrag").first
    box = drag.bounding_box()
    y = box["y"] + box["height"] / 2
    page.mouse.move(box["x"] + box["width"] * 0.3, y)
    page.mouse.down()
    for step in range(1, 11):
        page.mouse.move(box["x"] + box["width"] * (0.3 + 0.03 * step), y)
    page.mouse.up()
    expect(page).to_have_url(re.compile(r"[?&]start="))
    expect(caption).not_to_have_text(whole)
    settle(page)
    assert page.evaluate("history.length") == start + 1, "a dragged range is one history entry"

    page.go_back()
    expect(page).to_have_url(f"{demo_url}/?deployment=edge-a")
    expect(caption).to_have_text(whole)
    settle(page)
    page.wait_for_timeout(1500)
    assert page.url == f"{demo_url}/?deployment=edge-a", "the view before the drag stays"
    page.close()
