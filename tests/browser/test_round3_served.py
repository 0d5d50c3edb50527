"""Issue #55 in a real headless Chromium on the demo incident: Back undoes a filter change, chart axes fit
their data, the request page, red flags before the first chart."""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect
from test_glance_and_back import demo_url  # noqa: F401
from test_incident_flow import heading, new_page, settle
from test_served_dashboard import browser, metric  # noqa: F401

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
    page.context.close()
