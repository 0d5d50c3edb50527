"""A dashboard served by `streamlit run` and driven in Chromium: what the browser tests share."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from dashboard_data import TINY
from helpers import free_port
from playwright.sync_api import Page, expect

from specdec_core.demo.models import registry_dict

ROOT = Path(__file__).resolve().parents[2]


CHROMIUM = "/usr/bin/chromium"


# `--js-flags=--no-opt`: V8 runs the pages' scripts without its optimizing compiler (TurboFan), which a test's
# few views of a page never repay: `tests/browser` (-n 2), alternated twice, 110-112 CPU-s of Chromium against
# 116-123 (docs/benchmarks.md, session 27). The scripts and their results are the same.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--js-flags=--no-opt"]


# The ports this process has served dashboards on, each used again once it is free. Chromium keeps a page's
# scripts, compiled, by their address, port included: a dashboard served at the address an earlier one had, in
# the same browser (one per test process: conftest.py), is drawn without fetching and compiling Streamlit's
# and plotly's scripts again. The demo's Overview, first viewed from a new server: 2.3-2.5 CPU-s of Chromium
# at an address seen before, 4.0-4.6 at a new one (docs/benchmarks.md).
_PORTS: list[int] = []
# The logs of the dashboards serving now: a failed test's report ends with their last lines (conftest.py).
SERVING: dict[str, Path] = {}


def _free(port: int) -> bool:
    """Whether a server could listen on `port` now (as Streamlit binds: reusing an address left in TIME_WAIT)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def dashboard_port() -> int:
    """A port an earlier dashboard of this process served on and nothing listens on now, else a new one."""
    port = next((p for p in _PORTS if _free(p)), None)
    if port is None:
        port = free_port()
        _PORTS.append(port)
    return port


def wait_until_healthy(url: str, server: subprocess.Popen, log: Path) -> None:
    """Return once the dashboard at `url` answers its health check; raise with its log if it exits or takes 60 s."""
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as health:
                if health.read() == b"ok":
                    return
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the dashboard did not come up; its log: {log.read_text()[-2000:]}")
        time.sleep(0.3)


@contextmanager
def dashboard(db: Path, log: Path, env: dict[str, str] | None = None, preload: bool = False) -> Iterator[str]:
    """`streamlit run app.py -- --db DB` on a free local port (dashboard_port), until the block ends.

    preload: whether it loads the store's models when it opens (a test that replays); off, a demo store's
    three smollm2 models cost its server about 7 s of CPU the other tests lacked."""
    env = {"SPECDEC_PRELOAD": "1" if preload else "0", **(env or {})}
    for attempt in range(3):
        port = dashboard_port()
        with open(log, "w") as out:
            server = subprocess.Popen(
                [sys.executable, "-m", "streamlit", "run", str(ROOT / "app.py"), "--server.address", "127.0.0.1",
                 "--server.port", str(port), "--server.headless", "true", "--browser.gatherUsageStats", "false",
                 "--", "--db", str(db)],
                cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env},
            )
        url = f"http://127.0.0.1:{port}"
        try:
            wait_until_healthy(url, server, log)
            break
        except RuntimeError:
            server.kill()
            server.wait()
            # Another process took the port between the check and Streamlit's bind: a new port, once more.
            if f"Port {port} is not available" not in log.read_text() or attempt == 2:
                raise
            _PORTS.remove(port)
    SERVING[url] = log
    try:
        yield url
    finally:
        SERVING.pop(url, None)
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def server_frames(page: Page) -> list[float]:
    """When each websocket frame from its dashboard reached `page`, from now on: listen before the page loads."""
    frames: list[float] = []
    page.on("websocket", lambda ws: ws.on("framereceived", lambda _: frames.append(time.monotonic())))
    return frames


def assert_no_frame_for(page: Page, frames: list[float], ms: int, said: str) -> None:
    """No frame comes in the next `ms` (a rerun would have sent one by then). Playwright hands the browser's events
    over only while it waits: wait_for_timeout, not time.sleep."""
    heard = len(frames)
    page.wait_for_timeout(ms)
    assert len(frames) == heard, said


def metric(page: Page, label: str):
    return page.get_by_test_id("stMetric").filter(has_text=label).get_by_test_id("stMetricValue")


def registry_toml(tiny_registry) -> str:
    """A specdec.toml that knows only the tiny family the tests built, for the server process."""
    models_root = tiny_registry.model(TINY["target_model"]).path.parents[1]
    lines = []
    for table, entries in registry_dict(models_root, families=("tiny",)).items():
        for name, settings in entries.items():
            lines.append(f'[{table}."{name}"]')
            lines += [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n".join(lines) + "\n"


def new_page(browser, width: int = 1440, height: int = 900) -> Page:
    """A fresh tab (its own history and Streamlit session) of `width` x `height`; close it with page.close().

    Opened by a blank tab the browser keeps (`window.open`), so every test's tab shares one renderer and one
    HTTP cache: a tab of a fresh context started a renderer that compiled Streamlit's and plotly's scripts
    anew and fetched them again, about 2.5 CPU-s of a 5.5 CPU-s first view of the demo's Overview
    (docs/benchmarks.md). Cookies and storage are shared with the module's other tests; the dashboard keeps
    nothing in either."""
    opener = _opener(browser)
    with opener.context.expect_page() as opened:
        opener.evaluate("() => window.open('about:blank')")
    page = opened.value
    page.set_viewport_size({"width": width, "height": height})
    page.dialogs = []
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    return page


def _opener(browser) -> Page:
    """The blank tab that opens the browser's test tabs, made at the first one (a context of its own)."""
    opener = getattr(browser, "specdec_opener", None)
    if opener is None or opener.is_closed():
        opener = browser.new_context(reduced_motion="reduce").new_page()
        browser.specdec_opener = opener
    return opener


def heading(page: Page, title: str) -> None:
    expect(page.get_by_role("heading", level=1, name=title)).to_be_visible()


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
