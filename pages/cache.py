"""Cache: hit rates per model combination and over time, keys per identity, latency, speculation health."""

from __future__ import annotations

import plotly.express as px
import plotly.graph_objects as go
import streamlit as st

import ui
from specdec_core import analysis

ui.page_header("Cache")
ui.require_data()
filters = ui.filters()

st.subheader("Hit rate per target / draft combination")
combos = ui.cached(analysis.hit_rate_by_combination, filters=filters)
combos = combos.assign(combination=[ui.plot_label(f"{t} / {d}")
                                    for t, d in zip(combos.target_model, combos.draft_model, strict=True)])
figure = px.bar(combos, x="combination", y="hit_rate", hover_data=["requests", "hits", "contaminated_hits"],
                labels={"hit_rate": "hit rate", "combination": "target / draft"})
figure.update_yaxes(tickformat=".0%", range=[0, 1])
st.plotly_chart(figure, key="hit_rate_by_combination")

st.subheader("Hit rate over time")
over_time = ui.cached(analysis.hit_rate_over_time, filters=filters)
over_time = over_time.assign(combination=over_time.combination.map(ui.plot_label))
figure = px.line(over_time, x="bucket", y="hit_rate", color="combination", markers=True,
                 hover_data=["requests"], labels={"hit_rate": "hit rate", "bucket": "time (UTC)"})
figure.update_yaxes(tickformat=".0%", range=[0, 1.05])
st.plotly_chart(figure, key="hit_rate_over_time")

st.subheader("Unique keys per unique identity, by deployment")
st.caption("A correct key gives every identity its own entry, so each identity misses at least once: "
           "a hit rate above the ceiling means requests were served outputs made for other identities.")
ratios = ui.cached(analysis.key_ratio_by_deployment, filters=filters)
labels = [ui.plot_label(ui.deployment_label(d)) for d in ratios.deployment]
figure = go.Figure([
    go.Bar(name="observed hit rate", x=labels, y=ratios.hit_rate),
    go.Bar(name="ceiling for a correct key", x=labels, y=ratios.max_correct_hit_rate),
])
figure.update_layout(barmode="group", yaxis_tickformat=".0%", xaxis_title="deployment")
st.plotly_chart(figure, key="key_ratio_by_deployment")
st.dataframe(ratios, hide_index=True, column_config={
    "keys_per_identity": st.column_config.NumberColumn("keys per identity", format="%.3f"),
    "hit_rate": st.column_config.NumberColumn("hit rate", format="percent"),
    "max_correct_hit_rate": st.column_config.NumberColumn("ceiling for a correct key", format="percent"),
})

st.subheader("Latency of hits and misses")
latency = ui.cached(analysis.latency_hit_vs_miss, filters=filters)
if latency.empty:
    st.info("No request in this selection logged a latency.")
else:
    st.dataframe(latency, hide_index=True)

st.subheader("Speculative decoding health (decoded requests)")
acceptance = ui.cached(analysis.acceptance_by_combination, filters=filters)
if acceptance.empty:
    st.info("No decoded request in this selection used a draft model and logged its draft tokens.")
else:
    acceptance = acceptance.assign(combination=[
        ui.plot_label(f"{t} / {d}") for t, d in zip(acceptance.target_model, acceptance.draft_model, strict=True)
    ])
    left, right = st.columns(2)
    figure = px.bar(acceptance, x="combination", y="acceptance_rate",
                    labels={"acceptance_rate": "acceptance rate", "combination": "target / draft"})
    figure.update_yaxes(tickformat=".0%", range=[0, 1])
    left.plotly_chart(figure, key="acceptance_rate")
    figure = px.bar(acceptance, x="combination", y="mean_accepted_length",
                    labels={"mean_accepted_length": "accepted tokens per step", "combination": "target / draft"})
    right.plotly_chart(figure, key="mean_accepted_length")
    st.dataframe(acceptance.drop(columns="combination"), hide_index=True)
