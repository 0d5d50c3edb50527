"""`specdec incident-report`: the postmortem drafted from a store, whose every figure equals what `specdec stats`,
`specdec impact` and `specdec report` say of the same store; the HTML is one file that fetches nothing."""

from __future__ import annotations

import csv
import json
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import rec, run_cli, write_jsonl

from specdec_core.ingestion import ingest
from specdec_core.remediation import PurgeRecord, record_purge
from specdec_core.remediation.report import incident_report, render_html, render_markdown
from specdec_core.store import Store


def _incident() -> list[dict]:
    """edge keyed by the prompt alone until 10:30, then by the full identity in a new namespace; two tenants
    and two arms that differ in draft model."""
    records = []
    for i in range(30):
        minute = i * 2
        fixed = minute >= 30
        arm, draft = ("arm-a", "d-a") if i % 2 == 0 else ("arm-b", "d-b")
        prompt = f"p{i % 3}"
        key = f"edge-v2:full:{i}" if fixed else f"edge-v1:prompt:{prompt}"
        records.append(rec(f"r{i:02d}", ts=f"2026-03-01T10:{minute:02d}:00.000Z", prompt=prompt, temperature=0.7,
                           deployment="edge", cache_key=key, cache_hit=not fixed and i >= 3, draft_model=draft,
                           consumer="acme" if i % 3 else "globex", experiment=arm, max_tokens=8 + (i % 2),
                           output_tokens=9 if i == 5 else 4, latency_ms=100.0 + i))
    return records


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("report")
    path = folder / "s.duckdb"
    assert ingest(Store(path), [str(write_jsonl(folder / "log.jsonl", _incident()))]).accepted == 30
    return path


def _cli_json(*args: str) -> object:
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_every_figure_equals_stats_impact_and_report(db, tmp_path):
    stats = _cli_json("stats", "--db", str(db), "--json")
    consumers = _cli_json("impact", "--db", str(db), "--json")
    deployments = _cli_json("impact", "--db", str(db), "--by", "deployment", "--json")
    experiments = _cli_json("impact", "--db", str(db), "--experiments", "--json")
    assert run_cli("report", "--db", str(db), "--out", str(tmp_path / "r.csv")).returncode == 0
    with open(tmp_path / "r.csv", encoding="utf-8") as f:
        kinds = [row["kind"] for row in csv.DictReader(f)]
    out = tmp_path / "incident.md"
    done = run_cli("incident-report", "--db", str(db), "--out", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text(encoding="utf-8")

    report = incident_report(Store(db))
    assert report.headline.contaminated_hits == stats["contaminated_hits"] > 0
    assert (report.headline.requests, report.headline.length_violations) == (stats["requests"],
                                                                             stats["length_violations"])
    assert f"{stats['contaminated_hits']:,} contaminated hits" in text
    assert f"{stats['length_violations']:,} length violations among {stats['requests']:,} requests" in text
    assert [i.as_json() for i in report.consumers] == consumers
    assert [i.as_json() for i in report.deployments] == deployments
    assert report.experiments.as_json() == experiments
    for c in consumers:
        assert (f"| {c['value']} | {c['requests']:,} | {c['contaminated_hits']:,} | {c['length_violations']:,} |"
                in text)
    for c in experiments["cross_feeding"]:
        assert f"| {c['arm'] or '(none)'} | {c['served_from'] or '(none)'} | {c['hits']:,} |" in text
    for a in experiments["arms"]:
        assert f"| {a['arm']} | {a['requests']['all']:,} / {a['requests']['clean']:,} |" in text
        assert f"{a['mean_latency_ms']['all']:,.1f} / {a['mean_latency_ms']['clean']:,.1f}" in text
    for kind in ("contaminated_hit", "length_violation", "replay_mismatch"):
        assert f"- {kind}: {kinds.count(kind):,}" in text
    assert report.mismatch_counts.get("contaminated_hit") == kinds.count("contaminated_hit")


def test_the_sections_and_the_key_fix_the_store_shows(db):
    report = incident_report(Store(db))
    text = render_markdown(report)
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    assert headings == ["## Summary", "## Timeline", "## Root cause", "## Blast radius", "## Remediation",
                        "## Appendix: mismatch report"]
    [change] = report.changes
    assert (change.old_prefix, change.new_prefix) == ("edge-v1:prompt", "edge-v2:full")
    [fix] = report.fixes
    assert fix.hits_after_fix == 0
    events = [e.what.split(":")[0] for e in report.timeline()]
    assert events == ["first contaminated hit", "last contaminated hit", "key scheme change"]
    assert "the key scheme `edge-v1:prompt` left out identity fields: `draft_model`" in text
    assert "no purge recorded" in text
    assert "| Key fixed | done | edge since 2026-03-01 10:30:00 UTC; 0 hits after the fix on old-scheme keys |" in text
    assert report.plan.contaminated == 3 and report.plan.keys >= report.plan.contaminated


def test_the_html_is_one_file_with_inline_svg_charts_and_fetches_nothing(db, tmp_path):
    out = tmp_path / "incident.html"
    assert run_cli("incident-report", "--db", str(db), "--out", str(out)).returncode == 0
    page = out.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>") and page.count("<svg") == 3
    assert "<script" not in page and "<link" not in page and "@import" not in page
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", page)
    assert "acme" in page and "Cross-feeding" in page


def test_links_go_to_the_dashboard_when_its_address_is_configured(db, tmp_path, monkeypatch):
    config = tmp_path / "specdec.toml"
    config.write_text('[dashboard]\nexternal_url = "https://triage.example.com/"\n', encoding="utf-8")
    monkeypatch.setenv("SPECDEC_CONFIG", str(config))
    out = tmp_path / "linked.md"
    assert run_cli("incident-report", "--db", str(db), "--out", str(out)).returncode == 0
    text = out.read_text(encoding="utf-8")
    assert "[first contaminated hit](https://triage.example.com/mismatches)" in text
    assert "(https://triage.example.com/keys)" in text
    plain = render_markdown(incident_report(Store(db)))
    assert "https://" not in plain


def test_a_bad_suffix_or_a_missing_store_is_a_one_line_error(db, tmp_path):
    done = run_cli("incident-report", "--db", str(db), "--out", str(tmp_path / "report.pdf"))
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1 and ".md or .html" in done.stderr
    assert not (tmp_path / "report.pdf").exists()
    missing = run_cli("incident-report", "--db", str(tmp_path / "none.duckdb"), "--out", str(tmp_path / "r.md"))
    assert missing.returncode == 1 and "no such database" in missing.stderr


def test_a_store_without_contamination_says_so(tmp_path):
    path = tmp_path / "clean.duckdb"
    ingest(Store(path), [str(write_jsonl(tmp_path / "clean.jsonl", [rec("a"), rec("b", cache_key="k-2")]))])
    text = render_markdown(incident_report(Store(path)))
    assert "0 contaminated hits" in text and "No contaminated hit: no key left a field out." in text
    assert text.startswith("# Incident report: no cache hit served another request's output in these logs\n")
    assert "| Old namespace purged | unknown | no purge recorded |" in text


@pytest.mark.parametrize("lines", [[], ['{"request_id": "q1"}', "not json"]], ids=["empty", "all quarantined"])
def test_a_store_without_requests_gets_a_report_not_a_traceback(tmp_path, lines):
    path = tmp_path / "none.duckdb"
    (tmp_path / "log.jsonl").write_text("".join(f"{line}\n" for line in lines))
    assert ingest(Store(path), [str(tmp_path / "log.jsonl")]).accepted == 0
    for suffix in ("md", "html"):
        done = run_cli("incident-report", "--db", str(path), "--out", str(tmp_path / f"r.{suffix}"))
        assert done.returncode == 0, done.stderr
        assert "0 contaminated hits" in (tmp_path / f"r.{suffix}").read_text()


def test_purges_the_plan_and_the_fix_come_from_what_cache_and_stats_say(db, tmp_path):
    copy = tmp_path / "purged.duckdb"
    copy.write_bytes(db.read_bytes())
    plan = _cli_json("cache", "plan", "--db", str(copy), "--out", str(tmp_path / "plan.jsonl"), "--json")
    stats = _cli_json("stats", "--db", str(copy), "--json")
    at = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
    record_purge(Store(copy), PurgeRecord(ts=at, kind="namespace", target="redis://purger@cache:6379/0", plan=None,
                                          namespace="edge-v1:", planned=3, deleted=3, missing=0, dry_run=False))
    report = incident_report(Store(copy))
    assert (report.plan.keys, report.plan.contaminated, report.plan.collision) == (
        plan["keys"], plan["contaminated"], plan["collision"])
    assert {f.change.deployment: f.hits_after_fix for f in report.fixes} == stats["hits_after_fix"]
    text = render_markdown(report)
    assert "no purge recorded" not in text
    assert "| Old namespace purged | done | edge-v1: on redis://purger@cache:6379/0 at 2026-03-01 12:00:00 UTC" in text
    # A namespace purge that held none of the old scheme's keys leaves the item open, naming the scheme.
    other = tmp_path / "other.duckdb"
    other.write_bytes(db.read_bytes())
    record_purge(Store(other), PurgeRecord(ts=at, kind="namespace", target="redis://purger@cache:6379/0", plan=None,
                                           namespace="edge-v1:prompt:p0", planned=1, deleted=1, missing=0,
                                           dry_run=False))
    assert ("| Old namespace purged | left | edge-v1:prompt:p0 on redis://purger@cache:6379/0 at 2026-03-01 "
            "12:00:00 UTC: 1 deleted; not yet edge-v1:prompt:... (edge) |") in render_markdown(incident_report(Store(other)))
    assert report.timeline()[-1].what.startswith("purged the namespace edge-v1: on redis://purger@cache:6379/0")


def test_log_text_in_the_markdown_and_the_impact_table_stays_text(tmp_path):
    """A consumer named with HTML or a line break: the Markdown shows it as text wherever it is read, and the
    terminal table keeps one row per consumer."""
    hostile = "<img src=x onerror=alert(1)>\nrow"
    path = tmp_path / "hostile.duckdb"
    ingest(Store(path), [str(write_jsonl(tmp_path / "h.jsonl", [
        rec("m1", consumer=hostile), rec("h1", cache_hit=True, consumer=hostile, max_tokens=2, output_tokens=9)]))])
    text = render_markdown(incident_report(Store(path)))
    assert "<img" not in text and "&lt;img src=x onerror=alert(1)&gt; row" in text
    table = run_cli("impact", "--db", str(path)).stdout.splitlines()
    assert len(table) == 2 and table[1].startswith("<img src=x onerror=alert(1)> row")


def test_what_the_sentences_quote_from_the_log_stays_text_in_the_markdown(tmp_path):
    """The summary, the timeline, the root cause and the checklist quote a deployment and a key scheme's prefix
    as the log wrote them: in the Markdown neither renders as HTML or a link, and a backtick in a prefix does
    not end its code span early."""
    deployment = "<img src=x onerror=alert(1)>[x](javascript:alert(1))"
    records = [{**r, "deployment": deployment, "cache_key": r["cache_key"].replace("edge-v1", "ed`ge<b>v1")}
               for r in _incident()]
    path = tmp_path / "hostile.duckdb"
    assert ingest(Store(path), [str(write_jsonl(tmp_path / "h.jsonl", records))]).accepted == 30
    report = incident_report(Store(path))
    text = render_markdown(report)
    code = "``ed`ge<b>v1:prompt``"  # in a code span, HTML shows as text
    assert "<img" not in text and "<b>" not in text.replace(code, "")
    assert not re.search(r"(?<!\\)\]\(javascript", text), "a link"
    shown = r"&lt;img src=x onerror=alert(1)&gt;\[x\](javascript:alert(1))"
    lines = text.splitlines()
    for starts in ("- Contaminated hits from", "- Key fixed: ", "| 2026-03-01 10:30:00 UTC | key scheme change: ",
                   "| Key fixed | done | "):
        [line] = [line for line in lines if line.startswith(starts)]
        assert shown in line, line
    [cause] = [line for line in lines if "the key scheme" in line]
    assert cause == (f"- {shown}: the key scheme {code} left out identity fields: "
                     "`draft_model` (6 hits), `max_tokens` (6 hits).")
    page = render_html(report)
    assert "<img" not in page and "<b>" not in page
    assert "<code>ed`ge&lt;b&gt;v1:prompt</code>" in page


def test_a_field_left_out_once_is_one_hit(tmp_path):
    path = tmp_path / "one.duckdb"
    ingest(Store(path), [str(write_jsonl(tmp_path / "one.jsonl", [
        rec("m1", cache_key="K", draft_model="d1", temperature=0.7),
        rec("h1", cache_key="K", draft_model="d2", temperature=0.7, cache_hit=True)]))])
    [cause] = [line for line in render_markdown(incident_report(Store(path))).splitlines() if "left out" in line]
    assert cause.endswith("`draft_model` (1 hit); no change of key scheme seen yet.")


def test_impact_refuses_by_with_experiments_instead_of_ignoring_it(db):
    # The arms came out for `--experiments --by deployment` as if the grouping had been obeyed.
    done = run_cli("impact", "--db", str(db), "--experiments", "--by", "deployment", "--json")
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == ("specdec impact: --by groups the table per value; --experiments is per experiment arm "
                           "(its own figures): give one of them\n")
    table = run_cli("impact", "--db", str(db)).stdout.splitlines()
    assert table[0].startswith("consumer ") and len(table) > 1, table  # without --by: per consumer, as before


def test_a_restore_a_dry_run_and_an_interrupted_purge_read_as_what_they_did(db, tmp_path):
    """A walk of the remediation commands found the report saying "restored from a restore on ...: 36 planned,
    0 deleted, 0 missing" (no count put back, no backup named, the purge before it still "done"), a dry run
    listed under Remediation > Done, and an interrupted purge (17 of 40 deleted) read as a finished one."""
    copy = tmp_path / "restored.duckdb"
    copy.write_bytes(db.read_bytes())
    target = "redis://purger@cache:6379/0"

    def record(hour: int, kind: str, **kw) -> None:
        fields = {"plan": None, "namespace": None, "planned": 0, "deleted": 0, "missing": 0, "dry_run": False} | kw
        record_purge(Store(copy), PurgeRecord(ts=datetime(2026, 3, 1, hour, tzinfo=timezone.utc), kind=kind,
                                              target=target, **fields))

    record(11, "plan", plan="plan.jsonl", planned=40, dry_run=True)
    record(12, "plan", plan="plan.jsonl", planned=40, deleted=17, missing=2)
    record(13, "namespace", namespace="edge-v1:", planned=3, deleted=3)
    record(14, "restore", plan="backup.jsonl", planned=36, missing=1)
    text = render_markdown(incident_report(Store(copy)))
    done = text[text.index("### Done"):text.index("### Purge plan")]
    assert "dry run" not in done and "dry run of the plan plan.jsonl on " + target + ": 40 planned; nothing deleted" in text
    assert (f"purged the plan plan.jsonl on {target}: 40 planned, 17 deleted, 2 missing; interrupted with 21 keys "
            "left: run it again") in done
    assert (f"restored 35 keys from the backup backup.jsonl on {target} (1 had outlived their TTL): the purged "
            "entries it held are in the cache again") in done
    assert ("| Old namespace purged | left | a restore at 2026-03-01 14:00:00 UTC put the purged entries back |"
            in text)
    assert f"purged the namespace edge-v1: on {target}: 3 planned, 3 deleted, 0 missing\n" in done, "no interruption"
