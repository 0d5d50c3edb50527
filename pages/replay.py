"""Replay: one logged request decoded again with its full identity, diffed against what production returned.

Every replay is stored and has its own page, `replay?replay_id=...`; a batch lists its replays, each
linked; the replay history lists them all.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

import ui
from specdec_core import analysis
from specdec_core.contract import fields as contract
from specdec_core.replay import jobs, stored

ui.page_header("Replay")
ui.require_data()
filters = ui.filters()
db = ui.store()

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


def show_record(record: analysis.RequestRecord) -> None:
    logged = [(f, record.shown(f)) for f in contract.FIELD_NAMES if f not in ui.SHOWN_APART]
    logged += [("source_request_id", record.source_request_id), ("differing_fields", record.differing_fields)]
    left, right = st.columns(2)
    with left:
        st.markdown("**Logged request**")
        st.dataframe(pd.DataFrame({"field": [f for f, _ in logged], "value": [ui.value_text(v) for _, v in logged]}),
                     hide_index=True)
    with right:
        st.markdown("**Prompt**")
        if record.prompt is None:
            st.caption("Redacted: the log holds only the prompt's hash.")
        else:
            st.code(record.prompt, language=None, wrap_lines=True)
        st.markdown("**Production output**")
        st.code(record.output_text, language=None, wrap_lines=True)
    if record.contaminated:
        st.warning(f"A contaminated hit: production served the output cached by request "
                   f"{ui.code_span(record.source_request_id)}, whose identity differs in "
                   f"{ui.md_escape(record.differing_fields)}.")


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


def show_replay(view: stored.StoredReplay, *, key: str, served_from: str | None = None) -> None:
    """One replay: production, the replay and (foreign) the source's replay side by side; the diff against
    the replay that proves the cause; the evidence in words and numbers. `served_from`: the request whose
    cached output production served, where the store found the hit contaminated."""
    served = view.served_source(served_from)
    st.metric("Classification", "contaminated (sampled)" if served else view.classification)
    st.caption(MEANING.get(view.classification, ""))
    if served:
        st.warning(ui.md_escape(served))
    if view.message:
        st.markdown(f"**Why:** {ui.md_escape(view.message)}")
    foreign = view.classification == "foreign" and view.source_replay_text is not None
    columns = st.columns(3 if foreign else 2)
    with columns[0]:
        st.markdown("**Production**")
        st.code(ui.value_text(view.production_text), language=None, wrap_lines=True)
    with columns[1]:
        st.markdown("**Replay with the request's identity**")
        if view.replay_text is None:
            st.caption("Not replayed: the reason is above.")
        else:
            st.code(ui.value_text(view.replay_text), language=None, wrap_lines=True)
    if foreign:
        with columns[2]:
            st.markdown(f"**Replay of the source request {ui.code_span(view.source_request_id)}**")
            st.code(ui.value_text(view.source_replay_text), language=None, wrap_lines=True)
    row = st.columns(4)
    row[0].metric("Common prefix (tokens)", ui.fmt_int(view.common_prefix_tokens))
    row[1].metric("First divergent token", ui.fmt_int(view.first_divergent_token))
    row[2].metric("Similarity to this request's replay", ui.fmt_pct(view.similarity),
                  help="Production's words against the replay with this request's own identity")
    rate = analysis.acceptance_rate(view.accepted_tokens, view.draft_tokens)
    row[3].metric("Acceptance rate (replay)", ui.fmt_pct(rate))
    against, _ = view.proof
    proof = view.proof_diff()
    if proof is not None:
        ops, similarity = proof
        st.markdown(f"**Word diff: production against {ui.md_escape(against)}** ({similarity:.0%} of words alike; "
                    "production :red-background[~~removed~~], the replay :green-background[added])")
        st.markdown(diff_markdown(ops) or "_(both empty)_")
        with st.expander("Diff operations"):
            st.dataframe(pd.DataFrame([(w.op, w.production, w.replay) for w in ops],
                                      columns=["op", "production", "replay"]), hide_index=True, key=f"ops_{key}")
    st.markdown("**Evidence**")
    lines = stored.evidence_lines(view.evidence)
    if lines:
        st.dataframe(pd.DataFrame(lines, columns=["what", "value"]), hide_index=True, key=f"evidence_{key}")
    with st.expander("Environment of the replay"):
        st.dataframe(pd.DataFrame(stored.evidence_lines(view.environment), columns=["what", "value"]),
                     hide_index=True, key=f"environment_{key}")


def replay_link(replay_id: str, label: str = "Open this replay's page (a permanent link)") -> None:
    st.page_link(ui.PAGE_FILES["Replay"], label=label, icon=":material/link:",
                 query_params=ui.view_params(replay_id=replay_id))


# --- one stored replay, by its permanent address -------------------------------------------------------------

def _shown_live(replay_id: str) -> bool:
    """Whether the replay in the address bar is one this session's last run made (the page wrote it there):
    the page then stays the live one, its results and forms, so a request typed next or a batch started is
    not lost under the stored view. A reload or a copied link is a new session and gets the stored view."""
    job_id = st.session_state.get(ui.REPLAY_JOB_KEY)
    job = jobs.job(job_id) if job_id else None
    return job is not None and any(r.replay_id == replay_id for r in job.results)


replay_id = st.query_params.get("replay_id", "")
if replay_id and not _shown_live(replay_id):
    view = ui.cached(stored.stored_replay, replay_id)
    if view is None:
        st.warning(f"No replay {ui.code_span(replay_id)} in this database.")
    else:
        st.subheader(f"Replay of request {ui.code_span(view.request_id)}")
        st.caption(f"Replayed {ui.fmt_ts(view.replayed_at)} · replay id {ui.code_span(view.replay_id)}")
        record = ui.cached(analysis.request_record, view.request_id)
        if record is not None:
            with st.expander("The logged request", expanded=False):
                show_record(record)
        show_replay(view, key="stored", served_from=record.source_request_id if record and record.contaminated
                    else None)
        st.page_link(ui.PAGE_FILES["Replay"], label="Replay this request again", icon=":material/replay:",
                     query_params=ui.view_params(request_id=view.request_id))
    st.stop()


# --- a running replay: stages, progress, cancel --------------------------------------------------------------

def current_job() -> jobs.ReplayJob | None:
    job_id = st.session_state.get(ui.REPLAY_JOB_KEY)
    return jobs.job(job_id) if job_id else None


def start(ids: list[str], prompt: str | None = None) -> None:
    st.session_state[ui.REPLAY_JOB_KEY] = jobs.start_job(db, ids, prompt=prompt).job_id


SHOWN_RUNNING = "_replay_shown_running"  # the job the page last drew as running (buttons disabled)


@st.fragment(run_every=1)
def job_progress() -> None:
    """The running job's stage, redrawn every second; when it ends, the whole page is drawn again once."""
    job = current_job()
    if job is None:
        return
    if job.finished:
        # A rerun of this fragment alone leaves the rest of the page as the job found it (buttons disabled,
        # no results): draw it all again, once.
        if st.session_state.pop(SHOWN_RUNNING, None) == job.job_id:
            st.rerun(scope="app")
        return
    st.session_state[SHOWN_RUNNING] = job.job_id
    st.progress(job.done / job.total if job.total else 0.0,
                text=ui.md_escape(f"{job.done} of {job.total} replayed · {job.describe()}"))
    if st.button("Cancel", key="cancel_replay", icon=":material/cancel:"):
        job.cancel()


def running() -> bool:
    job = current_job()
    return job is not None and not job.finished


queued_start = st.session_state.pop(ui.REPLAY_START_KEY, None)
if queued_start and not running():
    start(queued_start)


def choose_request() -> str:
    """A link's ?request_id= fills the box; typing replaces it. Requests ticked on Mismatches are the batch's,
    not this box's: shown here too, they were a second form with a second primary button for the same run."""
    linked = st.query_params.get("request_id", "")
    if linked and st.session_state.get("_replay_linked") != linked:
        st.session_state["_replay_linked"] = linked
        st.session_state["replay_request_id"] = linked
    return st.text_input("Request id", key="replay_request_id").strip()


def show_outcome(job: jobs.ReplayJob) -> None:
    """A finished job: cancelled or failed requests, then one replay in full or a batch's table."""
    if job.cancelled:
        st.warning(f"Cancelled: {len(job.results)} of {job.total} replayed before; those are stored.")
    for failed, why in job.errors.items():
        st.error(f"Replay of {ui.code_span(failed)} failed: {ui.md_escape(why)}")
    for failure in job.engine_failures:
        st.error(ui.md_escape(failure.summary()))
    if job.total == 1 and job.results:
        result = job.results[0]
        # The address bar holds the replay's permanent link: a reload or a copied URL opens this replay.
        if st.query_params.get("replay_id") != result.replay_id:
            st.query_params["replay_id"] = result.replay_id
        replay_link(result.replay_id)
        served = ui.cached(analysis.request_record, result.request_id)
        show_replay(stored.as_stored(result), key="fresh",
                    served_from=served.source_request_id if served and served.contaminated else None)
    elif job.results:
        st.markdown(f"**Batch: {len(job.results)} of {job.total} replayed**")
        batch = pd.DataFrame({
            "open": [ui.replay_url(r.replay_id) for r in job.results],
            "request_id": [r.request_id for r in job.results],
            "request_page": [ui.request_url(r.request_id) for r in job.results],
            "classification": [r.classification for r in job.results],
            "similarity": [r.diff.similarity if r.diff else None for r in job.results],
            "source_request_id": [r.source_request_id for r in job.results],
            "message": [r.message for r in job.results],
        })
        ui.table(batch, key="batch_table", column_config={
            "open": st.column_config.LinkColumn("replay page", display_text="open", width="small"),
            "request_page": ui.request_link_column()})
        if st.toggle("Show each row's diff", key="batch_diffs"):
            for n, result in enumerate(job.results):
                with st.expander(f"{ui.md_escape(result.request_id)}: {result.classification}"):
                    replay_link(result.replay_id)
                    show_replay(stored.as_stored(result), key=f"batch_{n}")


def covers(job: jobs.ReplayJob | None, request_id: str) -> bool:
    return job is not None and request_id in job.request_ids


def batch_section() -> None:
    st.subheader("Batch replay")
    queued = st.session_state.get(ui.REPLAY_IDS_KEY, [])
    suspicious = "the most suspicious requests"
    if queued:
        choices = [suspicious, f"the {len(queued)} selected requests"]
        which = st.radio("Replay", choices, index=1, horizontal=True, key="batch_which")
    else:  # one choice is no choice: the radio comes with the ticks on Mismatches
        which = suspicious
        st.caption("Replays the most suspicious requests: contaminated hits first, then length violations. Tick "
                   "rows on Mismatches to replay those instead.")
    # Read by the button only: a count typed and the button clicked at once was a rerun racing the click (the
    # blur commits the count), and the click could be lost, as CI saw under load. Committed, it waits for it.
    count = st.number_input("How many suspicious requests", min_value=1, max_value=1000, value=10, step=1,
                            key="batch_count", disabled=which != suspicious, on_change="ignore")
    if st.button("Replay batch", disabled=running(), key="replay_batch"):
        if which == suspicious:
            ids = list(ui.cached(analysis.suspicious_requests, int(count), filters=filters).request_id)
        else:
            ids = list(queued)
        if ids:
            start(ids)
            st.rerun()
        else:
            st.info("Nothing to replay: no contaminated hit or length violation in this selection.")


def request_section(job: jobs.ReplayJob | None) -> None:
    st.subheader("Replay a request")
    request_id = choose_request()
    if not request_id:
        st.info("Type a request id, tick contaminated hits on the Mismatches page, or replay the most "
                "suspicious requests.")
        return
    record = ui.cached(analysis.request_record, request_id)
    if record is None:
        st.warning(f"No request {ui.code_span(request_id)} in this database.")
        return
    prompt = None
    if record.prompt is None:
        # Read by the button only, as the batch count (a commit's rerun races the click).
        prompt = st.text_area("Prompt (checked against the logged hash)", key="replay_prompt",
                              on_change="ignore") or None
    # The button before the logged request, whose table runs past a laptop's screen; for the request the run
    # above is about, it is no second primary button.
    label, kind = ("Replay again", "secondary") if covers(job, request_id) else \
        ("Replay with the full identity", "primary")
    if st.button(label, type=kind, disabled=running(), key="replay_one"):
        start([request_id], prompt)
        st.rerun()
    show_record(record)


preload = st.session_state.get(ui.PRELOAD_KEY)
if preload is not None and not preload.finished:
    st.caption(f"Models are loading in the background ({ui.md_escape(preload.stage)}): the first replay starts "
               "as soon as they are in.")
# One place for what is running, one for what it found, then what can be started: a run started here, from
# Mismatches or from a request's page shows once, whichever form started it.
job = current_job()
if running():
    st.subheader("Running")
    job_progress()
elif job is not None:
    st.subheader("Results")
    show_outcome(job)
request_section(job)
batch_section()


def show_history() -> None:
    history = ui.cached(stored.replay_history, filters=filters)
    if history.empty:
        st.caption("No replay stored for the requests of this selection yet. Replays run here or with "
                   "`specdec replay` are stored and listed here, each with its own page.")
        return
    history.insert(0, "open", [ui.replay_url(r) for r in history.replay_id])
    history.insert(1, "request_page", [ui.request_url(r) for r in history.request_id])
    # The verdict and the request first: on a phone they are all that fits beside the link.
    first = ["open", "classification", "request_id", "request_page"]
    history = history[first + [c for c in history.columns if c not in first]]
    ui.table(history, key="replay_history", column_config={
        "open": st.column_config.LinkColumn("replay page", display_text="open", width="small"),
        "request_page": ui.request_link_column()})


@st.fragment(run_every=1)
def history_while_running() -> None:
    """While a run stores its replays one by one, the history follows (the page itself is drawn again once,
    when the run ends): it said "no replay stored" after 2 of 3 were."""
    show_history()


st.subheader("Replay history")
if running():
    history_while_running()
else:
    show_history()
