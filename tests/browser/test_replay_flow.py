"""Issue #17, items 2-4 and 9, in a real headless Chromium: ticks on Mismatches follow request ids through a
filter change, "Replay selected" starts exactly those replays and each batch row opens its replay page;
a long batch shows its stage, disables the button and can be cancelled; clicking a bar lists its rows and
dragging across a time chart sets the global time range.

The incident: two misses (prod, staging) put a 24-token output under key k; forty hits with other
max_tokens were served it, one a minute, alternating deployments. The models are the tiny family, so
every replay really decodes. The long batch has its own incident: a thousand hits of one key, so it
is still running when the page first draws it, however fast the machine.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from dashboard_data import TINY, build_db
from helpers import rec
from playwright.sync_api import Error as PlaywrightError
from playwright.sync_api import Page, expect
from served import (
    assert_no_frame_for,
    dashboard,
    heading,
    metric,
    new_page,
    registry_toml,
    server_frames,
    settle,
)

from specdec_core.contract.identity import DecodeRequest

pytestmark = pytest.mark.browser
HITS = 40
DEPLOYMENTS = ("prod", "staging")


def hit_id(n: int) -> str:
    return f"h{n:02d}"


@pytest.fixture(scope="module")
def served(engine) -> dict:
    """What the tiny models answer for max_tokens 24, as the cache stored it under key k."""
    long = engine.generate(DecodeRequest(max_tokens=24, **TINY))
    return {"output_text": long.text, "output_tokens": len(long.token_ids), "cache_key": "k"}


@pytest.fixture(scope="module")
def incident(tmp_path_factory, tiny_registry, served, browser):
    folder = tmp_path_factory.mktemp("replay-flow")
    records = [rec(f"m-{d}", ts="2026-03-01T09:59:00Z", max_tokens=24, deployment=d, **served, **TINY)
               for d in DEPLOYMENTS]
    for n in range(1, HITS + 1):
        records.append(rec(hit_id(n), ts=f"2026-03-01T{10 + (n - 1) // 60}:{(n - 1) % 60:02d}:30Z",
                           max_tokens=4 + n % 9, cache_hit=True, deployment=DEPLOYMENTS[(n - 1) % 2],
                           **served, **TINY))
    db = build_db(folder, records, "flow")
    config = folder / "specdec.toml"
    config.write_text(registry_toml(tiny_registry))
    return db, config, folder


LONG = 1000  # the number box's maximum: the batch lasts long on any machine (each tiny replay takes ~0.1 s)


@pytest.fixture(scope="module")
def long_incident(tmp_path_factory, served, incident):
    """The same served output under key k, hit by LONG requests, one a second."""
    _, config, _ = incident
    folder = tmp_path_factory.mktemp("replay-long")
    records = [rec("m-prod", ts="2026-03-01T09:59:00Z", max_tokens=24, deployment="prod", **served, **TINY)]
    start = datetime(2026, 3, 1, 10, tzinfo=timezone.utc)
    for n in range(1, LONG + 1):
        ts = (start + timedelta(seconds=n)).strftime("%Y-%m-%dT%H:%M:%SZ")
        records.append(rec(f"l{n:04d}", ts=ts, max_tokens=4 + n % 9, cache_hit=True, deployment="prod",
                           **served, **TINY))
    return build_db(folder, records, "long"), config


@pytest.fixture(scope="module")
def server(incident):
    """One dashboard for the tests on this incident. Replay jobs live in the server process, but each is
    found through the session that started it (a fresh page is a fresh session), and a test waits for its
    replays to end; what they store changes nothing the other test reads (Mismatches counts the log)."""
    db, config, folder = incident
    with dashboard(db, folder / "streamlit.log", env={"SPECDEC_CONFIG": str(config)},
                   preload=True) as url:
        yield url


def main_text(page: Page) -> str:
    return page.get_by_test_id("stMain").inner_text()


def tick(page: Page, row: int) -> None:
    """Click the checkbox of the editor's `row` (0 = first data row): the grid is a canvas, so by position.

    The editor is drawn anew after each rerun: a box taken from a grid that was just replaced is retried."""
    for attempt in range(5):
        try:
            grid = page.get_by_test_id("stDataFrame").last
            grid.scroll_into_view_if_needed(timeout=5_000)
            box = grid.bounding_box(timeout=5_000)
            break
        except PlaywrightError:
            if attempt == 4:
                raise
            page.wait_for_timeout(500)
    header = row_height = 35
    page.mouse.click(box["x"] + 38, box["y"] + header + row_height * row + row_height / 2)


def selected_caption(page: Page):
    return page.get_by_text(re.compile(r"^\d+ requests? selected for replay"))


def test_ticks_follow_requests_and_replay_selected_replays_them(browser, server):
    page = new_page(browser)
    page.goto(f"{server}/mismatches")
    heading(page, "Mismatches")
    expect(page.get_by_text(f"{HITS} contaminated hits. Tick rows", exact=False)).to_be_visible()
    tick(page, 0)
    expect(selected_caption(page)).to_have_text("1 request selected for replay.", timeout=15_000)
    tick(page, 1)
    expect(selected_caption(page)).to_have_text("2 requests selected for replay.", timeout=15_000)  # h01, h02

    # Filter to staging (h02, h04, ...): the first row is h02, still ticked; tick the second, h04.
    page.get_by_role("textbox", name="Filter rows").fill("staging")
    page.keyboard.press("Enter")
    expect(page.get_by_text(f"{HITS // 2} of {HITS} contaminated hits", exact=False)).to_be_visible(timeout=15_000)
    expect(selected_caption(page)).to_have_text("2 requests selected for replay (1 not shown by this filter).")
    tick(page, 1)
    expect(selected_caption(page)).to_have_text("3 requests selected for replay (1 not shown by this filter).",
                                                timeout=15_000)
    # Positions 0 and 1 of the unfiltered table are h01 and h02; by position, the third tick would be h03.
    page.get_by_role("textbox", name="Filter rows").fill("")
    page.keyboard.press("Enter")
    expect(selected_caption(page)).to_have_text("3 requests selected for replay.", timeout=15_000)

    page.get_by_role("button", name="Replay 3 selected").click()
    heading(page, "Replay")
    expect(page.get_by_text("Batch: 3 of 3 replayed")).to_be_visible(timeout=120_000)
    batch = page.get_by_test_id("stDataFrame").filter(has_text="verdict").first
    # The grid draws on a canvas; its accessible table holds the cells' text.
    for n in (1, 2, 4):
        expect(batch).to_contain_text(hit_id(n))
    expect(batch).not_to_contain_text(hit_id(3))

    # Each row's diff on demand, each with the link to its permanent page.
    page.get_by_text("Show each row's diff").click()
    expander = page.get_by_test_id("stExpander").filter(has_text=f"{hit_id(4)}: foreign")
    expander.get_by_text(f"{hit_id(4)}: foreign").click()
    link = expander.get_by_role("link", name="Open this replay's page (a permanent link)")
    expect(link).to_be_visible(timeout=15_000)
    href = link.get_attribute("href")
    assert "replay_id=" in href
    other = new_page(browser)
    other.goto(href if href.startswith("http") else f"{server}/{href.lstrip('/')}")
    expect(metric(other, "Classification")).to_have_text("foreign")
    expect(other.get_by_text(f"Replay of request {hit_id(4)}")).to_be_visible()
    other.close()
    assert page.dialogs == []
    page.close()


def test_a_long_batch_shows_its_stage_disables_the_button_and_cancels(browser, long_incident, tmp_path):
    db, config = long_incident
    with dashboard(db, tmp_path / "streamlit.log", env={"SPECDEC_CONFIG": str(config)},
                   preload=True) as url:
        page = new_page(browser)
        frames = server_frames(page)
        page.goto(f"{url}/replay")
        heading(page, "Replay")
        settle(page)
        count = page.get_by_role("spinbutton", name="How many suspicious requests")
        count.fill(str(LONG))
        count.press("Tab")  # committed, as a click on the button commits it: no rerun to race that click
        assert_no_frame_for(page, frames, 2_000, "committing the count reran the page")
        button = page.get_by_role("button", name="Replay batch")
        expect(button).to_be_enabled()
        button.click()  # the click's rerun carries the count
        progress = page.get_by_text(re.compile(rf"^\d+ of {LONG} replayed · "))
        expect(progress).to_be_visible(timeout=60_000)
        expect(button).to_be_disabled()
        # A stage in words: loading the models, or which request and token it is at.
        expect(progress).to_have_text(
            re.compile(rf"(loading|request l\d{{4}} \(\d+ of {LONG}\): (decoding token|scoring))"))
        page.get_by_role("button", name="Cancel").click()
        cancelled = page.get_by_text(re.compile(rf"^Cancelled: \d+ of {LONG} replayed before; those are stored\."))
        expect(cancelled).to_be_visible(timeout=60_000)
        done = int(re.match(r"Cancelled: (\d+)", cancelled.inner_text()).group(1))
        assert done < LONG
        expect(button).to_be_enabled()
        assert page.dialogs == []
        page.close()


def bars(page: Page):
    chart = page.locator(".js-plotly-plot").first
    chart.scroll_into_view_if_needed()
    expect(chart.locator(".barlayer .point").first).to_be_visible()
    return chart.locator(".barlayer .point")


def centre(locator) -> tuple[float, float]:
    box = locator.bounding_box()
    return box["x"] + box["width"] / 2, box["y"] + box["height"] / 2


def test_clicking_a_bar_lists_its_rows_and_dragging_sets_the_time_range(browser, server):
    page = new_page(browser)
    page.goto(f"{server}/mismatches")
    heading(page, "Mismatches")
    expect(page.get_by_text(f"{HITS} contaminated hits. Tick rows", exact=False)).to_be_visible()

    # Bars are drawn per deployment trace; the fifth minute (10:04) belongs to prod (h05).
    # As a person does: the pointer rests on the bar (plotly shows its hover label, and the page's click
    # script is attached to the chart), then clicks. On a busy machine a click at once can land before either.
    page.wait_for_function("() => { const g = document.querySelector('.js-plotly-plot'); return g && g.__specdecClick; }",
                           timeout=30_000)
    x, y = centre(bars(page).nth(2))
    page.mouse.move(x, y)
    expect(page.locator(".js-plotly-plot .hoverlayer .hovertext").first).to_be_visible()
    page.mouse.click(x, y)
    listed = page.get_by_text(re.compile(r"^1 contaminated hit from 2026-03-01 10:0\d:00 UTC"))
    expect(listed).to_be_visible()
    # Its rows: a table above the editor (the grid's accessible cells hold the text), linked to replay pages.
    tables = page.get_by_test_id("stDataFrame")
    expect(tables).to_have_count(2)
    bucket = re.search(r"10:(\d\d):00 UTC", listed.inner_text()).group(1)
    expect(tables.first).to_contain_text(hit_id(int(bucket) + 1))

    sidebar = page.get_by_test_id("stSidebar")
    before = sidebar.get_by_text(re.compile(r"UTC to .* UTC$")).inner_text()
    start_x, mid_y = centre(bars(page).nth(4))
    end_x, _ = centre(bars(page).nth(12))
    page.mouse.move(start_x, mid_y)
    page.mouse.down()
    for step in range(1, 11):
        page.mouse.move(start_x + (end_x - start_x) * step / 10, mid_y)
    page.mouse.up()
    expect(sidebar.get_by_text(re.compile(r"UTC to .* UTC$"))).not_to_have_text(before)
    # While the page reruns, the old caption lingers beside the new one: wait for it to go.
    expect(page.get_by_text(re.compile(rf"^{HITS} contaminated hits\."))).to_have_count(0)
    # Every hit of the new range is listed: the caption counts them, with no "N of M".
    shown = page.get_by_text(re.compile(r"^\d+ contaminated hits?\. Tick rows"))
    expect(shown).to_have_count(1)
    n = int(re.match(r"(\d+)", shown.inner_text()).group(1))
    assert 0 < n < HITS, shown.inner_text()
    # The range is a filter like any other: it is in the address, so the view can be shared.
    assert "start=" in page.url and "end=" in page.url, page.url
    assert page.dialogs == []
    page.close()
