"""Settings shared by the browser tests."""

from playwright.sync_api import expect

# A dashboard served beside a loaded test run can take seconds to draw the last part of a page: an
# assertion waits up to 30 s for it (and returns as soon as it holds) instead of Playwright's 5 s.
expect.set_options(timeout=30_000)
