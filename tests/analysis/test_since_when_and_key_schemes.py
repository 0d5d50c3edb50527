"""Since when and is it over (issue #44, 2), and key-scheme changes (3): on the demo incident and on logs
built to sit on each side of the rules."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from helpers import rec, write_jsonl

from specdec_core import analysis
from specdec_core.analysis import Filters
from specdec_core.derived import summaries as summary
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

ROOT = Path(__file__).resolve().parents[2]
T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Store:
    store = Store(tmp_path_factory.mktemp("demo") / "demo.duckdb")
    ingest(store, [str(ROOT / "data" / "demo" / "requests.jsonl.gz")])
    return store


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def store_of(tmp_path: Path, records: list[dict]) -> Store:
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", records))])
    return store


def incident(first_hit_after: float, hits: int, gap: float, tail: float, key: str = "svc-v1:prompt:abc") -> list:
    """A miss at T0 fills `key`; `hits` hits of another identity (max_tokens) every `gap` s from
    `first_hit_after`; a clean miss `tail` s after the last hit."""
    out = [rec("m0", ts=at(0), cache_key=key)]
    for n in range(hits):
        out.append(rec(f"h{n}", ts=at(first_hit_after + n * gap), cache_key=key, cache_hit=True, max_tokens=99))
    out.append(rec("late", ts=at(first_hit_after + (hits - 1) * gap + tail), cache_key="svc-v1:prompt:other"))
    return out


def test_the_demo_says_edge_b_was_already_contaminated_when_the_logs_begin_and_is_clean_since(demo):
    status = {s.deployment: s for s in analysis.contamination_status(demo)}
    edge_b = status["edge-b"]
    assert edge_b.contaminated_hits == 340 and edge_b.under_way_at_start and edge_b.over
    assert edge_b.sentence.startswith("340 contaminated hits, already under way when the logs begin "
                                      "(2026-11-20 08:00:03 UTC; the first logged at 2026-11-20 08:00:37 UTC)")
    assert edge_b.sentence.endswith("none since 2026-11-20 11:52:48 UTC: 2 h 06 min clean.")
    # Ordered by first hit: edge-b's comes before edge-a's.
    assert [s.deployment for s in analysis.contamination_status(demo)] == ["edge-b", "edge-a"]


def test_a_contamination_that_starts_well_after_the_logs_and_is_still_going(tmp_path):
    store = store_of(tmp_path, incident(first_hit_after=3600, hits=20, gap=30, tail=60))
    (status,) = analysis.contamination_status(store)
    assert not status.under_way_at_start and not status.over
    assert status.sentence == ("20 contaminated hits, since 2026-03-01 11:00:00 UTC; still going: the last at "
                               "2026-03-01 11:09:30 UTC, 1 min before the newest request.")


def test_one_hit_right_at_the_start_of_a_time_range_says_the_range_not_the_logs(tmp_path):
    store = store_of(tmp_path, incident(first_hit_after=3600, hits=1, gap=30, tail=3600))
    (status,) = analysis.contamination_status(store, Filters(start=T0 + timedelta(seconds=3590)))
    assert status.under_way_at_start and status.over
    assert status.sentence.startswith("1 contaminated hit, already under way when this time range begins")


def test_the_demo_key_scheme_changes_are_found_at_the_fix(demo):
    changes = analysis.key_scheme_changes(demo)
    assert [(c.deployment, c.ts.strftime("%H:%M:%S"), c.old_prefix, c.new_prefix) for c in changes] == [
        ("edge-b", "11:54:15", "specdec:edge-b-v1:model_prompt", "specdec:edge-b-v2:v1"),
        ("edge-a", "11:55:04", "specdec:edge-a-v1:prompt_only", "specdec:edge-a-v2:v1"),
    ]
    with summary.from_rows():  # the summaries' answer is the rows' answer
        assert analysis.key_scheme_changes(demo) == changes
    marks = [a for a in analysis.detected_annotations(demo) if a.kind == "key_scheme_change"]
    assert [(a.deployment, a.label) for a in marks] == [("edge-b", "edge-b: key scheme changed"),
                                                        ("edge-a", "edge-a: key scheme changed")]


def test_two_key_shapes_used_side_by_side_are_no_scheme_change(tmp_path):
    records = [rec(f"a{n}", ts=at(n * 60), cache_key=f"svc-v1:prompt:{n}") for n in range(20)]
    records += [rec(f"b{n}", ts=at(n * 60 + 30), cache_key=f"svc-v2:full:{n}") for n in range(10, 30)]
    assert analysis.key_scheme_changes(store_of(tmp_path, records)) == []
    records = [r for r in records if not (r["request_id"].startswith("a") and int(r["request_id"][1:]) >= 12)]
    (tmp_path / "cut").mkdir()
    (change,) = analysis.key_scheme_changes(store_of(tmp_path / "cut", records))
    assert (change.old_prefix, change.new_prefix) == ("svc-v1:prompt", "svc-v2:full")


def test_hit_rate_evidence_names_only_what_makes_the_flag_true(demo):
    def evidence(filters: Filters) -> str:
        return next(f for f in analysis.red_flags(demo, filters) if f.id == "hit_rate_too_good").evidence

    whole = evidence(Filters())
    # edge-a's 72% is below its 83% ceiling: its never-served hits are the reason, and the only one given.
    assert "edge-a: 62 of 481 hits (13%) were for an identity this deployment had never served before" in whole
    assert "could reach" not in whole and "core" not in whole
    hour = Filters(start=datetime(2026, 11, 20, 9, tzinfo=timezone.utc), end=datetime(2026, 11, 20, 10, tzinfo=timezone.utc))
    zoomed = evidence(hour)
    assert zoomed.startswith("edge-a: ") and "edge-b: " in zoomed and "core" not in zoomed
    assert "ceiling" in analysis.CEILING_MEANING


def test_a_holding_key_fix_after_the_last_hit_ends_the_contamination_in_a_range_too(demo):
    """Two hours of the demo ending six minutes after the last contaminated hits: too short a clean stretch for
    the hits' own rhythm, but each deployment's key fix came after its last hit and holds. The status strip and
    the window said "contaminated now" / "still going" under the fix section's "0 hits from old-scheme keys"."""
    two_hours = Filters(start=datetime(2026, 11, 20, 10, tzinfo=timezone.utc),
                        end=datetime(2026, 11, 20, 12, tzinfo=timezone.utc))
    fixes = {f.deployment: f for f in analysis.fix_status(demo, two_hours)}
    status = {s.deployment: s for s in analysis.contamination_status(demo, two_hours)}
    for deployment in ("edge-a", "edge-b"):
        s, fix = status[deployment], fixes[deployment]
        assert fix.holding and not s.clean_long_enough and s.over, deployment
        assert s.sentence.endswith(f"6 min clean, and the key fix deployed at "
                                   f"{fix.fixed_at:%Y-%m-%d %H:%M:%S} UTC holds."), s.sentence
    states = {s.deployment: s.headline for s in analysis.deployment_states(demo, two_hours)}
    assert states["edge-a"] == states["edge-b"] == "clean"


def test_a_clean_request_in_the_same_second_is_the_newest_not_the_last_hit(tmp_path):
    """The last contaminated hit 0.4 s before a clean request: not "the newest request (...) is one"."""
    store = store_of(tmp_path, incident(first_hit_after=3600, hits=20, gap=30, tail=0.4))
    (status,) = analysis.contamination_status(store)
    assert not status.over and status.sentence.endswith(
        "still going: the last at 2026-03-01 11:09:30 UTC, under a second before the newest request.")
    (tmp_path / "same").mkdir()
    store = store_of(tmp_path / "same", incident(first_hit_after=3600, hits=20, gap=30, tail=0)[:-1])
    (status,) = analysis.contamination_status(store)
    assert status.sentence.endswith("still going: the newest request (2026-03-01 11:09:30 UTC) is one.")


def test_a_change_near_a_ranges_end_is_listed_beside_the_fix_it_reports(demo):
    """Two hours ending at 12:00: edge-b's new keys began at 11:54:15, nine requests before the range ends
    (a shape counts from ten), so the range's own requests showed only edge-a's change while fix_status, which
    finds the fix in the whole log, reported both (`stats --json`: key_scheme_changes edge-a only, hits_after_fix
    both). The whole log's changes that begin inside the range are listed too; one that begins after it is not."""
    two_hours = Filters(start=datetime(2026, 11, 20, 10, tzinfo=timezone.utc),
                        end=datetime(2026, 11, 20, 12, tzinfo=timezone.utc))
    changes = analysis.key_scheme_changes(demo, two_hours)
    assert [c.deployment for c in changes] == ["edge-b", "edge-a"] == [f.deployment for f in
                                                                      analysis.fix_status(demo, two_hours)]
    assert changes == analysis.key_scheme_changes(demo)
    stats = analysis.fix_stats(demo, two_hours)
    assert [c["deployment"] for c in stats["key_scheme_changes"]] == list(stats["hits_after_fix"]) == ["edge-b", "edge-a"]
    before = Filters(start=two_hours.start, end=datetime(2026, 11, 20, 11, 54, 30, tzinfo=timezone.utc))
    assert [c.deployment for c in analysis.key_scheme_changes(demo, before)] == ["edge-b"]
