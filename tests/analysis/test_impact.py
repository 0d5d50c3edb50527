"""Who was hurt: `specdec impact` per consumer, arm and deployment, and the arms' figures without their
contaminated hits; the summaries' answers equal the rows'."""

from __future__ import annotations

import csv
import io
import json
from datetime import datetime, timezone

import duckdb
import pytest
from helpers import rec, run_cli, write_jsonl

from specdec_core.analysis import Filters
from specdec_core.analysis.impact import (
    affected_csv,
    affected_requests,
    experiment_impact,
    impact,
    wrong_outputs_over_time,
)
from specdec_core.contract.identity import DecodeRequest, identity
from specdec_core.derived.summaries import from_rows
from specdec_core.ingestion import ingest
from specdec_core.store import Store
from specdec_core.store.connection import release_snapshots


def _ts(minute: int, second: int = 0) -> str:
    return f"2026-03-01T10:{minute:02d}:{second:02d}.000Z"


def _records() -> list[dict]:
    other = identity(DecodeRequest.from_record(rec("x", max_tokens=999)))
    # Sampled: a greedy output shared across drafts is harmless (speculative decoding is lossless).
    return [{**r, "temperature": 0.7} for r in [
        # K: arm A's miss, then arm B's hit on it (contaminated: another draft), then arm A's own hit (clean).
        rec("m1", ts=_ts(0), cache_key="K", consumer="t1", experiment="A", draft_model="d1", output_tokens=10,
            latency_ms=100.0, draft_tokens=8, accepted_tokens=6),
        rec("h1", ts=_ts(1), cache_key="K", cache_hit=True, consumer="t2", experiment="B", draft_model="d2",
            output_tokens=10, latency_ms=5.0, draft_tokens=None, accepted_tokens=None),
        rec("h2", ts=_ts(2), cache_key="K", cache_hit=True, consumer=None, experiment="A", draft_model="d1",
            output_tokens=10, latency_ms=4.0, draft_tokens=None, accepted_tokens=None),
        # K2: arm B's over-long miss, then arm A's hit on it (contaminated).
        rec("m2", ts=_ts(3), cache_key="K2", consumer="t2", experiment="B", draft_model="d2", max_tokens=8,
            output_tokens=12, latency_ms=200.0, draft_tokens=10, accepted_tokens=2),
        rec("h3", ts=_ts(4), cache_key="K2", cache_hit=True, consumer="t1", experiment="A", draft_model="d1",
            max_tokens=8, output_tokens=12, latency_ms=6.0, draft_tokens=None, accepted_tokens=None),
        # K3: a hit whose source is not in the log, its logged fingerprint another identity's.
        rec("h4", ts=_ts(5), cache_key="K3", cache_hit=True, consumer=None, experiment="B", cached_fingerprint=other,
            output_tokens=3, latency_ms=7.0, draft_tokens=None, accepted_tokens=None, deployment="edge"),
    ]]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Store:
    folder = tmp_path_factory.mktemp("impact")
    db = folder / "s.duckdb"
    result = ingest(Store(db), [str(write_jsonl(folder / "log.jsonl", _records()))])
    assert result.accepted == 6
    return Store(db)


def _at(minute: int) -> datetime:
    return datetime(2026, 3, 1, 10, minute, tzinfo=timezone.utc)


def test_each_consumer_gets_its_contaminated_hits_and_violations_with_their_first_and_last(store):
    rows = {i.value: i for i in impact(store, "consumer")}
    assert set(rows) == {"t1", "t2", ""}
    assert (rows["t1"].requests, rows["t1"].contaminated_hits, rows["t1"].length_violations) == (2, 1, 1)
    assert (rows["t1"].first, rows["t1"].last) == (_at(4), _at(4))  # h3: contaminated and over its limit
    assert (rows["t2"].requests, rows["t2"].contaminated_hits, rows["t2"].length_violations) == (2, 1, 1)
    assert (rows["t2"].first, rows["t2"].last) == (_at(1), _at(3))
    assert (rows[""].requests, rows[""].contaminated_hits, rows[""].length_violations) == (2, 1, 0)
    assert rows[""].first == _at(5)


def test_impact_by_experiment_and_deployment(store):
    arms = {i.value: (i.requests, i.contaminated_hits, i.length_violations) for i in impact(store, "experiment")}
    assert arms == {"A": (3, 1, 1), "B": (3, 2, 1)}
    deployments = {i.value: i.contaminated_hits for i in impact(store, "deployment")}
    assert deployments == {"prod": 2, "edge": 1}


def test_cross_feeding_names_the_arm_whose_output_each_arm_received(store):
    feeding = {(c.arm, c.served_from): c.hits for c in experiment_impact(store).cross_feeding}
    assert feeding == {("B", "A"): 1, ("A", "B"): 1, ("B", ""): 1}


def test_each_arm_is_read_again_without_its_contaminated_hits(store):
    arms = {a.arm: a for a in experiment_impact(store).arms}
    a, b = arms["A"], arms["B"]
    assert (a.requests.all, a.requests.clean) == (3, 2)
    assert a.mean_output_tokens.all == pytest.approx(32 / 3) and a.mean_output_tokens.clean == pytest.approx(10)
    assert a.mean_latency_ms.all == pytest.approx(110 / 3) and a.mean_latency_ms.clean == pytest.approx(52)
    assert (a.acceptance_rate.all, a.acceptance_rate.clean) == (pytest.approx(6 / 8), pytest.approx(6 / 8))
    assert (b.requests.all, b.requests.clean) == (3, 1)
    assert b.mean_latency_ms.all == pytest.approx(212 / 3) and b.mean_latency_ms.clean == pytest.approx(200)
    assert b.mean_latency_ms.difference == pytest.approx(212 / 3 - 200)


def test_the_summaries_answer_as_the_rows_do_and_a_time_range_reads_the_rows(store):
    whole = Filters(start=_at(0), end=_at(59))
    for by in ("consumer", "experiment", "deployment"):
        summarised = impact(store, by)
        with from_rows():
            assert impact(store, by) == summarised
        assert impact(store, by, whole) == summarised
    summarised = experiment_impact(store).as_json()
    with from_rows():
        rows = experiment_impact(store)
    assert [a.arm for a in rows.arms] == [a["arm"] for a in summarised["arms"]]
    for got, want in zip(rows.arms, summarised["arms"], strict=True):
        for figure in ("requests", "mean_output_tokens", "mean_latency_ms", "acceptance_rate"):
            assert getattr(got, figure).as_json() == pytest.approx(want[figure])
    later = {i.value: i.requests for i in impact(store, "consumer", Filters(start=_at(3)))}
    assert later == {"t1": 1, "t2": 1, "": 1}
    assert {i.value: i.contaminated_hits for i in impact(store, "deployment", Filters(deployments=("edge",)))} == {
        "edge": 1}


def test_a_consumers_affected_requests_and_wrong_outputs_over_time(store):
    t2 = affected_requests(store, "t2")
    assert list(zip(t2.request_id, t2.kind, t2.served_from, strict=True)) == [
        ("h1", "contaminated_hit", "A"), ("m2", "length_violation", "")]
    assert affected_csv(store, "t2").decode().splitlines()[1].startswith("h1,2026-03-01T10:01:00.000Z,contaminated_hit,t2,B")
    over = wrong_outputs_over_time(store, bucket="1 hour")
    assert dict(zip(over.consumer, over.wrong, strict=True)) == {"t1": 2, "t2": 2, "": 1}


def test_the_cli_prints_the_contracts_json(store, tmp_path):
    release_snapshots()
    done = run_cli("impact", "--db", str(store.path), "--json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)
    assert all(set(r) == {"value", "requests", "contaminated_hits", "length_violations", "first", "last"} for r in rows)
    assert {r["value"]: r["first"] for r in rows}["t2"] == "2026-03-01T10:01:00.000Z"
    by_arm = json.loads(run_cli("impact", "--db", str(store.path), "--by", "experiment", "--json").stdout)
    assert {r["value"] for r in by_arm} == {"A", "B"}
    done = run_cli("impact", "--db", str(store.path), "--experiments", "--json")
    result = json.loads(done.stdout)
    assert set(result) == {"cross_feeding", "arms"}
    assert {"arm": "B", "served_from": "A", "hits": 1} in result["cross_feeding"]
    arm = next(a for a in result["arms"] if a["arm"] == "A")
    assert set(arm) == {"arm", "requests", "mean_output_tokens", "mean_latency_ms", "acceptance_rate"}
    assert arm["requests"] == {"all": 3, "clean": 2}
    table = run_cli("impact", "--db", str(store.path))
    assert table.returncode == 0 and "t2" in table.stdout and "(none)" in table.stdout
    missing = run_cli("impact", "--db", str(tmp_path / "nothing.duckdb"))
    assert missing.returncode == 1 and len(missing.stderr.strip().splitlines()) == 1
    assert run_cli("impact", "--db", str(store.path), "--by", "tenant").returncode == 2


def test_the_cli_writes_the_affected_requests_of_every_consumer_or_of_one(store, tmp_path):
    """What the Impact page downloads for one consumer, from the terminal, for one or all of them at once."""
    release_snapshots()
    out = tmp_path / "affected.csv"
    done = run_cli("impact", "--db", str(store.path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"wrote 4 affected requests (every consumer) to {out}"
    rows = list(csv.DictReader(out.open(newline="", encoding="utf-8")))
    assert [(r["consumer"], r["request_id"], r["kind"]) for r in rows] == [
        ("", "h4", "contaminated_hit"), ("t1", "h3", "contaminated_hit"),
        ("t2", "h1", "contaminated_hit"), ("t2", "m2", "length_violation")]
    assert out.read_bytes() == affected_csv(store, None)
    one = run_cli("impact", "--db", str(store.path), "--out", "-", "--consumer", "t2")
    assert one.returncode == 0 and one.stdout.encode() == affected_csv(store, "t2")
    assert one.stderr.strip() == "wrote 2 affected requests (t2) to standard output"
    unnamed = run_cli("impact", "--db", str(store.path), "--out", "-", "--consumer", "")
    assert [r["request_id"] for r in csv.DictReader(io.StringIO(unnamed.stdout))] == ["h4"]
    nobody = run_cli("impact", "--db", str(store.path), "--out", str(tmp_path / "t3.csv"), "--consumer", "t3")
    assert nobody.returncode == 0
    assert nobody.stderr.strip() == "specdec impact: no consumer 't3' in this store (it holds: (none), t1, t2)"
    for wrong in (["--consumer", "t2"], ["--out", "-", "--by", "experiment"], ["--out", "-", "--experiments"],
                  ["--out", "-", "--json"], ["--out", str(store.path)]):
        done = run_cli("impact", "--db", str(store.path), *wrong)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, (wrong, done.stderr)
    assert Store(store.path).exists, "the store was not overwritten"


def test_the_cli_takes_the_sidebars_filters_and_answers_as_the_page_does(store, tmp_path):
    """`impact --start/--end/--deployment...`: the figures the Impact page shows for the same selection."""
    release_snapshots()
    chosen = Filters(start=_at(1), end=_at(4))
    window = ["--start", "2026-03-01 10:01:00 UTC", "--end", "2026-03-01T10:04:00Z"]
    rows = json.loads(run_cli("impact", "--db", str(store.path), *window, "--json").stdout)
    assert rows == [r.as_json() for r in impact(store, "consumer", chosen)]
    assert {r["value"]: r["contaminated_hits"] for r in rows} == {"t1": 1, "t2": 1, "": 0}, "h4 (10:05) is outside"
    arms = json.loads(run_cli("impact", "--db", str(store.path), *window, "--experiments", "--json").stdout)
    assert arms == experiment_impact(store, chosen).as_json()
    done = run_cli("impact", "--db", str(store.path), *window, "--out", "-")
    assert done.stdout.encode() == affected_csv(store, None, chosen)
    assert [r["request_id"] for r in csv.DictReader(io.StringIO(done.stdout))] == ["h3", "h1", "m2"]
    edge = run_cli("impact", "--db", str(store.path), "--deployment", "edge", "--deployment", "edgy", "--json")
    assert [r["value"] for r in json.loads(edge.stdout)] == [""], "only h4 is on edge, and it names no consumer"
    assert edge.stderr.startswith("specdec impact: no deployment 'edgy' in this store (it holds: ")


def test_the_affected_requests_csv_shows_log_text_and_never_runs_it(tmp_path):
    """A consumer's name and an output's first characters come from the log: the customer notice's CSV shows
    them in a spreadsheet, not runs them as formulas, and a carriage return in one does not split its row."""
    who, said = '=HYPERLINK("http://example.invalid/?leak","open")', "@SUM(1+1)\rsecond line"
    log = write_jsonl(tmp_path / "log.jsonl", [
        rec("m", ts=_ts(0), cache_key="K", temperature=0.7, draft_model="d1", consumer="-1", output_text=said),
        rec("h", ts=_ts(1), cache_key="K", temperature=0.7, draft_model="d2", cache_hit=True, consumer=who,
            output_text=said)])
    db = Store(tmp_path / "s.duckdb")
    assert ingest(db, [str(log)]).accepted == 2

    def read(data: bytes) -> list[dict[str, str]]:
        return list(csv.DictReader(io.StringIO(data.decode("utf-8"), newline="")))

    [row] = read(affected_csv(db, who))
    assert (row["request_id"], row["consumer"], row["output_preview"]) == ("h", "'" + who, "'" + said)
    [row] = read(affected_csv(db, who, raw=True))
    assert (row["consumer"], row["output_preview"]) == (who, said)
    [row] = read(affected_csv(db, None))
    assert (row["consumer"], row["output_preview"]) == ("'" + who, "'" + said)
    release_snapshots()
    done = run_cli("impact", "--db", str(db.path), "--out", str(tmp_path / "a.csv"), "--consumer", who)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "a.csv").read_bytes() == affected_csv(db, who)


def test_a_store_made_before_the_fields_gains_them_on_migrate(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K"), rec("h", cache_key="K", cache_hit=True,
                                                                             max_tokens=32)])
    db = tmp_path / "old.duckdb"
    assert run_cli("ingest", str(log), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE requests DROP COLUMN consumer; ALTER TABLE requests DROP COLUMN experiment; "
                "DROP TABLE summary_audience; DROP TABLE summary_impact_hits; "
                "UPDATE meta SET value = '10' WHERE key = 'summary_version'")
    con.close()
    assert run_cli("impact", "--db", str(db)).returncode == 1  # reads never write: they ask for the migrate
    assert run_cli("migrate", "--db", str(db)).returncode == 0
    rows = json.loads(run_cli("impact", "--db", str(db), "--json").stdout)
    assert rows == [{"value": "", "requests": 2, "contaminated_hits": 1, "length_violations": 0,
                     "first": "2026-03-01T10:00:00.000Z", "last": "2026-03-01T10:00:00.000Z"}]


def test_a_lake_store_fed_in_two_batches_answers_as_the_file_store(store, tmp_path):
    lake = Store(f"ducklake:{tmp_path / 'lake' / 's.sqlite'}")
    records = _records()
    for i, part in enumerate((records[:3], records[3:])):
        assert ingest(lake, [str(write_jsonl(tmp_path / f"part{i}.jsonl", part))]).accepted == len(part)
    for by in ("consumer", "experiment", "deployment"):
        assert impact(lake, by) == impact(store, by)
    assert experiment_impact(lake).cross_feeding == experiment_impact(store).cross_feeding
