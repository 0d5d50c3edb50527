"""The purge plan from a store with known contamination, and whether the key fix is holding."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import duckdb
import pytest
from helpers import run_cli, write_jsonl
from remediation_data import T0, incident

from specdec_core import analysis
from specdec_core.analysis import Filters
from specdec_core.cli import main
from specdec_core.ingestion import ingest
from specdec_core.remediation import PurgeRecord, plan_counts, purge_log, purge_plan, record_purge
from specdec_core.store import Store


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("incident")
    path = folder / "triage.duckdb"
    ingest(Store(path), [str(write_jsonl(folder / "log.jsonl", incident()))])
    return path


def test_plan_lists_contaminated_keys_by_first_contaminated_hit_then_collisions(db):
    plan = purge_plan(Store(db), key_template="app:{deployment}:{cache_key}")
    assert [(e.cache_key, e.reason, e.identities, e.contaminated_hits) for e in plan] == [
        ("svc-v1:prompt:b", "contaminated", 2, 1),
        ("svc-v1:prompt:a", "contaminated", 3, 2),
        ("svc-v1:prompt:c", "collision", 2, 0),
    ]
    b, a, c = plan
    assert b.redis_key == "app:prod:svc-v1:prompt:b"
    assert a.to_json()["first_contaminated"] == "2026-03-01T10:02:00.000Z"
    assert a.to_json()["last_seen"] == "2026-03-01T10:06:00.000Z"
    assert c.first_contaminated is None and c.to_json()["last_seen"] == "2026-03-01T10:05:00.000Z"
    assert plan_counts(plan).to_json() == {"keys": 3, "contaminated": 2, "collision": 1}


def test_plan_filters_as_every_command_does(db):
    store = Store(db)
    assert purge_plan(store, Filters(deployments=("edge",))) == []
    late = purge_plan(store, Filters(start=T0 + timedelta(minutes=1, seconds=45)))
    assert [(e.cache_key, e.reason, e.contaminated_hits) for e in late] == [
        ("svc-v1:prompt:a", "contaminated", 2), ("svc-v1:prompt:c", "collision", 0)]


def test_plan_command_writes_the_file_and_prints_the_counts(db, tmp_path, capsys):
    out = tmp_path / "plan.jsonl"
    assert main(["cache", "plan", "--db", str(db), "--out", str(out), "--json", "--since",
                 "2026-03-01T10:01:45Z", "--until", "2026-03-01T10:03:00Z", "--deployment", "prod"]) == 0
    assert json.loads(capsys.readouterr().out) == {"keys": 1, "contaminated": 1, "collision": 0}
    (line,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert line == {"deployment": "prod", "cache_key": "svc-v1:prompt:a", "redis_key": "svc-v1:prompt:a",
                    "reason": "contaminated", "identities": 2, "contaminated_hits": 1,
                    "first_contaminated": "2026-03-01T10:02:00.000Z", "last_seen": "2026-03-01T10:03:00.000Z"}
    # A date alone: --until is through that day, as `specdec stats --end` reads it (it was the day's first
    # instant, before every request of it: an empty plan, exit 0, nothing said).
    assert main(["cache", "plan", "--db", str(db), "--out", str(out)]) == 0
    whole = out.read_text().splitlines()
    assert main(["cache", "plan", "--db", str(db), "--out", str(out), "--until", "2026-03-01"]) == 0
    assert out.read_text().splitlines() == whole and len(whole) > 1
    assert main(["cache", "plan", "--db", str(db), "--out", str(out), "--until", "2026-02-28"]) == 0
    assert out.read_text() == ""
    capsys.readouterr()
    assert main(["cache", "plan", "--db", str(db), "--out", str(out), "--key-template", "app:{deployment}"]) == 2
    assert main(["cache", "plan", "--db", str(db), "--out", str(out), "--since", "yesterday"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 2


def test_fix_status_says_whether_old_scheme_keys_still_serve_hits(db):
    edge, prod = analysis.fix_status(Store(db))
    assert (edge.deployment, edge.hits_after_fix, edge.old_prefixes) == ("edge", 0, ("e-v1:x",))
    assert edge.sentence == "edge: fix deployed at 2026-03-01 10:10:00 UTC; 0 hits from old-scheme keys since."
    assert (prod.deployment, prod.hits_after_fix, prod.new_prefix) == ("prod", 2, "svc-v2:full")
    assert prod.sentence.startswith("prod: 2 hits from old-scheme keys after the fix: rollout incomplete")
    # A time range after the fix still knows it, and counts the hits in the range; one that ends before a
    # fix says nothing about that fix.
    late = analysis.fix_status(Store(db), Filters(start=T0 + timedelta(minutes=21, seconds=30)))
    assert [(s.deployment, s.hits_after_fix) for s in late] == [("edge", 0), ("prod", 1)]
    early = analysis.fix_status(Store(db), Filters(end=T0 + timedelta(minutes=15)))
    assert [(s.deployment, s.hits_after_fix) for s in early] == [("edge", 0)]


def test_stats_json_has_key_scheme_changes_and_hits_after_fix(db):
    done = run_cli("stats", "--db", str(db), "--json")
    out = json.loads(done.stdout)
    assert out["hits_after_fix"] == {"edge": 0, "prod": 2}
    assert [(c["deployment"], c["old_prefix"], c["new_prefix"], c["last_old_key"], c["first_new_key"],
             c["hits_after_fix"]) for c in out["key_scheme_changes"]] == [
        ("edge", "e-v1:x", "e-v2:y", "2026-03-01T10:09:00.000Z", "2026-03-01T10:10:00.000Z", 0),
        ("prod", "svc-v1:prompt", "svc-v2:full", "2026-03-01T10:22:00.000Z", "2026-03-01T10:20:00.000Z", 2),
    ]
    plain = run_cli("stats", "--db", str(db))
    fixes = [line.split(None, 2)[2] for line in plain.stdout.splitlines() if line.startswith("key fix")]
    assert len(fixes) == 2
    assert any("2 hits from old-scheme keys after the fix: rollout incomplete" in f for f in fixes)


def test_stats_says_the_fix_figures_and_time_range_of_its_selection_as_the_overview_does(db):
    late = Filters(start=T0 + timedelta(minutes=21, seconds=30))
    shown = json.loads(run_cli("stats", "--db", str(db), "--json", "--start", late.start.isoformat()).stdout)
    assert shown["hits_after_fix"] == {s.deployment: s.hits_after_fix for s in analysis.fix_status(Store(db), late)}
    assert shown["hits_after_fix"] == {"edge": 0, "prod": 1}
    edge = json.loads(run_cli("stats", "--db", str(db), "--json", "--deployment", "edge").stdout)
    assert edge["hits_after_fix"] == {"edge": 0}
    assert [c["deployment"] for c in edge["key_scheme_changes"]] == ["edge"]
    plain = run_cli("stats", "--db", str(db), "--deployment", "edge").stdout.splitlines()
    assert [line for line in plain if line.startswith("key fix")] == [
        "key fix                   edge: fix deployed at 2026-03-01 10:10:00 UTC; 0 hits from old-scheme keys since."]
    assert "time range                2026-03-01 10:00:00 UTC .. " in "\n".join(plain)
    nothing = run_cli("stats", "--db", str(db), "--deployment", "staging").stdout.splitlines()
    assert "time range                no requests" in nothing
    assert not [line for line in nothing if line.startswith("key fix")]


def test_purges_table_is_added_to_older_stores_and_kept_by_migrate_and_in_a_lake(db, tmp_path):
    old = tmp_path / "old.duckdb"
    old.write_bytes(db.read_bytes())
    with duckdb.connect(str(old)) as con:
        con.execute("DROP TABLE purges")
    assert purge_log(Store(old)) == []
    migrated = run_cli("migrate", "--db", str(old))
    assert migrated.returncode == 0, migrated.stderr
    record = PurgeRecord(ts=T0, kind="namespace", target="redis://purger@cache:6379/0", plan=None,
                         namespace="specdec:prod:", planned=10, deleted=9, missing=1, dry_run=False)
    lake = Store(f"ducklake:{tmp_path / 'lake' / 's.sqlite'}")
    ingest(lake, [str(write_jsonl(tmp_path / "log.jsonl", incident()[:3]))])
    for store in (Store(old), lake):
        record_purge(store, record)
        record_purge(store, PurgeRecord(**{**record.__dict__, "ts": T0 - timedelta(hours=1), "kind": "plan",
                                           "plan": "plan.jsonl", "namespace": None, "dry_run": True}))
        logged = purge_log(store)
        assert [r.kind for r in logged] == ["plan", "namespace"]  # oldest first
        assert logged[1] == record
    with pytest.raises(ValueError, match="kind"):
        record_purge(Store(old), PurgeRecord(**{**record.__dict__, "kind": "flush"}))


def test_every_cache_subcommand_and_option_is_in_the_cli_docs():
    import argparse

    from specdec_core.cli import build_parser

    docs = (Path(__file__).resolve().parents[2] / "docs" / "cli.md").read_text()
    top = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    cache = next(a for a in top.choices["cache"]._actions if isinstance(a, argparse._SubParsersAction))
    missing = [f"specdec cache {name} {option}" for name, parser in cache.choices.items()
               for action in parser._actions for option in action.option_strings
               if option.startswith("--") and option != "--help"
               and not (f"specdec cache {name}" in docs and option in docs)]
    assert sorted(cache.choices) == ["plan", "purge", "restore"] and missing == []
