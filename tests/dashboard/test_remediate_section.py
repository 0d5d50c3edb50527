"""The Keys page's Remediate section and the Overview's fix sentence, through Streamlit's AppTest."""

from __future__ import annotations

import json

from apptest import open_app
from dashboard_data import build_db
from remediation_data import incident

from specdec_core.remediation import plan_jsonl, purge_plan
from specdec_core.store import Store


def test_keys_page_offers_the_plan_and_the_purge_command(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, "keys")
    metrics = {m.label: m.value for m in at.metric}
    assert (metrics["Keys to purge"], metrics["Served contaminated hits"], metrics["Shared, none seen served"]) \
        == ("1", "1", "0")
    (button,) = [b for b in at.get("download_button") if b.proto.label == "Download the purge plan (JSONL)"]
    plan = purge_plan(Store(incident_db))
    assert [json.loads(line)["cache_key"] for line in plan_jsonl(plan).splitlines()] == ["k-1"]
    (command,) = [c.value for c in at.code if "specdec cache purge" in c.value]
    dry, real = command.splitlines()
    assert dry.startswith("specdec cache purge --plan specdec-purge-plan_") and dry.endswith("--dry-run")
    assert "--backup purge-backup.jsonl" in real and f"--db {incident_db}" in real
    assert "redis://HOST:6379/0" in real


def test_overview_says_whether_the_fix_holds(monkeypatch, tmp_path):
    db = build_db(tmp_path, incident(), "fixed")
    at = open_app(monkeypatch, db)
    said = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert "edge: fix deployed at 2026-03-01 10:10:00 UTC; 0 hits from old-scheme keys since." in said
    assert "prod: 2 hits from old-scheme keys after the fix: rollout incomplete" in said


def test_overview_says_the_fix_holds_in_a_time_range_after_the_contamination(monkeypatch, tmp_path):
    db = build_db(tmp_path, incident(), "after")
    at = open_app(monkeypatch, db, start="2026-03-01T10:08:00Z")
    said = " ".join(m.value for m in at.markdown).replace("\\", "")
    assert "edge: fix deployed at 2026-03-01 10:10:00 UTC; 0 hits from old-scheme keys since." in said
