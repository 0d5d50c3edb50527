"""`specdec stats` takes the dashboard's filters (issue #55, item 9): the same numbers for the same selection."""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone

from helpers import DROP, rec, run_cli, write_jsonl

from specdec_core.analysis import Filters, headline, logging_gaps
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store


def test_stats_filters_give_the_numbers_the_dashboard_shows_for_them(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [
        rec("a1", ts="2026-03-01T10:00:00Z"), rec("a2", ts="2026-03-01T10:05:00Z", cache_hit=True, max_tokens=2),
        rec("b1", ts="2026-03-01T10:06:00Z", deployment="staging", cache_key="k-9"),
        rec("a3", ts="2026-03-01T11:00:00Z", cache_key="k-3"),
    ]))])
    done = run_cli("stats", "--db", str(store.path), "--json", "--deployment", "prod", "--start",
                   "2026-03-01T10:01:00", "--end", "2026-03-01T10:30:00Z")
    assert done.returncode == 0, done.stderr
    shown = json.loads(done.stdout)
    chosen = Filters(start=datetime(2026, 3, 1, 10, 1, tzinfo=timezone.utc),
                     end=datetime(2026, 3, 1, 10, 30, tzinfo=timezone.utc), deployments=("prod",))
    assert shown["requests"] == headline(store, chosen).requests == 1
    assert shown["contaminated_hits"] == 1 and shown["length_violations"] == 1
    # Times as every other --json of the CLI writes them (impact, cache plan, the key scheme changes).
    assert (shown["first_ts"], shown["last_ts"]) == ("2026-03-01T10:05:00.000Z", "2026-03-01T10:05:00.000Z")
    assert json.loads(run_cli("stats", "--db", str(store.path), "--json").stdout)["requests"] == 4


def test_an_end_given_as_a_date_alone_runs_through_that_day(tmp_path):
    """`--start 2026-03-01 --end 2026-03-01` is that day, not its first instant; a time without a fraction is
    through its last figure's second (or minute), one with a fraction that instant."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [
        rec("a1", ts="2026-03-01T00:00:00Z"), rec("a2", ts="2026-03-01T23:59:59.999999Z"),
        rec("a3", ts="2026-03-02T00:00:00Z"),
    ]))])

    def requests(*bounds: str) -> int:
        done = run_cli("stats", "--db", str(store.path), "--json", *bounds)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["requests"]

    assert requests("--start", "2026-03-01", "--end", "2026-03-01") == 2
    assert requests("--end", "2026-03-01T00:00:00Z") == 1
    assert requests("--end", "2026-03-01T23:59:59Z") == requests("--end", "2026-03-01T23:59Z") == 2
    assert requests("--end", "2026-03-01T23:59:59.000Z") == 1
    assert requests("--start", "2026-03-02", "--end", "2026-03-02") == 1
    assert requests("--start", "20260301", "--end", "20260301") == 2  # the basic form too
    # RFC 3339's lowercase separator and zone, as `specdec cache plan --since/--until` reads them.
    assert requests("--start", "2026-03-01t23:59:59z", "--end", "2026-03-02t00:00:00z") == 2


def test_the_times_the_cli_shows_can_be_given_back_to_it(tmp_path):
    """`specdec stats` writes its time range as `2026-03-01 10:00:00 UTC`, to the second; pasted into --start or
    --end, or `specdec cache plan --since/--until`, it selects from that instant and through that whole second:
    the last request, logged later in the second shown, is kept."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [  # a contaminated hit on each of two keys
        rec("a1", ts="2026-03-01T10:00:00Z"), rec("a2", ts="2026-03-01T10:05:00.250Z", cache_hit=True, max_tokens=2),
        rec("b1", ts="2026-03-01T10:30:00Z", cache_key="k-9"),
        rec("b2", ts="2026-03-01T11:00:00.999Z", cache_key="k-9", cache_hit=True, max_tokens=2),
    ]))])
    whole = run_cli("stats", "--db", str(store.path)).stdout
    [first, last] = re.search(r"time range +(.+ UTC) \.\. (.+ UTC)\n", whole).groups()
    assert (first, last) == ("2026-03-01 10:00:00 UTC", "2026-03-01 11:00:00 UTC")
    done = run_cli("stats", "--db", str(store.path), "--json", "--start", "2026-03-01 10:05:00 UTC", "--end", last)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["requests"] == 3
    plan = run_cli("cache", "plan", "--db", str(store.path), "--since", first, "--until", "2026-03-01 10:05:00 utc",
                   "--out", str(tmp_path / "plan.jsonl"), "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout.splitlines()[-1])["contaminated"] == 1  # a2's key; b2's comes after --until
    # A zone said twice is no time: which one was meant?
    twice = run_cli("stats", "--db", str(store.path), "--start", "2026-03-01 10:05:00+02:00 UTC")
    assert twice.returncode == 2 and "'2026-03-01 10:05:00+02:00 UTC' is not an ISO 8601 time" in twice.stderr


def test_a_bad_time_is_one_line_naming_it(tmp_path):
    done = run_cli("stats", "--db", str(tmp_path / "none.duckdb"), "--start", "yesterday")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "'yesterday' is not an ISO 8601 time" in done.stderr


def test_a_selection_without_requests_has_no_logging_gaps_and_no_time_range(tmp_path):
    """Every field is "never set" among no requests: that says nothing of the log, the dashboard's Overview and
    stats alike (both read logging_gaps)."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [
        rec("a1", ts="2026-03-01T10:00:00Z"),
        rec("a2", ts="2026-03-01T10:05:00Z", cache_hit=True, temperature=DROP, __unknown__=["temperature"]),
    ]))])
    assert [g.field for g in logging_gaps(store)] == ["temperature"]
    for chosen in (Filters(deployments=("staging",)), Filters(start=datetime(2026, 3, 2, tzinfo=timezone.utc))):
        assert logging_gaps(store, chosen) == []
    whole = run_cli("stats", "--db", str(store.path)).stdout.splitlines()
    assert "time range                2026-03-01 10:00:00 UTC .. 2026-03-01 10:05:00 UTC" in whole
    assert [line.split(None, 2)[2] for line in whole if line.startswith("logging gap")] == [
        "temperature unknown on 1 of 1 hits: contamination through it cannot be seen here; log it"]
    none = run_cli("stats", "--db", str(store.path), "--deployment", "staging").stdout.splitlines()
    assert "time range                no requests" in none
    assert not [line for line in none if line.startswith("logging gap")]


def test_a_filter_the_store_cannot_match_is_said_on_standard_error(tmp_path):
    """A misspelt deployment gives an empty answer: said, so it does not read as nothing having happened."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [rec("a1", ts="2026-03-01T10:00:00Z")]))])
    done = run_cli("stats", "--db", str(store.path), "--json", "--deployment", "prdo", "--deployment", "prod")
    assert done.returncode == 0 and json.loads(done.stdout)["requests"] == 1
    assert done.stderr == "specdec stats: no deployment 'prdo' in this store (it holds: prod)\n"
    plan = run_cli("cache", "plan", "--db", str(store.path), "--out", str(tmp_path / "plan.jsonl"),
                   "--since", "2026-03-01T11:00:00Z", "--until", "2026-03-01T10:00:00Z")
    assert plan.returncode == 0
    assert plan.stderr == "specdec cache plan: the time range starts after it ends: no request can be in it\n"
    assert run_cli("stats", "--db", str(store.path), "--deployment", "prod").stderr == ""


def test_names_from_the_log_reach_the_terminal_as_escapes_not_as_control_sequences(tmp_path):
    """A deployment or key prefix holding an escape sequence can't clear the on-call engineer's terminal or
    colour a fake line: the key fix sentence and the names a filter can't match are written with escapes."""
    sequence = "\x1b[2J\x1b[31mFAKE\x1b[0m\r"
    deployment = f"edge{sequence}"
    records = [rec(f"r{i}", ts=f"2026-03-01T10:{i:02d}:00Z", deployment=deployment,  # a key scheme change at 10:20
                   cache_key=f"v1{sequence}:p{i % 2}" if i < 20 else f"v2:full:{i}") for i in range(40)]
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", records))])
    shown = "edge\\x1b[2J\\x1b[31mFAKE\\x1b[0m\\r"
    done = run_cli("stats", "--db", str(store.path))
    [fix] = [line for line in done.stdout.splitlines() if line.startswith("key fix")]
    assert fix.split()[2].startswith(shown), fix
    unmatched = run_cli("stats", "--db", str(store.path), "--deployment", "edge")
    assert unmatched.stderr == f"specdec stats: no deployment 'edge' in this store (it holds: {shown})\n"
    said = done.stdout + done.stderr + unmatched.stdout + unmatched.stderr
    assert "\x1b" not in said and "\r" not in said
