"""Overview: is the cache mixing identities, where and since when, and which of the six symptoms show."""

from __future__ import annotations

import plotly.express as px
import streamlit as st

import ui
from specdec_core import analysis

ui.page_header("Overview")
ui.require_data()
filters = ui.filters()
head = ui.cached(analysis.headline, filters=filters)

STATE_MARK = {"contaminated": ":red[**contaminated now**]", "clean": ":green[**clean**]", "no_data": ":gray[**no data**]"}
STRIP_COLUMNS = 4
STRIP_MOST = 12  # a strip, not a table: the rest are named in a line below it

# Each deployment at a glance, then the red flags: both before the first number or chart.
states = ui.cached(analysis.deployment_states, filters=filters)
for first in range(0, min(len(states), STRIP_MOST), STRIP_COLUMNS):
    cells = st.columns(STRIP_COLUMNS)
    for cell, state in zip(cells, states[first:first + STRIP_COLUMNS], strict=False):
        # One line each: on a phone the strip stacks, and boxes would push the flags a screen down.
        cell.markdown(f"**{ui.md_escape(ui.deployment_label(state.deployment))}** {STATE_MARK[state.state]} "
                      f":gray[{ui.md_escape(state.sentence)}]")
if len(states) > STRIP_MOST:
    rest = states[STRIP_MOST:]
    st.caption(f"and {ui.plural(len(rest), 'more deployment')}: "
               f"{ui.plural(sum(s.state == 'contaminated' for s in rest), 'contaminated now', 'contaminated now')}.")

st.subheader("Red flags")
STATUS = {True: ":red[**Yes**]", False: ":green[**No**]", None: ":gray[**Unknown**]"}
# The page that shows each red flag's evidence.
FLAG_PAGES = {"identical_outputs": "Mismatches", "replay_disagrees": "Replay", "biased_experiments": "Mismatches",
              "impossible_lengths": "Output length", "hit_rate_too_good": "Cache", "few_keys": "Keys"}
FLAG_COLUMNS = 3
flag_list = ui.cached(analysis.red_flags, filters=filters, head=head)
for first in range(0, len(flag_list), FLAG_COLUMNS):
    cells = st.columns(FLAG_COLUMNS)
    for cell, flag in zip(cells, flag_list[first:first + FLAG_COLUMNS], strict=False):
        with cell.container(border=True):
            st.markdown(f"{STATUS[flag.flagged]} · **{ui.md_escape(flag.title)}**")
            st.caption(ui.md_escape(flag.evidence))
            if flag.id == "hit_rate_too_good" and flag.numbers.get("above_ceiling"):
                st.caption(analysis.CEILING_MEANING)  # only where the ceiling is the reason
            ui.page_link(FLAG_PAGES[flag.id], icon=":material/arrow_forward:")

st.subheader("Numbers")
# Four narrow metrics a row, each value a short number: at 1024 px wide none is cut.
row = st.columns(4)
row[0].metric("Requests", ui.fmt_int(head.requests))
row[1].metric("Hit rate", ui.fmt_pct(head.hit_rate), help=f"{ui.fmt_int(head.hits)} cache hits")
row[2].metric("Contaminated hits", ui.fmt_int(head.contaminated_hits),
              help="Hits that served an output produced for a different request identity")
row[3].metric("Contaminated share of hits", ui.fmt_pct(head.contaminated_rate))
row = st.columns(4)
row[0].metric("Length violations", ui.fmt_int(head.length_violations),
              help="Requests whose output_tokens exceed their max_tokens")
row[1].metric("Key collisions", ui.fmt_int(head.key_collisions),
              help="Cache keys shared by more than one request identity")
row[2].metric("Unique keys", ui.fmt_int(head.unique_keys),
              help=f"for {ui.fmt_int(head.unique_identities)} unique identities: fewer keys than identities "
                   "means identities share cache entries")
row[3].metric("Unique identities", ui.fmt_int(head.unique_identities))
st.metric("Quarantined records", ui.fmt_int(head.quarantined),
          help="Log records that broke the contract; listed under 'Load logs' in the sidebar")

gaps = ui.cached(analysis.logging_gaps, filters=filters)
if gaps:
    st.subheader("Logging gaps")
    st.warning("\n".join(f"- {ui.md_escape(gap.sentence)}" for gap in gaps))

st.subheader("Contamination window")
st.markdown("\n\n".join(ui.md_escape(fix.sentence) for fix in ui.cached(analysis.fix_status, filters=filters)))
window = ui.cached(analysis.contamination_window, filters=filters)
if window.empty:
    st.success("No contaminated hits: every cache hit in this selection served an output produced for "
               "its own request identity.")
else:
    # A line per deployment, the first STRIP_MOST of each kind: a log that names its pods as deployments holds
    # hundreds (500 were 500 lines above the first chart); the table under the chart lists every one.
    statuses = ui.cached(analysis.contamination_status, filters=filters)
    for status in statuses[:STRIP_MOST]:
        st.markdown(f"**{ui.md_escape(ui.deployment_label(status.deployment))}**: {ui.md_escape(status.sentence)}")
    if len(statuses) > STRIP_MOST:
        st.caption(f"and {ui.plural(len(statuses) - STRIP_MOST, 'more contaminated deployment')}, each in the "
                   "contamination window's table below the chart.")
    changes = ui.cached(analysis.key_scheme_changes, filters=filters)
    for change in changes[:STRIP_MOST]:
        st.markdown(f":green[**Key scheme changed**] {ui.md_escape(change.sentence)}")
    if len(changes) > STRIP_MOST:
        st.caption(f"and {ui.plural(len(changes) - STRIP_MOST, 'more deployment')} whose key scheme changed: the "
                   "sidebar's deployment filter shows any other's, and `specdec stats --json` lists every one.")
    bucket = ui.cached(analysis.time_bucket, filters=filters)
    over_time = ui.cached(analysis.mismatch_rate_over_time, filters=filters, bucket=bucket)
    # A panel per contaminated deployment (at most MAX_PANELS, ui/charts.py: 34 at 20M rows drew 4,200 px in
    # 0.5 s), the most contaminated first; the table under it lists them all.
    ranked = window.sort_values(["contaminated_hits", "deployment"], ascending=[False, True]).deployment.tolist()
    shown = ui.shown_panels(ranked, "the most contaminated hits")
    over_time = over_time[over_time.deployment.isin(shown)]
    over_time = over_time.assign(label=[ui.plot_label(ui.deployment_label(d)) for d in over_time.deployment])
    figure = px.bar(over_time, x="bucket", y="contaminated_hits", facet_row="label",
                    custom_data=["deployment", "label", "hits"], color_discrete_sequence=[ui.ALARM],
                    category_orders={"label": sorted(over_time.label.unique())},
                    labels={"bucket": f"time (UTC, {ui.bucket_words(bucket)})", "contaminated_hits": "contaminated",
                            "label": "deployment"},
                    height=140 + 120 * len(shown), facet_row_spacing=ui.panel_spacing(len(shown), 120))
    figure.for_each_annotation(lambda a: a.update(text=a.text.split("=", 1)[-1]))
    figure.update_traces(hovertemplate=f"<b>%{{customdata[1]}}</b><br>%{{x|{ui.TIME_FORMAT_D3}}} UTC<br>"
                                       "%{y:,} contaminated of %{customdata[2]:,} hits<extra></extra>")
    ui.readable_layout(figure)
    point = ui.time_chart(figure, "contamination_timeline", bucket=bucket)
    ui.show_point_rows(figure, point, bucket, contaminated_only=True, key="contamination_rows")
    ui.table(window.sort_values(["first_contaminated", "deployment"]), key="contamination_window")
    ui.page_link("Mismatches", "See every contaminated hit", icon=":material/arrow_forward:")
