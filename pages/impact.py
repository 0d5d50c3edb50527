"""Impact: who received wrong outputs, which experiment arm was served whose, and the A/B figures read again
on clean rows; each consumer's affected requests for the customer notice, and the incident report."""

from __future__ import annotations

import pandas as pd
import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

import ui
from specdec_core import analysis
from specdec_core.analysis import impact as hurt
from specdec_core.remediation import report

CONSUMER_PARAM = "consumer"  # the consumer whose requests are listed: part of the page's address
MISSING_KEY = "_impact_link_consumer_missing"  # a link's consumer not listed, and the one shown instead
SHOWN_ROWS = 1000  # a consumer's affected requests listed on the page; the CSV holds them all
REPORT_KEY = "impact_report_drafted"

ui.page_header("Impact")
ui.require_data()
filters = ui.filters()

consumers = ui.cached(hurt.impact, "consumer", filters=filters)
arms = ui.cached(hurt.experiment_impact, filters=filters)
affected = [c for c in consumers if c.affected]
fed_arms = sorted({c.arm for c in arms.cross_feeding if c.arm})

st.subheader("Blast radius")
cells = st.columns(4)
hit, named, unnamed = hurt.named_affected(consumers)
cells[0].metric("Consumers affected", f"{hit:,} of {named:,}" if named else "none named",
                help="Consumers the log names; requests that name none are the table's (none) row.")
cells[1].metric("Contaminated hits received", ui.fmt_int(sum(c.contaminated_hits for c in consumers)))
cells[2].metric("Length violations received", ui.fmt_int(sum(c.length_violations for c in consumers)))
cells[3].metric("Experiment arms cross-fed", f"{len(fed_arms):,} of {len([a for a in arms.arms if a.arm]):,}")
if not affected:
    st.success("No consumer received a contaminated hit or an over-long output in this selection.")
if consumers and all(c.value == "" for c in consumers):
    st.info("This log names no consumer: log `consumer` (OTel `specdec.consumer` or `user.id`, LiteLLM "
            "`requester_metadata.consumer` or the key alias) to see who received what.")

st.subheader("Wrong outputs per consumer over time")
bucket = ui.cached(analysis.time_bucket, filters=filters)
over_time = ui.cached(hurt.wrong_outputs_over_time, filters=filters, bucket=bucket)
if over_time.empty:
    st.caption("Nothing to chart: no wrong output in this selection.")
else:
    over_time = over_time.assign(label=[ui.plot_label(c or "(none)") for c in over_time.consumer])
    # Legend and stacking in the table's order: the most affected consumer first, at the bottom.
    order = [ui.plot_label(c.value or "(none)") for c in consumers]
    figure = px.bar(over_time, x="bucket", y="wrong", color="label", color_discrete_sequence=ui.PALETTE,
                    category_orders={"label": order},
                    hover_data=["contaminated_hits", "length_violations"],
                    labels={"bucket": f"time (UTC, {ui.bucket_words(bucket)})", "wrong": "wrong outputs",
                            "label": "consumer"})
    ui.time_chart(ui.readable_layout(figure), "impact_over_time", bucket=bucket)

table = [{"consumer": c.value or "(none)", "requests": c.requests, "contaminated_hits": c.contaminated_hits,
          "length_violations": c.length_violations, "first": c.first, "last": c.last} for c in consumers]
ui.table(pd.DataFrame(table), key="impact_consumers")

st.subheader("Affected requests of one consumer")
names = [c.value for c in affected]
if names:
    wanted = st.query_params.get(CONSUMER_PARAM)
    index = names.index(wanted) if wanted in names else 0
    if wanted is not None and wanted not in names:  # a link's consumer: said while its stand-in stays chosen
        st.session_state[MISSING_KEY] = (wanted, names[0])
    chosen = st.selectbox("Consumer", names, index=index, format_func=lambda v: v or "(none)", key="impact_consumer")
    missing = st.session_state.get(MISSING_KEY)
    if missing and missing[1] == chosen:
        st.warning(f"This link names the consumer {ui.code_span(missing[0])}, who received no wrong output in "
                   f"this selection: showing {ui.code_span(chosen or '(none)')} instead.")
    else:
        st.session_state.pop(MISSING_KEY, None)
    if st.query_params.get(CONSUMER_PARAM) != chosen:
        st.query_params[CONSUMER_PARAM] = chosen
    rows = ui.cached(hurt.affected_requests, chosen, filters=filters, limit=SHOWN_ROWS)
    total = ui.cached(hurt.affected_count, chosen, filters=filters)
    shown = f"The first {len(rows):,} of {total:,} requests" if len(rows) < total else ui.plural(total, "request")
    st.caption(f"{shown} for which {ui.md_escape(chosen or '(none)')} received another request's output or an "
               "over-long one: what a customer notice lists (the CSV holds them all).")
    store = ui.store()
    # Written when clicked, not on every run: a busy consumer's list is hundreds of thousands of rows.
    one, every = st.columns(2)
    one.download_button(f"Download {ui.md_escape(chosen)}'s affected requests (CSV)" if chosen
                        else "Download the affected requests that name no consumer (CSV)",
                        data=lambda: hurt.affected_csv(store, chosen, filters),
                        file_name="affected-requests.csv", mime="text/csv",
                        key="impact_download")
    # Every consumer's, one after the other: the notices for all of them from one file (`impact --out`).
    every.download_button("Download every consumer's affected requests (CSV)",
                          data=lambda: hurt.affected_csv(store, None, filters),
                          file_name="affected-requests-all.csv", mime="text/csv", key="impact_download_all")
    ui.request_table(rows, key="impact_rows")

st.subheader("Cross-feeding between experiment arms")
if not arms.cross_feeding:
    st.success("No arm received an output produced for another identity.")
else:
    received = sorted({c.arm for c in arms.cross_feeding}, key=lambda a: (a == "", a))
    sources = sorted({c.served_from for c in arms.cross_feeding}, key=lambda a: (a == "", a))
    hits = {(c.arm, c.served_from): c.hits for c in arms.cross_feeding}
    matrix = [[hits.get((a, s), 0) for s in sources] for a in received]
    heatmap = go.Figure(go.Heatmap(
        z=matrix, x=[s or "(none)" for s in sources], y=[a or "(none)" for a in received], colorscale="Reds",
        text=matrix, texttemplate="%{text}", hovertemplate="%{y} served %{x}'s output: %{z}<extra></extra>"))
    heatmap.update_layout(xaxis_title="served from (the arm whose output it was)", yaxis_title="requested by arm",
                          yaxis_autorange="reversed", height=120 + 60 * len(received))
    st.plotly_chart(ui.readable_layout(heatmap), key="impact_cross_feeding", config=ui.CHART_CONFIG)
    st.caption("(none): requests in no experiment arm, or a source not in the log.")

st.subheader("The comparison on clean rows")
FIGURES = (("requests", "requests"), ("mean_output_tokens", "mean output tokens"),
           ("mean_latency_ms", "mean latency (ms)"), ("acceptance_rate", "acceptance rate"))
comparison = [{"arm": a.arm or "(none)", "figure": label, "all rows": getattr(a, name).all,
               "clean rows": getattr(a, name).clean, "difference": getattr(a, name).difference}
              for a in arms.arms for name, label in FIGURES]
frame = pd.DataFrame(comparison)
if not frame.empty:
    left, right = st.columns(2)
    with left:
        ui.table(frame, key="impact_comparison", height="content")
    with right:
        latency = frame[frame.figure == "mean latency (ms)"].melt(id_vars="arm", value_vars=["all rows", "clean rows"],
                                                                   var_name="rows", value_name="mean latency (ms)")
        bars = px.bar(latency, x="arm", y="mean latency (ms)", color="rows", barmode="group",
                      color_discrete_sequence=[ui.ALARM, ui.GOOD])
        st.plotly_chart(ui.readable_layout(bars), key="impact_latency_bars", config=ui.CHART_CONFIG)
    st.caption("Clean rows: an arm's requests without its contaminated hits. Where the two differ, the arm's "
               "figures rest on other requests' outputs.")

st.subheader("Incident report")
st.caption("The postmortem drafted from this database: summary, timeline, root cause, blast radius, "
           "remediation and the mismatch report (the whole log, whatever the filters).")
if st.button("Draft the incident report", key="impact_draft_report"):
    st.session_state[REPORT_KEY] = True
if st.session_state.get(REPORT_KEY):
    url = ui.dashboard_settings().external_url
    left, right = st.columns(2)
    left.download_button("Download the report (HTML)", data=ui.cached(report.incident_report_text, ".html", url),
                         file_name="incident-report.html", mime="text/html", key="impact_report_html")
    right.download_button("Download the report (Markdown)", data=ui.cached(report.incident_report_text, ".md", url),
                          file_name="incident-report.md", mime="text/markdown", key="impact_report_md")
