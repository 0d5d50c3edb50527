"""Issue #55 through AppTest: chart ranges that fit their data, the request page, red flags first, inert log
text (issue #51, item 10)."""

from __future__ import annotations

import json
import logging
import re
from collections import defaultdict
from datetime import datetime, timezone

import pytest
from apptest import _plain, markdown_unescape, metrics_of, open_app, stand_in_replay_module, texts, walk
from dashboard_data import HOSTILE_DEPLOYMENTS, build_db, incident_records
from helpers import rec, write_jsonl

from specdec_core import analysis
from specdec_core.ingestion.load import ingest
from specdec_core.replay import jobs
from specdec_core.replay.stored import StoredReplay
from specdec_core.store.connection import Store
from ui.format import WORD_JOINER, md_escape


def figures(at) -> dict[str, dict]:
    return {chart.key: _plain(json.loads(chart.proto.spec)) for chart in at.get("plotly_chart")}


def value_extent(spec: dict) -> dict[str, tuple[float, float]]:
    """Each value axis ('yaxis2', 'xaxis') -> the lowest and highest value drawn on it, stacked bars summed."""
    stacked = spec["layout"].get("barmode") in ("stack", "relative")
    sums: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for n, trace in enumerate(spec["data"]):
        if trace.get("type", "scatter") not in ("bar", "scatter"):
            continue
        horizontal = trace.get("orientation") == "h"
        values, places = (trace.get("x"), trace.get("y")) if horizontal else (trace.get("y"), trace.get("x"))
        axis = ("xaxis" + trace.get("xaxis", "x")[1:]) if horizontal else ("yaxis" + trace.get("yaxis", "y")[1:])
        for i, value in enumerate(values or []):
            if value is not None:
                key = places[i] if stacked and trace["type"] == "bar" else (n, i)
                sums[axis][key] += value
    return {axis: (min(0.0, *slots.values()), max(slots.values())) for axis, slots in sums.items() if slots}


@pytest.mark.parametrize("page", [None, "cache", "mismatches"])
def test_every_chart_range_fits_its_data(monkeypatch, incident_db, page):
    at = open_app(monkeypatch, incident_db, page)
    charts = figures(at)
    assert charts, "the page draws charts"
    for key, spec in charts.items():
        for axis, (low, high) in value_extent(spec).items():
            layout = spec["layout"].get(axis, {})
            assert "range" in layout and layout.get("autorange") is False, (key, axis)
            bottom, top = layout["range"]
            # The data inside the range, and the range no more than a quarter above the tallest value (a
            # little room where every value is 0).
            assert bottom <= low and high <= top <= high * 1.25 + (0.1 if high == 0 else 1e-9), \
                (key, axis, layout["range"], high)
            assert (bottom, top) != (-1, 4)


# --- the request page ---------------------------------------------------------------------------------------


def highlighted_rows(table) -> set[int]:
    styles = table.proto.arrow_data.styler.styles
    # One rule, `#T_..._row3_col0, ... { background-color: #fde2c4 }`, lists every highlighted cell.
    return {int(row) for row in re.findall(r"row(\d+)_col0\b", styles)} if "#fde2c4" in styles else set()


def test_a_contaminated_hit_shows_its_source_side_by_side_with_the_differences_highlighted(monkeypatch,
                                                                                             incident_db):
    at = open_app(monkeypatch, incident_db, "request", request_id="r4")
    assert [h.value for h in at.title] == ["Request"]
    [fields, *_] = at.dataframe
    table = fields.value
    assert list(table.columns) == ["field", "this request", "source r1"]
    marked = {table.field[n] for n in highlighted_rows(fields)}
    assert marked == {"draft_model", "max_tokens"}
    row = dict(zip(table.field, zip(table["this request"], table["source r1"], strict=True), strict=True))
    assert row["max_tokens"] == ("2", "64") and row["cache_key"][0] == row["cache_key"][1]
    [error] = [e.value for e in at.error if "contaminated hit" in e.value]
    assert "r1" in error and "draft_model" in error
    # The key, both prompts and both outputs, and the length check that fails.
    codes = texts(at, "code")
    assert codes[0] == row["cache_key"][0] and len(codes) == 5
    assert any("more than its max_tokens of 2" in markdown_unescape(e.value) for e in at.error)
    assert [m for m in texts(at, "markdown") if "Source r1" in markdown_unescape(m)]
    assert sum("No replay stored for this request yet." in c for c in texts(at, "caption")) == 2


def test_a_clean_request_shows_its_record_and_a_passing_length_check(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "request", request_id="r1")
    [fields, *_] = at.dataframe
    assert list(fields.value.columns) == ["field", "value"] and not highlighted_rows(fields)
    assert not [e for e in at.error if "contaminated" in e.value]
    assert [s.value for s in at.success if "within max_tokens" in markdown_unescape(s.value)]


def test_an_unknown_request_says_so(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "request", request_id="nope")
    assert any("No request" in w.value and "nope" in w.value for w in at.warning)


def test_replay_on_the_request_page_starts_the_replay_and_opens_the_replay_page(monkeypatch, incident_db):
    calls = stand_in_replay_module(monkeypatch)
    at = open_app(monkeypatch, incident_db, "request", request_id="r3")
    at.button(key="request_replay").click().run()
    assert [h.value for h in at.title] == ["Replay"]
    assert at.text_input(key="replay_request_id").value == "r3"
    jobs.wait_all(30)
    assert [c[:2] for c in calls] == [("replay", "r3")]


@pytest.mark.parametrize("page", ["mismatches", "output_length"])
def test_every_table_of_requests_links_each_row_to_its_page(monkeypatch, incident_db, page):
    at = open_app(monkeypatch, incident_db, page)
    linked = [t.value for t in at.dataframe if "open" in t.value.columns and "request_id" in t.value.columns]
    assert linked, page
    for table in linked:
        assert list(table.open) == [f"request?request_id={r}" for r in table.request_id]


# --- the Overview: each deployment and the red flags first; quick ranges --------------------------------------


def test_the_status_strip_and_the_red_flags_come_before_every_number_and_chart(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    order = [(e.type, getattr(e, "value", None)) for e in walk(at.main) if e.type in
             ("markdown", "subheader", "metric", "plotly_chart")]
    kinds = [kind for kind, _ in order]
    flags = order.index(("subheader", "Red flags"))
    assert flags < kinds.index("metric") and flags < kinds.index("plotly_chart")
    strip = [markdown_unescape(value) for kind, value in order[:flags] if kind == "markdown"]
    assert strip == ["**prod** :red[**contaminated now**] :gray[since 2026-03-01 10:02:00 UTC]",
                     "**staging** :green[**clean**] :gray[since 2026-03-01 10:05:00 UTC]"]


def test_a_log_naming_its_pods_as_deployments_gets_a_dozen_status_lines_and_the_count_of_the_rest(
        monkeypatch, tmp_path):
    """500 contaminated deployments (a log that names pods) were 500 lines above the first chart."""
    pods = [f"edge-pod-{n:02d}" for n in range(15)]
    records = [r for n, pod in enumerate(pods) for r in (
        rec(f"m{n}", cache_key=f"k{n}", deployment=pod, ts=f"2026-03-01T10:{n:02d}:00Z", max_tokens=32),
        rec(f"h{n}", cache_key=f"k{n}", deployment=pod, ts=f"2026-03-01T10:{n:02d}:30Z", max_tokens=8,
            cache_hit=True))]
    at = open_app(monkeypatch, build_db(tmp_path, records))
    lines = [text for m in at.main.markdown if (text := markdown_unescape(m.value)).startswith("**edge-pod-")]
    # The strip's twelve, then the status lines' twelve, the first contaminated first.
    assert [line.split("**")[1] for line in lines] == pods[:12] * 2
    assert "and 3 more contaminated deployments, each in the contamination window's table below the chart." in [
        c.value for c in at.main.caption]
    [window] = [t.value for t in at.main.dataframe if "first_contaminated" in t.value.columns]
    assert sorted(window.deployment) == pods


def test_a_quick_range_sets_the_time_filter_to_the_last_part_of_the_log(monkeypatch, tmp_path):
    hours = [rec(f"q{n}", ts=f"2026-03-01T{10 + n // 4:02d}:{(n % 4) * 15:02d}:00Z", cache_key=f"k{n}")
             for n in range(16)]
    at = open_app(monkeypatch, build_db(tmp_path, hours))
    at.sidebar.get("button_group")[0].set_value("1h").run()
    assert at.session_state["f_time"][0] == datetime(2026, 3, 1, 12, 45, tzinfo=timezone.utc)
    assert at.query_params["start"] in ("2026-03-01T12:45:00.000Z", ["2026-03-01T12:45:00.000Z"])
    assert "end" not in at.query_params
    assert {m.label: m.value for m in at.main.metric}["Requests"] == "5"
    at.sidebar.get("button_group")[0].set_value("all").run()
    assert "start" not in at.query_params and {m.label: m.value for m in at.main.metric}["Requests"] == "16"


def test_a_link_to_a_range_opens_the_same_requests_when_the_log_has_fractions_of_seconds(monkeypatch, tmp_path):
    """The last hour ends at the newest request's instant, milliseconds and all: the link keeps them, so a
    request a fraction of a second before the hour stays out of the linked view as it is out of this one."""
    times = ["10:00:00.250", "12:45:00.500", "12:45:01.000", "13:00:00.125", "13:45:00.750"]
    db = build_db(tmp_path, [rec(f"f{n}", ts=f"2026-03-01T{t}Z", cache_key=f"k{n}") for n, t in enumerate(times)])
    at = open_app(monkeypatch, db)
    at.sidebar.get("button_group")[0].set_value("1h").run()
    assert at.query_params["start"] in ("2026-03-01T12:45:00.750Z", ["2026-03-01T12:45:00.750Z"])
    assert metrics_of(at.main)["Requests"] == "3"
    start = at.query_params["start"]
    linked = open_app(monkeypatch, db, start=start if isinstance(start, str) else start[0])
    assert linked.session_state["f_time"][0] == at.session_state["f_time"][0]
    assert metrics_of(linked.main)["Requests"] == "3"
    # An end on a whole second keeps its `.000` in the link: without a fraction an end is through that second,
    # and the linked view would count the request an eighth of a second after it.
    at.sidebar.slider(key="f_time").set_value((datetime(2026, 3, 1, 10, 0, 0, 250_000, tzinfo=timezone.utc),
                                               datetime(2026, 3, 1, 13, tzinfo=timezone.utc))).run()
    assert metrics_of(at.main)["Requests"] == "3"
    end = at.query_params["end"]
    assert end in ("2026-03-01T13:00:00.000Z", ["2026-03-01T13:00:00.000Z"])
    linked = open_app(monkeypatch, db, end=end if isinstance(end, str) else end[0])
    assert metrics_of(linked.main)["Requests"] == "3"


# --- log text is inert (issue #51, item 10) ------------------------------------------------------------------



def test_md_escape_leaves_no_autolink_or_shortcode_for_markdown_to_find():
    for text in HOSTILE_DEPLOYMENTS:
        shown = md_escape(text)
        unescaped = re.sub(r"\\(.)", r"\1", shown)
        assert unescaped.replace(WORD_JOINER, "") == text
        for pattern in (r"https?://", r"www\.", r"[\w.+-]+@[\w-]+\.", r":[\w/+-]+:"):
            assert not re.search(pattern, unescaped), (text, pattern)
    assert md_escape("10:02:00") == "10\\:02\\:00", "times keep their colons bare"


def test_a_page_run_logs_no_deprecation(monkeypatch, incident_db, caplog):
    with caplog.at_level(logging.WARNING, logger="streamlit"):
        open_app(monkeypatch, incident_db, "mismatches")
    assert not [r.getMessage() for r in caplog.records if "deprecat" in r.name or "replace" in r.getMessage()]


def mid_log_records() -> list[dict]:
    """20 identities asked three times a minute apart: the first 20 requests miss, the rest hit their own."""
    return [rec(f"m{n}", ts=f"2026-03-01T10:{n:02d}:00Z", cache_key=f"k{n % 20}", cache_hit=n >= 20,
                prompt=f"p{n % 20}") for n in range(60)]


def test_a_hit_rate_flag_that_is_no_says_the_numbers_that_make_it_no(tmp_path):
    # A range that starts mid-log: the ceiling is not judged, and the never-served hits are few.
    store = Store(build_db(tmp_path, mid_log_records()))
    later = analysis.Filters(start=datetime(2026, 3, 1, 10, 30, tzinfo=timezone.utc))
    [flag] = [f for f in analysis.red_flags(store, later) if f.id == "hit_rate_too_good"]
    assert flag.flagged is False and flag.numbers["above_ceiling"] == 0
    assert flag.evidence.startswith("prod: 0 of 30 hits (0%) on identities never served before, within the 5%")
    assert "The ceiling is not judged over a time range that starts after the log does" in flag.evidence
    assert "could reach" not in flag.evidence


def ceiling_captions(at) -> list[str]:
    return [c for c in texts(at, "caption") if c.startswith("The ceiling is")]


def test_the_ceiling_is_explained_only_where_it_is_the_reason(monkeypatch, incident_db, tmp_path):
    # The incident's prod: 3 hits in 4 requests against a ceiling of 1 repeat in 4.
    assert len(ceiling_captions(open_app(monkeypatch, incident_db))) == 1
    at = open_app(monkeypatch, build_db(tmp_path, mid_log_records()), start="2026-03-01T10:30:00Z")
    assert ceiling_captions(at) == []


# --- a mostly quarantined load -------------------------------------------------------------------------------


def test_a_mostly_quarantined_load_is_said_on_every_page_and_can_go_into_a_new_database(monkeypatch, tmp_path):
    db = build_db(tmp_path, incident_records())
    # Four of five records reuse request ids already loaded, with other outputs: quarantined as conflicts.
    clashing = [{**r, "output_text": "Another output."} for r in incident_records()[:4]]
    log = write_jsonl(tmp_path / "again.jsonl", [*clashing, rec("n1", ts="2026-03-01T10:09:00Z", cache_key="k-n")])
    at = open_app(monkeypatch, db)
    assert not [w for w in at.warning if "mostly refused" in w.value]
    at.sidebar.text_input(key="load_path").set_value(str(log)).run()
    [b for b in at.sidebar.button if b.label == "Load path"][0].click().run()
    for page in (None, "cache", "mismatches"):
        if page:
            at.switch_page(f"pages/{page}.py").run()
        [warning] = [markdown_unescape(w.value) for w in at.warning if "mostly refused" in w.value]
        assert "4 of 5 records were quarantined" in warning and "1 was added" in warning
        assert "- 4 records: `conflict`, for example conflict: request_id r1 was loaded before" in warning

    at.switch_page("pages/overview.py").run()
    at.sidebar.toggle(key="load_new_db").set_value(True).run()
    fresh = tmp_path / "alone.duckdb"
    at.sidebar.text_input(key="load_new_db_path").set_value(str(fresh)).run()
    [b for b in at.sidebar.button if b.label == "Load path"][0].click().run()
    at.run()
    assert at.sidebar.text_input(key="db_path").value == str(fresh)
    assert {m.label: m.value for m in at.main.metric}["Requests"] == "5"
    assert not [w for w in at.warning if "mostly refused" in w.value]
    # The database it came from is as it was: 6 incident requests and the one the first load added.
    assert analysis.headline(Store(db)).requests == 7


def test_the_identities_behind_a_key_link_each_to_its_first_request(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "keys")
    [identities] = [t.value for t in at.dataframe if "first_request_id" in t.value.columns]
    # prod's key k-1: r1 and r2 share an identity, r3 and r4 each have their own.
    assert sorted(identities.first_request_id) == ["r1", "r3", "r4"]
    assert list(identities.open) == [f"request?request_id={r}" for r in identities.first_request_id]


def test_the_empty_store_message_shows_its_path_as_it_is(monkeypatch, tmp_path):
    missing = tmp_path / "new.duckdb"
    [info] = texts(open_app(monkeypatch, missing), "info")
    assert f"No requests in `{missing}` yet" in info and "\\/" not in info


def test_the_latency_axis_labels_only_powers_of_ten(monkeypatch, incident_db):
    axis = figures(open_app(monkeypatch, incident_db, "cache"))["latency_histogram"]["layout"]["xaxis"]
    assert axis["type"] == "log" and axis["dtick"] == 1


# --- a foreign verdict's diff is the one that explains it ----------------------------------------------------


def stored_foreign(source_text: str) -> StoredReplay:
    return StoredReplay("r" * 32, "h1", datetime(2026, 3, 1, tzinfo=timezone.utc), "foreign", "why",
                        "the cat sat", "a dog ran", "m1", source_text, 0.0, 0, 0, 3, None, None)


def test_an_exact_foreign_is_diffed_against_the_request_s_own_replay_and_says_so():
    label, text = stored_foreign("the cat sat").proof
    assert text == "a dog ran" and "production equals the replay of the source request m1 exactly" in label
    ops, similarity = stored_foreign("the cat sat").proof_diff()
    assert similarity < 1 and {op.op for op in ops} != {"equal"}


def test_a_near_tie_foreign_is_diffed_against_the_source_s_replay():
    label, text = stored_foreign("the cat sat down").proof
    assert text == "the cat sat down" and label == "the replay of the source request m1"


@pytest.mark.parametrize(("page", "key"), [(None, "contamination_timeline"), ("mismatches", "mismatch_rate_over_time"),
                                           ("cache", "hit_rate_over_time")])
def test_time_charts_hover_in_words_and_order_deployments_by_name(monkeypatch, incident_db, page, key):
    spec = figures(open_app(monkeypatch, incident_db, page))[key]
    for trace in spec["data"]:
        template = trace["hovertemplate"]
        assert "=%{" not in template and template.endswith("<extra></extra>") and " UTC" in template
    names = [a["text"] for a in spec["layout"].get("annotations", []) if a.get("textangle") == 90]
    # plotly lists the panels' labels bottom-up: by name from the top down.
    assert names == sorted(names, reverse=True)


# --- labels that leave the data visible, a toolbar that leaves the legend visible --------------------------------


def test_the_same_mark_of_two_deployments_is_one_label_without_a_box(monkeypatch, tmp_path):
    # prod and edge both contaminated from 10:02 to 10:03: one label for each bound, naming both deployments.
    twice = incident_records()[:4] + [{**r, "request_id": "e" + r["request_id"], "deployment": "edge"}
                                      for r in incident_records()[:4]]
    at = open_app(monkeypatch, build_db(tmp_path, twice, "twice"), "mismatches")
    [chart] = at.get("plotly_chart")
    spec = _plain(json.loads(chart.proto.spec))
    labels = [a for a in spec["layout"]["annotations"] if a.get("yref", "").endswith("domain")]
    assert sorted(a["text"] for a in labels) == ["edge, prod: first contaminated hit",
                                                 "edge, prod: last contaminated hit"]
    assert all("bgcolor" not in a and a["font"]["shadow"] == "auto" for a in labels), "no box over the bars"
    # Room above the tallest stack for the first row of labels, within the range the chart test allows.
    [low, top] = spec["layout"]["yaxis"]["range"]
    assert low == 0 and 2 * 1.2 <= top <= 2 * 1.25


def test_no_chart_has_plotlys_toolbar_over_its_legend(monkeypatch, incident_db):
    for page in (None, "cache", "mismatches", "keys", "output_length", "impact"):
        at = open_app(monkeypatch, incident_db, page)
        for chart in at.get("plotly_chart"):
            assert json.loads(chart.proto.config).get("displayModeBar") is False, (page, chart.key)


def test_deployments_are_listed_by_name_on_every_page(monkeypatch, tmp_path):
    # a-late is contaminated half an hour after prod: by name it still comes first, but for the window table,
    # which lists contamination as it began.
    late = [{**r, "request_id": "a" + r["request_id"], "deployment": "a-late",
             "ts": r["ts"].replace("T10:0", "T10:3")} for r in incident_records()[:4]]
    at = open_app(monkeypatch, build_db(tmp_path, incident_records() + late, "late"))
    strip = [markdown_unescape(m).split("**")[1] for m in texts(at, "markdown")
             if re.match(r"\*\*(a-late|prod|staging)\*\* ", markdown_unescape(m))]
    assert strip == ["a-late", "prod", "staging"], "the status strip"
    panels = [a["text"] for a in sorted(figures(at)["contamination_timeline"]["layout"]["annotations"],
                                        key=lambda a: -a.get("y", 0)) if a.get("textangle") == 90]
    assert [markdown_unescape(p) for p in panels] == ["a-late", "prod"], "the timeline's panels, top down"
    at.switch_page("pages/cache.py").run()
    spec = figures(at)["first_sight_hits"]
    assert list(reversed(spec["layout"]["yaxis"]["categoryarray"])) == ["a-late", "prod", "staging"]


def test_every_run_sends_the_browser_the_time_range_and_a_growing_store_moves_only_the_handles_at_its_ends(
        monkeypatch, tmp_path):
    """A run cut short by a click before its slider reached the browser (a slow first load of a link) left the
    next run's slider without a value: the browser drew its default, the whole span, and sent it back as chosen.
    Rows loaded later move a handle at the end, not one the link put inside."""
    db = build_db(tmp_path, incident_records())
    at = open_app(monkeypatch, db, start="2026-03-01T10:05:00Z")
    for _ in range(2):  # the run that read the link, then a later one of the same view
        slider = at.slider(key="f_time")
        assert slider.proto.set_value, "the browser is left to draw the slider at its default"
        assert list(slider.proto.value) != list(slider.proto.default)
        assert slider.value[0] == datetime(2026, 3, 1, 10, 5, tzinfo=timezone.utc)
        at.run()
    ingest(Store(db), [str(write_jsonl(tmp_path / "later.jsonl", [rec("late", ts="2026-03-01T12:00:00Z")]))])
    at.run()
    assert at.slider(key="f_time").value == (datetime(2026, 3, 1, 10, 5, tzinfo=timezone.utc),
                                             datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc))
