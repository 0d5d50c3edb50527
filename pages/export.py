"""Export: the evidence as CSV, filtered as on screen, in the same format as `specdec report`."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import ui
from specdec_core.analysis import report
from specdec_core.config import ConfigError
from specdec_core.replay import stored

ui.page_header("Export")
ui.require_data()
filters = ui.filters()
slug = ui.filter_slug(filters)
PREVIEW_ROWS = 1000

st.subheader("Mismatch report")
st.caption("One row per flagged request and kind, with the sidebar's filters applied: the same CSV as "
           f"{ui.code_span(f'specdec report --db {ui.store().path} --out report.csv')} writes for an unfiltered "
           "database. The file's name records the filters.")
kinds = st.multiselect("Kinds", report.KINDS, default=list(report.KINDS), key="export_kinds")
counts = ui.cached(report.report_counts, filters=filters, kinds=tuple(kinds))
total = sum(counts.values())
row = st.columns(len(report.KINDS))
for column, kind in zip(row, report.KINDS, strict=True):
    column.metric(kind, ui.fmt_int(counts.get(kind, 0)) if kind in kinds else "–")
# The CSV is built on click: at a million requests it is hundreds of thousands of rows.
store = ui.store()
try:  # read as `specdec report` reads it: both write the same links
    external_url = report.configured_external_url()
except ConfigError as exc:
    st.error(f"{ui.md_escape(exc)}: the report's replay links can't be written.")
    st.stop()
st.download_button("Download mismatch report (CSV)",
                   data=lambda: report.report_csv(report.mismatch_report(store, filters, kinds,
                                                                         external_url=external_url)),
                   file_name=f"specdec-mismatch-report_{slug}.csv", mime="text/csv", type="primary",
                   on_click="ignore", disabled=total == 0, key="download_report")
if total == 0:
    st.success("Nothing to report for these kinds in this selection.")
else:
    preview = ui.cached(report.mismatch_report, filters=filters, kinds=tuple(kinds), limit=PREVIEW_ROWS,
                        external_url=external_url, unknown=True)
    shown = "" if total <= PREVIEW_ROWS else f" (the first {PREVIEW_ROWS:,} shown; the CSV has all)"
    st.caption(f"{ui.plural(total, 'row')}{shown}.")
    # The CSV writes times as ISO text; on screen they read as every other table's.
    times = [c for c in ("ts", "source_ts") if c in preview.columns]
    # A field the log left unknown reads "unknown" (ui.table; the CSV leaves it empty, as for a value never logged).
    ui.table(preview.assign(**{c: pd.to_datetime(preview[c], utc=True, format="ISO8601") for c in times}))

st.subheader("Replays")
replays = ui.cached(stored.replays_for_export, filters=filters)
if replays.empty:
    st.info("No replay stored for the requests of this selection: replays run from the Replay page or "
            "`specdec replay --db FILE --request-id ID`.")
else:
    st.caption(f"{ui.plural(len(replays), 'replay')} of the requests the sidebar's filters select.")
    st.download_button("Download replays (CSV)", data=report.report_csv(replays),
                       file_name=f"specdec-replays_{slug}.csv", mime="text/csv", on_click="ignore",
                       key="download_replays")
    replays = replays.copy()
    replays.insert(0, "open", [ui.replay_url(r) for r in replays.replay_id])
    replays.insert(1, "request_page", [ui.request_url(r) for r in replays.request_id])
    ui.table(replays, column_config={
        "open": st.column_config.LinkColumn("replay page", display_text="open", width="small"),
        "request_page": ui.request_link_column()})
