"""Issue #55 through AppTest: chart ranges that fit their data, the request page, red flags first, inert log
text (issue #51, item 10)."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from test_charts_annotations_search import _plain
from test_pages import (  # noqa: F401
    build_db,
    incident_db,
    no_legacy_pages_folder,
    open_app,
)


def figures(at) -> dict[str, dict]:
    return {chart.key: _plain(json.loads(chart.proto.spec)) for chart in at.get("plotly_chart")}


def value_extent(spec: dict) -> dict[str, tuple[float, float]]:
    """Each value axis ('yaxis2', 'xaxis') -> the lowest and highest value drawn on it, stacked bars summed."""
    stacked = spec["layout"].get("barmode") in ("stack", "relative")
    sums: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for n, trace in enumerate(spec["data"]):
        if trace.get("type", "scatter") not in ("bar", "scatter"):
            continue
        horizontal = trace.get("orientation") == "h"
        values, places = (trace.get("x"), trace.get("y")) if horizontal else (trace.get("y"), trace.get("x"))
        axis = ("xaxis" + trace.get("xaxis", "x")[1:]) if horizontal else ("yaxis" + trace.get("yaxis", "y")[1:])
        for i, value in enumerate(values or []):
            if value is not None:
                key = places[i] if stacked and trace["type"] == "bar" else (n, i)
                sums[axis][key] += value
    return {axis: (min(0.0, *slots.values()), max(slots.values())) for axis, slots in sums.items() if slots}


@pytest.mark.parametrize("page", [None, "cache", "mismatches"])
def test_every_chart_range_fits_its_data(monkeypatch, incident_db, page):
    at = open_app(monkeypatch, incident_db, page)
    charts = figures(at)
    assert charts, "the page draws charts"
    for key, spec in charts.items():
        for axis, (low, high) in value_extent(spec).items():
            layout = spec["layout"].get(axis, {})
            assert "range" in layout and layout.get("autorange") is False, (key, axis)
            bottom, top = layout["range"]
            # The data inside the range, and the range no more than a quarter above the tallest value (a
            # little room where every value is 0).
            assert bottom <= low and high <= top <= high * 1.25 + (0.1 if high == 0 else 1e-9), \
                (key, axis, layout["range"], high)
            assert (bottom, top) != (-1, 4)
