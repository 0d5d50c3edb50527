"""Cache: hit rates per model combination and over time, the evidence of a hit rate too good, latency,
speculation health."""

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
                labels={"hit_rate": "hit rate", "combination": "target / draft"},
                color_discrete_sequence=[ui.GOOD])
figure.update_yaxes(tickformat=".0%")
st.plotly_chart(ui.readable_layout(ui.fit_value_axes(figure)), key="hit_rate_by_combination", config=ui.CHART_CONFIG)

st.subheader("Hit rate over time, per deployment")
# Smoothed by default: bucket by bucket, a few requests per combination make each line a comb.
smoothing = st.select_slider("Smoothing (trailing buckets)", analysis.SMOOTHING_WINDOWS, value=5,
                             key="hit_rate_smoothing", format_func=lambda n: "off" if n == 1 else f"{n} buckets")
bucket = ui.cached(analysis.time_bucket, filters=filters)
over_time = ui.cached(analysis.hit_rate_by_deployment_over_time, filters=filters, bucket=bucket,
                      smoothing=smoothing)
# A panel per deployment (at most MAX_PANELS, ui/charts.py): those with the most contaminated hits, then the busiest.
contaminated = {s.deployment: s.contaminated_hits for s in ui.cached(analysis.contamination_status, filters=filters)}
requests = over_time.groupby("deployment").requests.sum()
ranked = sorted(requests.index, key=lambda d: (-contaminated.get(d, 0), -requests[d], d))
over_time = over_time[over_time.deployment.isin(ui.shown_panels(ranked, "the most contaminated hits, then requests"))]
over_time = over_time.assign(combination=over_time.combination.map(ui.plot_label),
                             label=[ui.plot_label(ui.deployment_label(d)) for d in over_time.deployment])
deployments = over_time.deployment.nunique()
figure = px.line(over_time, x="bucket", y="smoothed_hit_rate", color="combination", facet_row="label",
                 custom_data=["deployment", "label", "combination", "requests", "hit_rate"],
                 markers=smoothing == 1 and deployments * over_time.bucket.nunique() < 400,
                 category_orders={"label": sorted(over_time.label.unique())},
                 labels={"smoothed_hit_rate": "hit rate", "bucket": f"time (UTC, {ui.bucket_words(bucket)})",
                         "label": "deployment", "combination": "target / draft"},
                 color_discrete_sequence=ui.PALETTE, height=160 + 150 * max(deployments, 1),
                 facet_row_spacing=ui.panel_spacing(deployments, 150))
figure.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
figure.update_yaxes(tickformat=".0%")
figure.update_traces(hovertemplate=f"<b>%{{customdata[1]}}</b> · %{{customdata[2]}}<br>%{{x|{ui.TIME_FORMAT_D3}}} UTC"
                                   "<br>hit rate %{y:.1%} smoothed, %{customdata[4]:.1%} in this bucket of "
                                   "%{customdata[3]:,} requests<extra></extra>")
ui.readable_layout(figure)
point = ui.time_chart(figure, "hit_rate_over_time", bucket=bucket)
ui.show_point_rows(figure, point, bucket, key="hit_rate_rows")

st.subheader("Hits on identities never served before")
st.caption("With a correct key an identity's first request misses: it can only hit an entry made for itself. "
           "A hit on an identity the deployment had never served got another identity's output (or an entry "
           "older than the log). Those hits are the evidence that the hit rate is too good.")
ratios = ui.cached(analysis.key_ratio_by_deployment, filters=filters)
labels = [ui.plot_label(ui.deployment_label(d)) for d in ratios.deployment]
repeat_hits = ratios.hits - ratios.first_sight_hits - ratios.partial_hits
bars = [
    # Two lines: in one, a phone cut the legend off at "(impossible with a correc".
    go.Bar(name="hits on an identity never served before<br>(impossible with a correct key)", y=labels,
           x=ratios.first_sight_hits, orientation="h", marker_color=ui.ALARM),
    go.Bar(name="hits on an identity served before", y=labels, x=repeat_hits, orientation="h",
           marker_color=ui.GOOD),
]
if ratios.partial_hits.any():  # LiteLLM's hits: their identity is not whole in the log, so neither can be said
    bars.append(go.Bar(name="hits whose log left identity fields unknown<br>(can't be told)", y=labels,
                       x=ratios.partial_hits, orientation="h", marker_color=ui.PALETTE[6]))
figure = go.Figure(bars)
figure.update_layout(barmode="stack", xaxis_title="cache hits", yaxis_title="deployment",
                     height=140 + 50 * max(len(ratios), 1))
# Top to bottom by name, as every other page lists deployments: plotly draws the first category lowest.
figure.update_yaxes(categoryorder="array", categoryarray=sorted(labels, reverse=True))
st.plotly_chart(ui.readable_layout(ui.fit_value_axes(figure)), key="first_sight_hits", config=ui.CHART_CONFIG)
ui.table(ratios, column_config={
    "keys_per_identity": st.column_config.NumberColumn("keys per identity", format="%.3f"),
    "max_correct_hit_rate": st.column_config.NumberColumn("ceiling for a correct key", format="percent",
                                                          help=analysis.CEILING_MEANING),
})

st.subheader("Latency of hits and misses")
latency = ui.cached(analysis.latency_hit_vs_miss, filters=filters)
if latency.empty:
    st.info("No request in this selection logged a latency.")
else:
    histogram = ui.cached(analysis.latency_histogram, filters=filters)
    figure = go.Figure([
        go.Bar(name=outcome, x=part.low_ms, y=part.requests, width=part.high_ms - part.low_ms, offset=0,
               marker_color=ui.GOOD if outcome == "hit" else ui.PALETTE[1], opacity=0.75,
               customdata=part.high_ms, hovertemplate="%{x:.3g} to %{customdata:.3g} ms: %{y:,} requests")
        for outcome, part in histogram.groupby("outcome")
    ])
    figure.update_layout(barmode="overlay", xaxis_title="latency (ms, log scale)", yaxis_title="requests")
    figure.update_xaxes(type="log", dtick=1)  # a label per power of ten: the 2s and 5s between crowded it
    st.plotly_chart(ui.readable_layout(ui.fit_value_axes(figure)), key="latency_histogram", config=ui.CHART_CONFIG)
    ui.table(latency)

st.subheader("Speculative decoding health (decoded requests)")
acceptance = ui.cached(analysis.acceptance_by_combination, filters=filters)
if acceptance.empty:
    st.info("No decoded request in this selection used a draft model and logged its draft tokens.")
else:
    acceptance = acceptance.assign(combination=[
        ui.plot_label(f"{t} / {d}") for t, d in zip(acceptance.target_model, acceptance.draft_model, strict=True)
    ])
    left, right = st.columns(2)
    figure = px.bar(acceptance, x="combination", y="acceptance_rate", color_discrete_sequence=[ui.GOOD],
                    labels={"acceptance_rate": "acceptance rate", "combination": "target / draft"})
    figure.update_yaxes(tickformat=".0%")
    left.plotly_chart(ui.readable_layout(ui.fit_value_axes(figure)), key="acceptance_rate", config=ui.CHART_CONFIG)
    figure = px.bar(acceptance, x="combination", y="mean_accepted_length", color_discrete_sequence=[ui.GOOD],
                    labels={"mean_accepted_length": "accepted tokens per step", "combination": "target / draft"})
    right.plotly_chart(ui.readable_layout(ui.fit_value_axes(figure)), key="mean_accepted_length", config=ui.CHART_CONFIG)
    ui.table(acceptance.drop(columns="combination"))
