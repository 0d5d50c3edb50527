"""Issue #17 through AppTest: charts that tell the truth, annotations, search, export, small fixes."""

from __future__ import annotations

import json
import re

import plotly.graph_objects as go
import pytest
from apptest import ROOT, figure, markdown_unescape, metrics_of, open_app, stand_in_replay_module, texts
from dashboard_data import build_db
from helpers import rec

from specdec_core import analysis
from specdec_core.analysis import impact
from specdec_core.ingestion import ingest
from specdec_core.replay import jobs
from specdec_core.store.connection import Store


def test_hit_rate_too_good_shows_first_sight_hits_as_the_chart(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "cache")
    spec = figure(at, "first_sight_hits")
    bars = {t["name"].split("<br>")[0]: dict(zip(t["y"], t["x"], strict=True)) for t in spec["data"]}
    # prod: r3 and r4 hit identities prod had never served; r2 hit r1's own identity.
    assert bars["hits on an identity never served before"] == {"prod": 2, "staging": 0}
    assert bars["hits on an identity served before"] == {"prod": 1, "staging": 0}
    assert spec["data"][0]["marker"]["color"] == "#D62728"


def test_output_length_draws_the_limit_as_a_line_and_violations_as_points(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "output_length")
    traces = {t["name"]: t for t in figure(at, "output_length_by_max_tokens")["data"]}
    assert set(traces) == {"output tokens", "max_tokens (the limit)", "requests over their limit"}
    assert traces["output tokens"]["marker"]["color"] != "#D62728", "no box turns red"
    assert traces["max_tokens (the limit)"]["mode"] == "lines"
    assert [y for y in traces["max_tokens (the limit)"]["y"] if y is not None] == [2, 2, 16, 16, 64, 64]
    points = traces["requests over their limit"]
    assert points["y"] == [3] and points["customdata"] == [["r4"]]
    assert round(points["x"][0]) == 0, "r4's point sits on its own max_tokens (2), the first box"


@pytest.fixture(scope="module")
def litellm_db(tmp_path_factory):
    """LiteLLM's payloads (tests/fixtures/formats): every hit logs no sampling parameters and no max_tokens."""
    db = tmp_path_factory.mktemp("litellm") / "litellm.duckdb"
    ingest(Store(db), [str(ROOT / "tests" / "fixtures" / "formats" / "litellm_payloads.jsonl")], log_format="litellm")
    return db


def test_output_length_keeps_hits_of_unknown_max_tokens_in_a_box_of_their_own(monkeypatch, litellm_db):
    """LiteLLM logs no max_tokens on a hit: those hits are one box, "unknown", without a limit line; before, the
    summaries' histogram put them in the box of the largest max_tokens."""
    db = litellm_db
    at = open_app(monkeypatch, db, "output_length")
    spec = figure(at, "output_length_by_max_tokens")
    ticks = spec["layout"]["xaxis"]["ticktext"]
    assert ticks[-1] == "unknown" and "unknown" not in ticks[:-1]
    boxes = {t["name"]: t for t in spec["data"]}["output tokens"]
    by_tick = dict(zip(ticks, boxes["median"], strict=True))
    with Store(db).read() as con:
        (unknown_median,) = con.execute("SELECT median(output_tokens) FROM requests WHERE max_tokens IS NULL").fetchone()
    assert by_tick["unknown"] == unknown_median
    limits = {t["name"]: t for t in spec["data"]}["max_tokens (the limit)"]["y"]
    assert limits[-3:] == [None, None, None] and any(y is not None for y in limits)
    assert list(at.dataframe[0].value.max_tokens)[-1] == "unknown"


def test_hits_whose_first_sight_cant_be_told_are_a_bar_of_their_own(monkeypatch, litellm_db):
    """LiteLLM's hits log no sampling parameters: they were drawn as hits on an identity served before."""
    db = litellm_db
    bars = {t["name"].split("<br>")[0]: dict(zip(t["y"], t["x"], strict=True))
            for t in figure(open_app(monkeypatch, db, "cache"), "first_sight_hits")["data"]}
    hits = dict(zip(*analysis.key_ratio_by_deployment(Store(db))[["deployment", "hits"]].T.values, strict=True))
    assert bars["hits whose log left identity fields unknown"] == hits and sum(hits.values()) == 17
    assert set(bars["hits on an identity served before"].values()) == {0}


def test_the_identities_behind_a_key_say_unknown_where_the_log_did_not_say(monkeypatch, litellm_db):
    """A hit that differs from its key's miss in a field both know is another identity; its temperature and
    max_tokens were not logged, and read "unknown", never compared (an empty cell read as a value not sent)."""
    at = open_app(monkeypatch, litellm_db, "keys")
    collisions, identities = (d.value for d in at.dataframe[:2])
    assert len(identities) == collisions.identities.iloc[0] == 4
    assert sorted(identities.temperature.astype(str)) == ["0", "unknown", "unknown", "unknown"]
    assert "temperature" not in identities.columns[:3] and "unknown_fields" not in identities.columns
    assert any("differ between them" in t and "`draft_model`" in t and "temperature" not in t for t in texts(at, "markdown"))


def test_a_hits_page_says_which_fields_its_log_left_unknown(monkeypatch, litellm_db):
    """Beside its source, a LiteLLM hit's temperature and max_tokens read "unknown", not empty (a value not sent),
    and its length check says why it can't be made."""
    with Store(litellm_db).read() as con:
        hit, source = con.execute("SELECT request_id, source_request_id FROM hit_sources WHERE contaminated "
                                  "ORDER BY request_id LIMIT 1").fetchone()
    at = open_app(monkeypatch, litellm_db, "request", request_id=hit)
    table = at.dataframe[0].value.set_index("field")
    assert table.loc["temperature", "this request"] == table.loc["max_tokens", "this request"] == "unknown"
    assert table.loc["max_tokens", f"source {source}"] not in ("", "unknown")
    assert table.loc["draft_model", "this request"] != "unknown"
    assert any("leaves this request's max_tokens unknown" in markdown_unescape(i.value) for i in at.info)


def test_hit_rate_over_time_is_split_by_deployment_and_smoothed(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "cache")
    spec = figure(at, "hit_rate_over_time")
    panels = sorted(a["text"] for a in spec["layout"]["annotations"] if a["text"] in ("prod", "staging"))
    assert panels == ["prod", "staging"], "one panel per deployment"
    assert all(t.get("line", {}).get("color") != "#D62728" for t in spec["data"])
    at.select_slider(key="hit_rate_smoothing").set_value(3).run()
    frame = analysis.hit_rate_by_deployment_over_time(Store(incident_db), bucket="1 minute", smoothing=3)
    prod = frame[frame.deployment == "prod"].smoothed_hit_rate.round(3).tolist()
    assert prod == [0.0, 0.5, 0.667, 1.0]
    with pytest.raises(ValueError):
        analysis.hit_rate_by_deployment_over_time(Store(incident_db), smoothing=4)


def test_hit_rate_over_time_shows_twelve_panels_the_contaminated_deployments_first(monkeypatch, tmp_path):
    # Fourteen deployments: d13 the quietest but contaminated (a hit on another max_tokens' entry), d00 the
    # busiest; all fourteen panels would be a chart taller than two screens.
    records = [rec(f"r{d}-{i}", ts=f"2026-03-01T10:{i:02d}:00Z", deployment=f"d{d:02d}", cache_key=f"k{d}-{i}")
               for d in range(13) for i in range(2 + (13 - d))]
    records += [rec("m13", deployment="d13", cache_key="K", max_tokens=64),
                rec("h13", ts="2026-03-01T10:05:00Z", deployment="d13", cache_key="K", cache_hit=True, max_tokens=8)]
    at = open_app(monkeypatch, build_db(tmp_path, records), "cache")
    panels = [a["text"] for a in figure(at, "hit_rate_over_time")["layout"]["annotations"]
              if re.fullmatch(r"d\d\d", a["text"])]
    assert sorted(panels) == [*(f"d{d:02d}" for d in range(11)), "d13"], "the contaminated one, then the busiest"
    assert any("12 deployments with the most contaminated hits, then requests, of 14" in c for c in texts(at, "caption"))


def test_the_contamination_timeline_shows_twelve_panels_the_most_contaminated_first(monkeypatch, tmp_path):
    # Fourteen contaminated deployments, d13 the most (14 hits), d00 the least (1): the table lists all of
    # them, the chart the twelve with the most.
    records = []
    for d in range(14):
        records.append(rec(f"m{d}", deployment=f"d{d:02d}", cache_key=f"K{d}", max_tokens=64))
        records += [rec(f"h{d}-{i}", ts=f"2026-03-01T10:{i + 1:02d}:00Z", deployment=f"d{d:02d}", cache_key=f"K{d}",
                        cache_hit=True, max_tokens=8) for i in range(d + 1)]
    at = open_app(monkeypatch, build_db(tmp_path, records))
    panels = [a["text"] for a in figure(at, "contamination_timeline")["layout"]["annotations"]
              if re.fullmatch(r"d\d\d", a["text"])]
    assert sorted(panels) == [f"d{d:02d}" for d in range(2, 14)], "the twelve most contaminated"
    assert any("12 deployments with the most contaminated hits, of 14" in c for c in texts(at, "caption"))
    [table] = [d.value for d in at.dataframe if len(d.value) == 14]  # the window's table: every deployment
    assert sorted(table.iloc[:, 0]) == [f"d{d:02d}" for d in range(14)]


def test_annotations_from_the_sidebar_and_detected_contamination_mark_every_time_chart(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    at.sidebar.text_area(key="annotations_text").set_value(
        "2026-03-01T10:01:30Z, prod, deploy v2\n2026-03-01T10:04:00Z, , key fix\nnot a line").run()
    assert any("line 3" in markdown_unescape(c) for c in texts(at, "caption"))
    labels = lambda key: sorted(a["text"] for a in figure(at, key)["layout"]["annotations"]  # noqa: E731
                                if "hit" in a["text"] or a["text"] in ("deploy v2", "key fix"))
    assert labels("contamination_timeline") == ["deploy v2", "key fix", "prod: first contaminated hit",
                                                "prod: last contaminated hit"]
    for page, key in (("cache", "hit_rate_over_time"), ("mismatches", "mismatch_rate_over_time")):
        at.switch_page(f"pages/{page}.py").run()
        assert "deploy v2" in labels(key) and "prod: first contaminated hit" in labels(key), page
    # Hit rate over time has a panel per deployment: prod's marks sit on prod's panel alone, a mark for every
    # deployment on each panel.
    at.switch_page("pages/cache.py").run()
    spec = figure(at, "hit_rate_over_time")
    layout = spec["layout"]
    go.Figure(spec)  # the marks are set unchecked (ui/charts.py): the figure as sent passes plotly's checks
    panel_of = {a["text"]: a["y"] for a in layout["annotations"] if a["text"] in ("prod", "staging")}

    def panel(annotation: dict) -> str:
        axis = layout["yaxis" + annotation["yref"].split()[0][1:]]
        return next(name for name, y in panel_of.items() if axis["domain"][0] <= y <= axis["domain"][1])

    marks = [(a["text"], panel(a)) for a in layout["annotations"] if a["text"] in
             ("deploy v2", "key fix", "prod: first contaminated hit", "prod: last contaminated hit")]
    assert sorted(marks) == [("deploy v2", "prod"), ("key fix", "prod"), ("key fix", "staging"),
                             ("prod: first contaminated hit", "prod"), ("prod: last contaminated hit", "prod")]


def test_parse_annotations_reads_lines_json_and_says_what_it_skipped():
    found, errors = analysis.parse_annotations('[{"ts": "2026-03-01T10:00:00Z", "label": "fix"}, {"ts": "x"}]')
    assert [(a.label, a.deployment) for a in found] == [("fix", None)] and len(errors) == 1
    found, errors = analysis.parse_annotations("ts,deployment,label\n1772359200000, edge, deploy, v2\n")
    assert [(a.ts.isoformat(), a.deployment, a.label) for a in found] == [
        ("2026-03-01T10:00:00+00:00", "edge", "deploy,v2")] and errors == []
    # A time as the tool shows it, or as RFC 3339 allows it: read as every time selection reads it.
    found, errors = analysis.parse_annotations("2026-03-01 10:00:00 UTC, , fix\n2026-03-01t10:00:00z, , fix\n"
                                               "2026-03-01 10:00:00+02:00 UTC, , fix\n")
    assert [a.ts.isoformat() for a in found] == ["2026-03-01T10:00:00+00:00"] * 2
    assert [e.split(":")[0] for e in errors] == ["line 3"]
    # Epoch milliseconds are ASCII digits: "١٧٧٢٣٥٩٢٠٠٠٠٠" (int() reads other scripts' digits) is no time.
    found, errors = analysis.parse_annotations("\u0661\u0667\u0667\u0662\u0663\u0665\u0669\u0662\u0660\u0660"
                                               "\u0660\u0660\u0660, , fix\n")
    assert found == [] and [e.split(":")[0] for e in errors] == ["line 1"]


def test_overview_and_keys_have_their_charts(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    spec = figure(at, "contamination_timeline")
    assert sum(sum(t["y"]) for t in spec["data"]) == 2
    at.switch_page("pages/keys.py").run()
    bars = figure(at, "identities_per_key")["data"][0]
    assert bars["x"] == [3]
    assert any("max_tokens" in markdown_unescape(m) and "draft_model" in markdown_unescape(m)
               for m in texts(at, "markdown") if m.startswith("Identity fields that differ"))
    assert "Summarise the incident." in texts(at, "code")


def test_latency_of_hits_and_misses_is_a_histogram(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "cache")
    traces = {t["name"]: t for t in figure(at, "latency_histogram")["data"]}
    assert sum(traces["hit"]["y"]) == 3 and figure(at, "latency_histogram")["layout"]["xaxis"]["type"] == "log"


def test_mismatch_chart_has_no_legend_for_a_clean_deployment_and_no_red(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "mismatches")
    spec = figure(at, "mismatch_rate_over_time")
    assert [t["name"] for t in spec["data"]] == ["prod"], "staging had no contaminated hit"
    assert spec["data"][0]["marker"]["color"] != "#D62728"


def test_search_finds_requests_by_output_text(monkeypatch, tmp_path):
    db = build_db(tmp_path, [rec("a", output_text="the invoice total is 42"), rec("b", cache_key="k-2"),
                             rec("c", cache_key="k-3", prompt="What is 100% of_it?")])
    at = open_app(monkeypatch, db, "search")
    at.text_input(key="search_text").set_value("INVOICE").run()
    [results] = [d.value for d in at.dataframe]
    assert list(results.request_id) == ["a"] and results.open[0] == "request?request_id=a"
    at.text_input(key="search_text").set_value("100% of_").run()
    assert list(at.dataframe[0].value.request_id) == ["c"], "% and _ are literal"
    at.text_input(key="search_text").set_value("inv(").run()
    at.radio(key="search_mode").set_value("regex").run()
    assert any("not a valid regular expression" in markdown_unescape(e) for e in texts(at, "error"))
    at.text_input(key="search_text").set_value("nothing like this").run()
    at.radio(key="search_mode").set_value("contains").run()
    assert any("No request" in w for w in texts(at, "warning"))


def test_export_replays_follow_the_filters_and_file_names_record_them(monkeypatch, incident_db, download):
    at = open_app(monkeypatch, incident_db, "export")
    at.sidebar.multiselect(key="f_deployments").set_value(["staging"]).run()
    assert at.get("download_button")[0].proto.file_name if hasattr(at.get("download_button")[0].proto,
                                                                     "file_name") else True
    at.sidebar.multiselect(key="f_deployments").set_value(["prod"]).run()
    [report] = at.get("download_button")
    assert download(report).decode().count("\n") == 4
    from specdec_core.replay.run import ReplayResult, _save

    _save(Store(incident_db), [ReplayResult("r3", "foreign", "m"), ReplayResult("s1", "match", "m")])
    at.run()
    names = [b.label for b in at.get("download_button")]
    assert names == ["Download mismatch report (CSV)", "Download replays (CSV)"]
    replays = download(at.get("download_button")[1]).decode().splitlines()
    assert len(replays) == 2 and ",r3," in replays[1], "only prod's replay"


def test_filter_slug_names_the_selection():
    from datetime import datetime, timezone

    import ui

    assert ui.filter_slug(analysis.NO_FILTERS) == "all"
    chosen = analysis.Filters(start=datetime(2026, 3, 1, 10, 2, tzinfo=timezone.utc), deployments=("prod",))
    assert ui.filter_slug(chosen) == "20260301T1002-end_prod"
    assert "/" not in ui.filter_slug(analysis.Filters(deployments=("../etc/x",)))


def test_ids_in_messages_show_without_backslashes_and_a_backtick_keeps_its_code_span(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "replay")
    at.text_input(key="replay_request_id").set_value("req-999999").run()
    assert texts(at, "warning") == ["No request `req-999999` in this database."]
    at.text_input(key="replay_request_id").set_value("a`b").run()
    assert texts(at, "warning") == ["No request ``a`b`` in this database."]
    at.switch_page("pages/export.py").run()
    assert any(f"--db {incident_db} --out" in c for c in texts(at, "caption")), "a path shows as it is"


def test_page_links_look_like_links_and_progress_is_not_red(monkeypatch, incident_db):
    import tomllib

    at = open_app(monkeypatch, incident_db)
    assert all(e.proto.icon for e in at.get("page_link"))
    theme = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())["theme"]
    assert theme["primaryColor"].lower() not in ("#ff4b4b", "#d62728") and theme["linkUnderline"] is True


def test_an_empty_upload_says_the_file_was_empty(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "uploaded.duckdb")
    [uploader] = [u for u in at.sidebar.get("file_uploader") if u.key == "uploads"]
    uploader.set_value(("empty.jsonl", b"", "application/octet-stream"))
    at.run()
    [b for b in at.sidebar.button if b.label == "Load uploads"][0].click().run()
    assert any("empty.jsonl" in w and "empty (0 bytes)" in w for w in texts(at, "warning"))
    assert not metrics_of(at.sidebar), "no zeros shown as if a file had been read"


def test_the_load_box_offers_the_log_formats(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "x.duckdb")
    assert at.sidebar.selectbox(key="load_format").options == [
        "auto (decided per file)", "the log contract", "OpenTelemetry GenAI spans",
        "OpenInference spans (Arize Phoenix)", "LiteLLM payloads", "Langfuse observations"]
    [uploads] = [u for u in at.sidebar.get("file_uploader") if u.key == "uploads"]
    assert set(uploads.proto.type) >= {".jsonl", ".ndjson", ".json", ".gz", ".csv", ".parquet"}


def test_a_phoenix_export_uploaded_as_openinference_is_loaded(monkeypatch, tmp_path):
    """Every format `specdec ingest --format` reads is offered, and an upload of it loads as the CLI loads it."""
    at = open_app(monkeypatch, tmp_path / "uploaded.duckdb")
    at.sidebar.selectbox(key="load_format").set_value("openinference").run()
    [uploader] = [u for u in at.sidebar.get("file_uploader") if u.key == "uploads"]
    fixture = ROOT / "tests" / "fixtures" / "formats" / "phoenix_spans.json"
    uploader.set_value(("phoenix_spans.json", fixture.read_bytes(), "application/json"))
    at.run()
    [b for b in at.sidebar.button if b.label == "Load uploads"][0].click().run()
    cli = Store(tmp_path / "cli.duckdb")
    expected = ingest(cli, [str(fixture)], log_format="openinference")
    assert expected.accepted > 0
    assert analysis.headline(Store(tmp_path / "uploaded.duckdb")).requests == expected.accepted


def test_live_shows_the_newest_request_and_its_lag(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    at.sidebar.toggle(key="live").set_value(True).run()
    [live] = [c for c in texts(at, "caption") if c.startswith("Live")]
    assert "2026-03-01 10:06:00 UTC" in live and "lag" in live
    fresh = analysis.freshness(Store(incident_db))
    assert fresh.requests == 6 and fresh.lag_seconds > 0


def test_a_stand_in_batch_job_can_be_cancelled_between_requests(monkeypatch, incident_db):
    calls = stand_in_replay_module(monkeypatch)
    job = jobs.start_job(Store(incident_db), ["r3", "r4"])  # the stand-in's decoder
    job.cancel()
    job.wait(10)
    assert job.finished and job.done <= 2 and len(calls) == job.done
    assert re.match(r"(cancelled|finished)", job.stage)


def test_an_upload_whose_every_record_is_quarantined_is_an_error_naming_the_file(monkeypatch, tmp_path):
    at = open_app(monkeypatch, tmp_path / "uploaded.duckdb")
    broken = [{"request_id": "b1", "ts": "2026-03-01T10:00:00Z"}, {"request_id": "b2", "ts": "not a time"}]
    [uploader] = [u for u in at.sidebar.get("file_uploader") if u.key == "uploads"]
    uploader.set_value(("broken.jsonl", "\n".join(json.dumps(r) for r in broken).encode(), "application/json"))
    at.run()
    [b for b in at.sidebar.button if b.label == "Load uploads"][0].click().run()
    assert any(e.startswith("Nothing loaded: all 2 records") for e in texts(at, "error"))
    assert not [p for p in at.sidebar.get("progress") if "Loaded" in str(p.proto)]
    quarantined = [d.value for d in at.sidebar.dataframe][0]
    assert set(quarantined.source_file) == {"broken.jsonl"}
    assert all(len(reason) > 10 for reason in quarantined.reason)


def test_hit_rate_over_time_is_smoothed_by_default_and_axes_say_buckets_in_words(monkeypatch, incident_db):
    import ui

    at = open_app(monkeypatch, incident_db, "cache")
    assert at.select_slider(key="hit_rate_smoothing").value == 5
    spec = figure(at, "hit_rate_over_time")
    assert all("markers" not in t.get("mode", "lines") for t in spec["data"]), "smoothed lines, no combs of dots"
    assert spec["layout"]["xaxis"]["title"]["text"] == "time (UTC, 1-minute buckets)"
    assert (ui.bucket_words("5 minutes"), ui.bucket_words("1 hour")) == ("5-minute buckets", "1-hour buckets")
    assert (ui.plural(1, "contaminated hit"), ui.plural(2, "contaminated hit")) == (
        "1 contaminated hit", "2 contaminated hits")


def test_a_store_whose_every_record_was_quarantined_says_so_not_that_nothing_was_loaded(monkeypatch, tmp_path):
    db = tmp_path / "refused.duckdb"
    log = tmp_path / "refused.jsonl"
    log.write_text('{"request_id": "b1", "ts": "2026-03-01T10:00:00Z"}\n{"request_id": "b2", "ts": "soon"}\nnot json\n')
    assert ingest(Store(db), [str(log)]).quarantined == 3
    at = open_app(monkeypatch, db)
    [said] = [w for w in texts(at, "warning") if w.startswith("All 3 records loaded into")]
    assert "were quarantined: there is no request to show" in said and "`bad JSON` (1)" in said
    assert any(i.startswith("No requests in") for i in texts(at, "info")), "the way to load logs stays"
    empty = open_app(monkeypatch, tmp_path / "new.duckdb")
    assert not [w for w in texts(empty, "warning") if w.startswith("All ")]


def test_the_export_preview_and_a_consumers_requests_say_unknown_where_the_log_did_not_say(monkeypatch, litellm_db):
    """The mismatch report's preview and the Impact page's affected requests: a LiteLLM hit's temperature and
    max_tokens read "unknown" (Streamlit drew the empty cell as "None", a value not sent); the CSVs leave them
    empty, as before, and hold no column the contract doesn't list."""
    store = Store(litellm_db)
    with store.read() as con:
        unknown = {r for (r,) in con.execute("SELECT request_id FROM requests WHERE list_contains(unknown_fields, "
                                             "'max_tokens')").fetchall()}
    preview = open_app(monkeypatch, litellm_db, "export").dataframe[0].value
    hits = preview[preview.request_id.isin(unknown)]
    assert len(hits) and set(hits.max_tokens) == set(hits.temperature) == {"unknown"}
    assert "unknown" not in set(preview[~preview.request_id.isin(unknown)].max_tokens)
    assert "unknown_fields" not in preview.columns
    csv = analysis.report_csv(analysis.mismatch_report(store)).decode()
    assert "unknown" not in csv and "unknown_fields" not in csv.splitlines()[0]
    at = open_app(monkeypatch, litellm_db, "impact")
    [rows] = [d.value for d in at.dataframe if "output_preview" in d.value.columns]
    assert set(rows[rows.request_id.isin(unknown)].max_tokens) == {"unknown"}
    assert "unknown" not in set(rows[~rows.request_id.isin(unknown)].max_tokens)
    assert "unknown_fields" not in rows.columns
    assert b"unknown_fields" not in impact.affected_csv(store, at.selectbox(key="impact_consumer").value)


def test_the_mismatches_table_says_unknown_where_the_log_did_not_say(monkeypatch, litellm_db):
    """The contaminated hits' table (an editor, for the replay ticks): a LiteLLM hit's sampling parameters and
    max_tokens read "unknown", not NaN or None, and the column of text is not configured as numbers (the
    browser would draw "unknown" empty)."""
    at = open_app(monkeypatch, litellm_db, "mismatches")
    [table] = [d for d in at.dataframe if "replay" in d.value.columns]
    frame = table.value
    assert len(frame) == 8
    assert "type_config" not in json.loads(table.proto.columns)["temperature"], "text, not a number column"
    assert set(frame.temperature) == set(frame.max_tokens) == {"unknown"}
    assert "unknown_fields" not in frame.columns
    assert set(frame.draft_model) != {"unknown"}


def test_a_log_that_names_no_consumer_is_not_one_consumer_of_one(monkeypatch, litellm_db):
    """LiteLLM's fixture names no consumer: the Impact page said "Consumers affected: 1 of 1" above "This log
    names no consumer", and the incident report "1 of 1 consumers received wrong outputs; 0 experiment arms",
    counting the unnamed as a consumer but not as an arm. Named ones are counted; the unnamed requests apart."""
    from specdec_core.remediation import report as incident

    at = open_app(monkeypatch, litellm_db, "impact")
    assert metrics_of(at.main)["Consumers affected"] == "none named"
    assert [b.proto.label for b in at.get("download_button")] == [
        "Download the affected requests that name no consumer (CSV)",
        "Download every consumer's affected requests (CSV)"], "not \"unnamed's\", beside the table's (none)"
    drafted = incident.incident_report(Store(litellm_db))
    [said] = [line for line in incident.summary_lines(drafted) if "consumer" in line]
    assert said.startswith("The log names no consumer: requests naming none received 8 contaminated hits and ")
    assert said.endswith("; 0 named experiment arms received contaminated hits.")
    assert '<b class="bad">none named</b>consumers affected' in incident.render_html(drafted), "wrong outputs went out"
