"""Issue #44 on the demo incident in a real headless Chromium: one history entry per view and Back restoring
it, time charts spanning the filtered range, chart labels that don't overlap; an idle tab that is not Live
hears nothing from its server, nor one whose text only a button reads was committed. One served dashboard
for all."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from served import assert_no_frame_for, heading, new_page, open_by_link, server_frames, settle

pytestmark = pytest.mark.browser
HOUR = "start=2026-11-20T09:00:00Z&end=2026-11-20T10:00:00Z"
HOUR_CAPTION = "2026-11-20 09:00:00 UTC to 2026-11-20 10:00:00 UTC"


@pytest.fixture(scope="module")
def desk(browser, demo_url) -> Page:
    page = new_page(browser)
    yield page
    page.close()


def open_view(page: Page, title: str) -> None:
    page.get_by_test_id("stSidebar").get_by_role("link", name=title, exact=True).click()
    expect(page.get_by_role("heading", level=1, name=title)).to_be_visible()
    settle(page)


def time_caption(page: Page):
    return page.get_by_test_id("stSidebar").get_by_text(" UTC to ")


def test_each_view_is_one_history_entry_and_back_restores_page_and_filters(desk, demo_url):
    desk.goto(f"{demo_url}/?{HOUR}")
    expect(desk.get_by_role("heading", level=1, name="Overview")).to_be_visible()
    settle(desk)
    before = desk.evaluate("history.length")
    open_view(desk, "Cache")
    open_view(desk, "Keys")
    assert desk.evaluate("history.length") == before + 2
    desk.go_back()
    expect(desk.get_by_role("heading", level=1, name="Cache")).to_be_visible()
    expect(time_caption(desk)).to_have_text(HOUR_CAPTION)
    assert "start=" in desk.url and "end=" in desk.url
    desk.go_back()
    expect(desk.get_by_role("heading", level=1, name="Overview")).to_be_visible()
    expect(time_caption(desk)).to_have_text(HOUR_CAPTION)


def test_back_restores_the_search_query_and_the_annotations(desk, demo_url):
    desk.goto(f"{demo_url}/search?{HOUR}")
    expect(desk.get_by_role("heading", level=1, name="Search")).to_be_visible()
    box = desk.get_by_role("textbox", name="Find requests whose prompt or output contains")
    box.fill("engineer")
    box.press("Enter")
    expect(desk.get_by_text("requests match")).to_be_visible()
    sidebar = desk.get_by_test_id("stSidebar")
    sidebar.get_by_text("Annotations").click()
    notes = sidebar.get_by_role("textbox", name="One per line: time, deployment, label")
    notes.fill("2026-11-20T09:30:00Z, , rollback")
    notes.press("Control+Enter")
    # The annotations reach the address bar in the rerun their submission starts: until then the sidebar's
    # links lack them, and a click on one would race that rerun's own history entry.
    expect(desk).to_have_url(re.compile(r"[?&]notes="))
    settle(desk)
    open_view(desk, "Overview")
    desk.go_back()
    expect(desk.get_by_role("heading", level=1, name="Search")).to_be_visible()
    expect(box).to_have_value("engineer")
    expect(notes).to_have_value("2026-11-20T09:30:00Z, , rollback")
    expect(time_caption(desk)).to_have_text(HOUR_CAPTION)


# The x range and the label boxes of each time chart (time_chart marks its charts in their layout's meta).
TIME_CHARTS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')]
    .filter(gd => gd.layout && gd.layout.meta && gd.layout.meta.specdec_click_selects)
    .map(gd => ({
        ranges: Object.keys(gd._fullLayout).filter(k => /^xaxis\\d*$/.test(k)).map(k => gd._fullLayout[k].range),
        labels: [...gd.querySelectorAll('g.annotation')].map(a => {
            const r = a.getBoundingClientRect();
            return {text: a.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
        }).filter(b => b.right > b.left)
    }))"""


def time_charts(page: Page) -> list[dict]:
    settle(page)
    expect(page.locator(".js-plotly-plot .main-svg").first).to_be_visible()
    # Every page drawn here has a time chart; on a loaded machine it may come after the first plot.
    page.wait_for_function(f"() => ({TIME_CHARTS_JS})().length > 0", timeout=30_000)
    return page.evaluate(TIME_CHARTS_JS)


# Every chart's axis titles and tick labels, its legend entries, and its own box.
AXES_AND_LEGENDS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(gd => {
    const box = e => { const r = e.getBoundingClientRect();
                       return {text: e.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom}; };
    const shown = b => b.right > b.left;
    return {chart: box(gd),
            axes: [...gd.querySelectorAll('g.g-xtitle text, g.g-ytitle text, g.xtick text, g.ytick text')]
                .map(box).filter(shown),
            legend: [...gd.querySelectorAll('g.legend g.traces')].map(box).filter(shown)};
})"""


def apart(a: dict, b: dict) -> bool:
    return a["right"] <= b["left"] or b["right"] <= a["left"] or a["bottom"] <= b["top"] or b["bottom"] <= a["top"]


def minutes(text: str) -> float:
    """A plotly date-axis end ('2026-11-20 07:57:30.5') as minutes after 2026-11-20 00:00."""
    clock = text.split(" ")[1].split(":")
    return int(clock[0]) * 60 + int(clock[1]) + float(clock[2] if len(clock) > 2 else 0) / 60


@pytest.mark.parametrize("size", [(1440, 900), (390, 844)])
def test_time_charts_span_the_range_and_their_labels_never_overlap(browser, demo_url, size):
    page = new_page(browser, *size)
    seen = 0
    # The Overview is loaded, the other two opened by their links: the charts are drawn the same way.
    page.goto(demo_url)
    for path, title in (("", "Overview"), ("mismatches", "Mismatches"), ("cache", "Cache")):
        if path:
            open_by_link(page, title)
        heading(page, title)
        for chart in time_charts(page):
            seen += 1
            for low, high in chart["ranges"]:
                # The demo runs 08:00:03 to 13:59:33: no axis starts an hour early or ends at the last
                # contaminated hit (11:52:57); half a bucket (at most 2.5 min) of room on each side.
                assert 8 * 60 - 3 <= minutes(low) <= 8 * 60, (path, low)
                assert 14 * 60 - 1 <= minutes(high) <= 14 * 60 + 3, (path, high)
            boxes = chart["labels"]
            for n, a in enumerate(boxes):
                for b in boxes[n + 1:]:
                    assert apart(a, b), (path, size, a["text"], b["text"])
            if path == "mismatches":
                texts = [b["text"] for b in boxes]
                # One label per mark and spot: deployments whose marks meet share it ("edge-a, edge-b: ...").
                changed = [t.rsplit(": ", 1)[0] for t in texts if t.endswith(": key scheme changed")]
                assert {"edge-a", "edge-b"} <= {d.strip() for who in changed for d in who.split(",")}, texts
        if path == "cache":
            # Its last charts come after the time chart: wait for the hits-on-new-identities legend.
            expect(page.get_by_text("hits on an identity served before")).to_have_count(1)
            legends = 0
            for chart in page.evaluate(AXES_AND_LEGENDS_JS):
                for entry in chart["legend"]:
                    legends += 1
                    # Whole (not cut at the chart's edge) and clear of every axis title and tick label.
                    assert chart["chart"]["left"] <= entry["left"] and entry["right"] <= chart["chart"]["right"] + 1, \
                        (size, entry["text"])
                    for text in chart["axes"]:
                        assert apart(entry, text), (size, entry["text"], text["text"])
            assert legends >= 6
    assert seen >= 3
    page.close()


def test_an_idle_tab_hears_from_its_server_only_while_live_is_on(desk, demo_url):
    """The Live check reruns every LIVE_EVERY_S (5 s) while Live is on; it was drawn, and rerun, in every tab
    whether Live was on or not: each open dashboard cost its server and its browser a redraw every 5 s."""
    frames = server_frames(desk)
    desk.goto(f"{demo_url}/cache?{HOUR}")  # a page load: the listener sees its connection open
    heading(desk, "Cache")
    sidebar = desk.get_by_test_id("stSidebar")
    live, label = sidebar.get_by_role("switch", name="Live"), sidebar.get_by_text("Live", exact=True)
    label.click()  # the switch's label takes the click
    expect(live).to_be_checked()
    caption = sidebar.get_by_text("Live · newest request")
    expect(caption).to_be_visible()
    settle(desk)
    heard, deadline = len(frames), time.monotonic() + 7
    while len(frames) == heard and time.monotonic() < deadline:
        desk.wait_for_timeout(100)  # the browser's events are handed over while Playwright waits
    assert len(frames) > heard, "Live on, and no rerun of its own came"
    label.click()
    expect(live).not_to_be_checked()
    expect(caption).to_have_count(0)
    settle(desk)
    assert_no_frame_for(desk, frames, 6_500, "an idle tab whose Live is off was sent a rerun")  # a tick and 1.5 s


def test_an_example_typed_for_the_audit_waits_for_its_button(desk, demo_url):
    """Text only a button reads is committed without a rerun: that rerun raced the click whose blur committed
    the text, and the click could be lost (the Replay page's batch count, CI)."""
    frames = server_frames(desk)
    desk.goto(f"{demo_url}/keys")
    heading(desk, "Keys")
    settle(desk)
    example = desk.get_by_role("textbox", name="Example request (JSON object)")
    example.fill('{"prompt": "cut short"')
    example.press("Tab")
    assert_no_frame_for(desk, frames, 2_000, "committing the example reran the page")
    desk.get_by_role("button", name="Audit", exact=True).click()  # its rerun carries the example
    expect(desk.get_by_text("Can't audit:")).to_be_visible()


def test_a_log_path_typed_and_load_clicked_at_once_loads_on_that_click(browser, demo_url):
    """The sidebar's load: the path and the new file typed, then Load path clicked once. The button was
    disabled until the path's commit reran the page, so that click was taken by the rerun, not the button."""
    page = new_page(browser)
    frames = server_frames(page)
    page.goto(f"{demo_url}/?{HOUR}")
    heading(page, "Overview")
    settle(page)
    sidebar = page.get_by_test_id("stSidebar")
    database = sidebar.get_by_role("textbox", name="Database", exact=True)
    fresh = str(Path(database.input_value()).with_name("loaded-at-once.duckdb"))
    sidebar.get_by_text("Load logs").click()
    settle(page)  # the expander opened, its content still (a CI run's click on the switch below was lost)
    sidebar.get_by_text("Into a new database", exact=True).click()
    expect(sidebar.get_by_role("switch", name="Into a new database")).to_be_checked()
    new_file = sidebar.get_by_role("textbox", name="New database file")
    expect(new_file).to_be_visible()
    settle(page)
    new_file.fill(fresh)
    path = sidebar.get_by_role("textbox", name="Log file, folder or glob")
    path.fill("data/demo/requests.jsonl.gz")
    path.press("Tab")
    assert_no_frame_for(page, frames, 2_000, "committing the path reran the page")
    sidebar.get_by_role("button", name="Load path").click()
    expect(database).to_have_value(fresh, timeout=60_000)  # loaded, and opened
    page.close()
