"""`specdec ingest` and `specdec stats` as a user runs them: exit codes, counts, one-line errors."""

from __future__ import annotations

import json
import random

from helpers import rec, run_cli, write_jsonl

from specdec_core.contract.identity import fingerprint
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

specdec = run_cli


def test_ingest_json_counts_and_exit_zero_with_quarantined_records(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a"), rec("a"), "{oops", rec("b", max_tokens=-3)])
    done = specdec("ingest", str(log), "--db", str(tmp_path / "t.duckdb"), "--json")
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert {k: counts[k] for k in ("read", "accepted", "duplicates", "quarantined")} == {
        "read": 4, "accepted": 1, "duplicates": 1, "quarantined": 2}


def test_ingest_plain_output_names_every_count(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a"), rec("b")])
    done = specdec("ingest", str(log), "--db", str(tmp_path / "t.duckdb"))
    assert done.returncode == 0
    assert "read 2, accepted 2, duplicates 0, quarantined 0" in done.stdout


def test_unreadable_path_exits_one_with_one_line_and_writes_nothing(tmp_path):
    db = tmp_path / "t.duckdb"
    done = specdec("ingest", str(tmp_path / "missing.jsonl"), "--db", str(db))
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0 and "missing.jsonl" in done.stderr
    assert not db.exists()


def test_report_on_a_missing_database_exits_one_and_creates_nothing(tmp_path):
    db = tmp_path / "none.duckdb"
    done = specdec("report", "--db", str(db), "--out", str(tmp_path / "r.csv"))
    assert done.returncode == 1 and "no such database" in done.stderr
    assert not db.exists() and not (tmp_path / "r.csv").exists()


def test_usage_errors_exit_two(tmp_path):
    assert specdec("ingest").returncode == 2
    assert specdec("report", "--db", str(tmp_path / "x.duckdb")).returncode == 2  # --out is required
    assert specdec("no-such-command").returncode == 2


def test_every_command_has_help():
    for command in ("ingest", "report", "stats"):
        done = specdec(command, "--help")
        assert done.returncode == 0 and "usage:" in done.stdout


def test_stats_prints_the_headline(tmp_path):
    db = tmp_path / "t.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "l.jsonl", [rec("a", cache_key="k"),
                                                              rec("b", cache_key="k", cache_hit=True)]))])
    done = specdec("stats", "--db", str(db), "--json")
    assert done.returncode == 0
    assert json.loads(done.stdout)["hit_rate"] == 0.5


def test_store_fingerprints_agree_with_the_library_on_varied_records(tmp_path):
    rng = random.Random(11)
    records = []
    for i in range(300):
        records.append(rec(
            f"v{i}",
            prompt=rng.choice(["a", "b", "ünï", "<x>", "long " * 20]),
            draft_model=rng.choice([None, "none", "d1", "ngram-3"]),
            num_speculative_tokens=rng.choice([None, 2, 5]),
            temperature=rng.choice([0, 0.0, 0.5, 0.7000000001, 1.0, 1.25]),
            top_p=rng.choice([1, 0.9, 0.95000004]),
            top_k=rng.choice([None, 0, 40]),
            max_tokens=rng.choice([1, 16, 256]),
            seed=rng.choice([None, 0, 7, 2**62]),
            stop=rng.choice([None, [], ["b", "a", "a"], ["\n"]]),
            tokenizer_version=rng.choice(["v1", "v2"]),
        ))
    store = Store(tmp_path / "v.duckdb")
    assert ingest(store, [str(write_jsonl(tmp_path / "v.jsonl", records))]).accepted == 300
    with store.read() as con:
        stored = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
    assert stored == {r["request_id"]: fingerprint(r) for r in records}


def test_a_database_path_that_is_not_a_database_is_one_line_naming_it(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("a")])
    text = tmp_path / "notes.duckdb"
    text.write_text("not a database")
    folder = tmp_path / "folder.duckdb"
    folder.mkdir()
    for args, name in ((("ingest", str(log), "--db", str(text)), "notes.duckdb"),
                       (("ingest", str(log), "--db", str(folder)), "folder.duckdb"),
                       (("stats", "--db", str(text)), "notes.duckdb"),
                       (("report", "--db", str(text), "--out", str(tmp_path / "r.csv")), "notes.duckdb")):
        done = specdec(*args)
        assert done.returncode == 1, args
        assert done.stderr.strip().count("\n") == 0 and name in done.stderr and ".tmp" not in done.stderr, done.stderr
    assert text.read_text() == "not a database"  # nothing lost either
    assert sorted(p.name for p in tmp_path.iterdir()) == ["folder.duckdb", "log.jsonl", "notes.duckdb",
                                                          "notes.duckdb.lock"]
