"""Search: every request whose prompt or output mentions a text (or matches a regular expression)."""

from __future__ import annotations

import time

import streamlit as st

import ui
from specdec_core import analysis

ui.page_header("Search")
ui.require_data()
filters = ui.filters()
LIMIT = 500

# The query lives in the address bar (?q=): Back, a reload or a pasted link shows the same search; a page
# left drops its widgets' state, so coming back the box starts from the address again.
linked = st.query_params.get("q", "")
if st.session_state.get("_search_linked") != linked or "search_text" not in st.session_state:
    st.session_state["_search_linked"] = st.session_state["search_text"] = linked
text = st.text_input("Find requests whose prompt or output contains", key="search_text",
                     placeholder="e.g. a phrase an output should never have mentioned")
if text != linked:
    st.session_state["_search_linked"] = text
    if text:
        st.query_params["q"] = text
    else:
        del st.query_params["q"]
left, middle, right = st.columns(3)
fields = left.multiselect("In", analysis.SEARCH_FIELDS, default=list(analysis.SEARCH_FIELDS), key="search_fields",
                          format_func={"prompt": "prompts", "output_text": "outputs"}.get)
mode = middle.radio("As", analysis.SEARCH_MODES, horizontal=True, key="search_mode",
                    format_func={"contains": "plain text", "regex": "regular expression"}.get)
case_sensitive = right.toggle("Match case", key="search_case")

if not text:
    st.info("Type a text to search the prompts and outputs of the requests the sidebar's filters select.")
    st.stop()
started = time.perf_counter()
try:
    found = ui.cached(analysis.search_requests, text, fields=tuple(fields), mode=mode,
                      case_sensitive=case_sensitive, filters=filters, limit=LIMIT)
except analysis.SearchError as exc:
    st.error(ui.md_escape(exc))
    st.stop()
took = time.perf_counter() - started
total = int(found.matches.iloc[0]) if len(found) else 0
if not total:
    st.warning(f"No request in this selection has {ui.code_span(text)} in its "
               f"{' or '.join('prompt' if f == 'prompt' else 'output' for f in fields)}.")
    st.stop()
more = f"; the first {LIMIT:,} are listed" if total > LIMIT else ""
st.caption(f"{ui.plural(total, 'request')} {'matches' if total == 1 else 'match'}{more} ({took:.2f} s). Each row "
           "shows where: the first match in its output (else its prompt), highlighted, with the text around it.")
# Where it matched comes right after the request and its time: in view at 1440 px without scrolling. The
# match is a cell of its own, between the text before (right-aligned, so it runs into the match) and after.
EXCERPT = ["match_before", "match_text", "match_after"]
shown = found[["request_id", "ts", "match_field", *EXCERPT, "deployment", "target_model", "cache_hit",
               "max_tokens", "output_tokens"]].copy()
for column in EXCERPT:
    shown[column] = shown[column].fillna("").str.replace(r"\s", " ", regex=True)
ui.request_table(shown, key="search_results", highlight=["match_text"], column_config={
    "request_id": st.column_config.TextColumn("request", width=100),
    "match_field": st.column_config.TextColumn("found in", width=70),
    "match_before": st.column_config.TextColumn("…before", width=230, alignment="right"),
    "match_text": st.column_config.TextColumn("match", width=110),
    "match_after": st.column_config.TextColumn("after…", width=230),
})
