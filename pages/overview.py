"""Overview: is the cache mixing identities, where and since when, and which of the six symptoms show."""

from __future__ import annotations

import streamlit as st

import ui
from specdec_core import analysis

ui.page_header("Overview")
ui.require_data()
filters = ui.filters()
head = ui.cached(analysis.headline, filters=filters)

row = st.columns(4)
row[0].metric("Requests", ui.fmt_int(head["requests"]))
row[1].metric("Hit rate", ui.fmt_pct(head["hit_rate"]), help=f"{ui.fmt_int(head['hits'])} cache hits")
row[2].metric("Contaminated hits", ui.fmt_int(head["contaminated_hits"]),
              help="Hits that served an output produced for a different request identity")
row[3].metric("Contaminated share of hits", ui.fmt_pct(head["contaminated_rate"]))
row = st.columns(4)
row[0].metric("Length violations", ui.fmt_int(head["length_violations"]),
              help="Requests whose output_tokens exceed their max_tokens")
row[1].metric("Key collisions", ui.fmt_int(head["key_collisions"]),
              help="Cache keys shared by more than one request identity")
row[2].metric("Unique keys / unique identities",
              f"{ui.fmt_int(head['unique_keys'])} / {ui.fmt_int(head['unique_identities'])}",
              help="Fewer keys than identities means identities share cache entries")
row[3].metric("Quarantined records", ui.fmt_int(head["quarantined"]),
              help="Log records that broke the contract; listed under 'Load logs' in the sidebar")

gaps = ui.cached(analysis.logging_gaps, filters=filters)
if gaps:
    st.subheader("Logging gaps")
    st.warning("\n".join(f"- {ui.md_escape(gap.sentence)}" for gap in gaps))

st.subheader("Contamination window")
window = ui.cached(analysis.contamination_window, filters=filters)
if window.empty:
    st.success("No contaminated hits: every cache hit in this selection served an output produced for "
               "its own request identity.")
else:
    for w in window.itertuples():
        st.markdown(
            f"**{ui.md_escape(ui.deployment_label(w.deployment))}**: {w.contaminated_hits:,} contaminated "
            f"hits since **{ui.fmt_ts(w.first_contaminated)}**, the last at {ui.fmt_ts(w.last_contaminated)}."
        )
    st.dataframe(window, hide_index=True)
    ui.page_link("Mismatches", "See every contaminated hit")

st.subheader("Red flags")
STATUS = {True: ":red[**Yes**]", False: ":green[**No**]", None: ":gray[**Unknown**]"}
# The page that shows each red flag's evidence.
FLAG_PAGES = {"identical_outputs": "Mismatches", "replay_disagrees": "Replay", "biased_experiments": "Mismatches",
              "impossible_lengths": "Output length", "hit_rate_too_good": "Cache", "few_keys": "Keys"}
for flag in ui.cached(analysis.red_flags, filters=filters, head=head):
    with st.container(border=True):
        st.markdown(f"{STATUS[flag.flagged]} · **{ui.md_escape(flag.title)}**")
        st.caption(ui.md_escape(flag.evidence))
        ui.page_link(FLAG_PAGES[flag.id])
