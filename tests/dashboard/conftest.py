"""Fixtures the dashboard's test modules share: the stores they open, Streamlit set up as a server runs it,
and the bytes a download button serves."""

from __future__ import annotations

from pathlib import Path

import pytest
import streamlit.runtime.scriptrunner.script_runner as script_runner
import streamlit.testing.v1.app_test as app_test_module
from dashboard_data import T0, build_db, build_incident_db, html_records
from helpers import rec
from streamlit.runtime.media_file_manager import MediaFileManager
from streamlit.runtime.pages_manager import PagesManager


@pytest.fixture(scope="module")
def incident_db(tmp_path_factory) -> Path:
    return build_incident_db(tmp_path_factory.mktemp("incident"))


@pytest.fixture(scope="module")
def clean_db(tmp_path_factory) -> Path:
    return build_db(tmp_path_factory.mktemp("clean"), [
        rec("c1", ts=T0 + "00:00Z"),
        rec("c2", ts=T0 + "01:00Z", cache_hit=True),
        rec("c3", ts=T0 + "02:00Z", cache_key="k-2", max_tokens=16),
    ])


@pytest.fixture(scope="module")
def html_db(tmp_path_factory) -> Path:
    """Log text that would be live HTML, a link or a script if it ever reached the page unescaped."""
    return build_db(tmp_path_factory.mktemp("html"), html_records())


@pytest.fixture(autouse=True)
def no_legacy_pages_folder(monkeypatch):
    """AppTest resets Streamlit's 'a pages/ folder means a legacy multipage app' flag before every run,
    so each rerun would start the page alone and ui.page_header's rerun through app.py would swallow
    button clicks. A real server clears the flag for good on the first st.navigation call;
    test_a_page_run_alone_reruns_through_app checks the fix-up itself."""

    class NavigationPagesManager(PagesManager):
        uses_pages_directory = False

    monkeypatch.setattr(script_runner, "PagesManager", NavigationPagesManager)


@pytest.fixture
def download(monkeypatch):
    """download(button) -> the bytes a click on it serves (built on click where the data is deferred)."""
    managers: list[MediaFileManager] = []

    class RecordingManager(MediaFileManager):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            managers.append(self)

    monkeypatch.setattr(app_test_module, "MediaFileManager", RecordingManager)

    def click(button) -> bytes:
        proto = button.proto
        for manager in reversed(managers):
            try:
                url = manager.execute_deferred(proto.deferred_file_id) if proto.deferred_file_id else proto.url
                return manager._storage.get_file(url.rsplit("/", 1)[-1].split(".")[0]).content
            except Exception:
                continue
        raise LookupError(f"no download behind {button.label!r}")

    return click
