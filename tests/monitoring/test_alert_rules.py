"""`specdec metrics rules` under `promtool test rules`: firing, not firing, the first sample, resolution."""

from __future__ import annotations

import json
import subprocess

import pytest
import yaml
from helpers import run_cli

from specdec_core.cli import main as cli_main

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


HOSTILE_URLS = [
    'https://x.example/{{ with query "count(up)" }}{{ . }}{{ end }}',  # a query run inside the alert's link
    "https://x.example/{{",  # promtool would refuse the file
    "https://x.example/a}}b",
    "javascript:alert(1)",
    "data:text/html,<script>alert(1)</script>",
    "ftp://x.example",
    "https://x.example/a b",
    "https://x.example/\x1b[2J",
]


@pytest.mark.parametrize("command", ["rules", "grafana"])
@pytest.mark.parametrize("url", HOSTILE_URLS)
def test_a_dashboard_url_prometheus_or_a_browser_would_run_is_refused_by_rules_and_grafana(capsys, command, url):
    code = cli_main(["metrics", command, "--dashboard-url", url])
    out, err = capsys.readouterr()
    assert code == 2 and out == "", out
    assert err.count("\n") == 1 and "--dashboard-url" in err, err


def test_the_filter_goes_into_the_pages_query_string_before_its_fragment(tmp_path, capsys):
    url = "https://x.example/triage/?tenant=a#top"
    assert cli_main(["metrics", "rules", "--dashboard-url", url]) == 0
    rules_text = capsys.readouterr().out
    links = {r["annotations"]["dashboard"] for r in yaml.safe_load(rules_text)["groups"][0]["rules"]}
    assert links == {"https://x.example/triage/mismatches?tenant=a&deployment={{ $labels.deployment | urlquery }}#top"}
    assert cli_main(["metrics", "grafana", "--dashboard-url", url]) == 0
    board = json.loads(capsys.readouterr().out)
    assert board["links"][0]["url"] == "https://x.example/triage/mismatches?tenant=a#top"
    assert {link["url"] for p in board["panels"] for link in p["fieldConfig"]["defaults"]["links"]} == {
        "https://x.example/triage/mismatches?tenant=a&deployment=${__field.labels.deployment}#top"}
    (tmp_path / "rules.yml").write_text(rules_text)
    check = subprocess.run(["promtool", "check", "rules", "rules.yml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


@pytest.mark.parametrize("window", ["0s", "0m", "00s", "300y", "99999999999y", "5", "m", "5x", "30m1h", "", "-5m"])
def test_a_window_prometheus_refuses_is_refused_in_one_line(capsys, window):
    code = cli_main(["metrics", "rules", f"--window={window}"])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "--window" in err, err


def test_every_window_accepted_passes_promtool(tmp_path, capsys):
    for n, window in enumerate(["1ms", "90s", "1h30m", "5m30s", "1d", "2w", "292y"]):
        assert cli_main(["metrics", "rules", "--window", window]) == 0, capsys.readouterr().err
        (tmp_path / f"rules-{n}.yml").write_text(capsys.readouterr().out)
    check = subprocess.run(["promtool", "check", "rules", *(f"rules-{n}.yml" for n in range(7))], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def test_an_external_url_with_a_template_in_the_config_file_is_refused_naming_the_file(tmp_path, capsys):
    config = tmp_path / "specdec.toml"
    config.write_text('[dashboard]\nexternal_url = "https://x.example/{{ 1 }}"\n')
    for command in ("rules", "grafana"):
        assert cli_main(["metrics", command, "--config", str(config)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and str(config) in err and "external_url" in err, err
