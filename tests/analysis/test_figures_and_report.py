"""Metrics and the mismatch report on a hand-built incident whose answers are known."""

from __future__ import annotations

import csv
import hashlib
import io
import random
from datetime import datetime, timezone

import pytest
from helpers import DROP, instant, rec, run_cli, write_csv, write_jsonl

from specdec_core import analysis
from specdec_core import contract as metrics_contract
from specdec_core.analysis import Filters
from specdec_core.analysis.report import mismatch_report, report_counts, report_csv
from specdec_core.contract.identity import identity
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store


def at(minute: int) -> str:
    return f"2026-03-01T10:{minute:02d}:00Z"


A = {"draft_model": "d1"}  # greedy, the defaults of logfactory.BASE
B = {"draft_model": "d2", "temperature": 0.7, "seed": 5}
C = {"draft_model": "d1", "max_tokens": 16}
D = {"draft_model": "d1", "max_tokens": 8}
OTHER_MODEL_IDENTITY = identity(rec("x", target_model="other-model"))

INCIDENT = [
    rec("m1", ts=at(0), cache_key="K1", **A, output_text="A's answer", output_tokens=12),
    rec("h1", ts=at(1), cache_key="K1", cache_hit=True, **B, output_text="A's answer", output_tokens=12),
    # A again, spelled differently: top_k 0, stop [] and an offset timestamp are all equivalent.
    rec("h2", ts="2026-03-01T12:02:00+02:00", cache_key="K1", cache_hit=True, **A, top_k=0, stop=[],
        output_text="A's answer", output_tokens=12),
    rec("h3", ts=at(3), cache_key="K2", cache_hit=True),  # its source is before the log window
    rec("h4", ts=at(4), cache_key="K3", cache_hit=True, cached_fingerprint=OTHER_MODEL_IDENTITY),
    # TTL expiry: C re-populates K1, and A and D are then served C's output.
    rec("m2", ts=at(5), cache_key="K1", **C, output_text="C's answer", output_tokens=16),
    rec("h5", ts=1772359560000, cache_key="K1", cache_hit=True, **A, output_text="C's answer",
        output_tokens=16),  # 10:06 as epoch milliseconds
    rec("h6", ts=at(7), cache_key="K1", cache_hit=True, **D, output_text="C's answer", output_tokens=16),
    # Greedy requests that differ only in seed share an identity.
    rec("m3", ts=at(8), cache_key="K4", seed=1),
    rec("h7", ts=at(9), cache_key="K4", cache_hit=True, seed=2),
    # Another deployment uses the same key string; it is not prod's source.
    rec("c1", ts=at(10), cache_key="K1", deployment="canary", temperature=0.3, seed=1),
    rec("h8", ts=at(11), cache_key="K1", cache_hit=True, **C, output_text="C's answer", output_tokens=16),
    # A redacted log compares equal to the same prompt logged in full.
    rec("m4", ts=at(12), cache_key="K5", prompt="P2"),
    rec("h9", ts=at(13), cache_key="K5", cache_hit=True, prompt=DROP,
        prompt_hash=hashlib.sha256(b"P2").hexdigest()),
]

EXPECTED_CONTAMINATED = {
    "h1": ("m1", "draft_model;temperature"),
    "h4": (None, "target_model"),
    "h5": ("m2", "max_tokens"),
    "h6": ("m2", "max_tokens"),
}


@pytest.fixture(scope="module")
def incident(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("incident")
    lines = INCIDENT[:]
    random.Random(3).shuffle(lines)  # all ordering uses ts, never line order
    store = Store(tmp / "incident.duckdb")
    result = ingest(store, [str(write_jsonl(tmp / "incident.jsonl", lines))])
    assert result.accepted == len(INCIDENT)
    return store


def test_headline_numbers(incident):
    h = analysis.headline(incident)
    assert h.requests == 14
    assert h.hits == 9
    assert h.hit_rate == pytest.approx(9 / 14)
    assert h.contaminated_hits == 4
    assert h.contaminated_rate == pytest.approx(4 / 9)
    assert h.length_violations == 1
    assert h.key_collisions == 1


def test_contaminated_hits_name_their_source_and_differing_fields(incident):
    frame = analysis.contaminated_hits(incident)
    got = {r.request_id: (r.source_request_id if isinstance(r.source_request_id, str) else None,
                          r.differing_fields) for r in frame.itertuples()}
    assert got == EXPECTED_CONTAMINATED
    assert frame.set_index("request_id").loc["h4", "fingerprint_mismatch"]


def test_key_collisions_group_by_deployment_and_key(incident):
    frame = analysis.key_collisions(incident)
    assert [(r.deployment, r.cache_key, r.identities, r.requests) for r in frame.itertuples()] == [
        ("prod", "K1", 4, 7)
    ]
    identities = analysis.key_collision_identities(incident, "prod", "K1")
    assert sorted(identities["requests"]) == [1, 1, 2, 3]  # B, D; C (m2, h8); A (m1, h2, h5)


def test_unique_key_ratio_and_the_hit_rate_a_correct_key_could_reach(incident):
    frame = analysis.key_ratio_by_deployment(incident).set_index("deployment")
    prod = frame.loc["prod"]
    # A, B, C, D, the base request (h3, h4, m3, h7: greedy, so seed does not count) and P2 (m4, h9).
    assert (prod.unique_keys, prod.unique_identities) == (5, 6)
    assert prod.max_correct_hit_rate == pytest.approx(1 - 6 / 13)
    assert prod.hit_rate == pytest.approx(9 / 13)
    # h1 (B), h3 (the base request: its entry predates the log) and h6 (D) hit on identities never seen before.
    assert prod.first_sight_hits == 3


def test_output_length_by_max_tokens_counts_violations(incident):
    frame = analysis.output_length_by_max_tokens(incident).set_index("max_tokens")
    assert frame.loc[8, "violations"] == 1 and frame.loc[8, "max"] == 16
    assert frame["violations"].sum() == 1
    assert list(analysis.length_violations(incident)["request_id"]) == ["h6"]


def test_acceptance_rate_and_mean_accepted_length(incident):
    frame = analysis.acceptance_by_combination(incident)
    # Every miss drafted 8 and accepted 6 with 4 tokens per step: 2 steps, 3 tokens accepted per step.
    assert set(frame["acceptance_rate"].round(6)) == {0.75}
    assert set(frame["mean_accepted_length"].round(6)) == {3.0}
    assert frame["decoded_requests"].sum() == 5  # the misses


def test_filters_narrow_every_number_and_injection_is_data(incident):
    canary = analysis.headline(incident, Filters(deployments=("canary",)))
    assert (canary.requests, canary.hits, canary.contaminated_hits) == (1, 0, 0)
    window = Filters(start=datetime(2026, 3, 1, 10, 5, tzinfo=timezone.utc),
                     end=datetime(2026, 3, 1, 10, 7, tzinfo=timezone.utc))
    assert analysis.headline(incident, window).contaminated_hits == 2  # h5, h6
    assert analysis.headline(incident, Filters(draft_models=("d2",))).contaminated_hits == 1
    canary_flags = {f.id: f.flagged for f in analysis.red_flags(incident, Filters(deployments=("canary",)))}
    assert canary_flags["impossible_lengths"] is False and canary_flags["few_keys"] is False
    injected = Filters(deployments=("x' OR 1=1 --",), target_models=("'; DROP TABLE requests; --",))
    assert analysis.headline(incident, injected).requests == 0
    assert analysis.headline(incident).requests == 14


def test_red_flags_fire_on_the_incident(incident):
    flags = {f.id: f for f in analysis.red_flags(incident)}
    assert flags["impossible_lengths"].flagged is True
    assert flags["few_keys"].flagged is True
    assert flags["hit_rate_too_good"].flagged is True
    assert flags["biased_experiments"].flagged is True
    assert flags["replay_disagrees"].flagged is None  # nothing replayed yet
    assert "1 request returned more tokens" in flags["impossible_lengths"].evidence


def test_clean_log_raises_no_flag(tmp_path):
    store = Store(tmp_path / "clean.duckdb")
    records = [rec("a", ts=at(0), cache_key="KA"), rec("b", ts=at(1), cache_key="KA", cache_hit=True),
               rec("c", ts=at(2), cache_key="KC", prompt="other")]
    ingest(store, [str(write_jsonl(tmp_path / "clean.jsonl", records))])
    flags = {f.id: f.flagged for f in analysis.red_flags(store)}
    assert flags == {"identical_outputs": False, "replay_disagrees": None, "biased_experiments": False,
                     "impossible_lengths": False, "hit_rate_too_good": False, "few_keys": False}


EXPECTED_REPORT = [
    ["h1", "2026-03-01T10:01:00.000Z", "contaminated_hit", "K1", "m1", "draft_model;temperature",
     "llama-8b", "d2", "0.7", "64", "tok-v1"],
    ["h4", "2026-03-01T10:04:00.000Z", "contaminated_hit", "K3", "", "target_model",
     "llama-8b", "llama-1b", "0.0", "64", "tok-v1"],
    ["h5", "2026-03-01T10:06:00.000Z", "contaminated_hit", "K1", "m2", "max_tokens",
     "llama-8b", "d1", "0.0", "64", "tok-v1"],
    ["h6", "2026-03-01T10:07:00.000Z", "contaminated_hit", "K1", "m2", "max_tokens",
     "llama-8b", "d1", "0.0", "8", "tok-v1"],
    ["h6", "2026-03-01T10:07:00.000Z", "length_violation", "K1", "", "",
     "llama-8b", "d1", "0.0", "8", "tok-v1"],
]
CONTRACT_COLUMNS = ["request_id", "ts", "kind", "cache_key", "source_request_id", "differing_fields",
                    "target_model", "draft_model", "temperature", "max_tokens", "tokenizer_version"]


def _contract_rows(data: bytes) -> list[list[str]]:
    rows = list(csv.DictReader(io.StringIO(data.decode("utf-8"))))
    return [[row[c] for c in CONTRACT_COLUMNS] for row in rows]


def test_report_rows_for_the_planted_incident(incident):
    assert _contract_rows(report_csv(mismatch_report(incident))) == EXPECTED_REPORT


def test_report_counts_and_a_preview_agree_with_the_whole_report(incident):
    # The Export page shows these two without building the whole report.
    assert report_counts(incident) == {"contaminated_hit": 4, "length_violation": 1, "replay_mismatch": 0}
    assert report_counts(incident, kinds=["length_violation"]) == {"length_violation": 1}
    late = Filters(start=datetime(2026, 3, 1, 10, 5, tzinfo=timezone.utc))
    assert report_counts(incident, late) == {"contaminated_hit": 2, "length_violation": 1, "replay_mismatch": 0}
    assert _contract_rows(report_csv(mismatch_report(incident, limit=2))) == EXPECTED_REPORT[:2]
    with pytest.raises(ValueError, match="report kind nope is unknown"):
        report_counts(incident, kinds=["nope"])


def test_report_ts_keeps_the_precision_the_log_had(tmp_path):
    store = Store(tmp_path / "us.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "us.jsonl", [
        rec("m", ts="2026-03-01T10:00:00.5Z"),
        rec("h", ts="2026-03-01T12:00:00.123456+02:00", cache_hit=True, max_tokens=8),
        rec("v", ts=1772359200007, output_tokens=99),
    ]))])
    rows = {(r["request_id"], r["kind"]): r["ts"]
            for r in csv.DictReader(io.StringIO(report_csv(mismatch_report(store)).decode()))}
    assert rows == {("h", "contaminated_hit"): "2026-03-01T10:00:00.123456Z",
                    ("v", "length_violation"): "2026-03-01T10:00:00.007Z"}


def test_report_cli_writes_the_same_file(incident, tmp_path):
    out = tmp_path / "report.csv"
    done = run_cli("report", "--db", str(incident.path), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert _contract_rows(out.read_bytes()) == EXPECTED_REPORT
    only = tmp_path / "lengths.csv"
    assert run_cli("report", "--db", str(incident.path), "--out", str(only), "--kind", "length_violation").returncode == 0
    assert _contract_rows(only.read_bytes()) == EXPECTED_REPORT[-1:]


def test_report_cli_takes_the_export_pages_filters(incident, tmp_path):
    """`report --start ...`: the rows the Export page downloads for the same selection."""
    late = Filters(start=datetime(2026, 3, 1, 10, 5, tzinfo=timezone.utc))
    done = run_cli("report", "--db", str(incident.path), "--out", "-", "--start", "2026-03-01 10:05:00 UTC")
    assert done.returncode == 0, done.stderr
    assert done.stdout.encode() == report_csv(mismatch_report(incident, late))
    kinds = [r["kind"] for r in csv.DictReader(io.StringIO(done.stdout))]
    assert sorted(kinds) == ["contaminated_hit", "contaminated_hit", "length_violation"], "as report_counts says"
    elsewhere = run_cli("report", "--db", str(incident.path), "--out", "-", "--deployment", "nowhere")
    assert elsewhere.stdout.splitlines()[1:] == []
    assert elsewhere.stderr.splitlines()[0].startswith("specdec report: no deployment 'nowhere' in this store")


@pytest.mark.parametrize("fmt", ["csv", "parquet", "jsonl.gz"])
def test_the_same_incident_in_another_format_gives_the_same_report(tmp_path, incident, fmt):
    import gzip

    import duckdb

    src = write_jsonl(tmp_path / "incident.jsonl", INCIDENT)
    path = tmp_path / f"incident.{fmt}"
    if fmt == "jsonl.gz":
        path.write_bytes(gzip.compress(src.read_bytes()))
    elif fmt == "parquet":
        con = duckdb.connect()
        con.execute(f"COPY (SELECT * FROM read_json('{src}', union_by_name = true)) TO '{path}' (FORMAT parquet)")
        con.close()
    else:
        write_csv(path, INCIDENT)
    store = Store(tmp_path / f"{fmt}.duckdb")
    assert ingest(store, [str(path)]).accepted == len(INCIDENT)
    assert _contract_rows(report_csv(mismatch_report(store))) == EXPECTED_REPORT


SAMPLED = {"temperature": 0.7, "seed": 5, "top_p": 0.9, "top_k": 40, "num_speculative_tokens": 4}
# One change per identity field; the red flag must fire whichever field the shared output hides.
IDENTITY_CHANGES = {
    "prompt": "A different question.", "target_model": "llama-70b", "draft_model": "llama-3b",
    "num_speculative_tokens": 6, "temperature": 0.9, "top_p": 0.8, "top_k": 20, "max_tokens": 32, "seed": 6,
    "stop": ["\n"], "tokenizer_version": "tok-v2",
}


def test_every_identity_field_has_a_change_in_the_red_flag_test():
    assert set(IDENTITY_CHANGES) == set(metrics_contract.IDENTITY_FIELDS)


@pytest.mark.parametrize("field", sorted(IDENTITY_CHANGES))
def test_identical_outputs_fires_when_requests_differ_only_in(field, tmp_path):
    # Three keys; on each, a miss then a hit that differs from it only in `field` and gets its output.
    records = []
    for n in range(3):
        out = {"output_text": f"answer {n}", "output_tokens": 3}
        records.append(rec(f"m{n}", ts=at(2 * n), cache_key=f"K{n}", prompt=f"Question {n}?", **SAMPLED, **out))
        records.append(rec(f"h{n}", ts=at(2 * n + 1), cache_key=f"K{n}", cache_hit=True,
                           **{"prompt": f"Question {n}?", **SAMPLED, field: IDENTITY_CHANGES[field]}, **out))
    store = Store(tmp_path / "one-field.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "one-field.jsonl", records))])
    flags = {f.id: f for f in analysis.red_flags(store)}
    assert flags["identical_outputs"].flagged is True, flags["identical_outputs"].evidence
    assert flags["identical_outputs"].numbers["shared_outputs"] == 3


def test_identical_outputs_stays_quiet_for_greedy_requests_that_differ_only_in_their_draft(tmp_path):
    # Greedy speculative decoding is lossless: one output for two drafts is no symptom by itself.
    records = [rec("m", ts=at(0), cache_key="K", draft_model="d1"),
               rec("h", ts=at(1), cache_key="K", cache_hit=True, draft_model="d2")]
    store = Store(tmp_path / "greedy.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "greedy.jsonl", records))])
    assert {f.id: f for f in analysis.red_flags(store)}["identical_outputs"].numbers["shared_outputs"] == 0


def test_a_hit_that_logs_no_sampling_parameters_counts_as_another_identity_only_where_a_known_field_differs(
        tmp_path):
    """LiteLLM logs no sampling parameters on a hit. A clean one is its miss's identity: no shared output, one
    identity, no collision, the hit rate within what a correct key reaches. One whose draft differs is another."""
    unknown = {**SAMPLED, "temperature": DROP, "seed": DROP, "top_p": DROP, "max_tokens": DROP,
               "__unknown__": ["max_tokens", "seed", "temperature", "top_p"]}
    records = [rec("m", ts=at(0), cache_key="K", **SAMPLED, output_text="answer"),
               rec("h1", ts=at(1), cache_key="K", cache_hit=True, output_text="answer", **unknown)]
    store = Store(tmp_path / "clean.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "clean.jsonl", records))])
    head, flags = analysis.headline(store), {f.id: f for f in analysis.red_flags(store)}
    assert (head.unique_identities, head.key_collisions) == (1, 0)
    assert flags["identical_outputs"].numbers["shared_outputs"] == 0
    assert flags["hit_rate_too_good"].flagged is False and flags["few_keys"].flagged is False
    # Whether the hit was its identity's first sight can't be told: not counted as served before either.
    assert analysis.key_ratio_by_deployment(store).partial_hits.tolist() == [1]
    assert "whether its 1 hit served identities never served before can't be told" in (
        flags["hit_rate_too_good"].evidence)
    later = [rec("h2", ts=at(2), cache_key="K", cache_hit=True, output_text="answer", draft_model="other", **unknown)]
    ingest(store, [str(write_jsonl(tmp_path / "later.jsonl", later))])
    head, flags = analysis.headline(store), {f.id: f for f in analysis.red_flags(store)}
    assert (head.unique_identities, head.key_collisions, head.contaminated_hits) == (2, 1, 1)
    assert flags["identical_outputs"].numbers["shared_outputs"] == 1 and flags["identical_outputs"].flagged
    # The arm of a temperature the log left unknown is named so (its NULL made the whole name None).
    assert "llama-8b / other / T unknown: 1 of 1" in flags["biased_experiments"].evidence
    window = Filters(start=instant(at(0)), end=instant(at(1)))
    assert {f.id: f for f in analysis.red_flags(store, window)}["identical_outputs"].numbers["shared_outputs"] == 0


def test_whether_a_hit_is_another_identity_does_not_hang_on_which_greedy_log_came_first(tmp_path):
    """A greedy identity leaves its seed out: one miss that logged the seed unknown and one that logged it share the
    identity, and the hit both stand for is not another identity, whichever file was read first."""
    m1 = rec("m1", ts=at(0), cache_key="K", seed=DROP, __unknown__=["seed"])
    m2 = rec("m2", ts=at(1), cache_key="K", seed=7)
    h = rec("h", ts=at(2), cache_key="K", cache_hit=True, seed=7, temperature=DROP, __unknown__=["temperature"])
    for name, batches in (("unknown-first", ([m1], [m2, h])), ("known-first", ([m2], [m1, h]))):
        store = Store(tmp_path / f"{name}.duckdb")
        for n, batch in enumerate(batches):
            ingest(store, [str(write_jsonl(tmp_path / f"{name}-{n}.jsonl", batch))])
        head = analysis.headline(store)
        assert (head.unique_identities, head.key_collisions) == (1, 0), name
