"""`specdec ingest --format otel|litellm|auto` and `--map` on fixtures made by the real libraries
(tests/fixtures/formats: LiteLLM 1.110 payloads, OpenTelemetry SDK spans), against their known answers."""

from __future__ import annotations

import contextlib
import csv
import json
import math
from datetime import datetime, timezone
from pathlib import Path

import pytest
from helpers import run_cli

from specdec_core import analysis, remediation
from specdec_core.derived import summaries
from specdec_core.monitoring.figures import read_figures
from specdec_core.store import Store

FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"
TRUTH = json.loads((FIXTURES / "truth.json").read_text())
COUNTS = ("read", "accepted", "duplicates", "quarantined", "skipped")


def ingest(tmp_path: Path, name: str, *options: str) -> tuple[dict, Path]:
    db = tmp_path / "store.duckdb"
    done = run_cli("ingest", str(FIXTURES / name), "--db", str(db), "--json", *options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), db


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """ingest() of a fixture, once per module for each set of options: the tests that only read it share it."""
    done: dict[tuple[str, ...], tuple[dict, Path]] = {}

    def load(name: str, *options: str) -> tuple[dict, Path]:
        if (name, *options) not in done:
            done[(name, *options)] = ingest(tmp_path_factory.mktemp("fixture"), name, *options)
        return done[(name, *options)]

    return load


def report_rows(db: Path, tmp_path: Path) -> list[dict]:
    out = tmp_path / "report.csv"
    done = run_cli("report", "--db", str(db), "--out", str(out))
    assert done.returncode == 0, done.stderr
    with open(out, newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


def contaminated(rows: list[dict]) -> dict[str, tuple[str, str]]:
    return {r["request_id"]: (r["source_request_id"], r["differing_fields"])
            for r in rows if r["kind"] == "contaminated_hit"}


def expected_contaminated(truth: dict) -> dict[str, tuple[str, str]]:
    return {c["request_id"]: (c["source_request_id"], c["differing_fields"]) for c in truth["contaminated"]}


@pytest.mark.parametrize(("name", "fmt"), [("otel_spans.jsonl", "otel"), ("litellm_payloads.jsonl", "litellm")])
def test_counts_contamination_and_length_violations_match_the_known_answers(name, fmt, tmp_path, loaded):
    truth = TRUTH[name]
    counts, db = loaded(name, "--format", fmt)
    assert {k: counts[k] for k in COUNTS} == truth["counts"]
    rows = report_rows(db, tmp_path)
    assert contaminated(rows) == expected_contaminated(truth)
    assert {r["request_id"] for r in rows if r["kind"] == "length_violation"} == \
        {v["request_id"] for v in truth["length_violations"]}


@pytest.mark.parametrize("name", ["otel_spans.jsonl", "litellm_payloads.jsonl"])
def test_auto_picks_the_format_from_the_first_record_and_says_so(name, tmp_path):
    db = tmp_path / "auto.duckdb"
    done = run_cli("ingest", str(FIXTURES / name), "--db", str(db))
    assert done.returncode == 0, done.stderr
    fmt = "otel" if name.startswith("otel") else "litellm"
    assert f"{name}: {fmt} (the format --format auto chose)\n" in done.stderr
    assert json.loads(run_cli("stats", "--json", "--db", str(db)).stdout)["requests"] == \
        TRUTH[name]["counts"]["accepted"]


def _as_utc(text: str) -> datetime:
    # The store keeps microseconds: nanoseconds in the log are cut, not rounded.
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").astimezone(timezone.utc)


def _assert_stored_as(db: Path, expected: dict, unknown: list[str] | None = None) -> None:
    stored = analysis.request_record(Store(db), expected["request_id"])
    assert stored is not None, expected["request_id"]
    for field, value in expected.items():
        got = stored[field]
        if field == "ts":
            assert got == _as_utc(value)
        elif field == "top_p" and value is None:
            assert got == 1.0  # the contract's default
        elif field == "stop" and value is not None:
            assert list(got) == value
        elif isinstance(value, float):
            assert math.isclose(got, value, rel_tol=1e-9), (field, got, value)
        else:
            assert got == value, (field, got, value)
    if unknown is not None:
        assert sorted(stored["unknown_fields"] or []) == sorted(unknown)


@pytest.mark.parametrize(("name", "fmt"), [("otel_spans.jsonl", "otel"), ("litellm_payloads.jsonl", "litellm")])
def test_records_are_mapped_field_by_field_as_the_contract_says(name, fmt, loaded):
    _, db = loaded(name, "--format", fmt)
    for case in TRUTH[name]["expected_records"].values():
        _assert_stored_as(db, case["record"], case.get("unknown_fields"))


def test_a_litellm_hit_differing_only_in_unknown_fields_is_not_contaminated_and_the_gap_is_said(tmp_path, loaded):
    truth = TRUTH["litellm_payloads.jsonl"]
    _, db = loaded("litellm_payloads.jsonl", "--format", "litellm")
    found = contaminated(report_rows(db, tmp_path))
    for case in truth["invisible_contamination"]:
        assert case["request_id"] not in found
    stats = json.loads(run_cli("stats", "--json", "--db", str(db)).stdout)
    gaps = {g["field"]: g for g in stats["logging_gaps"]}
    hits = truth["unknown_on_hits"]["hits"]
    for field, n in truth["unknown_on_hits"]["fields"].items():
        assert gaps[field]["unknown_hits"] == n and gaps[field]["hits"] == hits
    assert f"max_tokens unknown on {hits} of {hits} hits" in run_cli("stats", "--db", str(db)).stdout


def test_a_litellm_miss_takes_the_cache_key_of_the_hits_it_sourced(loaded):
    truth = TRUTH["litellm_payloads.jsonl"]
    _, db = loaded("litellm_payloads.jsonl", "--format", "litellm")
    for label, key in truth["miss_cache_keys"].items():
        assert analysis.request_record(Store(db), truth["labels"][label])["cache_key"] == key


def test_a_logged_source_link_wins_over_deployment_and_time(loaded):
    truth = TRUTH["litellm_payloads.jsonl"]
    _, db = loaded("litellm_payloads.jsonl", "--format", "litellm")
    h14 = analysis.request_record(Store(db), truth["labels"]["H14"])
    assert h14["source_request_id"] == truth["labels"]["M1"] and h14["deployment"] != "dep-a"


@pytest.mark.parametrize(("name", "fmt"), [("otel_bad.jsonl", "otel"), ("litellm_bad.jsonl", "litellm")])
def test_bad_lines_are_quarantined_with_their_line_and_the_rest_loads(name, fmt, loaded):
    truth = TRUTH[name]
    counts, db = loaded(name, "--format", fmt)
    assert {k: counts[k] for k in COUNTS} == truth["counts"]
    quarantined = analysis.quarantined_records(Store(db))
    assert sorted(quarantined["source_line"]) == sorted(q["line"] for q in truth["quarantine"])
    assert all(r and "\n" not in r for r in quarantined["reason"])
    with Store(db).read() as con:
        accepted = {r[0] for r in con.execute("SELECT request_id FROM requests").fetchall()}
        quotes = dict(con.execute("SELECT source_line, raw FROM quarantine").fetchall())
    assert accepted == set(truth["accepted_request_ids"])
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    for line, quote in quotes.items():
        if fmt == "otel" and line == 4:
            # A span read but rejected by the contract is quoted as its input (the span with its resource),
            # read again from the file, not as the contract record made from it.
            quoted = json.loads(quote)
            assert set(quoted) == {"resource", "span"} and "otel-req-007" in quote
            assert quoted["span"] in [s for r in json.loads(lines[3])["resourceSpans"]
                                      for sc in r["scopeSpans"] for s in sc["spans"]]
        else:
            assert quote == lines[line - 1]  # a line no reader could read: quoted as it was


def test_a_mapping_file_reads_any_json_lines(tmp_path):
    truth = TRUTH["mapping/custom.jsonl"]["custom_map.toml"]
    counts, db = ingest(tmp_path, "mapping/custom.jsonl", "--map", str(FIXTURES / "mapping" / "custom_map.toml"))
    assert {k: counts[k] for k in COUNTS} == truth["counts"]
    rows = report_rows(db, tmp_path)
    assert contaminated(rows) == expected_contaminated(truth)
    for case in truth["expected_records"].values():
        _assert_stored_as(db, case["record"])


def test_a_mapping_to_a_missing_path_quarantines_every_record_naming_the_field(tmp_path):
    counts, db = ingest(tmp_path, "mapping/custom.jsonl", "--map", str(FIXTURES / "mapping" / "bad_map.toml"))
    assert {k: counts[k] for k in COUNTS} == TRUTH["mapping/custom.jsonl"]["bad_map.toml"]["counts"]
    assert set(analysis.quarantined_records(Store(db))["reason"]) == {"missing required field: output_text"}


@pytest.mark.parametrize(("mapping", "named"), [("invalid_map.toml", "temprature"), ("invalid_unit_map.toml", "minutes")])
def test_a_bad_mapping_file_is_a_one_line_usage_error_naming_the_field(mapping, named, tmp_path):
    db = tmp_path / "none.duckdb"
    done = run_cli("ingest", str(FIXTURES / "mapping" / "custom.jsonl"), "--db", str(db),
                   "--map", str(FIXTURES / "mapping" / mapping))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and named in done.stderr
    assert not db.exists()


@pytest.mark.parametrize(("name", "fmt"), [("otel_spans.jsonl", "otel"), ("litellm_payloads.jsonl", "litellm")])
def test_a_line_past_the_size_limit_is_cut_and_quarantined_before_the_format_reads_it(name, fmt, tmp_path):
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    limit = max(len(line.encode()) for line in lines) + 1  # every line of the fixture fits
    long_line = lines[0][:-1] + ', "padding": "' + "p" * limit + '"}'  # the first line, grown past it
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join([long_line, *lines[1:]]) + "\n", encoding="utf-8")
    db = tmp_path / "store.duckdb"
    done = run_cli("ingest", str(log), "--db", str(db), "--json", "--format", fmt, "--max-record-bytes", str(limit))
    assert done.returncode == 0, done.stderr
    with Store(db).read() as con:
        [(line, reason, raw)] = con.execute("SELECT source_line, reason, raw FROM quarantine").fetchall()
    assert (line, reason) == (1, f"record too large: {len(long_line.encode()):,} bytes (limit {limit:,} bytes)")
    assert raw.startswith(long_line[:limit - 100]) and "[cut by specdec: the first " in raw


@pytest.mark.parametrize(("name", "fmt"), [("otel_spans.jsonl", "otel"), ("litellm_payloads.jsonl", "litellm")])
def test_a_line_nested_past_what_python_reads_is_quarantined_and_the_rest_loads(name, fmt, tmp_path, loaded):
    # Python's JSON reader recurses once a level: 100,000 levels raised RecursionError out of the ingest.
    lines = (FIXTURES / name).read_text(encoding="utf-8").splitlines()
    key = "resourceSpans" if fmt == "otel" else "messages"
    deep = '{"' + key + '": ' + "[" * 100_000 + "]" * 100_000 + "}"
    log = tmp_path / "log.jsonl"
    log.write_text("\n".join([lines[0], deep, *lines[1:]]) + "\n", encoding="utf-8")
    db = tmp_path / "store.duckdb"
    done = run_cli("ingest", str(log), "--db", str(db), "--json", "--format", fmt)
    assert done.returncode == 0, done.stderr
    whole, _ = loaded(name, "--format", fmt)  # the fixture alone
    counts = json.loads(done.stdout)
    assert counts["quarantined"] == whole["quarantined"] + 1 and counts["accepted"] == whole["accepted"]
    with Store(db).read() as con:
        assert con.execute("SELECT source_line, reason FROM quarantine WHERE source_line = 2").fetchall() == [
            (2, "bad JSON: nested too deeply to read")]


def test_a_clean_litellm_hit_is_its_sources_identity_not_another_one(loaded):
    """The hits log no sampling parameters: counted by their partial fingerprints, every clean hit was one more
    identity and every key with a hit a collision. The identities are the misses' and the contaminated hits'."""
    truth = TRUTH["litellm_payloads.jsonl"]
    _, db = loaded("litellm_payloads.jsonl", "--format", "litellm")
    wrong = {c["request_id"] for c in truth["contaminated"]}
    with Store(db).read() as con:
        rows = con.execute("SELECT deployment, cache_key, fingerprint, request_id, cache_hit FROM requests "
                           "WHERE cache_key IS NOT NULL").fetchall()
    per_key: dict[tuple[str, str], set[str]] = {}
    for dep, key, fp, request_id, hit in rows:
        ids = per_key.setdefault((dep or "", key), set())
        if not hit or request_id in wrong:
            ids.add(fp)
    counted = {(dep, fp) for (dep, _), fps in per_key.items() for fp in fps}
    stats = json.loads(run_cli("stats", "--json", "--db", str(db)).stdout)
    assert (stats["unique_identities"], stats["key_collisions"]) == (
        len(counted), sum(len(fps) > 1 for fps in per_key.values()))
    assert stats["unique_identities"] < len({(dep or "", fp) for dep, _, fp, _, _ in rows})
    plan = {(e.deployment, e.cache_key): e.identities for e in remediation.purge_plan(Store(db))}
    assert plan == {k: len(fps) for k, fps in per_key.items() if len(fps) > 1 or k in plan}
    # The metrics count them alike (specdec_identities, specdec_key_collisions), from the summaries and the rows.
    for rows_only in (False, True):
        with summaries.from_rows() if rows_only else contextlib.nullcontext():
            keys = {dep: (ids, collisions) for dep, _, ids, collisions in read_figures(Store(db)).keys}
        assert keys == {dep: (sum(d == dep for d, _ in counted),
                              sum(len(fps) > 1 for (d, _), fps in per_key.items() if d == dep)) for dep in keys}
        assert sum(ids for ids, _ in keys.values()) == len(counted)


def test_a_keys_identities_are_listed_as_counted_and_unknown_fields_are_never_compared(loaded):
    """The Keys page's table behind one key: a clean LiteLLM hit is its miss's row, not one of its own, and the hits'
    temperature and max_tokens (unknown) are never the fields that differ."""
    _, db = loaded("litellm_payloads.jsonl", "--format", "litellm")
    collisions = analysis.key_collisions(Store(db))
    assert len(collisions) == 4
    for key in collisions.itertuples():
        rows = analysis.key_collision_identities(Store(db), key.deployment, key.cache_key)
        assert len(rows) == key.identities and rows.requests.sum() == key.requests
        differing = analysis.differing_identity_columns(rows)
        assert differing and not {"temperature", "max_tokens", "seed"} & set(differing), (key.cache_key, differing)


def test_the_incident_report_says_its_counts_are_a_floor_where_hits_leave_fields_unknown(loaded, tmp_path):
    """Contamination through a field a hit did not log can't be seen: the postmortem says so, as stats does."""
    truth = TRUTH["litellm_payloads.jsonl"]
    _, db = loaded("litellm_payloads.jsonl", "--format", "litellm")
    done = run_cli("incident-report", "--db", str(db), "--out", str(tmp_path / "incident.md"))
    assert done.returncode == 0, done.stderr
    text = (tmp_path / "incident.md").read_text()
    [line] = [line for line in text.splitlines() if line.startswith("- A floor, not a count")]
    hits = truth["unknown_on_hits"]["hits"]
    for field, n in truth["unknown_on_hits"]["fields"].items():
        assert f"`{field}` on {n} of {hits} hits" in line
