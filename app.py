"""specdec-triage dashboard: `streamlit run app.py -- --db FILE`.

The entry holds the navigation and the shared sidebar (database, loading logs, filters);
each page in pages/ answers one question from what `specdec_core` computes.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import timedelta
from pathlib import Path

import streamlit as st

import ui
from specdec_core import analysis as metrics
from specdec_core.analysis import NO_FILTERS, Filters
from specdec_core.config import ConfigError, PathRefused
from specdec_core.store.connection import StoreError
from specdec_core.store.ingest import ingest
from specdec_core.store.readers import LogReadError

LAST_INGEST_KEY = "last_ingest"
UPLOAD_TYPES = ["jsonl", "gz", "csv", "parquet"]

st.set_page_config(page_title="specdec-triage", page_icon="🔎", layout="wide")

ICONS = {"Overview": ":material/dashboard:", "Cache": ":material/cached:", "Output length": ":material/straighten:",
         "Mismatches": ":material/difference:", "Keys": ":material/key:", "Replay": ":material/replay:",
         "Export": ":material/download:"}
navigation = st.navigation([st.Page(path, title=title, icon=ICONS[title], default=title == "Overview")
                            for title, path in ui.PAGE_FILES.items()])


def load_logs(paths: list[str]) -> None:
    """Ingest with a progress bar; the counts stay in the sidebar until the next load."""
    bar = st.progress(0.0, text="Reading logs")

    def progress(done: int, total: int, what: str) -> None:
        bar.progress(done / total if total else 1.0, text=ui.md_escape(what[:1].upper() + what[1:]))

    try:
        result = ingest(ui.store(), paths, progress=progress)
    except (LogReadError, StoreError, OSError, ValueError) as exc:
        bar.empty()
        st.session_state.pop(LAST_INGEST_KEY, None)
        st.error(f"Nothing loaded: {ui.md_escape(exc)}")
        return
    bar.progress(1.0, text="Loaded")
    st.session_state[LAST_INGEST_KEY] = result.to_json()


def load_path(text: str) -> None:
    """A typed path is opened only inside the configured roots, each file checked after its links."""
    try:
        files = ui.confined_log_files(text)
    except (PathRefused, ConfigError, LogReadError, OSError) as exc:
        st.session_state.pop(LAST_INGEST_KEY, None)
        st.error(f"Nothing loaded: {ui.md_escape(exc)}")
        return
    load_logs(files)


def load_uploads(files: list) -> None:
    """Uploads go to a temporary folder under their own names, so the suffix picks the reader."""
    folder = Path(tempfile.mkdtemp(prefix="specdec-upload-"))
    try:
        paths = []
        for n, upload in enumerate(files):
            target = folder / str(n) / Path(upload.name).name
            target.parent.mkdir()
            target.write_bytes(upload.getvalue())
            paths.append(str(target))
        load_logs(paths)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def show_last_ingest() -> None:
    counts = st.session_state.get(LAST_INGEST_KEY)
    if not counts:
        return
    left, right = st.columns(2)
    left.metric("Read", ui.fmt_int(counts["read"]))
    right.metric("Accepted", ui.fmt_int(counts["accepted"]))
    left.metric("Duplicates", ui.fmt_int(counts["duplicates"]))
    right.metric("Quarantined", ui.fmt_int(counts["quarantined"]))
    if counts["quarantined"]:
        with st.expander("Quarantined records"):
            st.dataframe(ui.cached(metrics.quarantined_records), hide_index=True)


def keep_valid(key: str, options: list) -> None:
    """Drop selections the current database no longer has (another file, or a filter left from before)."""
    if key in st.session_state:
        st.session_state[key] = [v for v in st.session_state[key] if v in options]


def time_range(options: dict) -> tuple:
    # The slider spans the bulk of the requests (see metrics.filter_options): a few lines with an unset
    # clock (epoch 0, year 1) neither break it nor stretch it past the incident's hours.
    start, end = options["span_start"], options["span_end"]
    if end <= start:
        return None, None
    chosen = st.session_state.get("f_time")
    if not chosen or chosen[0] < start or chosen[1] > end:
        st.session_state["f_time"] = (start, end)
    step = max(timedelta(seconds=1), timedelta(seconds=round((end - start).total_seconds() / 1000)))
    low, high = st.slider("Time range (UTC)", min_value=start, max_value=end, step=step,
                          format="YYYY-MM-DD HH:mm" if (end - start).days > 300 else "MM-DD HH:mm", key="f_time")
    st.caption(f"{ui.fmt_ts(low)} to {ui.fmt_ts(high)}")
    if options["outside_span"]:
        st.caption(f"{options['outside_span']:,} requests have timestamps beyond this slider (earliest "
                   f"{ui.fmt_ts(options['start'])}, latest {ui.fmt_ts(options['end'])}); a handle at its end "
                   "keeps them in.")
    # A handle at its end is no bound on that side: requests loaded later, or beyond the slider, stay in view.
    return (None if low <= start else low), (None if high >= end else high)


def filter_widgets() -> Filters:
    options = ui.cached(metrics.filter_options, span_limits=ui.SLIDER_LIMITS)
    start, end = time_range(options)
    chosen = {}
    for key, label, format_func in (
        ("deployments", "Deployments", ui.deployment_label),
        ("target_models", "Target models", str),
        ("draft_models", "Draft models", str),
    ):
        keep_valid(f"f_{key}", options[key])
        chosen[key] = tuple(st.multiselect(label, options[key], format_func=format_func, key=f"f_{key}",
                                           placeholder="All"))
    return Filters(start=start, end=end, **chosen)


with st.sidebar:
    if ui.DB_KEY not in st.session_state:
        st.session_state[ui.DB_KEY] = ui.default_db_path()
    st.text_input("Database", key=ui.DB_KEY, on_change=ui.confine_db_choice,
                  help="A DuckDB file made by `specdec ingest`; created on first load. Only inside the folders "
                       "the config's [dashboard] roots name (default: the repo's data/ and the folder the "
                       "dashboard was started in).")
    if ui.DB_REFUSED_KEY in st.session_state:
        st.error(ui.md_escape(st.session_state.pop(ui.DB_REFUSED_KEY)))
    try:
        ready = ui.has_data()
    except StoreError:
        ready = None  # the page says what is wrong with the file
    with st.expander("Load logs", expanded=not ready):
        log_path = st.text_input("Log file, folder or glob", key="load_path", placeholder="data/demo/")
        if st.button("Load path", disabled=not log_path.strip()):
            load_path(log_path.strip())
        uploads = st.file_uploader("Or upload log files", type=UPLOAD_TYPES, accept_multiple_files=True,
                                   key="uploads")
        if st.button("Load uploads", disabled=not uploads):
            load_uploads(uploads)
        show_last_ingest()
    st.subheader("Filters")
    # Asked again: a load just above may have filled an empty database.
    st.session_state[ui.FILTERS_KEY] = filter_widgets() if ready is not None and ui.has_data() else NO_FILTERS

with ui.entrypoint():
    navigation.run()
