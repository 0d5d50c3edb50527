"""Issue 44 items 9 and 12 through AppTest: Search shows each match highlighted in its text; every table
speaks as the charts do (one timestamp format, human headers, rates as percentages, temperature 0);
plurals; the contamination window ordered by first hit."""

from __future__ import annotations

import json

from apptest import figure, markdown_unescape, open_app, texts, ui
from dashboard_data import T0, build_db
from helpers import rec

from specdec_core import analysis
from specdec_core.store.connection import Store

PAGES = ["overview", "cache", "output_length", "mismatches", "keys", "export", "replay"]


def tables(at) -> list[tuple]:
    """Each table on the page: (its data, its column config as Streamlit got it)."""
    return [(t.value, json.loads(t.proto.columns or "{}")) for t in at.dataframe]


def test_search_shows_where_each_request_matched_highlighted_first_in_the_row(monkeypatch, tmp_path):
    db = build_db(tmp_path, [rec("a", output_text="x" * 300 + " the <b>INVOICE</b> total"), rec("b", cache_key="k-2")])
    at = open_app(monkeypatch, db, "search")
    at.text_input(key="search_text").set_value("invoice").run()
    [(data, config)] = tables(at)
    assert list(data.columns[:7]) == ["open", "request_id", "ts", "match_field", "match_before", "match_text",
                                      "match_after"], "the match in view at 1440 px, right after the request"
    assert (data.match_text[0], data.match_before[0][-8:], data.match_after[0]) == ("INVOICE", " the <b>", "</b> total")
    assert config["match_before"]["alignment"] == "right", "the text before runs into the match"
    styles = at.dataframe[0].proto.arrow_data.styler.styles
    match_column = list(data.columns).index("match_text")
    assert f"row0_col{match_column} {{ background-color: #fde2c4 }}" in styles
    assert [c for c in range(len(data.columns)) if f"_col{c} " in styles] == [match_column], "only the match"
    assert any(c.startswith("1 request matches (") for c in texts(at, "caption"))


def test_every_table_has_human_headers_one_time_format_percentages_and_temperature_0(monkeypatch, incident_db):
    seen = set()
    for page in PAGES:
        at = open_app(monkeypatch, incident_db, page)
        for data, config in tables(at):
            for name in data.columns:
                column = config.get(name, {})
                label = column.get("label", name) if isinstance(column, dict) else column
                assert "_" not in label, (page, name, label)
                kind = column.get("type_config", {}) if isinstance(column, dict) else {}
                if str(data[name].dtype).startswith("datetime"):
                    assert kind.get("format") == ui.TIME_FORMAT == "YYYY-MM-DD HH:mm:ss", (page, name)
                    seen.add("time")
                if name.endswith("_rate") or name == "similarity":
                    assert kind.get("format") == "percent", (page, name)
                    seen.add(name)
                if name == "temperature":
                    assert kind.get("format") == "%g", (page, name)
                    seen.add(name)
    assert {"time", "hit_rate", "acceptance_rate", "temperature"} <= seen
    # The Keys page's identities are styled (differing fields highlighted): there the text is the Styler's.
    at = open_app(monkeypatch, incident_db, "keys")
    styled = at.dataframe[-1].proto.arrow_data.styler.display_values
    assert styled, "the identities table is the styled one"


def test_the_slider_and_the_charts_hover_write_times_as_the_tables_do(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db)
    slider = at.sidebar.slider(key="f_time")
    assert slider.label == "Time range (UTC, 2026-03-01)" and slider.proto.format == "HH:mm:ss"
    spec = figure(at, "contamination_timeline")
    assert {a["hoverformat"] for k, a in spec["layout"].items() if k.startswith("xaxis")} == {"%Y-%m-%d %H:%M:%S"}
    assert "1-minute buckets" in spec["layout"]["xaxis"]["title"]["text"]
    at = open_app(monkeypatch, incident_db, "replay", request_id="r1")
    logged = at.dataframe[0].value.set_index("field")["value"]
    assert (logged["ts"], logged["temperature"]) == ("2026-03-01 10:00:00 UTC", "0")


def test_one_contaminated_hit_is_singular_and_the_window_lists_the_earliest_first(monkeypatch, tmp_path):
    # staging's contamination starts first though "staging" sorts after "prod"; prod has one contaminated hit.
    db = build_db(tmp_path, [
        rec("s1", ts=T0 + "00:00Z", deployment="staging", cache_key="s-1"),
        rec("s2", ts=T0 + "01:00Z", deployment="staging", cache_key="s-1", cache_hit=True, max_tokens=16),
        rec("s3", ts=T0 + "01:30Z", deployment="staging", cache_key="s-1", cache_hit=True, max_tokens=32),
        rec("p1", ts=T0 + "02:00Z"),
        rec("p2", ts=T0 + "03:00Z", cache_hit=True, max_tokens=16),
    ])
    window = analysis.contamination_window(Store(db))
    assert list(window.deployment) == ["staging", "prod"]
    at = open_app(monkeypatch, db)
    [(shown, _)] = [t for t in tables(at) if "first_contaminated" in t[0].columns]
    assert list(shown.deployment) == ["staging", "prod"]
    sentences = [markdown_unescape(m) for m in texts(at, "markdown") if "contaminated hit" in m]
    assert any(s.startswith("**prod**: 1 contaminated hit,") for s in sentences), sentences
    at = open_app(monkeypatch, db, "mismatches", deployment="prod")
    assert any(c.startswith("1 contaminated hit. Tick") for c in texts(at, "caption"))
