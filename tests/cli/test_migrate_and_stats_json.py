"""`specdec stats --json` names the six red flags; `specdec migrate` brings an older store up to date."""

from __future__ import annotations

import json
import stat

import duckdb
from helpers import contents, rec, run_cli, write_jsonl

from specdec_core.analysis import RED_FLAG_IDS
from specdec_core.store.connection import release_snapshots


def test_stats_json_lists_the_six_red_flags_with_their_evidence(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K"), rec("h", cache_key="K", cache_hit=True,
                                                                             max_tokens=8, output_tokens=12)])
    db = tmp_path / "s.duckdb"
    assert run_cli("ingest", str(log), "--db", str(db)).returncode == 0
    done = run_cli("stats", "--json", "--db", str(db))
    assert done.returncode == 0, done.stderr
    flags = json.loads(done.stdout)["red_flags"]
    assert [f["id"] for f in flags] == list(RED_FLAG_IDS)
    by_id = {f["id"]: f for f in flags}
    assert by_id["impossible_lengths"]["flagged"] is True and "1 request returned" in by_id["impossible_lengths"]["evidence"]
    assert by_id["replay_disagrees"]["flagged"] is None


def test_migrate_rebuilds_an_older_store_that_reads_refuse(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K"), rec("h", cache_key="K", cache_hit=True)])
    db = tmp_path / "s.duckdb"
    run_cli("ingest", str(log), "--db", str(db))
    con = duckdb.connect(str(db))
    con.execute("UPDATE meta SET value = '1' WHERE key = 'summary_version'")
    con.close()
    refused = run_cli("stats", "--db", str(db))
    assert refused.returncode == 1 and "specdec migrate" in refused.stderr and len(refused.stderr.splitlines()) == 1
    done = run_cli("migrate", "--db", str(db))
    assert done.returncode == 0 and "rebuilt" in done.stdout
    assert run_cli("stats", "--db", str(db)).returncode == 0
    assert "already up to date" in run_cli("migrate", "--db", str(db)).stdout


def test_migrate_drops_the_key_that_identities_had_and_keeps_them_unique(tmp_path):
    # Stores written before this change keyed identities by fingerprint (an index each checkpoint rewrote whole).
    log = write_jsonl(tmp_path / "log.jsonl", [rec(f"m{i}", cache_key=f"K{i}", max_tokens=8 + i) for i in range(5)])
    db = tmp_path / "s.duckdb"
    assert run_cli("ingest", str(log), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db))
    rows = con.execute("SELECT * FROM identities ORDER BY fingerprint").fetchall()
    columns = ", ".join(f'"{n}" {t}' + (" PRIMARY KEY" if n == "fingerprint" else "")
                        for n, t, *_ in con.execute("DESCRIBE identities").fetchall())
    con.execute("CREATE TABLE keyed AS SELECT * FROM identities; DROP TABLE identities")
    con.execute(f"CREATE TABLE identities ({columns}); INSERT INTO identities SELECT * FROM keyed; DROP TABLE keyed")
    con.close()

    def keys() -> list[tuple]:
        with duckdb.connect(str(db), read_only=True) as c:
            return c.execute("SELECT constraint_type FROM duckdb_constraints() WHERE table_name = 'identities' "
                             "AND constraint_type IN ('PRIMARY KEY', 'UNIQUE')").fetchall()

    assert keys() == [("PRIMARY KEY",)]
    done = run_cli("migrate", "--db", str(db))
    assert done.returncode == 0 and done.stdout.strip() == \
        f"{db}: dropped the key of identities (kept unique by every ingest)", done.stdout
    assert keys() == []
    # The same identities again, and new ones: each identity is stored once.
    more = write_jsonl(tmp_path / "more.jsonl", [rec(f"n{i}", cache_key=f"K{i}", max_tokens=8 + i) for i in range(8)])
    assert run_cli("ingest", str(more), "--db", str(db)).returncode == 0
    with duckdb.connect(str(db), read_only=True) as c:
        counts = c.execute("SELECT count(*), count(DISTINCT fingerprint) FROM identities").fetchall()[0]
        kept = c.execute("SELECT * FROM identities WHERE fingerprint IN "
                         f"({', '.join(repr(r[0]) for r in rows)}) ORDER BY fingerprint").fetchall()
    assert counts == (8, 8)
    assert kept == rows


def test_migrate_lets_fields_a_log_may_leave_unknown_be_null_and_says_so(tmp_path):
    # Stores made before fields could be unknown had NOT NULL on the required ones.
    log = write_jsonl(tmp_path / "log.jsonl", [rec("m", cache_key="K")])
    db = tmp_path / "s.duckdb"
    assert run_cli("ingest", str(log), "--db", str(db)).returncode == 0
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE requests ALTER COLUMN temperature SET NOT NULL; "
                "ALTER TABLE requests ALTER COLUMN max_tokens SET NOT NULL")
    con.close()

    def not_null() -> set[str]:
        with duckdb.connect(str(db), read_only=True) as c:
            return {r[0] for r in c.execute("SELECT unnest(constraint_column_names) FROM duckdb_constraints() "
                                            "WHERE table_name = 'requests' AND constraint_type = 'NOT NULL'")
                    .fetchall()}

    assert {"temperature", "max_tokens"} <= not_null()
    done = run_cli("migrate", "--db", str(db))
    assert done.returncode == 0 and done.stdout.strip() == (
        f"{db}: let requests.temperature be unknown (NULL); let requests.max_tokens be unknown (NULL)"), done.stdout
    assert not {"temperature", "max_tokens"} & not_null()
    assert run_cli("migrate", "--db", str(db)).stdout.strip() == f"{db}: already up to date"


def test_a_store_migrated_in_place_is_written_into_a_fresh_file_that_holds_the_same(tmp_path):
    # Rebuilding every derived table in the working copy left their old blocks free in the file (a 5M-row store
    # grew 1.1 -> 1.5 GB) and slowed every later checkpoint: the migration commits a fresh file instead.

    log = write_jsonl(tmp_path / "log.jsonl", [rec(f"r{i}", ts=f"2026-03-01T10:{i // 600 % 60:02d}:{i // 10 % 60:02d}Z",
                                                   cache_key=f"K{i % 97}", cache_hit=i % 4 != 0, max_tokens=8 + i % 5,
                                                   output_text=f"output {i} " * 40) for i in range(6000)])
    db = tmp_path / "s.duckdb"
    assert run_cli("ingest", str(log), "--db", str(db)).returncode == 0
    db.chmod(0o640)

    def shape() -> tuple[list, list, list]:
        with duckdb.connect(str(db), read_only=True) as c:
            return (c.execute("SELECT table_name, column_name, data_type, is_nullable, column_default "
                              "FROM duckdb_columns() WHERE database_name = current_database() ORDER BY ALL").fetchall(),
                    c.execute("SELECT table_name, constraint_type, constraint_text FROM duckdb_constraints() "
                              "WHERE database_name = current_database() ORDER BY ALL").fetchall(),
                    c.execute("PRAGMA database_size").fetchall()[0])

    before, (columns, constraints, _) = contents(str(db)), shape()
    release_snapshots()  # this process's read view holds the file open
    with duckdb.connect(str(db)) as c:
        c.execute("UPDATE meta SET value = '1' WHERE key = 'summary_version'")
    done = run_cli("migrate", "--db", str(db))
    assert done.returncode == 0 and "rebuilt" in done.stdout, done.stderr
    after_columns, after_constraints, size = shape()
    assert contents(str(db)) == before
    assert (after_columns, after_constraints) == (columns, constraints)
    free_blocks = size[5]
    assert free_blocks == 0, f"{free_blocks} blocks left free of {size[3]}"
    assert stat.S_IMODE(db.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl", "s.duckdb", "s.duckdb.lock"]
    # It takes appends as before.
    more = write_jsonl(tmp_path / "more.jsonl", [rec("late-1", ts="2026-03-01T12:00:00Z", cache_key="K1")])
    assert run_cli("ingest", str(more), "--db", str(db)).returncode == 0
    assert len(contents(str(db))["requests"]) == len(before["requests"]) + 1
