"""`specdec metrics rules` under `promtool test rules`: firing, not firing, the first sample, resolution."""

from __future__ import annotations

import subprocess

import yaml
from helpers import run_cli

BASE = "https://triage.example.com/ops"
LINK = BASE + "/mismatches?deployment="


def annotations(alert: str, deployment: str, value: str, query: str) -> dict[str, str]:
    where = f"on deployment {deployment}"
    text = {
        "SpecdecContaminatedHits": (
            f"Contaminated cache hits {where}",
            f"{value} cache hit(s) {where} served an output cached for another request identity within the last "
            "5m: the cache key is narrower than the identity. Open the Mismatches page for the requests and their "
            "sources."),
        "SpecdecLengthViolations": (
            f"Outputs longer than max_tokens {where}",
            f"{value} request(s) {where} returned more tokens than their max_tokens within the last 5m: often an "
            "output cached for a request with a larger limit."),
        "SpecdecKeyCollisions": (
            f"Cache keys shared by several identities grow {where}",
            f"{value} more cache key(s) {where} are shared by requests of different identities than 5m ago: each "
            "is a contaminated hit waiting to happen."),
    }[alert]
    return {"summary": text[0], "description": text[1], "dashboard": LINK + query}


def expect(alert: str, deployment: str, value: str, severity: str, query: str) -> dict:
    return {"exp_labels": {"deployment": deployment, "severity": severity},
            "exp_annotations": annotations(alert, deployment, value, query)}


# One scrape a minute. `narrow/a b` grows from 0 to 1 at 2m; `good` stays at 0; `fresh` first appears at 3m
# already at 1 (its first sample: increase() alone would never see it).
SERIES = [
    {"series": 'specdec_contaminated_hits_total{deployment="narrow/a b",target_model="t",draft_model="d"}',
     "values": "0 0 1 1 1 1 1 1 1 1 1 1"},
    {"series": 'specdec_contaminated_hits_total{deployment="good",target_model="t",draft_model="d"}',
     "values": "0x11"},
    {"series": 'specdec_contaminated_hits_total{deployment="fresh",target_model="t",draft_model="d"}',
     "values": "_ _ _ 1 1 1 1 1 1 1 1 1"},
    {"series": 'specdec_length_violations_total{deployment="good",target_model="t"}', "values": "0x11"},
    {"series": 'specdec_length_violations_total{deployment="fresh",target_model="t"}',
     "values": "_ _ _ 2 2 2 2 2 2 2 2 2"},
    {"series": 'specdec_key_collisions{deployment="narrow/a b"}', "values": "0 0 3 3 3 3 3 3 3 3 3 3"},
    {"series": 'specdec_key_collisions{deployment="good"}', "values": "0x11"},
]


def promtool_tests(narrow_at_2m: list[dict]) -> dict:
    contaminated = "SpecdecContaminatedHits"
    return {
        "rule_files": ["rules.yml"],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": SERIES,
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": contaminated, "exp_alerts": []},  # nothing new yet
                {"eval_time": "2m", "alertname": contaminated, "exp_alerts": narrow_at_2m},
                # fresh's first sample at 1: fires at once, with no `for:`; narrow still within its window.
                {"eval_time": "3m", "alertname": contaminated, "exp_alerts": [
                    expect(contaminated, "fresh", "1", "page", "fresh"),
                    expect(contaminated, "narrow/a b", "1", "page", "narrow%2Fa+b")]},
                # Resolution: no growth within the last 5 minutes (narrow's 0 -> 1 at 2m left the window at 7m,
                # fresh's first sample at 8m), then keep_firing_for's minute.
                {"eval_time": "6m", "alertname": contaminated, "exp_alerts": [
                    expect(contaminated, "fresh", "1", "page", "fresh"),
                    expect(contaminated, "narrow/a b", "1", "page", "narrow%2Fa+b")]},
                {"eval_time": "8m", "alertname": contaminated, "exp_alerts": [
                    expect(contaminated, "fresh", "1", "page", "fresh")]},
                {"eval_time": "9m", "alertname": contaminated, "exp_alerts": []},
                {"eval_time": "3m", "alertname": "SpecdecLengthViolations", "exp_alerts": [
                    expect("SpecdecLengthViolations", "fresh", "2", "warning", "fresh")]},
                {"eval_time": "11m", "alertname": "SpecdecLengthViolations", "exp_alerts": []},
                {"eval_time": "2m", "alertname": "SpecdecKeyCollisions", "exp_alerts": [
                    expect("SpecdecKeyCollisions", "narrow/a b", "3", "warning", "narrow%2Fa+b")]},
                {"eval_time": "8m", "alertname": "SpecdecKeyCollisions", "exp_alerts": []},
            ],
        }, {
            "interval": "1m",
            "input_series": [{"series": 'specdec_newest_request_timestamp_seconds{deployment="idle"}',
                              "values": "0x30"},
                             {"series": 'specdec_newest_request_timestamp_seconds{deployment="busy"}',
                              "values": "0+60x30"}],
            "alert_rule_test": [
                {"eval_time": "14m", "alertname": "SpecdecIngestStale", "exp_alerts": []},
                {"eval_time": "16m", "alertname": "SpecdecIngestStale", "exp_alerts": [{
                    "exp_labels": {"deployment": "idle", "severity": "warning"},
                    "exp_annotations": {
                        "summary": "No new requests logged on deployment idle",
                        "description": "The newest request on deployment idle is 16m 0s old (threshold 900 s): the "
                                       "service stopped logging, the follower stopped, or the deployment stopped "
                                       "serving.",
                        "dashboard": LINK + "idle"}}]},
            ],
        }],
    }


def promtool(tmp_path, tests: dict) -> subprocess.CompletedProcess[str]:
    (tmp_path / "tests.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run(["promtool", "test", "rules", "tests.yml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)


def test_rules_fire_resolve_and_see_a_first_sample(tmp_path):
    done = run_cli("metrics", "rules", "--dashboard-url", BASE + "/")
    assert done.returncode == 0, done.stderr
    (tmp_path / "rules.yml").write_text(done.stdout)
    rules = yaml.safe_load(done.stdout)["groups"][0]["rules"]
    assert {r["alert"] for r in rules} == {"SpecdecContaminatedHits", "SpecdecLengthViolations",
                                           "SpecdecKeyCollisions", "SpecdecIngestStale"}
    assert all("for" not in r for r in rules)
    assert [r.get("keep_firing_for") for r in rules] == ["1m", "1m", "1m", None]
    check = subprocess.run(["promtool", "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr

    narrow = [expect("SpecdecContaminatedHits", "narrow/a b", "1", "page", "narrow%2Fa+b")]
    done = promtool(tmp_path, promtool_tests(narrow))
    assert done.returncode == 0, done.stdout + done.stderr
    # The same file expecting silence where narrow grew: promtool really evaluates, and says it fired.
    done = promtool(tmp_path, promtool_tests([]))
    assert done.returncode != 0 and "SpecdecContaminatedHits" in done.stdout + done.stderr


def test_the_dashboard_link_comes_from_the_config_file(tmp_path):
    config = tmp_path / "specdec.toml"
    config.write_text('[dashboard]\nexternal_url = "https://from-config.example"\n')
    done = run_cli("metrics", "rules", "--config", str(config))
    assert done.returncode == 0, done.stderr
    links = {r["annotations"]["dashboard"] for r in yaml.safe_load(done.stdout)["groups"][0]["rules"]}
    assert links == {"https://from-config.example/mismatches?deployment={{ $labels.deployment | urlquery }}"}
    config.write_text('[dashboard]\nexternal_url = "ftp://nope"\n')
    done = run_cli("metrics", "rules", "--config", str(config))
    assert done.returncode == 2 and "external_url" in done.stderr and len(done.stderr.splitlines()) == 1
    done = run_cli("metrics", "rules", "--dashboard-url", "not a url")
    assert done.returncode == 2 and "--dashboard-url" in done.stderr
