"""Request: one logged request, `request?request_id=ID`. For a contaminated hit, the request whose cached output
it was served beside it, the identity fields that differ highlighted, the key, both outputs, the length
check, the stored replays of either, and a Replay button: the whole case without waiting for a replay."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import ui
from specdec_core import analysis
from specdec_core.contract import fields as contract
from specdec_core.replay import jobs, stored

ui.page_header("Request")
ui.require_data()



linked = st.query_params.get("request_id", "")
if st.session_state.get("_request_linked") != linked or "request_page_id" not in st.session_state:
    st.session_state["_request_linked"] = st.session_state["request_page_id"] = linked
request_id = st.text_input("Request id", key="request_page_id").strip()
if request_id != linked:
    st.session_state["_request_linked"] = request_id
    st.query_params["request_id"] = request_id
if not request_id:
    st.info("Open a request from any table of requests (Mismatches, Output length, Search, a chart's bar), "
            "or type its id.")
    st.stop()
detail = ui.cached(analysis.request_detail, request_id)
if detail is None:
    st.warning(f"No request {ui.code_span(request_id)} in this database.")
    st.stop()
record, source = detail.record, detail.source

st.subheader(f"Request {ui.code_span(record.request_id)}")
served = "a cache hit" if record.fields.get("cache_hit") else "a miss (decoded)"
st.caption(f"{ui.fmt_ts(record.fields.get('ts'))} · deployment "
           f"{ui.code_span(ui.deployment_label(record.fields.get('deployment') or ''))} · {served}")
if detail.contaminated:
    st.error(f"A contaminated hit: production served the output cached by request "
             f"{ui.code_span(record.source_request_id)}, whose identity differs in "
             + (", ".join(ui.code_span(f) for f in detail.differing) or "its fingerprint") + ".")

# --- the identity, beside the source's -------------------------------------------------------------------------

fields = [f for f in contract.FIELD_NAMES if f not in ui.SHOWN_APART]
if source is not None:
    rows = pd.DataFrame({"field": fields,
                         "this request": [ui.value_text(record.shown(f)) for f in fields],
                         f"source {source.request_id}": [ui.value_text(source.shown(f)) for f in fields]})
    st.markdown("**This request and its source, side by side** (the identity fields that differ highlighted)")
    ui.side_by_side(rows, marked=[n for n, f in enumerate(fields) if f in detail.differing], key="request_fields")
else:
    rows = pd.DataFrame({"field": fields, "value": [ui.value_text(record.shown(f)) for f in fields]})
    st.markdown("**Logged request**")
    ui.side_by_side(rows, marked=[], key="request_fields")

st.markdown("**Cache key**")
st.code(ui.value_text(record.fields.get("cache_key")), language=None, wrap_lines=True)

st.markdown("**Length check**")
if detail.length.fits is False:
    st.error(ui.md_escape(detail.length.sentence))
elif detail.length.fits:
    st.success(ui.md_escape(detail.length.sentence))
else:
    st.info(ui.md_escape(detail.length.sentence))

# --- the prompts and outputs ------------------------------------------------------------------------------------

sides = [("This request", record)] + ([(f"Source {source.request_id}", source)] if source is not None else [])
columns = st.columns(len(sides))
for column, (title, shown) in zip(columns, sides, strict=True):
    with column:
        st.markdown(f"**{ui.md_escape(title)}: prompt**")
        if shown.prompt is None:
            st.caption("Redacted: the log holds only the prompt's hash.")
        else:
            st.code(shown.prompt, language=None, wrap_lines=True)
        st.markdown(f"**{ui.md_escape(title)}: output{' (as served)' if shown is record else ' (as produced)'}**")
        st.code(shown.output_text, language=None, wrap_lines=True)

# --- replays ---------------------------------------------------------------------------------------------------

st.subheader("Replays")
for title, shown in sides:
    history = ui.cached(stored.replay_history, request_id=shown.request_id)
    st.markdown(f"**{ui.md_escape(title)}**")
    if history.empty:
        st.caption("No replay stored for this request yet.")
        continue
    history.insert(0, "open", [ui.replay_url(r) for r in history.replay_id])
    first = ["open", "classification", "replayed_at"]
    ui.table(history[first + [c for c in history.columns if c not in first]], key=f"replays_{shown.request_id}",
             column_config={"open": st.column_config.LinkColumn("replay page", display_text="open", width="small")})

job_id = st.session_state.get(ui.REPLAY_JOB_KEY)
busy = job_id is not None and (job := jobs.job(job_id)) is not None and not job.finished
if st.button("Replay with the full identity", type="primary", disabled=busy, key="request_replay",
             help="Decodes this request again with its own identity and diffs it against production; the "
                  "Replay page shows the run and its result."):
    if record.prompt is not None:  # a redacted prompt is given on the Replay page first
        st.session_state[ui.REPLAY_JOB_KEY] = jobs.start_job(ui.store(), [record.request_id]).job_id
    st.switch_page(ui.PAGE_FILES["Replay"], query_params=ui.view_params(request_id=record.request_id))
if busy:
    st.caption("A replay is running: the Replay page shows it.")
