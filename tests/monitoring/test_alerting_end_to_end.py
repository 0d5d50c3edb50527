"""End to end with real parts: a log a writer appends to, `specdec ingest --follow --metrics`, Prometheus with
`specdec metrics rules`, Alertmanager, a webhook. A narrow key pages; a correct key never does."""

from __future__ import annotations

import json
import time
from datetime import datetime, timezone

import pytest
from helpers import rec, run_cli
from prom_stack import alerting_stack, ready, wait_for

DASHBOARD = "https://triage.example.com"


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def traffic(tag: str, deployment: str, narrow: bool) -> list[dict]:
    """A miss then a hit on one key: with a narrow key the hit's request differs (its max_tokens), so it is
    served another identity's output; with a correct key the hit repeats the miss's request exactly."""
    key = f"{deployment}-{tag}"
    return [rec(f"{key}-miss", ts=now(), deployment=deployment, cache_key=key, prompt=tag),
            rec(f"{key}-hit", ts=now(), deployment=deployment, cache_key=key, prompt=tag, cache_hit=True,
                max_tokens=16 if narrow else 64)]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    rules = run_cli("metrics", "rules", "--dashboard-url", DASHBOARD)
    assert rules.returncode == 0, rules.stderr
    with alerting_stack(tmp_path_factory.mktemp("alerting"), rules.stdout) as s:
        yield s


def firing(stack, alert: str, deployment: str) -> list[dict]:
    return [a for _, a in stack.hook.alerts() if a["labels"]["alertname"] == alert
            and a["labels"].get("deployment") == deployment]


def evaluated_over_what_is_scraped(stack) -> None:
    """Wait for an evaluation of every rule that reads every sample Prometheus holds now: what an alert that
    should not fire would have needed. (A webhook gets an alert only after Prometheus has it.)"""
    now = time.time()
    wait_for(lambda: stack.evaluated_after(now), 30, "a rule evaluation after the last scrape")


def alerts_about(stack, deployment: str) -> list[dict]:
    return [a for a in stack.active_alerts() if a["labels"].get("deployment") == deployment]


def test_a_narrow_key_pages_and_a_correct_key_never_does(stack):
    # Both deployments serve for a while with nothing wrong: their series exist, at 0.
    stack.append(traffic("warm", "narrow", narrow=False) + traffic("warm", "good", narrow=False))
    wait_for(lambda: stack.query('specdec_contaminated_hits_total{deployment="narrow"} == 0'), 30,
             "narrow's counter at 0")
    started = time.monotonic()
    stack.append(traffic("t1", "narrow", narrow=True) + traffic("t1", "good", narrow=False))
    alerts = wait_for(lambda: firing(stack, "SpecdecContaminatedHits", "narrow"), 60, "the page for narrow")
    latency = stack.hook.alerts()[0][0] - started
    assert latency < 20, latency
    annotations = alerts[0]["annotations"]
    assert annotations["dashboard"] == f"{DASHBOARD}/mismatches?deployment=narrow"
    assert "1 cache hit(s) on deployment narrow" in annotations["description"]

    # A deployment whose first batch already holds a contaminated hit: its counter's first sample is 1.
    stack.append(traffic("t2", "fresh", narrow=True))
    wait_for(lambda: firing(stack, "SpecdecContaminatedHits", "fresh"), 60, "the page for fresh")

    # The correct key kept serving all along: once the rules have been evaluated over its latest traffic,
    # nothing about it is pending or firing.
    stack.append(traffic("t3", "good", narrow=False))
    wait_for(lambda: stack.query('specdec_requests_total{deployment="good",cache_hit="true"} == 3'), 30,
             "good's third hit")
    evaluated_over_what_is_scraped(stack)
    assert not alerts_about(stack, "good")
    assert not [a for _, a in stack.hook.alerts() if a["labels"].get("deployment") == "good"]
    assert not stack.query('ALERTS{deployment="good"}')
    assert firing(stack, "SpecdecKeyCollisions", "narrow")  # its key now serves two identities


def test_the_figures_prometheus_holds_equal_stats(stack):
    wait_for(lambda: stack.query('specdec_requests_total{deployment="good",cache_hit="true"} == 3'), 30,
             "the first test's traffic")
    stats = json.loads(run_cli("stats", "--db", str(stack.db), "--json").stdout)

    def value(expr: str) -> float:
        return float(stack.query(expr)[0]["value"][1])

    wait_for(lambda: value("sum(specdec_requests_total)") == stats["requests"], 30, "the last batch's scrape")
    assert value("sum(specdec_contaminated_hits_total)") == stats["contaminated_hits"] == 2
    assert value("sum(specdec_key_collisions)") == stats["key_collisions"]


def test_every_grafana_panel_returns_its_series(stack):
    done = run_cli("metrics", "grafana", "--dashboard-url", DASHBOARD)
    assert done.returncode == 0, done.stderr
    board = json.loads(done.stdout)
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "deployment"]
    wait_for(lambda: stack.query('specdec_requests_total{deployment="fresh"}'), 30, "fresh's series")
    for panel in board["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$deployment", "narrow|good|fresh").replace("$__rate_interval", "1m")
            result = stack.query(expr)
            assert result, f"{panel['title']}: {expr} returned nothing"
            by_deployment = {r["metric"].get("deployment"): float(r["value"][1]) for r in result}
            if "by (deployment" in expr:
                assert {"narrow", "good", "fresh"} <= set(by_deployment), (panel["title"], by_deployment)
            if panel["title"] == "Contaminated hits over time":
                assert by_deployment["narrow"] > 0 and by_deployment["good"] == 0
            if panel["title"] == "Keys per identity":
                assert by_deployment["good"] == 1 and by_deployment["narrow"] < 1
            if panel["title"] == "Contaminated hits by differing field":
                assert {r["metric"]["field"]: float(r["value"][1]) for r in result}["max_tokens"] == 2
    # A deployment filter keeps only that deployment's series.
    only = stack.query(board["panels"][4]["targets"][0]["expr"].replace("$deployment", "good")
                       .replace("$__rate_interval", "1m"))
    assert {r["metric"]["deployment"] for r in only} == {"good"}


def test_a_follower_restart_changes_no_figure_and_pages_no_one(stack):
    def counters() -> dict[str, float]:
        return {json.dumps(r["metric"], sort_keys=True): float(r["value"][1])
                for r in stack.query('{__name__=~"specdec_.*_total"}')}

    def alerting() -> set[str]:
        return {json.dumps(a["labels"], sort_keys=True) for a in stack.active_alerts()}

    before, alerts_before, notified_before = counters(), alerting(), len(stack.hook.alerts())
    assert stack.restart_follower() == 0
    wait_for(lambda: ready(stack.exporter_url), 60, "the restarted follower's exporter")
    restarted = time.time()
    wait_for(lambda: stack.scraped_after(restarted), 30, "a scrape of the restarted follower")
    evaluated_over_what_is_scraped(stack)
    assert counters() == before
    assert alerting() == alerts_before
    assert len(stack.hook.alerts()) == notified_before
    stack.append(traffic("t4", "good", narrow=False))
    wait_for(lambda: stack.query('specdec_requests_total{deployment="good",cache_hit="true"} == 4'), 30,
             "good's fourth hit, through the restarted follower")
    evaluated_over_what_is_scraped(stack)
    assert not alerts_about(stack, "good")
    assert not [a for _, a in stack.hook.alerts() if a["labels"].get("deployment") == "good"]
