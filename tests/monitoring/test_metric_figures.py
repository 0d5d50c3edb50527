"""The exporter's figures: equal to `specdec stats` and the Overview, counters that never fall, bounded labels."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.request
from dataclasses import fields
from pathlib import Path

import duckdb
import pytest
from helpers import free_port, rec, run_cli, write_jsonl
from prometheus_client.parser import text_string_to_metric_families

from specdec_core.analysis import headline
from specdec_core.analysis.query import Filters
from specdec_core.derived.summaries import from_rows
from specdec_core.ingestion import ingest
from specdec_core.monitoring.exporter import Listen, serve
from specdec_core.monitoring.figures import Figures, read_figures
from specdec_core.store import Store, StoreError
from specdec_core.store.connection import release_snapshots

CONTRACT = {
    "specdec_requests_total": ("counter", {"deployment", "target_model", "draft_model", "cache_hit"}),
    "specdec_contaminated_hits_total": ("counter", {"deployment", "target_model", "draft_model"}),
    "specdec_contaminated_hit_fields_total": ("counter", {"deployment", "field"}),
    "specdec_length_violations_total": ("counter", {"deployment", "target_model"}),
    "specdec_quarantined_records_total": ("counter", set()),
    "specdec_cache_keys": ("gauge", {"deployment"}),
    "specdec_identities": ("gauge", {"deployment"}),
    "specdec_key_collisions": ("gauge", {"deployment"}),
    "specdec_draft_tokens_total": ("counter", {"deployment", "target_model", "draft_model"}),
    "specdec_accepted_tokens_total": ("counter", {"deployment", "target_model", "draft_model"}),
    "specdec_newest_request_timestamp_seconds": ("gauge", {"deployment"}),
    "specdec_replays_total": ("counter", {"classification"}),
}


def scrape(store: Store, top: int = 50) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Serve `store` on a free port, scrape /metrics once over HTTP, parse it as Prometheus would."""
    server = serve(store, Listen("127.0.0.1", free_port()), top)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
    finally:
        server.stop()
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    types = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            out.setdefault(sample.name, []).append((sample.labels, sample.value))
            types[sample.name] = family.type
    out["__types__"] = [(types, 0.0)]
    return out


def total(samples, **labels: str) -> float:
    return sum(v for lab, v in samples if all(lab.get(k) == want for k, want in labels.items()))


def incident_log(path: Path) -> Path:
    """A narrow key on deployment `narrow` (prompt only), a correct one on `good`; one length violation."""
    records = []
    for i in range(6):
        ts = f"2026-03-01T10:0{i}:00Z"
        records.append(rec(f"n-miss-{i}", ts=ts, deployment="narrow", cache_key=f"k{i}", prompt=f"p{i}"))
        records.append(rec(f"n-hit-{i}", ts=ts.replace(":00Z", ":30Z"), deployment="narrow", cache_key=f"k{i}",
                           prompt=f"p{i}", cache_hit=True, temperature=0.7 if i % 2 else 0.0, seed=i,
                           max_tokens=64 if i % 2 else 32, output_tokens=40 if i == 4 else 3))
        records.append(rec(f"g-miss-{i}", ts=ts, deployment="good", cache_key=f"g{i}", prompt=f"p{i}",
                           draft_model=None if i == 0 else "llama-1b"))
        records.append(rec(f"g-hit-{i}", ts=ts.replace(":00Z", ":40Z"), deployment="good", cache_key=f"g{i}",
                           prompt=f"p{i}", cache_hit=True, output_tokens=80 if i == 5 else 3,
                           draft_model=None if i == 0 else "llama-1b"))
    records.append(rec("no-dep", deployment=None, cache_key="z"))
    records.append('{"request_id": "broken"')
    return write_jsonl(path, records)


def test_scraped_figures_equal_stats_and_the_overview(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(incident_log(tmp_path / "log.jsonl"))])
    m = scrape(store)
    types = m["__types__"][0][0]
    for name, (kind, labels) in CONTRACT.items():
        if name == "specdec_replays_total":
            continue  # no replays stored: the family is there, with no series yet
        assert types[name] == kind, name
        assert m[name] and all(set(lab) == labels for lab, _ in m[name]), name

    stats = json.loads(run_cli("stats", "--db", str(store.path), "--json").stdout)
    assert total(m["specdec_requests_total"]) == stats["requests"] == 25
    assert total(m["specdec_requests_total"], cache_hit="true") == stats["hits"]
    assert total(m["specdec_contaminated_hits_total"]) == stats["contaminated_hits"] == 6
    assert total(m["specdec_contaminated_hits_current"]) == stats["contaminated_hits"]
    assert total(m["specdec_length_violations_total"]) == stats["length_violations"] == 2
    assert total(m["specdec_key_collisions"]) == stats["key_collisions"]
    assert total(m["specdec_cache_keys"]) == stats["unique_keys"]
    assert total(m["specdec_identities"]) == stats["unique_identities"]
    assert total(m["specdec_quarantined_records_total"]) == stats["quarantined"] == 1
    # Per deployment, as the Overview shows it with the deployment filter (its summaries and its row path).
    for dep in ("narrow", "good", ""):
        for path in (None, from_rows):
            if path is None:
                h = headline(store, Filters(deployments=(dep,)))
            else:
                with path():
                    h = headline(store, Filters(deployments=(dep,)))
            assert total(m["specdec_requests_total"], deployment=dep) == h.requests
            assert total(m["specdec_contaminated_hits_total"], deployment=dep) == h.contaminated_hits
            assert total(m["specdec_length_violations_total"], deployment=dep) == h.length_violations
            assert total(m["specdec_key_collisions"], deployment=dep) == h.key_collisions
            assert total(m["specdec_cache_keys"], deployment=dep) == h.unique_keys
            assert total(m["specdec_identities"], deployment=dep) == h.unique_identities
    assert total(m["specdec_contaminated_hits_total"], deployment="good") == 0  # pre-created at 0
    # Each contaminated hit once per differing field: greedy hits differ in no sampling field.
    assert total(m["specdec_contaminated_hit_fields_total"], deployment="narrow", field="temperature") == 3
    assert total(m["specdec_contaminated_hit_fields_total"], deployment="narrow", field="max_tokens") == 3
    assert total(m["specdec_requests_total"], deployment="good", draft_model="none") == 2
    assert total(m["specdec_draft_tokens_total"]) == 8 * 25
    assert total(m["specdec_newest_request_timestamp_seconds"], deployment="good") == 1772359540.0


@pytest.mark.parametrize("db", ["s.duckdb", "ducklake:s.sqlite"])
def test_counters_hold_across_a_late_file_that_rejudges_and_a_restart(tmp_path, db):
    """On a DuckDB file and on a shared DuckLake (a SQLite catalog here)."""
    store = Store(db.replace("s.", f"{tmp_path}/s.", 1))
    first = write_jsonl(tmp_path / "a.jsonl", [
        rec("m1", ts="2026-03-01T10:00:00Z", prompt="A", cache_key="k"),
        rec("h1", ts="2026-03-01T10:02:00Z", prompt="B", cache_key="k", cache_hit=True)])
    ingest(store, [str(first)])
    before = scrape(store)
    assert total(before["specdec_contaminated_hits_total"]) == 1
    # A late file: a miss of B's identity between them, so h1 served B's own output after all.
    late = write_jsonl(tmp_path / "b.jsonl", [rec("m0", ts="2026-03-01T10:01:00Z", prompt="B", cache_key="k")])
    ingest(store, [str(late)])
    after = scrape(store)  # a new exporter (a restart): what it counts comes from the store alone
    stats = json.loads(run_cli("stats", "--db", str(store), "--json").stdout)
    assert stats["contaminated_hits"] == 0
    assert total(after["specdec_contaminated_hits_current"]) == 0
    assert total(after["specdec_contaminated_hits_total"]) == 1  # a counter never falls
    assert after["specdec_contaminated_hits_total"] == scrape(store)["specdec_contaminated_hits_total"]


def test_a_million_names_fold_into_other(tmp_path):
    """A hostile log with a new deployment and model name on every line: at most top + 1 values per label."""
    n = 30_000
    lines = [json.dumps(rec(f"r{i}", deployment=f"dep-{i}", target_model=f"model-{i}", cache_key=f"k{i}"))
             for i in range(n)]
    lines += [json.dumps(rec(f"big{i}", deployment="big", cache_key="kb")) for i in range(5)]
    (tmp_path / "hostile.jsonl").write_text("\n".join(lines) + "\n")
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(tmp_path / "hostile.jsonl")])
    m = scrape(store, top=10)
    deployments = {lab["deployment"] for lab, _ in m["specdec_requests_total"]}
    models = {lab["target_model"] for lab, _ in m["specdec_requests_total"]}
    assert len(deployments) == 11 and "big" in deployments and "other" in deployments
    assert len(models) == 11 and "llama-8b" in models
    assert total(m["specdec_requests_total"]) == n + 5  # folded, not dropped
    assert total(m["specdec_requests_total"], deployment="other") == n - 9
    assert total(m["specdec_cache_keys"]) == n + 1
    assert sum(len(v) for k, v in m.items() if k != "__types__") < 1000
    assert total(m["specdec_label_values_folded"], label="deployment") == n + 1 - 10


def test_without_prometheus_client_the_commands_say_how_to_install(tmp_path):
    code = ("import sys; sys.modules['prometheus_client'] = None; from specdec_core.cli import main; "
            "sys.exit(main(sys.argv[1:]))")
    for args in (["metrics", "serve", "--db", str(tmp_path / "s.duckdb")],
                 ["ingest", "--follow", str(tmp_path), "--metrics", "127.0.0.1:0", "--db", str(tmp_path / "s")]):
        done = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, done.stderr
        assert "pip install 'specdec-triage[metrics]'" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("listen", ["nohost", "127.0.0.1:99999", ":80", "127.0.0.1:\u00b2"])
def test_a_bad_listen_address_is_one_line(tmp_path, listen):
    done = run_cli("metrics", "serve", "--db", str(tmp_path / "s.duckdb"), "--listen", listen)
    assert done.returncode == 2 and "HOST:PORT" in done.stderr and len(done.stderr.splitlines()) == 1


def test_serve_scrapes_over_http_and_stops_cleanly(tmp_path):
    """`--listen 127.0.0.1:0` takes a free port, and the line it says once it listens names that port."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(incident_log(tmp_path / "log.jsonl"))])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, "-m", "specdec_core", "metrics", "serve", "--db", str(store.path),
                             "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True, env=env)
    watchdog = threading.Timer(60, proc.kill)  # a server that never says it listens ends the read below
    watchdog.start()
    try:
        said = proc.stderr.readline()
        watchdog.cancel()
        listening = re.fullmatch(rf"serving {re.escape(str(store.path))} at http://127\.0\.0\.1:(\d+)/metrics\n", said)
        assert listening and int(listening[1]) > 0, said
        port = int(listening[1])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            text = resp.read().decode()
        assert 'specdec_contaminated_hits_total{deployment="narrow"' in text
        busy = run_cli("metrics", "serve", "--db", str(store.path), "--listen", f"127.0.0.1:{port}")
        assert busy.returncode == 1 and "can't listen on 127.0.0.1:" in busy.stderr
        assert len(busy.stderr.splitlines()) == 1
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert err.strip() == ""


def _rows(figures: Figures) -> dict[str, object]:
    """Each figure's rows in one order (a read returns them in the order DuckDB's threads finish)."""
    return {f.name: sorted(v) if isinstance(v := getattr(figures, f.name), tuple) else v for f in fields(figures)}


def _two_deployments(tmp_path: Path, store: Store) -> dict[str, object]:
    """Ingest batches for `a`, then enough for `b` to take its top place (top=1), each with a contaminated
    hit; after each, the figures read from the summaries equal those read from the rows."""
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec(f"a{i}", deployment="a", draft_tokens=i,
                                                              accepted_tokens=1) for i in range(3)]))])
    for name, dep, n in (("b.jsonl", "a", 2), ("c.jsonl", "b", 6)):
        records = [rec(f"{name}{i}", deployment=dep, draft_tokens=10, accepted_tokens=2) for i in range(n)]
        records.append(rec(f"{name}-hit", deployment=dep, prompt="another", cache_hit=True, ts="2026-03-01T11:00:00Z"))
        ingest(store, [str(write_jsonl(tmp_path / name, records))])
        summarised = _rows(read_figures(store, top=1))
        with from_rows():
            assert _rows(read_figures(store, top=1)) == summarised
    return summarised


def test_a_read_of_the_figures_reads_the_summaries_alone(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    figures = _two_deployments(tmp_path, store)
    assert figures["tokens"] == [("b", "llama-8b", "llama-1b", 68, 18), ("other", "llama-8b", "llama-1b", 31, 13)]
    assert figures["contaminated_first"] == [("b", "llama-8b", "llama-1b", 1), ("other", "llama-8b", "llama-1b", 1)]
    # Without a request or a first verdict left, the summaries still give every figure: a scrape's cost follows
    # them (a few rows per minute and label set), not the requests or the hits ever judged.
    release_snapshots()
    with duckdb.connect(str(store.path)) as con:
        con.execute("DELETE FROM requests; DELETE FROM contaminated_first_verdicts; DELETE FROM hit_sources")
    assert _rows(read_figures(store, top=1)) == figures


def test_a_store_of_the_previous_summaries_is_migrated_to_the_same_figures(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    figures = _two_deployments(tmp_path, store)
    release_snapshots()
    with duckdb.connect(str(store.path)) as con:  # as version 9 left it: no token sums of every request, no counts
        con.execute("ALTER TABLE summary_minute DROP COLUMN logged_draft_tokens; "
                    "ALTER TABLE summary_minute DROP COLUMN logged_accepted_tokens; DROP TABLE summary_first_verdicts; "
                    "UPDATE meta SET value = '9' || value[3:] WHERE key = 'summary_version'")
    with pytest.raises(StoreError, match="specdec migrate"):
        read_figures(store)
    done = run_cli("migrate", "--db", str(store.path))
    assert done.returncode == 0 and "rebuilt" in done.stdout, done.stderr
    assert _rows(read_figures(store, top=1)) == figures
    # The first verdicts kept their ingests: a migrate counts none of them again.
    with store.read() as con:
        assert con.execute("SELECT sum(hits) FROM summary_first_verdicts").fetchall() == [(2,)]


def test_label_values_with_quotes_braces_and_nul_are_folded_and_kept_as_logged(tmp_path):
    names = ["it's", "{dep}", "a\x00b", "$1"]
    records = [rec(f"r{i}-{n}", deployment=name, cache_key=f"k{i}") for n, name in enumerate(names) for i in range(n + 1)]
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "odd.jsonl", records))])
    figures = read_figures(store, top=3)
    assert sorted((r[0], r[4]) for r in figures.requests if r[3] == "false") == [
        ("$1", 4), ("a\x00b", 3), ("other", 1), ("{dep}", 2)]


def test_a_fresh_process_reads_the_figures_without_importing_pandas(tmp_path):
    """A restarted exporter's first scrape: binding a value would make DuckDB's client import pandas (0.5 s+)."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(incident_log(tmp_path / "log.jsonl"))])
    code = ("import sys; from specdec_core.monitoring.figures import read_figures; from specdec_core.store import "
            "Store; f = read_figures(Store(sys.argv[1])); print(len(f.requests), 'pandas' in sys.modules)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, "-c", code, str(store.path)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.stdout.split() == ["7", "False"], done.stderr


def test_read_from_rows_the_first_verdicts_are_the_recorded_ones_or_the_current_ones_before_any_record(tmp_path):
    """Without summaries, the counter of hits first judged contaminated reads their record; a store made before
    that record existed counts the hits contaminated now, which its next ingest records."""
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(incident_log(tmp_path / "log.jsonl"))])

    def hits(rows) -> int:
        return sum(row[-1] for row in rows)

    with store.write() as con:  # one recorded first verdict fewer than the hits contaminated now
        con.execute("DELETE FROM contaminated_first_verdicts WHERE request_id = 'n-hit-1'")
    with from_rows():
        figures = read_figures(store)
    assert hits(figures.contaminated_now) == 6 and hits(figures.contaminated_first) == 5
    with store.write() as con:
        con.execute("DROP TABLE contaminated_first_verdicts")
    with from_rows():
        figures = read_figures(store)
    assert hits(figures.contaminated_first) == hits(figures.contaminated_now) == 6
