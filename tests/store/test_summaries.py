"""The summary tables answer every dashboard question exactly as the rows do, under any filter."""

from __future__ import annotations

import dataclasses
from datetime import datetime, timedelta, timezone
from pathlib import Path
from zoneinfo import ZoneInfo

import duckdb
import pandas as pd
import pytest
from helpers import DROP, contents, rec, write_jsonl

from specdec_core import analysis
from specdec_core.analysis import Filters, impact, report
from specdec_core.analysis.query import one
from specdec_core.analysis.red_flags import hit_rate_trend, shared_outputs_range_sql, shared_outputs_rows_sql
from specdec_core.demo.synthetic import make_synthetic_log
from specdec_core.derived import migrate
from specdec_core.derived import summaries as summary
from specdec_core.ingestion.load import ingest
from specdec_core.remediation import purge_plan
from specdec_core.store.connection import Store, StoreError, release_snapshots
from specdec_core.store.schema import SUMMARY_VERSION

START = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("summary")
    log = make_synthetic_log(tmp / "synthetic.jsonl", 4000, seed=5, prompts=300, start=START, hours=0.5)
    # Rows without a deployment, and one whose draft is spelled "none", join the synthetic traffic.
    extra = write_jsonl(tmp / "extra.jsonl", [
        rec("x1", ts="2026-11-20T08:03:30.5Z", deployment=None, cache_key="KX", latency_ms=12.25),
        rec("x2", ts="2026-11-20T08:03:59.999Z", deployment=None, cache_key="KX", cache_hit=True,
            max_tokens=8, output_tokens=12, temperature=0.5, seed=3, latency_ms=1.5),
        rec("x3", ts="2026-11-20T08:04:00Z", deployment="", cache_key="KX", draft_model="none",
            latency_ms=None),
        # Logs that don't say which key served a request: no key to count, share or collide on.
        rec("x4", ts="2026-11-20T08:05:10Z", deployment="edge-z", cache_key=DROP, __unknown__=["cache_key"]),
        rec("x5", ts="2026-11-20T08:05:20Z", deployment="edge-z", cache_key=DROP, __unknown__=["cache_key"],
            max_tokens=9),
        rec("x6", ts="2026-11-20T08:05:30Z", deployment="edge-z", cache_key=DROP, __unknown__=["cache_key"],
            max_tokens=9, cache_hit=True),
        # A gateway that logs no sampling parameters on its hits: logging gaps, counted per minute.
        rec("x7", ts="2026-11-20T08:06:10Z", deployment="edge-y", cache_key="KY", temperature=DROP, seed=DROP,
            cache_hit=True, __unknown__=["seed", "temperature"]),
        rec("x8", ts="2026-11-20T08:06:20Z", deployment="edge-y", cache_key="KY", temperature=DROP,
            cache_hit=True, __unknown__=["temperature"]),
        # Hits on keys of edge-a's old scheme after its fix began (08:18:01): the rollout is not holding.
        rec("x9", ts="2026-11-20T08:20:00Z", deployment="edge-a", cache_key="edge-a:p:0001", cache_hit=True),
        rec("x10", ts="2026-11-20T08:21:30.5Z", deployment="edge-a", cache_key="edge-a:p:0001", cache_hit=True),
        # An engine that overran max_tokens, and a clean hit that served its output again: a violation whose
        # source the Impact page names (found in hit_sources, not in the contaminated hits' summaries).
        rec("x11", ts="2026-11-20T08:07:00Z", deployment="edge-v", cache_key="KV", max_tokens=8, output_tokens=12,
            experiment="arm-src"),
        rec("x12", ts="2026-11-20T08:07:30Z", deployment="edge-v", cache_key="KV", max_tokens=8, output_tokens=12,
            cache_hit=True),
        # LiteLLM's hits log no sampling parameters: a clean one is its source's identity, not another one; one
        # that names another draft is. x16 knows more than x14, and is still the miss's identity.
        rec("x13", ts="2026-11-20T08:08:00Z", deployment="edge-w", cache_key="KW", temperature=0.7, seed=4),
        *(rec(f"x{n}", ts=ts, deployment="edge-w", cache_key="KW", cache_hit=True, temperature=DROP, seed=DROP,
              top_p=DROP, max_tokens=DROP, __unknown__=["max_tokens", "seed", "temperature", "top_p"], **more)
          for n, ts, more in ((14, "2026-11-20T08:08:30Z", {}), (15, "2026-11-20T08:09:00Z", {"draft_model": "d-9"}))),
        rec("x16", ts="2026-11-20T08:25:00Z", deployment="edge-w", cache_key="KW", cache_hit=True, temperature=DROP,
            seed=4, __unknown__=["temperature"]),
    ])
    s = Store(tmp / "summary.duckdb")
    result = ingest(s, [str(log), str(extra)])
    assert result.quarantined == 0 and result.accepted == 4016
    return s


def _copy(store: Store, path: Path) -> Store:
    path.write_bytes(store.path.read_bytes())
    return Store(path)


def _tamper(store: Store, *statements: str) -> None:
    """Change a file store as another program would (an older specdec, another DuckDB, a hand)."""
    release_snapshots()  # our read views hold the file: let go before writing it in place
    con = duckdb.connect(str(store.path))
    for statement in statements:
        con.execute(statement)
    con.close()


def _ts(store: Store, n: int) -> datetime:
    """The n-th request's timestamp (a row lies exactly on the bound)."""
    with store.read() as con:
        return con.execute("SELECT ts FROM requests ORDER BY ts, request_id LIMIT 1 OFFSET ?", [n]).fetchall()[0][0]


def _filters(store: Store) -> dict[str, Filters]:
    options = analysis.filter_options(store)
    deployments, targets, drafts = options.deployments, options.target_models, options.draft_models
    return {
        "none": Filters(),
        "deployment": Filters(deployments=(deployments[-1],)),
        "no deployment": Filters(deployments=("",)),
        "target and draft": Filters(target_models=(targets[0],), draft_models=(drafts[0], "none")),
        "off-minute range": Filters(start=START + timedelta(minutes=2, seconds=17.25),
                                    end=START + timedelta(minutes=21, seconds=3.5)),
        "range on row timestamps": Filters(start=_ts(store, 500), end=_ts(store, 3100)),
        "range on minute bounds": Filters(start=START + timedelta(minutes=3), end=START + timedelta(minutes=4)),
        "within one minute": Filters(start=START + timedelta(minutes=7, seconds=5),
                                     end=START + timedelta(minutes=7, seconds=40)),
        "start only": Filters(start=START + timedelta(minutes=11, seconds=59)),
        "end only": Filters(end=START + timedelta(minutes=4)),
        "range and deployment": Filters(start=START + timedelta(minutes=1, seconds=1),
                                        end=START + timedelta(minutes=9, seconds=2), deployments=(deployments[0],)),
        "naive and other-zone bounds": Filters(start=(START + timedelta(minutes=5, seconds=30)).replace(tzinfo=None),
                                               end=(START + timedelta(minutes=9, seconds=45)).astimezone(
                                                   timezone(timedelta(hours=5, minutes=30)))),
        "injection": Filters(deployments=("x' OR 1=1 --",)),
        "empty window": Filters(start=START - timedelta(days=2), end=START - timedelta(days=1)),
    }


def _busiest(impacts: list[impact.Impact]) -> list[impact.Impact]:
    """The consumer with the most wrong outputs, and the one without a name."""
    ranked = sorted(impacts, key=lambda i: (-(i.contaminated_hits + i.length_violations), i.value))
    return [*ranked[:1], *(i for i in ranked[1:] if i.value == "")]


QUESTIONS = {
    "headline": lambda s, f: pd.DataFrame([analysis.headline(s, f)]),
    "hit_rate_by_combination": analysis.hit_rate_by_combination,
    "hit_rate_over_time": lambda s, f: analysis.hit_rate_over_time(s, f, bucket="1 minute"),
    "hit_rate_over_time_auto": analysis.hit_rate_over_time,
    "mismatch_rate_over_time": lambda s, f: analysis.mismatch_rate_over_time(s, f, bucket="5 minutes"),
    "contamination_window": analysis.contamination_window,
    "acceptance_by_combination": analysis.acceptance_by_combination,
    "key_ratio_by_deployment": analysis.key_ratio_by_deployment,
    "key_collisions": analysis.key_collisions,
    "output_length_by_max_tokens": analysis.output_length_by_max_tokens,
    "latency_hit_vs_miss": analysis.latency_hit_vs_miss,
    "contaminated_hits": analysis.contaminated_hits,
    "time_bucket": lambda s, f: pd.DataFrame([{"bucket": analysis.time_bucket(s, f)}]),
    "impact_by_consumer": lambda s, f: pd.DataFrame([i.as_json() for i in impact.impact(s, "consumer", f)]),
    "impact_by_experiment": lambda s, f: pd.DataFrame([i.as_json() for i in impact.impact(s, "experiment", f)]),
    "experiment_impact": lambda s, f: pd.json_normalize([a.as_json() for a in impact.experiment_impact(s, f).arms]),
    "wrong_outputs_over_time": lambda s, f: impact.wrong_outputs_over_time(s, f, bucket="5 minutes"),
    "cross_feeding": lambda s, f: pd.DataFrame(impact.experiment_impact(s, f).as_json()["cross_feeding"]),
    # A consumer's affected requests, as the Impact page lists the first of them, and their count.
    "affected_requests": lambda s, f: pd.concat([impact.affected_requests(s, i.value, f, limit=limit).assign(
        consumer_total=impact.affected_count(s, i.value, f), limit=limit)
        for i in _busiest(impact.impact(s, "consumer")) for limit in (1, 7, 10_000)]),
    # The Output length page's list of violations (its first rows) and their hits' sources.
    "length_violations": lambda s, f: pd.concat([analysis.length_violations(s, f, limit=limit).assign(limit=limit)
                                                 for limit in (1, 7, 10_000)]),
    # The Export page's counts and preview (the report's first rows).
    "report": lambda s, f: pd.concat([report.mismatch_report(s, f, limit=limit).assign(limit=limit)
                                      for limit in (1, 7, 10_000)]).assign(**report.report_counts(s, f)),
    "purge_plan": lambda s, f: pd.DataFrame([e.to_json() for e in purge_plan(s, f)]),
    "logging_gaps": lambda s, f: pd.DataFrame([g.__dict__ for g in analysis.logging_gaps(s, f)]),
    "fix_status": lambda s, f: pd.DataFrame([{**st.__dict__, "old_prefixes": str(st.old_prefixes)}
                                             for st in analysis.fix_status(s, f)]),
    "hit_rate_trend": lambda s, f: pd.DataFrame([hit_rate_trend(s, f)]),
    "red_flags": lambda s, f: pd.DataFrame([{**flag.to_json(), "numbers": str(flag.numbers)}
                                            for flag in analysis.red_flags(s, f)]),
}


def _same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    # Sums of doubles may differ in the last bits when added in another order.
    pd.testing.assert_frame_equal(a.reset_index(drop=True), b.reset_index(drop=True), check_dtype=False,
                                  rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("question", QUESTIONS)
def test_every_question_answers_the_same_from_summaries_and_rows(store, question):
    ask = QUESTIONS[question]
    checked = 0
    for name, f in _filters(store).items():
        with summary.from_rows():
            expected = ask(store, f)
        got = ask(store, f)
        try:
            _same(got, expected)
        except AssertionError as exc:
            raise AssertionError(f"{question} under filter {name!r}: {exc}") from None
        checked += len(expected)
    assert checked > 0  # the filters select something


def test_shared_outputs_by_their_hashes_answer_as_the_rows_where_no_identity_is_partial(store):
    """A store that holds partial identities asks the rows for a time range's shared outputs (a hash can't say which
    identity stands for a partial one): the hashes' answer is checked here on the deployments that hold none."""
    picked = [d for d in analysis.filter_options(store).deployments if d.startswith("edge-") and d not in
              ("edge-y", "edge-w", "edge-z")]
    checked = 0
    for name, f in _filters(store).items():
        if f.start is None and f.end is None:
            continue
        f = dataclasses.replace(f, deployments=tuple(picked))
        with summary.from_rows():
            expected = one(store, shared_outputs_rows_sql, f)
        assert one(store, shared_outputs_rows_sql, f, ranged=shared_outputs_range_sql) == expected, name
        checked += expected["shared_outputs"]
    assert checked > 0


def test_filter_options_come_from_the_summary_alike(store):
    with summary.from_rows():
        expected = analysis.filter_options(store)
    assert analysis.filter_options(store) == expected
    assert "" in expected.deployments and "none" in expected.draft_models


def test_summaries_answer_when_ready_and_rows_otherwise(store, tmp_path):
    # Plant a wrong count in a copy's summary: the default path must show it, the row path must not.
    copy = _copy(store, tmp_path / "copy.duckdb")
    _tamper(copy, "UPDATE summary_minute SET requests = requests + 1000 WHERE rowid = 0")
    real = analysis.headline(store).requests
    assert analysis.headline(copy).requests == real + 1000
    with summary.from_rows():
        assert analysis.headline(copy).requests == real
    # Summaries of another version: a read refuses (it never writes); migrate rebuilds, dropping the planted count.
    _tamper(copy, "UPDATE meta SET value = 'old' WHERE key = 'summary_version'")
    before = copy.path.read_bytes()
    with pytest.raises(StoreError, match="specdec migrate"):
        analysis.headline(copy)
    assert copy.path.read_bytes() == before
    assert migrate(copy) == ["rejudged hits and rebuilt summaries"]
    assert analysis.headline(copy).requests == real
    with copy.read() as con:
        assert summary.ready(con)
    assert migrate(copy) == []  # nothing left to do


def test_key_hashes_another_duckdb_wrote_are_rebuilt_before_they_are_counted(store, tmp_path):
    # The same summary version, written by a DuckDB whose hash() differs: its stored hashes can't be mixed with ours.
    copy = _copy(store, tmp_path / "other-hash.duckdb")
    _tamper(copy, f"UPDATE meta SET value = '{SUMMARY_VERSION}.0' WHERE key = 'summary_version'",
            "UPDATE summary_request_keys SET key_hash = key_hash + 1, identity_hash = 0")
    with pytest.raises(StoreError, match="specdec migrate"):
        analysis.headline(copy)
    assert migrate(copy) == ["rejudged hits and rebuilt summaries"]
    window = Filters(start=START + timedelta(minutes=2, seconds=17.25), end=START + timedelta(minutes=21))
    assert analysis.headline(copy, window) == analysis.headline(store, window)
    with copy.read() as con:
        assert con.execute("SELECT count(*) FROM summary_request_keys k JOIN requests r "
                           "ON r.ts = k.ts AND k.key_hash = hash(coalesce(r.deployment, ''), r.cache_key) AND "
                           "k.identity_hash = hash(coalesce(r.deployment, ''), r.fingerprint)").fetchall()[0][0] == 4013


def test_a_store_from_an_older_version_is_brought_up_to_date_by_migrate(store, tmp_path):
    # Written before summaries and before hit_sources had source_ts: the Mismatches page reads both.
    old = _copy(store, tmp_path / "old.duckdb")
    _tamper(old, "DROP TABLE summary_minute; DROP TABLE summary_contaminated; "
                 "ALTER TABLE hit_sources DROP COLUMN source_ts; DELETE FROM meta WHERE key = 'summary_version'")
    with pytest.raises(StoreError, match="older specdec"):
        analysis.contaminated_hits(old)
    changes = migrate(old)
    assert changes[0] == "added column hit_sources.source_ts" and changes[-1] == "rejudged hits and rebuilt summaries"
    hits = analysis.contaminated_hits(old)
    assert len(hits) == len(analysis.contaminated_hits(store)) > 0 and hits["source_ts"].notna().any()
    with old.read() as con:
        assert summary.ready(con)


def test_summaries_one_step_older_get_the_step_alone(store, tmp_path):
    """Version 12 lacked summary_violations: migrate builds it, judges no hit again, and the store answers as one
    built by this version. A store whose hashes another DuckDB computed is still rebuilt whole."""
    old = _copy(store, tmp_path / "v12.duckdb")
    _tamper(old, "DROP TABLE summary_violations",
            "UPDATE meta SET value = '12.' || split_part(value, '.', 2) WHERE key = 'summary_version'",
            # A verdict changed by hand: a rejudge would set it right again; the step leaves it.
            "UPDATE hit_sources SET differing_fields = 'marked' WHERE request_id = 'x2'")
    with pytest.raises(StoreError, match="specdec migrate"):
        analysis.headline(old)
    assert migrate(old) == [f"brought the summaries up to version {SUMMARY_VERSION}"]
    with old.read() as con, store.read() as fresh:
        assert summary.ready(con)
        violations = "SELECT * FROM summary_violations ORDER BY ts, request_id"
        assert con.execute(violations).fetchall() == fresh.execute(violations).fetchall() != []
        assert con.execute("SELECT differing_fields FROM hit_sources WHERE request_id = 'x2'").fetchall() == [("marked",)]
    _tamper(old, "UPDATE meta SET value = '12.0' WHERE key = 'summary_version'")
    assert migrate(old) == ["rejudged hits and rebuilt summaries"]
    with old.read() as con:
        assert con.execute("SELECT differing_fields FROM hit_sources WHERE request_id = 'x2'").fetchall() != [("marked",)]


def test_the_partitions_version_13_wrote_with_nul_are_rewritten(store, tmp_path):
    """Version 13 stored NUL as the partition of requests that log no deployment (a lake's catalog query broke on
    it): migrate rewrites it, and the store holds what this version builds."""
    old = _copy(store, tmp_path / "v13.duckdb")
    _tamper(old, "UPDATE meta SET value = '13.' || split_part(value, '.', 2) WHERE key = 'summary_version'",
            *(f"UPDATE {table} SET dep = chr(0) WHERE dep = chr(1)" for table in ("identity_first_seen", "key_last_miss")))
    con = duckdb.connect(str(old.path), read_only=True)
    assert con.execute("SELECT count(*) FROM identity_first_seen WHERE dep = chr(0)").fetchall()[0][0] > 0
    con.close()
    assert migrate(old) == [f"brought the summaries up to version {SUMMARY_VERSION}"]
    assert contents(str(old.path)) == contents(str(store.path))


def test_version_14_gets_its_partial_hits_and_aliases_alone(store, tmp_path):
    """Version 14 had no identity_aliases and no partial_hits: migrate adds them, judges no hit again (a hand's
    change to a verdict stays), and the store then holds what this version builds."""
    old = _copy(store, tmp_path / "v14.duckdb")
    _tamper(old, "UPDATE meta SET value = '14.' || split_part(value, '.', 2) WHERE key = 'summary_version'",
            "DROP TABLE identity_aliases",
            *(f"ALTER TABLE {t} DROP COLUMN partial_hits" for t in ("summary_minute", "summary_keys", "summary_shared_keys")),
            "UPDATE hit_sources SET differing_fields = 'marked' WHERE request_id = 'x2'")
    assert migrate(old)[-1] == f"brought the summaries up to version {SUMMARY_VERSION}"
    migrated, fresh = contents(str(old.path)), contents(str(store.path))
    assert ("x2", "marked") in {(r[0], r[4]) for r in migrated.pop("hit_sources")}
    fresh.pop("hit_sources")
    assert migrated == fresh
    assert len(fresh["identity_aliases"]) == 3  # x13 stands for x14 and x16, x8 (knowing seed) for x7


def test_a_later_ingest_rebuilds_the_summaries(tmp_path):
    s = Store(tmp_path / "two.duckdb")
    ingest(s, [str(write_jsonl(tmp_path / "a.jsonl", [rec("m1", ts="2026-03-01T10:00:00Z", cache_key="K")]))])
    assert analysis.headline(s).contaminated_hits == 0
    later = [rec("h1", ts="2026-03-01T10:00:30Z", cache_key="K", cache_hit=True, max_tokens=99)]
    ingest(s, [str(write_jsonl(tmp_path / "b.jsonl", later))])
    head = analysis.headline(s)
    assert (head.requests, head.hits, head.contaminated_hits) == (2, 1, 1)
    assert list(analysis.contaminated_hits(s)["source_request_id"]) == ["m1"]


def test_a_time_ranges_cut_minutes_are_read_once_per_state_and_again_after_a_write(tmp_path):
    # Each question of a page aggregates the minutes a range cuts through from the rows; a state of the file
    # keeps them once aggregated (at 20M rows 0.3-0.6 s a question). A write is a new state: read again.
    store = Store(tmp_path / "s.duckdb")
    rows = [rec(f"r{i}", ts=f"2026-03-01T10:{i // 60:02d}:{i % 60:02d}Z", cache_key=f"K{i % 7}", cache_hit=i % 3 > 0)
            for i in range(600)]
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", rows))])
    cut = Filters(start=datetime(2026, 3, 1, 10, 0, 30, tzinfo=timezone.utc),
                  end=datetime(2026, 3, 1, 10, 7, 29, 500000, tzinfo=timezone.utc))

    def kept() -> int:
        with store.read() as con:
            return con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = 'memory' "
                               "AND table_name LIKE 'specdec_edges_%'").fetchall()[0][0]

    def answers() -> tuple:
        with summary.from_rows():
            expected = (analysis.headline(store, cut), analysis.logging_gaps(store, cut))
        got = (analysis.headline(store, cut), analysis.logging_gaps(store, cut))
        assert got == expected
        return got

    assert kept() == 0
    first = answers()
    assert first[0].requests == 420 and kept() == 1  # both questions, one aggregate
    # The same instants with another UTC (a page's sidebar gave pytz's): the same aggregate, not one more.
    same = Filters(start=cut.start.astimezone(ZoneInfo("UTC")), end=cut.end.astimezone(ZoneInfo("UTC")))
    assert analysis.headline(store, same) == first[0] and kept() == 1
    ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("late", ts="2026-03-01T10:00:45Z", cache_key="K1",
                                                              cache_hit=True, seed=DROP, __unknown__=["seed"])]))])
    second = answers()
    assert second[0].requests == 421 and second != first and kept() == 1
