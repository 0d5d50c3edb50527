"""The Impact page through Streamlit's AppTest: blast radius, the cross-feeding, the clean comparison, a
consumer's affected requests as CSV (its choice in the address) and the incident report's downloads."""

from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

import pytest
import streamlit.runtime.scriptrunner.script_runner as script_runner
from helpers import rec, write_jsonl
from streamlit.runtime.pages_manager import PagesManager
from streamlit.testing.v1 import AppTest

from specdec_core.analysis.impact import affected_csv
from specdec_core.ingestion import ingest
from specdec_core.store import Store

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
APP = ROOT / "app.py"
T0 = "2026-03-01T10:"


def _records() -> list[dict]:
    sampled = {"temperature": 0.7}
    return [
        rec("m1", ts=T0 + "00:00Z", consumer="acme", experiment="arm-a", **sampled),
        rec("h1", ts=T0 + "01:00Z", cache_hit=True, consumer="globex", experiment="arm-b", draft_model="other",
            latency_ms=5.0, draft_tokens=None, accepted_tokens=None, **sampled),
        rec("h2", ts=T0 + "02:00Z", cache_hit=True, consumer="acme", experiment="arm-a", latency_ms=4.0,
            draft_tokens=None, accepted_tokens=None, **sampled),
        rec("m2", ts=T0 + "03:00Z", cache_key="k-2", consumer="globex", experiment="arm-b", draft_model="other",
            max_tokens=2, **sampled),
        rec("m3", ts=T0 + "04:00Z", cache_key="k-3", consumer="initech", experiment="arm-a", max_tokens=2, **sampled),
    ]


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("impact-page")
    path = folder / "impact.duckdb"
    ingest(Store(path), [str(write_jsonl(folder / "log.jsonl", _records()))])
    return path


@pytest.fixture(autouse=True)
def no_legacy_pages_folder(monkeypatch):
    class NavigationPagesManager(PagesManager):
        uses_pages_directory = False

    monkeypatch.setattr(script_runner, "PagesManager", NavigationPagesManager)


def _open(monkeypatch, db: Path, **query: str) -> AppTest:
    monkeypatch.setenv("SPECDEC_DB", str(db))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update(query)
    at.run()
    at.switch_page("pages/impact.py").run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def test_the_blast_radius_names_the_consumers_and_arms_affected(monkeypatch, db):
    at = _open(monkeypatch, db)
    assert [t.value for t in at.title] == ["Impact"]
    metrics = {m.label: m.value for m in at.main.metric}
    assert metrics == {"Consumers affected": "2 of 3", "Contaminated hits received": "1",
                       "Length violations received": "2", "Experiment arms cross-fed": "1 of 2"}
    consumers = at.dataframe[0].value
    assert list(consumers.consumer) == ["globex", "initech", "acme"]
    assert list(consumers.contaminated_hits) == [1, 0, 0] and list(consumers.length_violations) == [1, 1, 0]


def test_the_comparison_shows_each_arm_on_all_and_clean_rows(monkeypatch, db):
    at = _open(monkeypatch, db)
    frame = next(d.value for d in at.dataframe if "clean rows" in d.value.columns)
    b = frame[(frame.arm == "arm-b") & (frame.figure == "requests")].iloc[0]
    assert (b["all rows"], b["clean rows"], b["difference"]) == (2, 1, 1)
    latency = frame[(frame.arm == "arm-b") & (frame.figure == "mean latency (ms)")].iloc[0]
    assert (latency["all rows"], latency["clean rows"]) == (pytest.approx(62.5), pytest.approx(120.0))


def test_a_consumers_requests_download_as_csv_and_its_choice_is_in_the_address(monkeypatch, db):
    at = _open(monkeypatch, db)
    assert at.selectbox(key="impact_consumer").value == "globex"
    assert at.query_params["consumer"] == "globex"
    rows = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    assert list(zip(rows.request_id, rows.kind, strict=True)) == [("h1", "contaminated_hit"),
                                                                 ("m2", "length_violation")]
    written = affected_csv(Store(db), "globex").decode()
    assert written.splitlines()[0].startswith("request_id,ts,kind,consumer") and len(written.splitlines()) == 3
    assert "Download globex's affected requests (CSV)" in [b.proto.label for b in at.get("download_button")]
    linked = _open(monkeypatch, db, consumer="initech")  # a pasted address opens that consumer's requests
    assert linked.selectbox(key="impact_consumer").value == "initech"
    rows = next(d.value for d in linked.dataframe if "kind" in d.value.columns)
    assert list(rows.request_id) == ["m3"]
    assert not linked.warning


def test_a_link_to_a_consumer_not_listed_says_whose_requests_it_shows_instead(monkeypatch, db):
    """A customer-notice link reused under other filters, or with a typo: never another consumer's list in silence."""
    at = _open(monkeypatch, db, consumer="nope")
    assert at.selectbox(key="impact_consumer").value == "globex"
    [warning] = [w.value for w in at.warning]
    assert warning == ("This link names the consumer `nope`, who received no wrong output in this selection: "
                       "showing `globex` instead.")
    at.run()
    assert [w.value for w in at.warning] == [warning], "said while its stand-in stays chosen"
    at.selectbox(key="impact_consumer").set_value("initech").run()
    assert not at.warning, "the visitor's own choice needs no warning"


def test_the_incident_report_is_offered_once_drafted(monkeypatch, db):
    at = _open(monkeypatch, db)
    labels = [b.proto.label for b in at.get("download_button")]
    assert not any("incident" in label or "report" in label for label in labels)
    at.button(key="impact_draft_report").click().run()
    assert not at.exception
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Download the report (HTML)" in labels and "Download the report (Markdown)" in labels


def test_a_busy_consumers_list_shows_its_first_thousand_and_the_csv_holds_them_all(monkeypatch, tmp_path):
    # 1,200 over-long outputs for one consumer: more than the page lists.
    records = [rec(f"v{i:04d}", ts=f"2026-03-01T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}Z",
                   cache_key=f"k{i}", consumer="bigco", max_tokens=2) for i in range(1200)]
    db = tmp_path / "busy.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "busy.jsonl", records))])
    at = _open(monkeypatch, db)
    rows = next(d.value for d in at.dataframe if "kind" in d.value.columns)
    assert len(rows) == 1000 and rows.request_id.iloc[0] == "v0000" and rows.request_id.iloc[-1] == "v0999"
    assert any("The first 1,000 of 1,200 requests" in c.value for c in at.caption)
    assert len(affected_csv(Store(db), "bigco").splitlines()) == 1 + 1200


def test_the_downloads_serve_one_consumers_and_every_consumers_affected_requests(monkeypatch, db, download):
    at = _open(monkeypatch, db)
    buttons = {b.proto.label: b for b in at.get("download_button")}
    assert download(buttons["Download globex's affected requests (CSV)"]) == affected_csv(Store(db), "globex")
    every = download(buttons["Download every consumer's affected requests (CSV)"])
    rows = list(csv.DictReader(io.StringIO(every.decode("utf-8"))))
    assert [(r["consumer"], r["request_id"], r["kind"]) for r in rows] == [
        ("globex", "h1", "contaminated_hit"), ("globex", "m2", "length_violation"), ("initech", "m3", "length_violation")]
