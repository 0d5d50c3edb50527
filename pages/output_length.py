"""Output length: output tokens per max_tokens; a box reaching above its own limit is impossible."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

import ui
from specdec_core import analysis

ui.page_header("Output length")
ui.require_data()
filters = ui.filters()

st.caption("A request cannot return more tokens than its max_tokens. Outputs longer than their limit were "
           "produced for another request and served from a shared cache entry.")
boxes = ui.cached(analysis.output_length_by_max_tokens, filters=filters)
categories = [str(m) for m in boxes.max_tokens]
figure = go.Figure()
for violating, name, color in ((False, "within max_tokens", "#4c78a8"), (True, "exceeds max_tokens", "#e45756")):
    part = boxes[(boxes.violations > 0) == violating]
    if part.empty:
        continue
    figure.add_trace(go.Box(
        name=name, x=[str(m) for m in part.max_tokens], q1=part["q1"], median=part["median"], q3=part["q3"],
        lowerfence=part["min"], upperfence=part["max"], marker_color=color, boxpoints=False,
    ))
figure.add_trace(go.Scatter(
    name="max_tokens", x=categories, y=boxes.max_tokens, mode="markers",
    marker={"symbol": "line-ew-open", "size": 28, "color": "black"},
))
figure.update_layout(xaxis={"title": "max_tokens", "type": "category", "categoryorder": "array",
                            "categoryarray": categories},
                     yaxis_title="output tokens", boxmode="overlay")
st.plotly_chart(figure, key="output_length_by_max_tokens")
st.dataframe(boxes, hide_index=True)

st.subheader("Length violations")
count = ui.cached(analysis.headline, filters=filters)["length_violations"]
if not count:
    st.success("No request in this selection returned more tokens than its max_tokens.")
else:
    violations = ui.cached(analysis.length_violations, filters=filters)
    shown = "" if len(violations) == count else f" (the first {len(violations):,} listed)"
    st.error(f"{count:,} requests returned more tokens than their max_tokens allows{shown}.")
    st.dataframe(violations, hide_index=True)
