"""Replay: one logged request decoded again with its full identity, diffed against what production returned."""

from __future__ import annotations

import pandas as pd
import streamlit as st

import ui
from specdec_core import analysis
from specdec_core.replay import run as replay

ui.page_header("Replay")
ui.require_data()
filters = ui.filters()
db = ui.store()
results = st.session_state.setdefault(ui.REPLAY_RESULTS_KEY, {})

MEANING = {
    "match": "The replay reproduces production's output.",
    "near_tie": "Production is this request's greedy output up to tokens whose top two logits were nearly tied: "
                "numerics of another environment, not the cache.",
    "sampled": "A sampled request whose replay differs: production's tokens are scored under this identity, "
               "so an output this request could hardly have sampled stands out.",
    "foreign": "Production returned the output of another request identity (the cache entry's source).",
    "diverged": "A greedy output that differs beyond numerical noise, and no source explains it.",
    "unavailable": "This request can't be replayed here (its model or tokenizer isn't available).",
    "redacted": "The log holds only the prompt's hash: give the prompt below to replay it.",
}


def choose_request() -> str:
    """A link's ?request_id= or a new selection on Mismatches fills the box; typing replaces it."""
    queued = st.session_state.get(ui.REPLAY_IDS_KEY, [])
    linked = st.query_params.get("request_id", "")
    for source, value in (("linked", linked), ("queued", queued[0] if queued else "")):
        if value and st.session_state.get(f"_replay_{source}") != value:
            st.session_state[f"_replay_{source}"] = value
            st.session_state["replay_request_id"] = value
    if queued:
        st.selectbox("Selected on the Mismatches page", queued, key="replay_pick",
                     on_change=lambda: st.session_state.update(replay_request_id=st.session_state.replay_pick))
    return st.text_input("Request id", key="replay_request_id").strip()


def show_record(record: dict) -> None:
    identity = ["ts", "deployment", "target_model", "draft_model", "num_speculative_tokens", "temperature",
                "top_p", "top_k", "max_tokens", "seed", "stop", "tokenizer_version", "cache_key", "cache_hit",
                "source_request_id", "differing_fields", "output_tokens", "finish_reason", "latency_ms",
                "draft_tokens", "accepted_tokens", "prompt_hash"]
    left, right = st.columns(2)
    with left:
        st.markdown("**Logged request**")
        st.dataframe(pd.DataFrame({"field": identity, "value": [_text(record.get(f)) for f in identity]}),
                     hide_index=True)
    with right:
        st.markdown("**Prompt**")
        if record["prompt"] is None:
            st.caption("Redacted: the log holds only the prompt's hash.")
        else:
            st.code(record["prompt"], language=None, wrap_lines=True)
        st.markdown("**Production output**")
        st.code(record["output_text"], language=None, wrap_lines=True)
    if record.get("contaminated"):
        st.warning(f"A contaminated hit: production served the output cached by request "
                   f"{ui.md_escape(record['source_request_id'])}, whose identity differs in "
                   f"{ui.md_escape(record['differing_fields'])}.")


def _text(value: object) -> str:
    return "" if value is None else str(value)


def diff_markdown(word_ops) -> str:
    """Production's words against the replay's, every word escaped: removed in red, added in green."""
    parts = []
    for w in word_ops:
        if w.op == "equal":
            parts.append(ui.md_escape(w.production))
            continue
        parts.append(_marked(w.production, ":red-background[~~{}~~]"))
        parts.append(_marked(w.replay, ":green-background[{}]"))
    return "".join(parts)


def _marked(text: str, template: str) -> str:
    # Markdown's ~~ needs the words against it: the spaces around a change go outside the mark.
    core = text.strip()
    if not core:
        return ui.md_escape(text)
    lead = " " if text[:1].isspace() else ""
    trail = " " if text[-1:].isspace() else ""
    return lead + template.format(ui.md_escape(core)) + trail


def show_result(result) -> None:
    st.metric("Classification", result.classification)
    st.caption(MEANING.get(result.classification, ""))
    if result.message:
        st.caption(ui.md_escape(result.message))
    foreign = result.classification == "foreign" and result.source_replay_text is not None
    columns = st.columns(3 if foreign else 2)
    with columns[0]:
        st.markdown("**Production**")
        st.code(_text(result.production_text), language=None, wrap_lines=True)
    with columns[1]:
        st.markdown("**Replay with the request's identity**")
        st.code(_text(result.replay_text), language=None, wrap_lines=True)
    if foreign:
        with columns[2]:
            st.markdown(f"**Replay of the source request {ui.md_escape(result.source_request_id)}**")
            st.code(_text(result.source_replay_text), language=None, wrap_lines=True)
    diff = result.diff
    if diff is not None:
        row = st.columns(5)
        row[0].metric("Common prefix (tokens)", ui.fmt_int(diff.common_prefix_tokens))
        row[1].metric("First divergent token", ui.fmt_int(diff.first_divergent_token))
        row[2].metric("Similarity", ui.fmt_pct(diff.similarity))
        row[3].metric("Tokens production / replay",
                      f"{ui.fmt_int(diff.production_tokens)} / {ui.fmt_int(diff.replay_tokens)}")
        row[4].metric("max_tokens", ui.fmt_int(diff.max_tokens))
        st.markdown("**Word diff** (production :red-background[~~removed~~], replay :green-background[added])")
        st.markdown(diff_markdown(diff.word_ops) or "_(both empty)_")
        with st.expander("Diff operations"):
            st.dataframe(pd.DataFrame([(w.op, w.production, w.replay) for w in diff.word_ops],
                                      columns=["op", "production", "replay"]), hide_index=True)
    row = st.columns(3)
    row[0].metric("Draft tokens (replay)", ui.fmt_int(result.draft_tokens))
    row[1].metric("Accepted tokens (replay)", ui.fmt_int(result.accepted_tokens))
    rate = result.accepted_tokens / result.draft_tokens if result.draft_tokens else None
    row[2].metric("Acceptance rate (replay)", ui.fmt_pct(rate))
    st.markdown("**Evidence**")
    st.json(result.evidence or {}, expanded=True)


request_id = choose_request()
if request_id:
    record = ui.cached(analysis.request_record, request_id)
    if record is None:
        st.warning(f"No request `{ui.md_escape(request_id)}` in this database.")
    else:
        show_record(record)
        st.subheader("Replay")
        prompt = None
        if record["prompt"] is None:
            prompt = st.text_area("Prompt (checked against the logged hash)", key="replay_prompt") or None
        if st.button("Replay with the full identity", type="primary"):
            with st.spinner("Loading models and decoding"):
                try:
                    results[request_id] = replay.replay(db, request_id, replay.default_decoder(), prompt=prompt)
                except Exception as exc:  # the message is the user's next step; the page stays usable
                    st.error(f"Replay of {ui.md_escape(request_id)} failed: {ui.md_escape(exc)}")
        if request_id in results:
            show_result(results[request_id])
else:
    st.info("Type a request id, select contaminated hits on the Mismatches page, or replay the most "
            "suspicious requests below.")

st.subheader("Batch replay")
queued = st.session_state.get(ui.REPLAY_IDS_KEY, [])
which = st.radio("Replay", ["the most suspicious requests", f"the {len(queued)} selected requests"],
                 index=1 if queued else 0, horizontal=True, key="batch_which")
count = st.number_input("How many suspicious requests", min_value=1, max_value=1000, value=10, step=1,
                        key="batch_count", disabled=which != "the most suspicious requests")
if st.button("Replay batch"):
    if which == "the most suspicious requests":
        ids = list(ui.cached(analysis.suspicious_requests, int(count), filters=filters).request_id)
    else:
        ids = list(queued)
    bar = st.progress(0.0, text=f"0 of {len(ids)} replayed")

    def progress(done: int, total: int, result) -> None:
        results[result.request_id] = result
        bar.progress(done / total if total else 1.0, text=f"{done} of {total} replayed")

    try:
        replay.replay_many(db, ids, replay.default_decoder(), progress=progress)
    except Exception as exc:  # the message is the user's next step; the page stays usable
        st.error(f"Batch replay stopped: {ui.md_escape(exc)}")
stored = ui.cached(replay.replays_table)
if not stored.empty:
    st.subheader("Replays stored in this database")
    st.dataframe(stored, hide_index=True)
