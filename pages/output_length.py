"""Output length: output tokens per max_tokens; the limit a line, the requests above it points."""

from __future__ import annotations

import pandas as pd
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
count = ui.cached(analysis.headline, filters=filters).length_violations
violations = ui.cached(analysis.length_violations, filters=filters) if count else None
position = {m: i for i, m in enumerate(boxes.max_tokens)}
figure = go.Figure()
figure.add_trace(go.Box(
    name="output tokens", x=list(range(len(boxes))), q1=boxes["q1"], median=boxes["median"], q3=boxes["q3"],
    lowerfence=boxes["min"], upperfence=boxes["max"], marker_color=ui.GOOD, boxpoints=False,
))
# The limit of each box as a line across it: None breaks the line between boxes.
xs, ys = [], []
for i, limit in enumerate(boxes.max_tokens):
    xs += [i - 0.45, i + 0.45, None]
    ys += [None, None, None] if pd.isna(limit) else [limit, limit, None]  # unknown (LiteLLM's hits): no line
figure.add_trace(go.Scatter(name="max_tokens (the limit)", x=xs, y=ys, mode="lines",
                            line={"color": "#222222", "width": 2, "dash": "dash"}, hoverinfo="skip"))
if violations is not None and not violations.empty:
    # Spread across the box's width so requests of equal length stay apart; the same spread every render.
    spread = [((n * 37) % 61) / 61 * 0.6 - 0.3 for n in range(len(violations))]
    figure.add_trace(go.Scatter(
        name="requests over their limit", mode="markers",
        x=[position[m] + dx for m, dx in zip(violations.max_tokens, spread, strict=True)],
        y=violations.output_tokens, marker={"color": ui.ALARM, "size": 8, "symbol": "x"},
        customdata=violations[["request_id"]].map(ui.plot_label).to_numpy(),
        hovertemplate="%{customdata[0]}: %{y} tokens<extra></extra>",
    ))
figure.update_layout(xaxis={"title": "max_tokens", "tickmode": "array", "tickvals": list(range(len(boxes))),
                            "ticktext": ["unknown" if pd.isna(m) else str(m) for m in boxes.max_tokens]},
                     yaxis_title="output tokens")
event = st.plotly_chart(ui.readable_layout(figure), key="output_length_by_max_tokens", config=ui.CHART_CONFIG, on_select="rerun",
                        selection_mode="points")
# A column of one type (Arrow's): as text where one max_tokens is unknown.
ui.table(boxes.assign(max_tokens=["unknown" if pd.isna(m) else str(m) for m in boxes.max_tokens])
         if boxes.max_tokens.isna().any() else boxes)

st.subheader("Length violations")
if not count:
    st.success("No request in this selection returned more tokens than its max_tokens.")
else:
    picked = [violations.request_id.iloc[p["point_index"]] for p in (event.selection.points if event else [])
              if p.get("curve_number") == 2 and p.get("point_index", -1) < len(violations)]
    if picked:
        violations = violations[violations.request_id.isin(picked)]
        st.caption("The requests clicked in the chart; click elsewhere to list them all.")
    shown = "" if len(violations) == count or picked else f" (the first {len(violations):,} listed)"
    st.error(f"{ui.plural(count, 'request')} returned more tokens than their max_tokens allows{shown}.")
    ui.request_table(violations, key="length_violation_rows")
