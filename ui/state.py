"""This session's database and filters, the cached library calls every page makes, and the page frame.

Pages call `specdec_core` only through `cached` (or directly for writes).
"""

from __future__ import annotations

import gc
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, TypeVar

import streamlit as st
from streamlit import runtime

from specdec_core.analysis import NO_FILTERS, Filters
from specdec_core.store import Store, StoreError, resolve_db
from ui.format import code_span, md_escape, plural

DB_KEY = "db_path"
DB_ACCEPTED_KEY = "db_path_accepted"
DB_REFUSED_KEY = "db_path_refused"
FILTERS_KEY = "filters"
REPLAY_IDS_KEY = "replay_request_ids"
REPLAY_RESULTS_KEY = "replay_results"
REPLAY_JOB_KEY = "replay_job"
REPLAY_START_KEY = "replay_start_batch"
ANNOTATIONS_KEY = "annotations"
PRELOAD_KEY = "model_preload"
VIEW_PARAMS_KEY = "view_params"  # the filters as query parameters: every link to another page carries them
_ENTRYPOINT_KEY = "_entrypoint_running"
# Set when a page's run first ends in this server process: the model preload (app.py) waits for it, so that
# first view's queries don't share the interpreter and the two cores with torch's import and the weights.
PAGE_RAN = threading.Event()

# Page titles -> the page file that shows them.
PAGE_FILES = {
    "Overview": "pages/overview.py",
    "Cache": "pages/cache.py",
    "Output length": "pages/output_length.py",
    "Mismatches": "pages/mismatches.py",
    "Impact": "pages/impact.py",
    "Keys": "pages/keys.py",
    "Replay": "pages/replay.py",
    "Search": "pages/search.py",
    "Export": "pages/export.py",
    "Request": "pages/request.py",
}
# Pages reached from a row of a table, not from the sidebar: they show one thing, named in their URL.
LINKED_ONLY = ("Request",)

T = TypeVar("T")

# How many modules the process had when it last froze what it held (freeze_what_is_loaded).
_frozen_at_modules = 0


def freeze_what_is_loaded() -> None:
    """In a served dashboard, once per set of imported modules, set what the process holds aside from Python's
    cycle collector.

    A server collects every generation after each run of a page (`runner.postScriptGC`): that walked every
    object of the modules the dashboard imports, 0.07 s a run, and 0.17 s once the replay's models had brought
    torch and transformers in. A run's own objects are still collected; the modules' (and the models') live
    as long as the process does. Again whenever the modules grew: a preload or a page imported more. Not in a
    script run without a server (AppTest), which collects nothing after a run: there it would only keep the
    host's garbage.
    """
    global _frozen_at_modules
    if runtime.exists() and len(sys.modules) != _frozen_at_modules:
        _frozen_at_modules = len(sys.modules)
        gc.collect()
        gc.freeze()


# Streamlit's slider places dates exactly from 1684 to 2255: the time filter spans no further.
SLIDER_LIMITS = (datetime(1700, 1, 1, tzinfo=timezone.utc), datetime(2250, 1, 1, tzinfo=timezone.utc))


def default_db_path(argv: Sequence[str] | None = None) -> str:
    """`--db FILE` after `--` in `streamlit run app.py -- --db FILE`, else $SPECDEC_DB, else the default."""
    args = list(sys.argv[1:] if argv is None else argv)
    chosen = None
    for i, arg in enumerate(args):
        if arg == "--db" and i + 1 < len(args):
            chosen = args[i + 1]
        elif arg.startswith("--db="):
            chosen = arg.split("=", 1)[1]
    return resolve_db(chosen)

def store() -> Store:
    return Store(st.session_state.get(DB_KEY) or default_db_path())


def filters() -> Filters:
    return st.session_state.get(FILTERS_KEY, NO_FILTERS)


@st.cache_data(show_spinner=False, max_entries=1024)
def _call(name: str, db: str, version: tuple[int, int], args: tuple, kwargs: tuple, _fn: Callable) -> Any:
    # The key is the function's name, the database, its version and the arguments (filters included):
    # a new state of the file means new answers. `_fn` itself is left out of the key (leading underscore).
    return _fn(Store(db), *args, **dict(kwargs))


def cached(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(store, *args, **kwargs), cached per (database, its version, arguments including the filters)."""
    db = store()
    return _call(f"{fn.__module__}.{fn.__qualname__}", db.name, db.version(), args,
                 tuple(sorted(kwargs.items())), _fn=fn)


def has_data() -> bool:
    """Whether the database exists and holds at least one request (never creates the file)."""
    from specdec_core import analysis

    db = store()
    if not db.exists:
        return False
    return cached(analysis.filter_options, span_limits=SLIDER_LIMITS).start is not None


def require_data() -> None:
    """Stop the page with the way to load logs when there is nothing to show yet."""
    db = store()
    try:
        ready = has_data()
    except StoreError as exc:
        st.error(f"{md_escape(exc)}. Choose another database file in the sidebar.")
        st.stop()
    if not ready:
        empty_state(db)
        st.stop()


def empty_state(db: Store) -> None:
    from specdec_core import analysis

    refused = cached(analysis.headline).quarantined if db.exists else 0
    if refused:  # loaded, but every record broke the contract: not the same as nothing loaded yet
        reasons = cached(analysis.quarantine_reasons).head(3)
        st.warning(f"All {plural(refused, 'record')} loaded into {code_span(db.path)} broke the log "
                   "contract and were quarantined: there is no request to show. The commonest reasons: "
                   + ", ".join(f"{code_span(r.reason)} ({r.records:,})" for r in reasons.itertuples())
                   + ". The sidebar's **Load logs** lists them; `specdec stats` counts them.")
    st.info(
        f"No requests in {code_span(db.path)} yet. Load logs from the sidebar (a path, or upload "
        "JSON Lines, CSV, Parquet or a Phoenix export), or from a shell:\n\n"
        f"    specdec ingest PATH --db {db.path}\n\n"
        "`make run` loads the demo logs in `data/demo/` and opens this dashboard on them."
    )


@contextmanager
def entrypoint() -> Iterator[None]:
    """app.py runs the current page inside this, so a page knows the sidebar and filters ran before it."""
    st.session_state[_ENTRYPOINT_KEY] = True
    try:
        yield
    finally:
        st.session_state.pop(_ENTRYPOINT_KEY, None)
        PAGE_RAN.set()


def page_header(title: str) -> None:
    """Every page starts here: the title, once app.py (sidebar, filters) has run first.

    Streamlit treats a folder named pages/ as a legacy multipage app until some session has
    called st.navigation (https://docs.streamlit.io/develop/api-reference/navigation/st.navigation):
    the first visit to a fresh server straight at /mismatches would run the page alone, without
    the sidebar. Turning that mode off and rerunning goes through app.py, on the same page with
    the same query parameters.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if not st.session_state.get(_ENTRYPOINT_KEY) and getattr(PagesManager, "uses_pages_directory", False):
        PagesManager.uses_pages_directory = False
        st.rerun()
    st.title(title)



def view_params(**extra: str) -> dict[str, Any]:
    """This view's filters as query parameters, with a page's own: a link or a switch that carries them
    keeps the filters (a URL without them is a view of everything, as Back to it must show)."""
    return {**(st.session_state.get(VIEW_PARAMS_KEY) or {}), **extra}


def page_link(title: str, label: str | None = None, **kwargs: Any) -> None:
    """A link to another page of this view: the filters go with it, so the switch is one history entry."""
    kwargs.setdefault("query_params", st.session_state.get(VIEW_PARAMS_KEY) or {})
    st.page_link(PAGE_FILES[title], label=label or f"Open {title}", **kwargs)


def replay_url(replay_id: str) -> str:
    """The permanent address of one stored replay, relative to the dashboard."""
    return f"replay?replay_id={replay_id}"


def request_url(request_id: str) -> str:
    """The address of one request's page, relative to the dashboard."""
    from urllib.parse import quote

    return f"request?request_id={quote(request_id, safe='')}"

