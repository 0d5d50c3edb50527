"""Mismatches: the hits that served another identity's output, over time and one by one; tick some to replay."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

import ui
from specdec_core import analysis
from specdec_core.contract import fields as contract

SELECTED_KEY = "mismatch_selected"  # request ids: a selection follows requests, not table positions

ui.page_header("Mismatches")
ui.require_data()
filters = ui.filters()

window = ui.cached(analysis.contamination_window, filters=filters)
if window.empty:
    st.success("No contaminated hits: every cache hit in this selection served an output produced for its own "
               "request identity.")
    st.stop()

st.subheader("Contaminated hits over time")
bucket = ui.cached(analysis.time_bucket, filters=filters)
over_time = ui.cached(analysis.mismatch_rate_over_time, filters=filters, bucket=bucket)
# Only deployments with contaminated hits get a colour and a legend entry; none of them is red, which would
# say one deployment is worse than another.
over_time = over_time[over_time.contaminated_hits > 0]
over_time = over_time.assign(label=[ui.plot_label(ui.deployment_label(d)) for d in over_time.deployment])
figure = px.bar(over_time, x="bucket", y="contaminated_hits", color="label",
                custom_data=["deployment", "label", "hits", "mismatch_rate"], color_discrete_sequence=ui.PALETTE,
                category_orders={"label": sorted(over_time.label.unique())},
                labels={"bucket": f"time (UTC, {ui.bucket_words(bucket)})", "contaminated_hits": "contaminated hits",
                        "label": "deployment"})
figure.update_traces(hovertemplate=f"<b>%{{customdata[1]}}</b><br>%{{x|{ui.TIME_FORMAT_D3}}} UTC<br>%{{y:,}} "
                                   "contaminated of %{customdata[2]:,} hits (%{customdata[3]:.1%})<extra></extra>")
ui.readable_layout(figure)
point = ui.time_chart(figure, "mismatch_rate_over_time", bucket=bucket)
ui.show_point_rows(figure, point, bucket, contaminated_only=True, key="mismatch_point_rows")

st.subheader("Contaminated hits")
hits = ui.cached(analysis.contaminated_hits, filters=filters, unknown=True)
needle = st.text_input("Filter rows", placeholder="deployment, differing field or model, e.g. max_tokens",
                       key="mismatch_filter").strip().lower()
if needle:
    searched = hits[["deployment", "differing_fields", "target_model", "draft_model"]].fillna("")
    hits = hits[searched.apply(lambda column: column.str.lower().str.contains(needle, regex=False)).any(axis=1)]
hits = hits.reset_index(drop=True)
selected: list[str] = st.session_state.setdefault(SELECTED_KEY, [])
# What an engineer reads first, then the rest of the identity as the contract lists it, then the evidence.
FIRST = ["request_id", "ts", "deployment", "differing_fields", "source_request_id", "target_model", "draft_model"]
COLUMNS = FIRST + [f for f in contract.IDENTITY_FIELDS if f in hits.columns and f not in FIRST] + \
    [c for c in ("output_tokens", "cache_key", "source_ts", "output_preview") if c in hits.columns]
# A field the hit's log left unknown (LiteLLM's sampling parameters) reads "unknown", as in every ui.table.
table = ui.unknown_cells(hits[COLUMNS + ["unknown_fields"]])
table.insert(0, "replay", table.request_id.isin(selected))
table.insert(1, "open", [ui.request_url(r) for r in table.request_id])
# The editor's own state is per position; it is keyed by the rows it shows, so a new filter starts it anew
# from the ids ticked so far.
editor_key = f"mismatch_editor_{len(table)}_{ui.short_digest(table.request_id)}"


def remember_ticks() -> None:
    edits = st.session_state.get(editor_key, {}).get("edited_rows", {})
    chosen = list(st.session_state.get(SELECTED_KEY, []))
    for position, change in edits.items():
        if "replay" not in change or int(position) >= len(table):
            continue
        request_id = table.request_id.iloc[int(position)]
        if change["replay"] and request_id not in chosen:
            chosen.append(request_id)
        elif not change["replay"] and request_id in chosen:
            chosen.remove(request_id)
    st.session_state[SELECTED_KEY] = chosen


total = int(window.contaminated_hits.sum())
shown = f"{len(hits):,} of {ui.plural(total, 'contaminated hit')}" if len(hits) < total else \
    ui.plural(total, "contaminated hit")
st.caption(f"{shown}. Tick rows to replay them with their full identity; ticks stay with "
           "their requests when the filter changes.")
st.data_editor(table, hide_index=True, key=editor_key, on_change=remember_ticks,
               disabled=[c for c in table.columns if c != "replay"],
               column_config={**ui.columns_for(table), "replay": st.column_config.CheckboxColumn("replay", width="small"),
                              "open": ui.request_link_column()})
selected = st.session_state[SELECTED_KEY]
if selected:
    hidden = [r for r in selected if r not in set(table.request_id)]
    st.write(f"{ui.plural(len(selected), 'request')} selected for replay"
             + (f" ({len(hidden)} not shown by this filter)." if hidden else "."))
    left, right = st.columns([1, 1])
    if left.button(f"Replay {len(selected)} selected", type="primary", key="replay_selected"):
        st.session_state[ui.REPLAY_IDS_KEY] = list(selected)
        st.session_state[ui.REPLAY_START_KEY] = list(selected)
        st.switch_page(ui.PAGE_FILES["Replay"], query_params=ui.view_params())
    if right.button("Clear the selection", key="clear_selection"):
        st.session_state[SELECTED_KEY] = []
        st.rerun()
