"""Mismatches: the hits that served another identity's output, over time and one by one; pick some to replay."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

import ui
from specdec_core import analysis

ui.page_header("Mismatches")
ui.require_data()
filters = ui.filters()

window = ui.cached(analysis.contamination_window, filters=filters)
if window.empty:
    st.success("No contaminated hits: every cache hit in this selection served an output produced for its own "
               "request identity.")
    st.stop()

st.subheader("Contaminated hits over time")
over_time = ui.cached(analysis.mismatch_rate_over_time, filters=filters)
over_time = over_time.assign(deployment=[ui.plot_label(ui.deployment_label(d)) for d in over_time.deployment])
figure = px.bar(over_time, x="bucket", y="contaminated_hits", color="deployment",
                hover_data=["hits", "mismatch_rate"],
                labels={"bucket": "time (UTC)", "contaminated_hits": "contaminated hits"})
st.plotly_chart(figure, key="mismatch_rate_over_time")

st.subheader("Contaminated hits")
hits = ui.cached(analysis.contaminated_hits, filters=filters)
needle = st.text_input("Filter rows", placeholder="deployment, differing field or model, e.g. max_tokens",
                       key="mismatch_filter").strip().lower()
if needle:
    searched = hits[["deployment", "differing_fields", "target_model", "draft_model"]].fillna("")
    hits = hits[searched.apply(lambda column: column.str.lower().str.contains(needle, regex=False)).any(axis=1)]
hits = hits.reset_index(drop=True)
shown = f"{len(hits):,} of {window.contaminated_hits.sum():,}"
st.caption(f"{shown} contaminated hits. Select rows to replay them with their full identity.")
table = st.dataframe(
    hits[["request_id", "ts", "deployment", "source_request_id", "differing_fields", "target_model",
          "draft_model", "temperature", "max_tokens", "seed", "tokenizer_version", "output_tokens", "cache_key",
          "source_ts", "output_preview"]],
    hide_index=True, on_select="rerun", selection_mode="multi-row", key="mismatch_table",
)
selected = [hits.request_id[i] for i in table.selection.rows if i < len(hits)]
if selected:
    st.session_state[ui.REPLAY_IDS_KEY] = selected
    st.write(f"{len(selected)} selected for replay.")
    if st.button("Replay selected", type="primary"):
        st.switch_page(ui.PAGE_FILES["Replay"])
    ui.page_link("Replay", "Open Replay with the selection")
