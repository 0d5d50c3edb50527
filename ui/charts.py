"""Time charts: the palette and layout, annotations as marked lines, drag-to-zoom and click-to-list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from specdec_core.analysis import Annotation, annotations_for
from ui.format import code_span, deployment_label, fmt_ts, plot_label, plural
from ui.state import ANNOTATIONS_KEY, SLIDER_LIMITS, cached, filters
from ui.tables import TIME_FORMAT_D3, request_table

# Colour-blind-safe (Okabe-Ito order) and without red: red is kept for what is wrong.
PALETTE = ["#0072B2", "#E69F00", "#009E73", "#56B4E9", "#CC79A7", "#F0E442", "#7F7F7F", "#000000"]
ALARM = "#D62728"
GOOD = "#4C78A8"
TIME_KEY = "f_time"
TIME_ZOOM_KEY = "time_zoom"  # a box dragged across a time chart, for the sidebar to take
# plotly's toolbar sits at the figure's top right, where the legends are: on a phone it covered them. Dragging
# selects a time range, the ranges are fitted, and Streamlit's own toolbar (full screen) sits outside the plot.
CHART_CONFIG = {"displaylogo": False, "displayModeBar": False}
# Room above the tallest value of a chart with marks, for the first rows of their labels (fit_value_axes).
MARKED_PAD = 0.22


# The user's notes grey and dashed; the contamination's bounds red and dotted; a key-scheme change (the fix,
# as the keys show it) green and solid.
MARK_STYLES = {"note": {"width": 1, "dash": "dash", "color": "#444444"},
               "contamination_start": {"width": 1, "dash": "dot", "color": ALARM},
               "contamination_end": {"width": 1, "dash": "dot", "color": ALARM},
               "key_scheme_change": {"width": 2, "dash": "solid", "color": "#009E73"}}


def readable_layout(figure: Any, *, height: int | None = None) -> Any:
    """Legends above the plot, not beside it: on a phone a side legend squeezes the plot to a sliver. Not
    under it either: plotly places a legend a share of the plot's height below it but the axis title a
    number of pixels below it, so on a short plot the two overlapped (Cache, issue 44)."""
    figure.update_layout(legend={"orientation": "h", "yanchor": "bottom", "y": 1.02, "x": 0, "title": None},
                         margin={"l": 8, "r": 8, "t": 36, "b": 8}, colorway=PALETTE)
    if height:
        figure.update_layout(height=height)
    return figure


def fit_value_axes(figure: Any, *, pad: float = 0.08) -> Any:
    """Each value axis's range set from the data drawn on it, from zero (stacked bars by their sums), with
    a little room above. Set explicitly, not left to plotly's autorange: once a chart's time axis has a
    fixed range, plotly.js stops autoranging its other axes too and draws them at its default -1..4,
    cutting every taller bar at 4."""
    stacked = (figure.layout.barmode or "group") in ("stack", "relative")
    extent: dict[str, dict[Any, list[float]]] = {}
    for number, trace in enumerate(figure.data):
        if trace.type not in ("bar", "scatter"):
            continue
        horizontal = getattr(trace, "orientation", None) == "h"
        values, places = (trace.x, trace.y) if horizontal else (trace.y, trace.x)
        if values is None:
            continue
        axis = "x" + (trace.xaxis or "x")[1:] if horizontal else "y" + (trace.yaxis or "y")[1:]
        together = stacked and trace.type == "bar" and places is not None
        slots = extent.setdefault(axis, {})
        numbers = pd.to_numeric(pd.Series(list(values), dtype=object), errors="coerce")
        for n, value in enumerate(numbers):
            if pd.isna(value):
                continue
            slot = slots.setdefault(places[n] if together else (number, n), [0.0, 0.0])
            slot[0 if value < 0 else 1] += float(value)
    for axis, slots in extent.items():
        if not slots:
            continue
        low = min(slot[0] for slot in slots.values())
        high = max(slot[1] for slot in slots.values())
        room = (high - low) * pad if high > low else 0.08  # every value 0: a little room, whatever the pad
        # Each panel of a faceted chart on its own scale: a quiet deployment's bars stay readable beside a
        # busy one's, and no panel's range is another's.
        figure.update_layout({_axis_name(axis): {"range": [low - room if low < 0 else 0.0, high + room],
                                                 "autorange": False, "matches": None}})
    return figure


def _axis_name(axis: str) -> str:
    """'y2' -> 'yaxis2', 'x' -> 'xaxis': the layout's name of a trace's axis."""
    return f"{axis[0]}axis{axis[1:]}"


# A chart with a panel per deployment shows at most MAX_PANELS of them: fifty panels are a chart taller than
# seven screens that nobody reads (and plotly takes seconds to build it).
MAX_PANELS = 12


def shown_panels(ranked: list[str], most: str) -> list[str]:
    """The deployments a chart with a panel each shows: the first MAX_PANELS of `ranked` (those with `most`
    first), said in a caption when others are left out; the sidebar's deployment filter chooses any others."""
    if len(ranked) > MAX_PANELS:
        st.caption(f"The {MAX_PANELS} deployments with {most}, of {len(ranked)}: the sidebar's deployment "
                   "filter shows any others.")
    return ranked[:MAX_PANELS]


def panel_spacing(panels: int, panel_px: int) -> float:
    """facet_row_spacing that leaves about 30 px between panels of `panel_px` each: room for the labels of a
    panel's marks (annotate), which sit above it and ran into the bars of the panel above at plotly's 3%."""
    if panels < 2:
        return 0.03
    return min(0.9 / (panels - 1), 30 / (panel_px * panels + 40))


def annotations() -> list[Annotation]:
    """The annotations of this session: the sidebar's and the file's, and the detected contamination."""
    return st.session_state.get(ANNOTATIONS_KEY, [])


# Labels are placed for a plot this narrow (a phone's), in px, with this many px per character: wider plots
# only give them more room. A label that would run into another goes on the next row down.
LABEL_PLOT_PX = 340
LABEL_CHAR_PX = 6.2
LABEL_ROW_PX = 17  # a 10 px label with its padding is about 15 px tall


def annotate(figure: Any, deployment: str | None = None, span: tuple[float, float] | None = None) -> Any:
    """Deploys, fixes, key-scheme changes and the first/last contaminated hit as labelled vertical lines on
    a time chart, the labels in rows from the top of the plot so that none covers another.

    On a chart with one panel per deployment (facet_row), a deployment's marks go on its own panel only;
    a mark for every deployment goes on each."""
    panels = _deployment_panels(figure) or {None: ("x", "y")}
    marks: dict[tuple[str, str], list[tuple[float, str, dict]]] = {axes: [] for axes in panels.values()}
    for note in annotations_for(annotations(), deployment):
        # An epoch-millisecond x: plotly's own arithmetic on datetimes fails on some versions.
        x = note.ts.timestamp() * 1000
        if span is not None and not span[0] <= x <= span[1]:
            continue  # outside the range shown: its label would sit over the axis's end
        style = MARK_STYLES.get(note.kind, MARK_STYLES["note"])
        if note.deployment is None or None in panels:
            targets = list(panels.values())
        else:
            own = panels.get(plot_label(deployment_label(note.deployment)))
            targets = [own] if own else []  # a deployment this chart has no panel for
        for axes in targets:
            marks[axes].append((x, plot_label(note.label), style))
    shapes, labels = [], []
    for (x_axis, y_axis), notes in marks.items():
        low, high = span or _data_span(figure, notes)
        ms_per_px = max(high - low, 1.0) / LABEL_PLOT_PX
        for x, text, style, row, right in _label_rows(_merged(notes, ms_per_px), low, high, ms_per_px):
            shapes.append({"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "xref": x_axis,
                           "yref": f"{y_axis} domain", "line": style})
            # No box: a white box hid the bars under it. A white outline keeps the text readable over them.
            labels.append({"x": x, "y": 1, "xref": x_axis, "yref": f"{y_axis} domain", "text": text,
                           "showarrow": False, "xanchor": "right" if right else "left", "yanchor": "top",
                           "yshift": -row * LABEL_ROW_PX, "font": {"size": 10, "color": style["color"], "shadow": "auto"}})
    if shapes:
        _add_marks(figure.layout, shapes, labels)
    return figure


def _add_marks(layout: Any, shapes: list[dict], labels: list[dict]) -> None:
    """The marks' lines and labels set at once, unchecked. plotly checks the whole list again on each
    add_shape/add_annotation, so one at a time cost the square of the marks (3.6 s of the Cache page's 3.9 s
    with 50 deployments); set at once through update_layout it still checked every mark and merged each
    facet label into itself (0.23 s of a chart's 0.5 s). Built above from fixed keys and MARK_STYLES, they
    are valid: the tests' figures go through plotly's checks (tests/dashboard/test_charts_annotations_search.py)."""
    before = (tuple(layout.shapes), tuple(layout.annotations))
    checked, layout._validate = layout._validate, False
    try:
        layout.shapes = [*before[0], *shapes]
        layout.annotations = [*before[1], *labels]
    finally:
        layout._validate = checked


def _merged(notes: list[tuple[float, str, dict]], ms_per_px: float) -> list[tuple[float, str, dict]]:
    """The same event of several deployments at the same place ("edge-a: last contaminated hit" and
    "edge-b: ..." a pixel apart) as one label naming them all: six labels stacked over the data on Mismatches."""
    merged: list[tuple[float, list[str], str, dict]] = []
    for x, text, style in sorted(notes, key=lambda n: n[0]):
        who, sep, what = text.partition(": ")
        if not sep:
            who, what = "", text
        for n, (mx, names, mwhat, mstyle) in enumerate(merged):
            if who and names and mwhat == what and mstyle == style and abs(x - mx) <= 2 * ms_per_px:
                merged[n] = (mx, names + [who], mwhat, mstyle)
                break
        else:
            merged.append((x, [who] if who else [], what, style))
    return [(x, f"{', '.join(sorted(names))}: {what}" if names else what, style) for x, names, what, style in merged]


def _data_span(figure: Any, notes: list[tuple[float, str, dict]]) -> tuple[float, float]:
    xs = [x for x, _, _ in notes]
    for trace in figure.data:
        xs += [pd.Timestamp(v).timestamp() * 1000 for v in (trace.x if trace.x is not None else ())]
    return (min(xs), max(xs)) if xs else (0.0, 1.0)


def _label_rows(notes: list[tuple[float, str, dict]], low: float, high: float,
                ms_per_px: float) -> list[tuple[float, str, dict, int, bool]]:
    """Each label's row and side: left of its line (right=True) unless that runs past the plot's start; in
    the first row where its box clears the boxes already there."""
    placed: list[tuple[float, str, dict, int, bool]] = []
    rows: list[list[tuple[float, float]]] = []
    for x, text, style in sorted(notes, key=lambda n: n[0]):
        width = (len(text) * LABEL_CHAR_PX + 8) * ms_per_px
        right = x - width >= low or x + width > high
        box = (x - width, x) if right else (x, x + width)
        free = [n for n, boxes in enumerate(rows) if all(box[1] < b[0] or box[0] > b[1] for b in boxes)]
        if not free:
            rows.append([])
        row = free[0] if free else len(rows) - 1
        rows[row].append(box)
        placed.append((x, text, style, row, right))
    return placed


def _deployment_panels(figure: Any) -> dict[str, tuple[str, str]]:
    """A facet_row chart's panels: the panel's label (as plotly express wrote it, turned on its side at the
    right) -> the (x axis, y axis) its traces use. Empty for a chart of one panel."""
    axes = {trace.yaxis or "y": trace.xaxis or "x" for trace in figure.data}
    if len(axes) < 2:
        return {}
    # Each axis's domain read once, not once per label (plotly's lookups: 0.13 s a chart of 12 panels).
    domains = {y_axis: figure.layout["yaxis" + y_axis[1:]].domain or (0, 1) for y_axis in axes}
    panels = {}
    for label in figure.layout.annotations:
        y = label.y
        if label.textangle != 90 or y is None:
            continue
        for y_axis, x_axis in axes.items():
            if domains[y_axis][0] <= y <= domains[y_axis][1]:
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

# In drag-to-select mode Streamlit turns plotly's click-to-select off, so a click on a bar would be lost.
# The script (no data in it) hands a click on a time chart to Streamlit as the selection of that one point;
# a drag still selects a box. It runs in a same-origin frame and watches for charts drawn later;
# only charts drawn by time_chart (marked in their layout's meta) are touched.
_CLICK_BRIDGE = f"<script>\n{(Path(__file__).parent / 'click_bridge.js').read_text(encoding='utf-8')}</script>"


def click_bridge() -> None:
    """Drawn once per run by the entrypoint (sidebar, 1 px: a height must be positive), so every page's time
    charts have it. st.iframe, not st.components.v1.html: Streamlit deprecated that and logged so on every
    run (336 times in 30 minutes); both run the script in a same-origin frame."""
    st.iframe(_CLICK_BRIDGE, height=1, tab_index=-1, alt="chart click helper (no content)")


def chart_span(bucket: str | None = None) -> tuple[float, float] | None:
    """The x range of every time chart, in epoch ms: the sidebar's time range (the whole log's span where
    a handle sits at its end), so a chart shows when nothing happened too, up to where the selection ends.
    Widened by half a bucket on each side: a bucket's bar is drawn centred on its start."""
    from specdec_core import analysis

    options = cached(analysis.filter_options, span_limits=SLIDER_LIMITS)
    chosen = filters()
    start, end = chosen.start or options.span_start, chosen.end or options.span_end
    if start is None or end is None:
        return None
    half = bucket_delta(bucket).total_seconds() * 500 if bucket else 0.0
    return start.timestamp() * 1000 - half, end.timestamp() * 1000 + half


def time_chart(figure: Any, key: str, deployment: str | None = None, *, bucket: str | None = None) -> dict | None:
    """Show a time chart with its annotations over the selected time range. Dragging across it sets the
    sidebar's time range (the global filter); clicking a bar or point returns that point (x, customdata) for
    its rows to be shown."""
    span = chart_span(bucket)
    if span is not None:
        figure.update_xaxes(range=list(span), autorange=False)
    # One timestamp format (tables, the slider, the sentences); the date under the first tick and where
    # it changes, as plotly does by default.
    figure.update_xaxes(hoverformat=TIME_FORMAT_D3, tickformat="%H:%M\n%Y-%m-%d")
    annotate(figure, deployment, span)
    fit_value_axes(figure, pad=MARKED_PAD if figure.layout.shapes else 0.08)
    figure.update_layout(dragmode="select", selectdirection="h", meta={"specdec_click_selects": True})
    event = st.plotly_chart(figure, key=key, on_select=lambda: _set_time_filter_from(key),
                            selection_mode=("points", "box"), config=CHART_CONFIG)
    points = event.selection.points if event is not None and event.selection else []
    if points and not (event.selection.box or []):
        return points[0]
    return None


def point_time(point: dict) -> pd.Timestamp:
    ts = pd.Timestamp(point["x"])
    return ts.tz_localize("UTC") if ts.tzinfo is None else ts



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
    st.markdown(f"**{plural(len(rows), 'contaminated hit' if contaminated_only else 'request')}** from "
                f"{fmt_ts(start.to_pydatetime())} to {fmt_ts(end.to_pydatetime())}{where}")
    request_table(rows, key=key)

