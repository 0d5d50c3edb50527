"""What app.py and every page share: this session's database and filters, cached library calls, safe text.

Pages call `specdec_core` only through `cached` (or directly for writes); log text
reaches the screen through `st.code`/`st.text`/dataframes, or through `md_escape`
when it must sit inside markdown. Nothing here renders HTML.
"""

from __future__ import annotations

import html
import string
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
import streamlit as st

from specdec_core import config
from specdec_core.analysis import NO_FILTERS, Annotation, Filters, annotations_for
from specdec_core.config import DashboardSettings
from specdec_core.store import Store, StoreError, resolve_db
from specdec_core.store.location import LocationError, lake_location

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
_ENTRYPOINT_KEY = "_entrypoint_running"

# Page titles -> the page file that shows them.
PAGE_FILES = {
    "Overview": "pages/overview.py",
    "Cache": "pages/cache.py",
    "Output length": "pages/output_length.py",
    "Mismatches": "pages/mismatches.py",
    "Keys": "pages/keys.py",
    "Replay": "pages/replay.py",
    "Search": "pages/search.py",
    "Export": "pages/export.py",
}

T = TypeVar("T")

# Streamlit's slider places dates exactly from 1684 to 2255: the time filter spans no further.
SLIDER_LIMITS = (datetime(1700, 1, 1, tzinfo=timezone.utc), datetime(2250, 1, 1, tzinfo=timezone.utc))


# --- the database and filters of this session --------------------------------------------------------------


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


# --- what the dashboard may open: its users are whoever reaches the port, with no login ----------------------


def dashboard_settings() -> DashboardSettings:
    """The config's [dashboard] settings; the folder of the database the dashboard was started with
    (`--db` or $SPECDEC_DB, chosen by whoever started it) may always be opened too."""
    return config.dashboard_settings().with_roots(_started_store_folders())


def _started_store_folders() -> list[Path]:
    """The folder of the store the dashboard was started with: a DuckDB file's, or a local lake catalog's."""
    started = default_db_path()
    try:
        lake = lake_location(started)
    except LocationError:
        return []
    if lake is None:
        return [Path(started).resolve().parent]
    return [] if lake.postgres else [Path(lake.catalog).parent]


def operator_stores() -> tuple[str, ...]:
    """The stores the operator named (the configured shared store, the --db it was started with)."""
    try:
        return tuple(dict.fromkeys((default_db_path(), resolve_db(None))))
    except LocationError:
        return (default_db_path(),)


def confine_db_choice() -> None:
    """on_change of the Database box: a store outside the roots is refused, and the box goes back.

    What is kept is the store as it will be opened (an absolute path; a lake's resolved catalog),
    never the typed text: `md:`, `ducklake:` or a relative name can't mean something else later.
    """
    chosen = str(st.session_state.get(DB_KEY) or "").strip()
    try:
        chosen = dashboard_settings().confine_store(chosen, allowed=operator_stores())
    except (config.PathRefused, config.ConfigError) as exc:
        st.session_state[DB_KEY] = st.session_state.get(DB_ACCEPTED_KEY) or default_db_path()
        st.session_state[DB_REFUSED_KEY] = f"Database not changed: {exc}"
    else:
        st.session_state[DB_KEY] = st.session_state[DB_ACCEPTED_KEY] = chosen
        st.session_state.pop(DB_REFUSED_KEY, None)


def confined_log_files(text: str) -> list[str]:
    """The log files a path, folder or glob typed into the sidebar names, all inside the roots."""
    return dashboard_settings().confine_logs(text)


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
    from specdec_core import analysis as metrics

    db = store()
    if not db.exists:
        return False
    return cached(metrics.filter_options, span_limits=SLIDER_LIMITS)["start"] is not None


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
    st.info(
        f"No requests in `{md_escape(str(db.path))}` yet. Load logs from the sidebar (a path, or upload "
        "`.jsonl`, `.jsonl.gz`, `.csv` or `.parquet` files), or from a shell:\n\n"
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


# --- formatting ---------------------------------------------------------------------------------------------

_MD_SPECIAL = set(string.punctuation)


def md_escape(text: object) -> str:
    """Log text made inert inside st.markdown: every ASCII punctuation backslash-escaped (CommonMark),
    so no HTML, link, image, directive or formula can form; newlines become spaces."""
    out = []
    for ch in str(text):
        if ch in _MD_SPECIAL:
            out.append("\\" + ch)
        elif ch in "\r\n":
            out.append(" ")
        else:
            out.append(ch)
    return "".join(out)


def plot_label(text: object) -> str:
    """Log text used as a plotly label: plotly reads a few HTML tags in labels, entities show as text."""
    return html.escape(str(text), quote=False)


def fmt_int(value: Any) -> str:
    return "–" if value is None else f"{int(value):,}"


def fmt_pct(value: Any) -> str:
    return "–" if value is None else f"{float(value):.1%}"


def fmt_ts(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def deployment_label(value: str) -> str:
    return value or "(none)"


def page_link(title: str, label: str | None = None, **kwargs: Any) -> None:
    st.page_link(PAGE_FILES[title], label=label or f"Open {title}", **kwargs)


def code_span(text: object) -> str:
    """Text as a markdown code span, shown exactly as it is: nothing inside a code span is markup, so no
    escaping (which would show as backslashes); the fence is one backtick longer than the longest run
    of backticks in the text, so a backtick in a log value can't close it."""
    value = str(text).replace("\r", " ").replace("\n", " ")
    longest = max((len(run) for run in _backtick_runs(value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or not value.strip() else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _backtick_runs(text: str) -> list[str]:
    runs, current = [], ""
    for ch in text:
        if ch == "`":
            current += ch
        elif current:
            runs.append(current)
            current = ""
    return runs + ([current] if current else [])


def filter_slug(filters: Filters) -> str:
    """The filters in a file name: what a downloaded CSV was cut to, in its own name."""
    parts = []
    if filters.start is not None or filters.end is not None:
        start = filters.start.strftime("%Y%m%dT%H%M") if filters.start else "start"
        end = filters.end.strftime("%Y%m%dT%H%M") if filters.end else "end"
        parts.append(f"{start}-{end}")
    for values in (filters.deployments, filters.target_models, filters.draft_models):
        if values:
            parts.append("+".join(deployment_label(v) for v in values))
    slug = "_".join(parts) or "all"
    safe = "".join(ch if ch.isalnum() or ch in "-+._" else "-" for ch in slug)
    return safe[:120].strip("-") or "all"


def replay_url(replay_id: str) -> str:
    """The permanent address of one stored replay, relative to the dashboard."""
    return f"replay?replay_id={replay_id}"


def request_url(request_id: str) -> str:
    from urllib.parse import quote

    return f"replay?request_id={quote(request_id, safe='')}"



# --- charts -------------------------------------------------------------------------------------------------

# Colour-blind-safe (Okabe-Ito order) and without red: red is kept for what is wrong.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#56B4E9", "#CC79A7", "#F0E442", "#7F7F7F", "#000000"]
ALARM = "#D62728"
GOOD = "#4C78A8"
TIME_KEY = "f_time"


def readable_layout(figure: Any, *, height: int | None = None) -> Any:
    """Legends under the plot, not beside it: on a phone a side legend squeezes the plot to a sliver."""
    figure.update_layout(legend={"orientation": "h", "yanchor": "top", "y": -0.18, "x": 0, "title": None},
                         margin={"l": 8, "r": 8, "t": 36, "b": 8}, colorway=PALETTE)
    if height:
        figure.update_layout(height=height)
    return figure


def panel_spacing(panels: int, panel_px: int) -> float:
    """facet_row_spacing that leaves about 30 px between panels of `panel_px` each: room for the labels of a
    panel's marks (annotate), which sit above it and ran into the bars of the panel above at plotly's 3%."""
    if panels < 2:
        return 0.03
    return min(0.9 / (panels - 1), 30 / (panel_px * panels + 40))


def annotations() -> list[Annotation]:
    """The annotations of this session: the sidebar's and the file's, and the detected contamination."""
    return st.session_state.get(ANNOTATIONS_KEY, [])


def annotate(figure: Any, deployment: str | None = None) -> Any:
    """Deploys, fixes and the first/last contaminated hit as labelled vertical lines on a time chart.

    On a chart with one panel per deployment (facet_row), a deployment's marks go on its own panel only;
    a mark for every deployment goes on each."""
    panels = _deployment_panels(figure)
    for note in annotations_for(annotations(), deployment):
        detected = note.kind != "note"
        # An epoch-millisecond x: plotly's own arithmetic on datetimes in add_vline fails on some versions.
        x = note.ts.timestamp() * 1000
        style = {"width": 1, "dash": "dot" if detected else "dash", "color": ALARM if detected else "#444444"}
        if not panels:
            figure.add_vline(x=x, line=style, annotation_text=plot_label(note.label),
                             annotation_position="top left", annotation_font_size=10)
            continue
        if note.deployment is None:
            targets = list(panels.values())
        else:
            own = panels.get(plot_label(deployment_label(note.deployment)))
            targets = [own] if own else []  # a deployment this chart has no panel for
        for x_axis, y_axis in targets:
            figure.add_shape(type="line", x0=x, x1=x, y0=0, y1=1, xref=x_axis, yref=f"{y_axis} domain", line=style)
            figure.add_annotation(x=x, y=1, xref=x_axis, yref=f"{y_axis} domain", text=plot_label(note.label),
                                  showarrow=False, xanchor="right", yanchor="bottom", font={"size": 10})
    return figure


def _deployment_panels(figure: Any) -> dict[str, tuple[str, str]]:
    """A facet_row chart's panels: the panel's label (as plotly express wrote it, turned on its side at the
    right) -> the (x axis, y axis) its traces use. Empty for a chart of one panel."""
    axes = {trace.yaxis or "y": trace.xaxis or "x" for trace in figure.data}
    if len(axes) < 2:
        return {}
    panels = {}
    for label in figure.layout.annotations:
        if label.textangle != 90 or label.y is None:
            continue
        for y_axis, x_axis in axes.items():
            domain = figure.layout["yaxis" + y_axis[1:]].domain or (0, 1)
            if domain[0] <= label.y <= domain[1]:
                panels[label.text] = (x_axis, y_axis)
    return panels


def _set_time_filter_from(key: str) -> None:
    """on_select of a time chart: a box dragged across it becomes the sidebar's time range."""
    state = st.session_state.get(key)
    boxes = (state or {}).get("selection", {}).get("box", []) if isinstance(state, dict) else \
        getattr(getattr(state, "selection", None), "box", [])
    if not boxes:
        return
    xs = boxes[0].get("x") or []
    if len(xs) < 2:
        return
    low, high = sorted(pd.Timestamp(x, tz="UTC") if pd.Timestamp(x).tzinfo is None else pd.Timestamp(x)
                       for x in xs[:2])
    st.session_state[TIME_ZOOM_KEY] = (low.to_pydatetime(), high.to_pydatetime())


TIME_ZOOM_KEY = "time_zoom"


# In drag-to-select mode Streamlit turns plotly's click-to-select off, so a click on a bar would be lost.
# This script (no data in it) hands a click on a time chart to Streamlit as the selection of that one point;
# a drag still selects a box. It runs in a same-origin component frame and watches for charts drawn later;
# only charts drawn by time_chart (marked in their layout's meta) are touched.
_CLICK_BRIDGE = """<script>
(function () {
  const doc = window.parent.document;
  function attach() {
    doc.querySelectorAll('[data-testid="stPlotlyChart"] .js-plotly-plot').forEach(function (gd) {
      if (gd.__specdecClick || !gd.on || !gd.emit) return;
      const meta = gd.layout && gd.layout.meta;
      if (!meta || !meta.specdec_click_selects) return;
      gd.__specdecClick = true;
      // A press and release on the same spot is a click on the point hovered when it was pressed. Only DOM
      // listeners here: plotly drops its own event handlers when Streamlit draws the chart again.
      let down = null;
      gd.addEventListener('mousedown', function (ev) {
        const hover = gd._hoverdata;
        const h = hover && hover.length ? hover[0] : null;
        // Only the fields a selected point carries: a hover point also holds the axes, which can't be sent.
        const point = h && {curveNumber: h.curveNumber, pointNumber: h.pointNumber, pointIndex: h.pointNumber,
                            x: h.x, y: h.y, customdata: h.customdata, data: h.data, fullData: h.fullData};
        down = {x: ev.clientX, y: ev.clientY, point: point};
      }, true);
      doc.addEventListener('mouseup', function (ev) {
        if (!down) return;
        const moved = Math.abs(ev.clientX - down.x) + Math.abs(ev.clientY - down.y);
        const point = down.point;
        down = null;
        if (moved > 3 || !point) return;
        // After plotly has handled the click (it clears the selection), select that point.
        doc.defaultView.setTimeout(function () { gd.emit('plotly_selected', {points: [point]}); }, 50);
      }, true);
    });
  }
  attach();
  new MutationObserver(attach).observe(doc.body, {childList: true, subtree: true});
})();
</script>"""


def click_bridge() -> None:
    """Drawn once per run by the entrypoint (sidebar, no height), so every page's time charts have it."""
    import streamlit.components.v1 as components

    components.html(_CLICK_BRIDGE, height=0)


def time_chart(figure: Any, key: str, deployment: str | None = None) -> dict | None:
    """Show a time chart with its annotations. Dragging across it sets the sidebar's time range (the
    global filter); clicking a bar or point returns that point (x, customdata) for its rows to be shown."""
    annotate(figure, deployment)
    figure.update_layout(dragmode="select", selectdirection="h", meta={"specdec_click_selects": True})
    event = st.plotly_chart(figure, key=key, on_select=lambda: _set_time_filter_from(key),
                            selection_mode=("points", "box"), config={"displaylogo": False})
    points = event.selection.points if event is not None and event.selection else []
    if points and not (event.selection.box or []):
        return points[0]
    return None


def point_time(point: dict) -> pd.Timestamp:
    ts = pd.Timestamp(point["x"])
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts


def fmt_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def bucket_delta(bucket: str) -> pd.Timedelta:
    return pd.Timedelta(bucket)


def point_deployment(figure: Any, point: dict) -> str | None:
    """The deployment of a clicked point, from the customdata its trace carries."""
    try:
        return str(figure.data[point["curve_number"]].customdata[point["point_index"]][0])
    except (KeyError, IndexError, TypeError, AttributeError):
        return None


def show_point_rows(figure: Any, point: dict | None, bucket: str, *, contaminated_only: bool = False,
                    key: str) -> None:
    """The requests behind a clicked bar or point of a time chart, each linked to its replay page."""
    if point is None:
        st.caption("Click a bar or point to list its requests; drag across the chart to set the time range.")
        return
    from specdec_core import analysis

    start = point_time(point)
    end = start + bucket_delta(bucket)
    deployment = point_deployment(figure, point)
    rows = cached(analysis.requests_in_window, filters(), start.to_pydatetime(), end.to_pydatetime(),
                  deployment=deployment, contaminated_only=contaminated_only)
    where = f" in {code_span(deployment_label(deployment))}" if deployment is not None else ""
    st.markdown(f"**{len(rows):,} {'contaminated hits' if contaminated_only else 'requests'}** from "
                f"{fmt_ts(start.to_pydatetime())} to {fmt_ts(end.to_pydatetime())}{where}")
    request_table(rows, key=key)


def request_table(rows: pd.DataFrame, *, key: str, **kwargs: Any) -> Any:
    """Requests with a link to each one's replay page in the first column."""
    shown = rows.copy()
    shown.insert(0, "open", [request_url(r) for r in shown["request_id"]])
    return st.dataframe(shown, hide_index=True, key=key, column_config={
        "open": st.column_config.LinkColumn("replay", display_text="open", width="small"),
    }, **kwargs)


def short_digest(values: Any) -> str:
    """A short, stable name for a list of values (never Python's hash(), which changes per process)."""
    import hashlib

    return hashlib.sha256("\x1f".join(map(str, values)).encode()).hexdigest()[:12]
