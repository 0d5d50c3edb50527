"""Ingest: every record is accepted, skipped as an exact duplicate or quarantined with its place and reason."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
import subprocess
import sys
import threading

import duckdb
import pytest
from helpers import DROP, rec, write_csv, write_jsonl

from specdec_core.contract.identity import canonical_json, fingerprint, identity
from specdec_core.formats.files import LogReadError
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store, StoreError, release_snapshots


def quarantine_rows(store):
    with store.read() as con:
        return con.execute(
            "SELECT source_line, reason FROM quarantine ORDER BY source_file, source_line"
        ).fetchall()


def test_valid_records_are_accepted_with_fingerprints_equal_to_the_library(store, tmp_path):
    records = [
        rec("a", temperature=0.7, seed=3, top_k=40, stop=["\n\n", "END"], top_p=0.9),
        rec("b", draft_model="none", top_k=0),
        rec("c", prompt=DROP, prompt_hash=hashlib.sha256(b"redacted prompt").hexdigest()),
        rec("d", prompt="Grüße, 世界 <b>", temperature=1.2345678, seed=2**40),
        rec("e", draft_model=None, num_speculative_tokens=None, stop=[], latency_ms=-3.5),  # a skewed clock
        # A seed past 64 bits is kept exactly; RFC 3339 allows a lower-case t and z.
        rec("f", temperature=0.5, seed=-(2**63) - 1, ts="2026-03-01t10:00:00.250z"),
        # A string is a list of one (log-schema.md): g and h are one identity.
        rec("g", temperature=0.3, stop="END"),
        rec("h", temperature=0.3, stop=["END", "END"]),
    ]
    result = ingest(store, [str(write_jsonl(tmp_path / "ok.jsonl", records))])
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (8, 8, 0, 0)
    with store.read() as con:
        stored = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
        kept = dict(con.execute("SELECT fingerprint, identity::VARCHAR FROM identities").fetchall())
        assert con.execute("SELECT seed::VARCHAR, strftime(ts, '%H:%M:%S.%g') FROM requests "
                           "WHERE request_id = 'f'").fetchall() == [(str(-(2**63) - 1), "10:00:00.250")]
    assert stored == {r["request_id"]: fingerprint(r) for r in records}
    assert stored["g"] == stored["h"] != stored["a"]
    # The stored identity is the canonical text itself: its SHA-256 is the fingerprint beside it.
    assert set(kept) == set(stored.values())
    assert {fp: canonical_json(identity(r)) for r in records for fp in [fingerprint(r)]} == kept
    assert all(hashlib.sha256(text.encode()).hexdigest() == fp for fp, text in kept.items())


BAD_LINES = [
    ('{"request_id": "t1", "ts": ', "bad JSON"),
    ("[1, 2, 3]", "not a JSON object"),
    ('"just a string"', "not a JSON object"),
    (json.dumps(rec("m1", target_model=DROP)), "missing required field: target_model"),
    (json.dumps(rec("m2", prompt=DROP)), "one of prompt or prompt_hash"),
    (json.dumps(rec("w1", max_tokens="64")), "max_tokens: expected an integer >= 1"),
    (json.dumps(rec("w2", cache_hit="yes")), "cache_hit: expected a boolean"),
    (json.dumps(rec("w3", stop=5)), "stop: expected a list of strings or a string, got 5"),
    (json.dumps(rec("w4", stop=["a", 1])), "stop: expected a list of strings"),
    (json.dumps(rec("w5", ts="yesterday")), "ts: expected an RFC 3339 string"),
    (json.dumps({**rec("w6"), "request_id": 7}), "request_id: expected a non-empty string"),
    (json.dumps(rec("r1", temperature=-0.1)), "temperature: expected a number >= 0"),
    (json.dumps(rec("r2", top_p=0)), "top_p: expected a number in (0, 1]"),
    (json.dumps(rec("r3", top_p=1.5)), "top_p: expected a number in (0, 1]"),
    (json.dumps(rec("r4", max_tokens=0)), "max_tokens: expected an integer >= 1"),
    (json.dumps(rec("r5", output_tokens=-1)), "output_tokens: expected an integer >= 0"),
    (json.dumps(rec("r6", cached_fingerprint="abc")), "cached_fingerprint: expected a JSON object"),
    (json.dumps(rec("r7", prompt_hash="0" * 64)), "prompt_hash: does not match"),
    (json.dumps(rec("n1", max_tokens=None)), "max_tokens: required, got null"),
    (json.dumps(rec("l1", latency_ms="fast")), "latency_ms: expected a number"),
    # DuckDB's own cast takes these; the contract's ts doesn't.
    (json.dumps(rec("ts1", ts="infinity")), "ts: expected an RFC 3339 string"),
    (json.dumps(rec("ts2", ts="2026-03-01")), "ts: expected an RFC 3339 string"),
    (json.dumps(rec("ts3", ts="2026-03-01T10:00:00+25:00")), "ts: expected an RFC 3339 string"),
    # Numbers past what a column holds are rejected one by one, never an error for the whole file.
    (json.dumps(rec("ts4", ts=10**17)), "ts: expected an RFC 3339 string"),
    (json.dumps(rec("o1", max_tokens=2**64)), "max_tokens: out of range"),
    (json.dumps(rec("o2", output_tokens=10**30)), "output_tokens: out of range"),
    (json.dumps(rec("o3", top_k=1e300)), "top_k: out of range"),
    # Named twice: this store would read one value and most JSON readers the other.
    (json.dumps(rec("k1"))[:-1] + ', "max_tokens": 0}', "duplicate field: max_tokens appears more than once"),
]


def test_each_bad_record_is_quarantined_at_its_line_with_its_reason_and_the_rest_loads(store, tmp_path):
    lines = [json.dumps(rec("good-1"))]
    for raw, _ in BAD_LINES:
        lines.append(raw)
        lines.append("")  # blank lines are skipped but still counted in line numbers
    lines.append(json.dumps(rec("good-2")))
    path = write_jsonl(tmp_path / "mixed.jsonl", lines)
    result = ingest(store, [str(path)])
    assert result.read == len(BAD_LINES) + 2
    assert (result.accepted, result.quarantined, result.duplicates) == (2, len(BAD_LINES), 0)
    rows = quarantine_rows(store)
    assert [line for line, _ in rows] == [2 + 2 * i for i in range(len(BAD_LINES))]
    for (line, reason), (raw, expected) in zip(rows, BAD_LINES, strict=True):
        assert expected in reason, (line, raw, reason)
    with store.read() as con:
        raws = [r[0] for r in con.execute("SELECT raw FROM quarantine ORDER BY source_line").fetchall()]
    assert raws == [raw for raw, _ in BAD_LINES]  # the raw text is kept verbatim


def test_exact_duplicate_is_skipped_and_conflicting_duplicate_is_quarantined(store, tmp_path):
    first = rec("dup", output_text="first")
    path = write_jsonl(tmp_path / "dups.jsonl", [first, first, rec("dup", output_text="other")])
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (3, 1, 1, 1)
    [(line, reason)] = quarantine_rows(store)
    assert line == 3 and "conflict" in reason and "dups.jsonl:1" in reason


def test_ingesting_the_same_file_twice_adds_nothing(store, tmp_path):
    path = write_jsonl(tmp_path / "once.jsonl", [rec("x1"), rec("x2"), "{broken"])
    first = ingest(store, [str(path)])
    second = ingest(store, [str(path)])
    assert (first.accepted, first.quarantined) == (2, 1)
    assert (second.read, second.accepted, second.duplicates, second.quarantined) == (3, 0, 3, 0)
    with store.read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 2
        assert con.execute("SELECT count(*) FROM quarantine").fetchall()[0][0] == 1


def test_a_write_puts_back_a_table_or_a_column_an_older_store_lacks(store, tmp_path):
    """Every write brings a store up to this version's tables and columns (the common case, a store that has
    them all, is found by one statement that binds them: store/ddl.py)."""
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("x1")]))])
    columns = "SELECT table_name, column_name FROM duckdb_columns() WHERE database_name = current_database()"
    with store.read() as con:
        current = set(con.execute(columns).fetchall())
    for older in ("ALTER TABLE requests DROP COLUMN experiment", "DROP TABLE purges"):
        with store.write() as con:
            con.execute(older)
        with store.read() as con:
            assert set(con.execute(columns).fetchall()) < current, older
        ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("x2")]))])
        with store.read() as con:
            assert set(con.execute(columns).fetchall()) == current, older


def test_a_request_id_loaded_before_with_other_content_is_a_conflict(store, tmp_path):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("same", output_text="A")]))])
    result = ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("same", output_text="B")]))])
    assert (result.accepted, result.quarantined) == (0, 1)
    assert "loaded before from" in quarantine_rows(store)[0][1]


def test_empty_file_reads_nothing_and_missing_file_fails_before_writing(store, tmp_path):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    assert ingest(store, [str(empty)]).read == 0
    good = write_jsonl(tmp_path / "good.jsonl", [rec("g")])
    with pytest.raises(LogReadError, match="nope.jsonl: no such file"):
        ingest(store, [str(good), str(tmp_path / "nope.jsonl")])
    with store.read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == 0


def test_gzip_folder_and_glob_paths_are_read(store, tmp_path):
    folder = tmp_path / "logs"
    folder.mkdir()
    with gzip.open(folder / "part-1.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(rec("gz-1")) + "\n" + json.dumps(rec("gz-2")) + "\n")
    write_jsonl(folder / "part-2.jsonl", [rec("plain-1")])
    (folder / "notes.txt").write_text("not a log")
    assert ingest(store, [str(folder)]).accepted == 3
    other = Store(tmp_path / "glob.duckdb")
    assert ingest(other, [str(folder / "*.jsonl*")]).accepted == 3


def test_csv_records_equal_their_jsonl_twins_and_a_missing_column_quarantines_each_row(store, tmp_path):
    records = [rec("c1", stop=["b", "a"], temperature=0.5, seed=9), rec("c2", cache_hit=True),
               rec("c3", temperature=0.5, stop="END"), rec("c4", temperature=0.5, stop=["END"])]
    result = ingest(store, [str(write_csv(tmp_path / "log.csv", records))])
    assert result.accepted == 4
    with store.read() as con:
        stored = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
    assert stored == {r["request_id"]: fingerprint(r) for r in records}
    assert stored["c3"] == stored["c4"]

    broken = Store(tmp_path / "broken.duckdb")
    result = ingest(broken, [str(write_csv(tmp_path / "nocol.csv", records, drop_column="max_tokens"))])
    assert (result.read, result.accepted, result.quarantined) == (4, 0, 4)
    assert {reason for _, reason in quarantine_rows(broken)} == {"missing required field: max_tokens"}


def test_csv_integers_written_as_floats_are_read_as_integers_and_fractions_are_not(store, tmp_path):
    # pandas writes an integer column that holds a missing value as floats: 4 becomes 4.0.
    records = [rec("f1", num_speculative_tokens=4, top_k=None, seed=None),
               rec("f2", temperature=0.8, seed=7, ts=1772359200000), rec("f3", max_tokens=64)]
    path = write_csv(tmp_path / "floats.csv", records)
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split(",")
    rows = [line.split(",") for line in lines[1:]]
    for column in ("num_speculative_tokens", "seed", "max_tokens", "output_tokens"):
        i = header.index(column)
        for row in rows:
            row[i] = row[i] and f"{row[i]}.0"
    rows[1][header.index("ts")] += ".0"  # epoch milliseconds
    rows[2][header.index("max_tokens")] = "64.5"
    path.write_text("\n".join([lines[0]] + [",".join(r) for r in rows]) + "\n", encoding="utf-8")
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    with store.read() as con:
        stored = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
    assert stored == {r["request_id"]: fingerprint(r) for r in records[:2]}
    assert quarantine_rows(store) == [(3, 'max_tokens: expected an integer >= 1, got 64.5')]
    with store.read() as con:
        assert con.execute("SELECT epoch_ms(ts) FROM requests WHERE request_id = 'f2'").fetchall() == [
            (1772359200000,)]


def test_a_csv_header_naming_a_field_twice_quarantines_each_row_with_why(store, tmp_path):
    path = write_csv(tmp_path / "twice.csv", [rec("t1"), rec("t2")])
    lines = path.read_text(encoding="utf-8").splitlines()
    path.write_text("\n".join([lines[0] + ",max_tokens"] + [line + ",1" for line in lines[1:]]) + "\n")
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (2, 0, 2)
    assert {reason for _, reason in quarantine_rows(store)} == {
        "bad CSV row: the header names max_tokens more than once"}


def test_parquet_is_read(store, tmp_path):
    records = [rec("p1", stop=["x"]), rec("p2", temperature=0.3, seed=1)]
    src = write_jsonl(tmp_path / "src.jsonl", records)
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM read_json('{src}')) TO '{tmp_path / 'log.parquet'}' (FORMAT parquet)")
    con.close()
    assert ingest(store, [str(tmp_path / "log.parquet")]).accepted == 2
    with store.read() as con:
        stored = dict(con.execute("SELECT request_id, fingerprint FROM requests").fetchall())
    assert stored == {r["request_id"]: fingerprint(r) for r in records}


def test_unknown_fields_are_kept(store, tmp_path):
    ingest(store, [str(write_jsonl(tmp_path / "x.jsonl", [rec("u", team="search", tags={"a": [1]})]))])
    with store.read() as con:
        extra = con.execute("SELECT extra::VARCHAR FROM requests").fetchall()[0][0]
    assert json.loads(extra) == {"team": "search", "tags": {"a": [1]}}
    # A field of the user's own named twice is kept, not a reason to quarantine.
    line = json.dumps(rec("u2", note="a"))[:-1] + ', "note": "b"}'
    assert ingest(store, [str(write_jsonl(tmp_path / "y.jsonl", [line]))]).accepted == 1


def test_mixed_timestamp_formats_are_stored_in_utc(store, tmp_path):
    records = [
        rec("t-z", ts="2026-03-01T10:00:00Z"),
        rec("t-offset", ts="2026-03-01T12:00:01+02:00"),
        rec("t-ms", ts=1772359202000),  # 2026-03-01T10:00:02Z
    ]
    ingest(store, [str(write_jsonl(tmp_path / "ts.jsonl", records))])
    with store.read() as con:
        rows = con.execute("SELECT request_id, epoch(ts) FROM requests ORDER BY ts").fetchall()
    assert [r[0] for r in rows] == ["t-z", "t-offset", "t-ms"]
    assert [r[1] - rows[0][1] for r in rows] == [0, 1, 2]


def test_reader_never_sees_a_half_written_batch(store, tmp_path):
    ingest(store, [str(write_jsonl(tmp_path / "seed.jsonl", [rec("s0")]))])
    big = write_jsonl(tmp_path / "big.jsonl", [rec(f"b{i}", ts=f"2026-03-01T10:{i // 60 % 60:02d}:{i % 60:02d}Z")
                                              for i in range(20000)])
    seen: list[int] = []
    done = threading.Event()

    def read_loop():
        while not done.is_set():
            with store.read() as con:
                seen.append(con.execute("SELECT count(*) FROM requests").fetchall()[0][0])

    reader = threading.Thread(target=read_loop)
    reader.start()
    try:
        ingest(store, [str(big)])
    finally:
        done.set()
        reader.join()
    assert seen and set(seen) <= {1, 20001}


def test_shuffled_lines_give_the_same_store(tmp_path):
    records = [rec(f"r{i}", ts=f"2026-03-01T10:00:{i:02d}Z", cache_hit=i % 3 != 0,
                   draft_model=["a", "b"][i % 2]) for i in range(40)]
    shuffled = records[:]
    random.Random(7).shuffle(shuffled)
    stores = []
    for name, recs in (("ordered", records), ("shuffled", shuffled)):
        s = Store(tmp_path / f"{name}.duckdb")
        ingest(s, [str(write_jsonl(tmp_path / f"{name}.jsonl", recs))])
        with s.read() as con:
            stores.append(con.execute("SELECT * FROM hit_sources ORDER BY request_id").fetchall())
    assert stores[0] == stores[1] and stores[0]


def test_lines_with_control_characters_or_bad_utf8_are_kept_not_lost(store, tmp_path):
    path = tmp_path / "dirty.jsonl"
    good = json.dumps(rec("ok-1")).encode()
    path.write_bytes(good + b"\n" + b'{"request_id": "x\x01y"}\n' + b"\t \n" + b'{"bad": "\xff\xfe"}\n'
                     + json.dumps(rec("ok-2")).encode() + b"\n")
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (4, 2, 2)
    assert [line for line, _ in quarantine_rows(store)] == [2, 4]


def test_whitespace_only_lines_are_blank_on_the_fast_path_too(store, tmp_path):
    path = tmp_path / "ws.jsonl"
    path.write_text(json.dumps(rec("w1")) + "\n\t \n   \n" + json.dumps(rec("w2")) + "\n")
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (2, 2, 0)
    with store.read() as con:
        assert sorted(con.execute("SELECT source_line FROM requests").fetchall()) == [(1,), (4,)]


def test_parquet_float32_columns_read_as_the_decimals_written(store, tmp_path):
    """numpy's and Arrow's 32-bit floats: 0.7 is 0.699999988079071 as a double, which the store, the report and
    a replay held where the same request logged as JSON holds 0.7. An unknown float32 column named with a quote
    is kept in `extra` alike."""
    src = write_jsonl(tmp_path / "log.jsonl", [rec("f32", temperature=0.7, top_p=0.9, latency_ms=12.3)])
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * REPLACE (temperature::FLOAT AS temperature, top_p::FLOAT AS top_p, "
                f"latency_ms::FLOAT AS latency_ms), 0.1::FLOAT AS \"odd\"\"name\" FROM read_json('{src}')) "
                f"TO '{tmp_path / 'f32.parquet'}' (FORMAT parquet)")
    assert con.execute(f"SELECT temperature::DOUBLE FROM '{tmp_path / 'f32.parquet'}'").fetchall() == [
        (0.699999988079071,)]
    assert ingest(store, [str(tmp_path / "f32.parquet")]).accepted == 1
    with store.read() as con:
        assert con.execute("SELECT temperature, top_p, latency_ms, extra::VARCHAR FROM requests").fetchall() == [
            (0.7, 0.9, 12.3, '{"odd\\"name":0.1}')]


def test_csv_epoch_milliseconds_and_parquet_json_text_columns_are_read(store, tmp_path):
    records = [rec("e1", ts=1772359200000, stop=["b", "a"]), rec("e2", cache_hit=True,
                                                                  cached_fingerprint={"prompt": "x"})]
    assert ingest(store, [str(write_csv(tmp_path / "ms.csv", records))]).accepted == 2
    with store.read() as con:
        assert con.execute("SELECT epoch_ms(ts) FROM requests WHERE request_id = 'e1'").fetchall() == [
            (1772359200000,)]
    # A Parquet writer that stored the two JSON columns as text, as CSV does.
    src = write_jsonl(tmp_path / "src.jsonl", [{**rec("p1"), "stop": json.dumps(["x", "y"]),
                                                 "cached_fingerprint": json.dumps({"prompt": "z"})}])
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * FROM read_json('{src}')) TO '{tmp_path / 'text.parquet'}' (FORMAT parquet)")
    con.close()
    other = Store(tmp_path / "text.duckdb")
    assert ingest(other, [str(tmp_path / "text.parquet")]).accepted == 1
    with other.read() as c:
        stop, cached = c.execute("SELECT stop, cached_fingerprint::VARCHAR FROM requests").fetchall()[0]
    assert stop == ["x", "y"] and json.loads(cached) == {"prompt": "z"}
    assert fingerprint({**rec("p1"), "stop": ["x", "y"]}) == other_fingerprint(other, "p1")


def other_fingerprint(store, request_id):
    with store.read() as con:
        return con.execute("SELECT fingerprint FROM requests WHERE request_id = ?", [request_id]).fetchall()[0][0]


def test_a_read_in_progress_keeps_its_state_while_later_reads_see_the_new_one(tmp_path):
    # DuckDB gives connect(path) the instance already open for that path: a held reader must
    # neither make later reads stale nor be closed under its user when the file is replaced.
    s = Store(tmp_path / "states.duckdb")
    ingest(s, [str(write_jsonl(tmp_path / "one.jsonl", [rec("a")]))])
    with s.read() as old:
        assert old.execute("SELECT count(*) FROM requests").fetchall() == [(1,)]
        ingest(s, [str(write_jsonl(tmp_path / "two.jsonl", [rec("b")]))])
        with s.read() as new:
            assert new.execute("SELECT count(*) FROM requests").fetchall() == [(2,)]
        assert old.execute("SELECT count(*) FROM requests").fetchall() == [(1,)]
    with s.read() as again:
        assert again.execute("SELECT count(*) FROM requests").fetchall() == [(2,)]


def test_a_duckdb_file_that_is_not_a_store_is_refused_in_one_line(tmp_path):
    path = tmp_path / "other.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT 1 AS x")
    con.close()
    with pytest.raises(StoreError, match=r"other\.duckdb: a DuckDB file, but not a specdec database") as err:
        with Store(path).read():
            pass
    assert "\n" not in str(err.value)


def test_rejects_in_several_files_of_one_ingest_keep_their_own_file_line_and_text(store, tmp_path):
    # A gzip file (the Python reader), a plain one (DuckDB's line reader) and a CSV, in one ingest:
    # each file's lines are numbered in that file, and a rejected record is quoted from that file.
    folder = tmp_path / "logs"
    folder.mkdir()
    with gzip.open(folder / "a.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("\n".join([json.dumps(rec("a-1")), "", "[1, 2]", json.dumps(rec("shared", output_text="A"))]) + "\n")
    write_jsonl(folder / "b.jsonl", [rec("b-1"), "{truncated", rec("shared", output_text="B"), rec("b-2")])
    write_csv(folder / "c.csv", [rec("c-1"), rec("c-2", max_tokens=0)])
    result = ingest(store, [str(folder)])
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (9, 5, 0, 4)
    with store.read() as con:
        rows = con.execute("SELECT regexp_extract(source_file, '[^/]+$'), source_line, reason, raw "
                           "FROM quarantine ORDER BY source_file, source_line").fetchall()
        accepted = con.execute("SELECT request_id, regexp_extract(source_file, '[^/]+$'), source_line "
                               "FROM requests ORDER BY request_id").fetchall()
    assert [(f, line) for f, line, _, _ in rows] == [("a.jsonl.gz", 3), ("b.jsonl", 2), ("b.jsonl", 3),
                                                      ("c.csv", 2)]
    assert rows[0][3] == "[1, 2]" and "not a JSON object" in rows[0][2]
    assert rows[1][3] == "{truncated" and "bad JSON" in rows[1][2]
    assert rows[2][3] == json.dumps(rec("shared", output_text="B")) and "a.jsonl.gz:4" in rows[2][2]
    assert json.loads(rows[3][3])["request_id"] == "c-2" and "max_tokens" in rows[3][2]
    assert accepted == [("a-1", "a.jsonl.gz", 1), ("b-1", "b.jsonl", 1), ("b-2", "b.jsonl", 4),
                        ("c-1", "c.csv", 1), ("shared", "a.jsonl.gz", 4)]


def test_a_byte_order_mark_is_not_part_of_the_first_record_or_header(store, tmp_path):
    lines = json.dumps(rec("bom-1")) + "\n" + json.dumps(rec("bom-2")) + "\n"
    (tmp_path / "plain.jsonl").write_text(lines.replace("bom-", "plain-"), encoding="utf-8-sig")
    with gzip.open(tmp_path / "packed.jsonl.gz", "wt", encoding="utf-8-sig") as fh:
        fh.write(lines)
    csv_text = write_csv(tmp_path / "plain.csv", [rec("csv-1")]).read_text(encoding="utf-8")
    (tmp_path / "plain.csv").write_text(csv_text, encoding="utf-8-sig")
    result = ingest(store, [str(tmp_path)])
    assert (result.read, result.accepted, result.quarantined) == (5, 5, 0)


def test_progress_moves_through_each_file_and_the_batch_steps(store, tmp_path):
    a = write_jsonl(tmp_path / "a.jsonl", [rec("p1")])
    b = write_jsonl(tmp_path / "b.jsonl", [rec("p2", cache_hit=True)])
    seen = []
    ingest(store, [str(a), str(b)], progress=lambda done, total, what: seen.append((done, total, what)))
    assert [done for done, _, _ in seen] == list(range(9)) and {total for _, total, _ in seen} == {8}
    assert [what for _, _, what in seen] == [
        "reading a.jsonl", "checking a.jsonl", "reading b.jsonl", "checking b.jsonl", "fingerprinting identities",
        "writing requests", "finding each hit's source", "summarising", "done"]


def test_rows_appended_to_a_store_go_into_small_row_groups_and_read_back_whole(tmp_path):
    # A new store keeps DuckDB's row groups; a batch into a store holding rows writes groups of at most
    # APPEND_ROW_GROUP_SIZE rows, whose checkpoint does not slow down as a large last group fills.
    from specdec_core.store.working_copy import APPEND_ROW_GROUP_SIZE

    store = Store(tmp_path / "s.duckdb")
    first = [rec(f"a{i}", ts=f"2026-03-01T10:00:{i % 60:02d}Z", cache_key=f"K{i % 50}") for i in range(30_000)]
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", first))])
    more = [rec(f"b{i}", ts=f"2026-03-01T11:00:{i % 60:02d}Z", cache_key=f"K{i % 50}", cache_hit=True)
            for i in range(40_000)]
    ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", more))])
    with duckdb.connect(str(store.path), read_only=True) as con:
        groups = [n for (n,) in con.execute(
            "SELECT sum(count) FROM pragma_storage_info('requests') WHERE column_name = 'request_id' "
            "AND segment_type = 'VARCHAR' GROUP BY row_group_id ORDER BY row_group_id").fetchall()]
        assert groups[0] == 30_000
        assert sum(groups) == 70_000
        assert len(groups) >= 1 + -(-40_000 // APPEND_ROW_GROUP_SIZE)
        assert max(groups[1:]) <= APPEND_ROW_GROUP_SIZE
        assert con.execute("SELECT count(*), count(DISTINCT request_id) FROM requests WHERE request_id LIKE 'b%'"
                           ).fetchall()[0] == (40_000, 40_000)


def _compression(con, column: str, segment_type: str) -> set[str]:
    return {c for (c,) in con.execute("SELECT DISTINCT compression FROM pragma_storage_info('requests') "
                                      "WHERE column_name = ? AND segment_type = ?", [column, segment_type]).fetchall()}


def _seed_compression(con) -> set[str]:
    return _compression(con, "seed", "HUGEINT")


def test_the_seed_column_of_a_file_store_is_run_length_encoded_after_every_write(tmp_path):
    # DuckDB 1.5.5 bit-packs a HUGEINT of small numbers and unpacks it slowly (a read of the seed: 0.25 s at 1M
    # rows, 5 s at 20M); schema.py asks for RLE. A batch appended, and the fresh file a migration writes, keep it.
    from specdec_core.store.working_copy import compact_after_write

    store = Store(tmp_path / "s.duckdb")

    def seed_compression() -> set[str]:
        with duckdb.connect(str(store.path), read_only=True) as con:
            return _seed_compression(con)

    rows = [rec(f"a{i}", seed=[7, 42, DROP][i % 3], ts=f"2026-03-01T10:00:{i % 60:02d}Z") for i in range(3000)]
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", rows))])
    assert seed_compression() == {"RLE"}
    ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [{**r, "request_id": "b" + r["request_id"]} for r in rows]))])
    store.transact(compact_after_write)
    assert seed_compression() == {"RLE"}
    with store.read() as con:
        assert con.execute("SELECT count(seed), sum(seed) FROM requests").fetchall() == [(4000, 2000 * 49)]


def test_a_store_of_schema_version_1_gets_its_seed_column_encoded_by_the_next_write(tmp_path):
    from specdec_core.derived import migrate

    store = Store(tmp_path / "s.duckdb")
    rows = [rec(f"a{i}", seed=[7, 42, DROP][i % 3], ts=f"2026-03-01T10:00:{i % 60:02d}Z") for i in range(3000)]
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", rows))])
    release_snapshots()
    with duckdb.connect(str(store.path)) as con:  # as specdec wrote it before: DuckDB's choice, bit-packed
        con.execute("CREATE TABLE r1 AS SELECT * FROM requests; DROP TABLE requests; ALTER TABLE r1 RENAME TO requests")
        con.execute("UPDATE meta SET value = '1' WHERE key = 'schema_version'; CHECKPOINT")
        before = con.execute("SELECT * FROM requests ORDER BY request_id").fetchall()
        assert _seed_compression(con) == {"BitPacking"}
    assert migrate(store) == ["wrote requests again, its seed column run-length encoded",
                              "wrote the store anew in DuckDB 1.5's storage format"]
    with store.read() as con:
        assert _seed_compression(con) == {"RLE"}
        assert con.execute("SELECT * FROM requests ORDER BY request_id").fetchall() == before
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [("3",)]
    assert migrate(store) == []


def _text_compression(con) -> set[str]:
    return _compression(con, "output_text", "VARCHAR")


def test_a_store_in_duckdbs_older_storage_format_is_written_anew_in_1_5s_by_the_next_write(tmp_path):
    # DuckDB writes its 1.0 format unless told otherwise; 1.5's stores a column of repeated texts (a cache hit
    # repeats its source's output) as a dictionary of FSST strings. A store written before (schema version 2)
    # is written anew by its next write, every row group, not only the ones that write appends.
    from specdec_core.store.convert import storage_number

    store = Store(tmp_path / "s.duckdb")
    rows = [rec(f"a{i}", output_text=f"output {i % 40} " + "tok " * 60, ts=f"2026-03-01T10:{i // 60 % 60:02d}:"
                f"{i % 60:02d}Z") for i in range(20_000)]
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", rows))])
    assert storage_number(store.path) == 68
    with store.read() as con:
        assert _text_compression(con) == {"DICT_FSST"}
    release_snapshots()
    old = tmp_path / "old.duckdb"
    with duckdb.connect() as con:  # the same store as specdec wrote it before: DuckDB's default format
        con.execute(f"ATTACH '{store.path}' AS s (READ_ONLY); ATTACH '{old}' AS o (STORAGE_VERSION 'v1.0.0')")
        con.execute("COPY FROM DATABASE s TO o")
        con.execute("UPDATE o.meta SET value = '2' WHERE key = 'schema_version'; CHECKPOINT o")
        before = con.execute("SELECT * FROM o.requests ORDER BY request_id").fetchall()
        assert "DICT_FSST" not in {c for (c,) in con.execute(
            "SELECT compression FROM pragma_storage_info('o.requests') WHERE column_name = 'output_text'").fetchall()}
    old.replace(store.path)
    assert storage_number(store.path) == 64
    more = [rec("b0", ts="2026-03-01T11:00:00Z")]
    assert ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", more))]).accepted == 1
    assert storage_number(store.path) == 68
    with store.read() as con:
        assert _text_compression(con) == {"DICT_FSST"}
        assert con.execute("SELECT * FROM requests WHERE request_id <> 'b0' ORDER BY request_id").fetchall() == before
        assert con.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchall() == [("3",)]


def test_an_ingest_binds_no_parameter_so_its_process_never_imports_pandas(tmp_path):
    """DuckDB's Python client imports pandas (0.3 s) to bind a first parameter; an ingest needs no pandas, so every
    value it sends is written into its statements. First and later batches, a file and a lake, with rejects, a
    cached_fingerprint object and stop lists (the values the identities are written with)."""
    records = [rec(f"p{i}", stop=["\n", f"s{i % 3}"], temperature=0.7 if i % 2 else 0.0, seed=2**62 + i,
                   cached_fingerprint=identity(rec("elsewhere", temperature=0.7, seed=2**100 + 1)) if i == 3 else None)
               for i in range(20)]
    first = write_jsonl(tmp_path / "a.jsonl", [*records[:10], {"request_id": "bad"}])
    later = write_jsonl(tmp_path / "b.jsonl", records[10:])
    code = ("import sys\nfrom specdec_core.ingestion import ingest\nfrom specdec_core.store import Store\n"
            "for store in sys.argv[3:]:\n    for path in sys.argv[1:3]:\n        ingest(Store(store), [path])\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas')[:1])")
    done = subprocess.run([sys.executable, "-c", code, str(first), str(later), str(tmp_path / "s.duckdb"),
                           f"ducklake:{tmp_path}/lake.sqlite"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout
    with Store(tmp_path / "s.duckdb").read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == [(20,)]
        # The identity given whole was written too (the lists of _insert_identities).
        assert con.execute(f"SELECT count(*) FROM identities WHERE seed::VARCHAR = '{2**100 + 1}'").fetchall() == [(1,)]
