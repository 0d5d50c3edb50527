"""Ingest under hostile file systems and inputs: odd names, link loops, huge records, kills, full disks."""

from __future__ import annotations

import errno
import gzip
import hashlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
import uuid
from pathlib import Path

import duckdb
import pytest
from helpers import rec, run_cli, sigint_default, write_csv, write_jsonl

from specdec_core import interrupts
from specdec_core.cli import main as cli_main
from specdec_core.formats.files import LogReadError
from specdec_core.ingestion import load
from specdec_core.ingestion.load import ingest
from specdec_core.ingestion.staging import IngestLimits
from specdec_core.store import connection
from specdec_core.store.connection import Store, StoreError

REPO = Path(__file__).resolve().parents[2]


def loaded(store):
    with store.read() as con:
        return sorted(con.execute("SELECT request_id, regexp_extract(source_file, '[^/]+$'), source_line "
                                  "FROM requests").fetchall())


def quarantined(store):
    with store.read() as con:
        return con.execute("SELECT regexp_extract(source_file, '[^/]+$'), source_line, reason, raw "
                           "FROM quarantine ORDER BY source_file, source_line").fetchall()


def specdec(*args: str, **kwargs) -> subprocess.CompletedProcess:
    return run_cli(*args, cwd=REPO, **kwargs)


# --- 5: glob characters in file names ------------------------------------------------------------


def _logs_named_like_globs(tmp_path: Path) -> Path:
    """A folder whose file names hold glob characters, each beside a file the pattern would match."""
    logs = tmp_path / "logs"
    logs.mkdir()
    write_jsonl(logs / "[ab].jsonl", [rec("bracket")])
    write_jsonl(logs / "a.jsonl", [rec("plain-a")])
    write_jsonl(logs / "x*.jsonl", [rec("star")])
    write_jsonl(logs / "xa.jsonl", [rec("plain-xa")])
    return logs


def test_a_file_named_like_a_glob_is_read_as_itself_beside_the_files_it_would_match(store, tmp_path):
    logs = _logs_named_like_globs(tmp_path)
    with gzip.open(logs / "g?.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(rec("question")) + "\n")
    with gzip.open(logs / "gz.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write(json.dumps(rec("plain-gz")) + "\n")
    result = ingest(store, [str(logs)])
    assert (result.read, result.accepted, result.quarantined) == (6, 6, 0)
    assert loaded(store) == [("bracket", "[ab].jsonl", 1), ("plain-a", "a.jsonl", 1), ("plain-gz", "gz.jsonl.gz", 1),
                             ("plain-xa", "xa.jsonl", 1), ("question", "g?.jsonl.gz", 1), ("star", "x*.jsonl", 1)]


def test_a_path_that_exists_is_not_expanded_and_a_pattern_expands_once(tmp_path):
    logs = _logs_named_like_globs(tmp_path)
    literal = Store(tmp_path / "literal.duckdb")
    assert ingest(literal, [str(logs / "[ab].jsonl"), str(logs / "x*.jsonl")]).read == 2
    assert loaded(literal) == [("bracket", "[ab].jsonl", 1), ("star", "x*.jsonl", 1)]
    pattern = Store(tmp_path / "pattern.duckdb")
    # ? matches the * in x*.jsonl's name; that file is then read as itself, not expanded a second time.
    assert ingest(pattern, [str(logs / "x?.jsonl")]).read == 2
    assert loaded(pattern) == [("plain-xa", "xa.jsonl", 1), ("star", "x*.jsonl", 1)]
    every = Store(tmp_path / "every.duckdb")
    assert ingest(every, [str(logs / "*.jsonl")]).read == 4


def test_csv_and_parquet_files_with_glob_characters_are_read_as_themselves(store, tmp_path):
    write_csv(tmp_path / "c[12].csv", [rec("csv-bracket")])
    write_csv(tmp_path / "c1.csv", [rec("csv-plain")])
    for name, rid in (("p[12].parquet", "pq-bracket"), ("p1.parquet", "pq-plain")):
        src = write_jsonl(tmp_path / f"{rid}.src", [rec(rid)])
        con = duckdb.connect()
        con.execute(f"COPY (SELECT * FROM read_json('{src}')) TO '{tmp_path / name}' (FORMAT parquet)")
        con.close()
    result = ingest(store, [str(tmp_path / "c[12].csv"), str(tmp_path / "p[12].parquet")])
    assert (result.read, result.accepted) == (2, 2)
    assert loaded(store) == [("csv-bracket", "c[12].csv", 1), ("pq-bracket", "p[12].parquet", 1)]


# --- 6: symlink loops ------------------------------------------------------------------------------


def _ingest_in_subprocess(db: Path, path: str, timeout: float = 60) -> dict:
    code = ("import json, sys; from specdec_core.store.connection import Store; "
            "from specdec_core.ingestion.load import ingest; "
            "print(json.dumps(ingest(Store(sys.argv[1]), [sys.argv[2]]).to_json()))")
    done = subprocess.run([sys.executable, "-c", code, str(db), path], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_a_symlink_loop_under_a_recursive_glob_or_a_folder_ends(tmp_path):
    root = tmp_path / "dir"
    (root / "sub").mkdir(parents=True)
    write_jsonl(root / "top.jsonl", [rec("top")])
    write_jsonl(root / "sub" / "deep.jsonl", [rec("deep")])
    # Two links back up: following them walks 2^40 paths before the kernel says ELOOP.
    os.symlink(root, root / "sub" / "up")
    os.symlink(root / "sub", root / "sub" / "here")
    assert _ingest_in_subprocess(tmp_path / "glob.duckdb", str(root / "**" / "*.jsonl"))["read"] == 2
    assert _ingest_in_subprocess(tmp_path / "folder.duckdb", str(root))["read"] == 2


def test_a_fifo_or_a_device_named_as_a_log_is_refused_in_one_line_not_read_forever(tmp_path):
    os.mkfifo(tmp_path / "pipe.jsonl")
    os.symlink("/dev/zero", tmp_path / "zero.jsonl")
    for name in ("pipe.jsonl", "zero.jsonl"):
        done = specdec("ingest", str(tmp_path / name), "--db", str(tmp_path / "s.duckdb"), timeout=60)
        assert done.returncode == 1
        assert done.stderr.strip() == f"specdec ingest: {tmp_path / name}: not a regular file or folder"


# --- 7: one enormous record ------------------------------------------------------------------------


def test_a_record_past_the_size_limit_is_quarantined_and_the_rest_loads(store, tmp_path):
    huge = rec("huge", output_text="x" * (2 * 1024 * 1024))
    path = write_jsonl(tmp_path / "huge.jsonl", [rec("before"), huge, rec("after")])
    result = ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1024 * 1024))
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    [(name, line, reason, raw)] = quarantined(store)
    size = len(json.dumps(huge).encode())
    assert (name, line) == ("huge.jsonl", 2)
    assert reason == f"record too large: {size:,} bytes (limit 1 MiB)"
    # Its first 64 KiB are kept, with what finds the whole of it in its file: its size and MD5.
    text = json.dumps(huge)
    digest = hashlib.md5(text.encode()).hexdigest()
    assert raw == (text[:64 * 1024] + f" [cut by specdec: the first 65,536 of {size:,} bytes; "
                   f"MD5 of the whole record {digest}]")
    assert [r[0] for r in loaded(store)] == ["after", "before"]


def test_a_parquet_row_past_the_size_limit_is_cut_in_the_reader_and_the_rest_loads(store, tmp_path):
    # A Parquet of a few MB can hold a cell of hundreds: it is cut before the ingest holds it.
    path = tmp_path / "rows.parquet"
    con = duckdb.connect()
    rows = [rec("before"), rec("huge", output_text="h" * (2 << 20)), rec("after")]
    con.execute("CREATE TABLE t AS SELECT * FROM read_json(?, format = 'newline_delimited')",
                [str(write_jsonl(tmp_path / "rows.jsonl", rows))])
    con.execute(f"COPY t TO '{path}' (FORMAT parquet)")
    text = con.execute("SELECT to_json(t)::VARCHAR FROM t WHERE request_id = 'huge'").fetchall()[0][0]
    con.close()
    result = ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1 << 20))
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    [(_, row, reason, raw)] = quarantined(store)
    size = len(text.encode())
    assert (row, reason) == (2, f"record too large: {size:,} bytes (limit 1 MiB)")
    assert raw == (text[:64 * 1024] + f" [cut by specdec: the first 65,536 of {size:,} bytes; "
                   f"MD5 of the whole record {hashlib.md5(text.encode()).hexdigest()}]")
    assert [r[0] for r in loaded(store)] == ["after", "before"]


def test_a_csv_cell_may_be_as_long_as_a_record_and_a_longer_one_rejects_its_row_alone(store, tmp_path):
    # The csv module stops at 128 KiB a cell, which failed a whole file for one long output.
    # (On one physical line, the line is past the limit before the cell is: it is read past in parts.)
    rows = [rec("before"), rec("long", output_text="l" * (300 * 1024)), rec("huge", output_text="h" * (2 << 20)),
            rec("after")]
    path = write_csv(tmp_path / "cells.csv", rows)
    result = ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1 << 20))
    assert (result.read, result.accepted, result.quarantined) == (4, 3, 1)
    [(_, row, reason, raw)] = quarantined(store)
    assert (row, reason) == (3, "record too large: a line longer than the limit (1 MiB)")
    assert "the row is in the file" in raw and len(raw) < 200
    assert [r[0] for r in loaded(store)] == ["after", "before", "long"]


def test_a_quoted_csv_cell_past_the_limit_over_many_lines_is_one_rejected_row(store, tmp_path):
    # The csv module starts again at the next physical line, inside the cell: its lines came out as rows, and
    # the line that closes it (a quote at its start) opened a cell that swallowed the next record.
    rows = [rec("before"), rec("huge", output_text="line\n" * 420_000), rec("after"), rec("after2")]
    path = write_csv(tmp_path / "lines.csv", rows)
    result = ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1 << 20))
    assert (result.read, result.accepted, result.quarantined) == (4, 3, 1)
    [(_, row, reason, _)] = quarantined(store)
    assert (row, reason) == (2, "record too large: a cell longer than the limit (1 MiB)")
    assert [(r[0], r[2]) for r in loaded(store)] == [("after", 3), ("after2", 4), ("before", 1)]


@pytest.mark.parametrize("quoted", [False, True])
def test_a_csv_line_longer_than_a_record_is_read_past_in_parts_not_held(store, tmp_path, quoted):
    # The csv module held a whole physical line (a 300 MB line, 300 MB and more) before its cell limit cut it.
    huge = "x" * (3 << 20)
    cell = f'"a ""quoted"" start\n{huge}, still quoted\nend"' if quoted else huge
    text = (write_csv(tmp_path / "head.csv", [rec("before")]).read_text()
            + f"huge,{cell},trailing\n" + "".join(write_csv(tmp_path / "t.csv", [rec(f"after{i}")]).read_text()
                                                 .split("\n", 1)[1] for i in range(2)))
    path = tmp_path / "long.csv"
    path.write_text(text)
    result = ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1 << 20))
    assert (result.read, result.accepted, result.quarantined) == (4, 3, 1)
    [(_, row, reason, raw)] = quarantined(store)
    assert (row, reason) == (2, "record too large: a line longer than the limit (1 MiB)")
    assert [(r[0], r[2]) for r in loaded(store)] == [("after0", 3), ("after1", 4), ("before", 1)]


def test_a_csv_whose_header_is_longer_than_a_record_is_refused_in_one_line(store, tmp_path):
    path = tmp_path / "header.csv"
    path.write_text("request_id," + "h" * (2 << 20) + "\nx,y\n")
    with pytest.raises(LogReadError) as refused:
        ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1 << 20))
    assert str(refused.value) == f"{path}: cannot be read as CSV: its header line is longer than 1 MiB"


@pytest.mark.parametrize("separator", [";", "\t"])
def test_a_csv_separated_by_semicolons_or_tabs_is_refused_in_one_line(store, tmp_path, separator):
    """Excel where a comma is the decimal mark saves ';', a TSV tabs: read with commas, the header was one column
    and every row was quarantined as missing its request_id, which was there."""
    path = write_csv(tmp_path / "log.csv", [rec("a"), rec("b")])
    path.write_text(path.read_text(encoding="utf-8").replace(",", separator), encoding="utf-8")
    with pytest.raises(LogReadError) as refused:
        ingest(store, [str(path)])
    assert str(refused.value) == (f"{path}: cannot be read as CSV: its header is one column, its field names "
                                  f"separated by {separator!r}; specdec reads comma-separated CSV: save it with commas")
    assert not store.exists


_CSV_PIECES = ["a", "b,", ",", '"', '""', '"x"', "\n", "\r\n", "\r", " ", '",', ',"']


@pytest.mark.parametrize("seed", range(40))
def test_where_a_csv_record_ends_is_read_as_the_csv_module_reads_it(seed):
    # Over random texts of commas, quotes and line breaks: a quoted cell is open at the end of every line of a
    # record but its last, as the csv module (excel dialect, not strict) splits them.
    import csv
    import io
    import random

    from specdec_core.formats.csv_file import _QUOTED, _START, _csv_state_after, _CsvLines

    rnd = random.Random(seed)
    text = "".join(rnd.choice(_CSV_PIECES) for _ in range(400))
    lines = _CsvLines(io.StringIO(text, newline=""), max_line=1 << 20)
    seen: list[list[str]] = []

    class Spy:
        def __iter__(self):
            return self

        def __next__(self):
            line = next(lines)
            seen[-1].append(line)
            return line

    reader = csv.reader(Spy())
    records = 0
    while True:
        seen.append([])
        try:
            next(reader)
        except StopIteration:
            break
        except csv.Error:
            return  # a text the csv module refuses: nothing to compare with
        record, state = seen[-1], _START
        for i, line in enumerate(record):
            state = _csv_state_after(line, state)
            open_quote = state == _QUOTED
            last = i == len(record) - 1
            if not (last and not line.endswith(("\n", "\r"))):  # the file's end closes a record, open or not
                assert open_quote == (not last), (record, i)
        records += 1
    assert records > 20
    # Read in parts (a line past the limit is), the state is the same wherever the parts split the text.
    for cut in rnd.sample(range(len(text)), 20):
        assert _csv_state_after(text[cut:], _csv_state_after(text[:cut], _START)) == _csv_state_after(text, _START)


@pytest.mark.parametrize("others", [0, 2])
def test_a_plain_file_whose_only_line_is_past_the_limit_loses_nothing(store, tmp_path, others):
    # DuckDB's line reader reads such a file as no lines at all, without an error.
    huge = rec("huge", output_text="x" * (3 * 1024 * 1024))
    path = write_jsonl(tmp_path / "one.jsonl", [huge, *(rec(f"ok{i}") for i in range(others))])
    result = ingest(store, [str(path)], limits=IngestLimits(max_record_bytes=1024 * 1024))
    assert (result.read, result.accepted, result.quarantined) == (1 + others, others, 1)
    [(_, line, reason, _)] = quarantined(store)
    assert (line, reason) == (1, f"record too large: {len(json.dumps(huge).encode()):,} bytes (limit 1 MiB)")


@pytest.mark.parametrize("last_line_ends", [True, False])
def test_a_gzip_line_of_hundreds_of_megabytes_is_cut_and_the_rest_loads(store, tmp_path, last_line_ends):
    # 200 MB of one character is 200 KB of gzip: the reader must neither hold it nor copy it again and again
    # (it ran DuckDB out of memory before; and a line grown 1 MB at a time is quadratic).
    path = tmp_path / "bomb.jsonl.gz"
    size = 200 * 1024 * 1024
    bomb = hashlib.md5()
    with gzip.open(path, "wb", compresslevel=6) as fh:
        fh.write((json.dumps(rec("before")) + "\n").encode())
        fh.write(b'{"request_id": "bomb", "output_text": "')
        bomb.update(b'{"request_id": "bomb", "output_text": "')
        block = b"a" * (1 << 20)
        for _ in range(size // len(block)):
            fh.write(block)
            bomb.update(block)
        fh.write(b'"}')
        bomb.update(b'"}')
        if last_line_ends:
            fh.write(("\n" + json.dumps(rec("after")) + "\n").encode())
    result = ingest(store, [str(path)])
    assert (result.read, result.quarantined) == (3 if last_line_ends else 2, 1)
    [(_, line, reason, raw)] = quarantined(store)
    whole = size + len(b'{"request_id": "bomb", "output_text": "') + 2
    assert (line, reason) == (2, f"record too large: {whole:,} bytes (limit 16 MiB)")
    assert raw.startswith('{"request_id": "bomb", "output_text": "aaa') and len(raw) < 65 * 1024
    assert raw.endswith(f"of {whole:,} bytes; MD5 of the whole record {bomb.hexdigest()}]")
    assert [r[0] for r in loaded(store)] == (["after", "before"] if last_line_ends else ["before"])


def test_the_default_size_limit_is_16_mib_on_the_gzip_reader_too(store, tmp_path):
    huge = rec("huge", output_text="y" * (17 * 1024 * 1024))
    with gzip.open(tmp_path / "huge.jsonl.gz", "wt", encoding="utf-8", compresslevel=1) as fh:
        fh.write("\n".join(json.dumps(r) for r in (rec("before"), huge, rec("after"))) + "\n")
    result = ingest(store, [str(tmp_path / "huge.jsonl.gz")])
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    [(_, line, reason, _)] = quarantined(store)
    assert line == 2 and reason.startswith("record too large: ") and reason.endswith(" bytes (limit 16 MiB)")


def test_a_record_with_too_many_fields_is_quarantined_and_the_rest_loads(store, tmp_path):
    wide = rec("wide")
    wide.update({f"extra_{i}": i for i in range(8000 - len(wide))})
    path = write_jsonl(tmp_path / "wide.jsonl", [rec("before"), wide, rec("after")])
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    [(_, line, reason, raw)] = quarantined(store)
    assert (line, reason) == (2, "too many fields: 8000 (limit 1000)")
    assert json.loads(raw) == wide


def test_limits_are_settable_from_the_environment(store, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_MAX_FIELDS", "30")
    monkeypatch.setenv("SPECDEC_MAX_RECORD_BYTES", "4096")
    wide = {**rec("wide"), **{f"e{i}": i for i in range(10)}}
    path = write_jsonl(tmp_path / "env.jsonl", [rec("ok"), wide, rec("long", output_text="z" * 5000)])
    result = ingest(store, [str(path)])
    assert (result.accepted, result.quarantined) == (1, 2)
    reasons = [reason for _, _, reason, _ in quarantined(store)]
    assert reasons[0] == f"too many fields: {len(wide)} (limit 30)"
    assert reasons[1].startswith("record too large: ") and reasons[1].endswith("(limit 4 KiB)")


# --- 8: the database file's mode and links ---------------------------------------------------------


def test_a_private_database_stays_private_after_an_ingest(store, tmp_path):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    os.chmod(store.path, 0o600)
    ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b")]))])
    assert stat.S_IMODE(store.path.stat().st_mode) == 0o600
    assert [r[0] for r in loaded(store)] == ["a", "b"]


def test_a_symlinked_database_stays_a_link_and_its_target_gets_the_data(tmp_path):
    real = tmp_path / "real" / "triage.duckdb"
    real.parent.mkdir()
    link = tmp_path / "link.duckdb"
    ingest(Store(real), [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    link.symlink_to(real)
    ingest(Store(link), [str(write_jsonl(tmp_path / "b.jsonl", [rec("b")]))])
    assert link.is_symlink() and Path(os.readlink(link)) == real
    assert [r[0] for r in loaded(Store(real))] == ["a", "b"]
    assert [r[0] for r in loaded(Store(link))] == ["a", "b"]
    # A link to a database not created yet: the target is created, the link kept.
    dangling = tmp_path / "new.duckdb"
    dangling.symlink_to(tmp_path / "real" / "new-target.duckdb")
    ingest(Store(dangling), [str(tmp_path / "a.jsonl")])
    assert dangling.is_symlink() and (tmp_path / "real" / "new-target.duckdb").is_file()


# --- 9: leftovers of killed ingests ----------------------------------------------------------------


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_leftovers_of_a_killed_writer_are_removed_on_the_next_write_and_a_live_ones_kept(store, tmp_path):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    dead, live = _dead_pid(), os.getppid()
    name = store.path.name
    stale = [tmp_path / f"{name}.{dead}.tmp", tmp_path / f"{name}.{dead}.tmp.wal"]
    for p in stale:
        p.write_bytes(b"x" * 1000)
    folders = [tmp_path / f"{name}.{dead}.tmp.spill", tmp_path / f"{name}.{dead}.tmp.fresh"]  # spill, fresh file
    for folder in folders:
        folder.mkdir()
        (folder / "block").write_bytes(b"x" * 1000)
    kept = [tmp_path / f"{name}.{live}.tmp", tmp_path / f"other.duckdb.{dead}.tmp", tmp_path / f"{name}.notes.tmp"]
    for p in kept:
        p.write_bytes(b"y")
    ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b")]))])
    assert not any(p.exists() for p in [*stale, *folders])
    assert all(p.exists() for p in kept)


# --- 10: the report never overwrites the database --------------------------------------------------


def test_report_refuses_to_write_over_its_own_database(tmp_path):
    db = tmp_path / "t.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "l.jsonl", [rec("a", cache_key="k"),
                                                              rec("b", cache_key="k", cache_hit=True, seed=3)]))])
    before = db.read_bytes()
    link = tmp_path / "out.csv"
    link.symlink_to(db)
    for out in (str(db), str(link), str(tmp_path / "." / "t.duckdb")):
        done = specdec("report", "--db", str(db), "--out", out)
        assert done.returncode == 2, (out, done.stderr)
        assert done.stderr.strip().count("\n") == 0 and "is the database" in done.stderr
        assert db.read_bytes() == before


# --- 11: Ctrl-C and a full disk --------------------------------------------------------------------


@pytest.mark.parametrize("exc", [KeyboardInterrupt(), duckdb.InterruptException("INTERRUPT Error: Interrupted!"),
                                 RuntimeError("Query interrupted")])
def test_every_kind_of_interrupt_ends_in_one_line_and_exit_130(exc, tmp_path, monkeypatch, capsys):
    def interrupted(*args, **kwargs):
        raise exc

    monkeypatch.setattr("specdec_core.cli.store_cmds.ingest", interrupted)
    log = write_jsonl(tmp_path / "l.jsonl", [rec("a")])
    assert cli_main(["ingest", str(log), "--db", str(tmp_path / "t.duckdb")]) == 130
    assert capsys.readouterr().err == "specdec: interrupted\n"


def test_an_unrelated_runtime_error_is_not_called_an_interrupt(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("something else")

    monkeypatch.setattr("specdec_core.cli.store_cmds.ingest", broken)
    with pytest.raises(RuntimeError, match="something else"):
        cli_main(["ingest", str(write_jsonl(tmp_path / "l.jsonl", [rec("a")])), "--db", str(tmp_path / "t.duckdb")])


def test_sigint_during_a_real_ingest_exits_130_with_one_line_and_leaves_the_store_as_it_was(tmp_path):
    db = tmp_path / "t.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "seed.jsonl", [rec("seed")]))])
    before = db.read_bytes()
    line = json.dumps(rec("R", output_text="o" * 300))
    with open(tmp_path / "big.jsonl", "w") as fh:
        for i in range(120_000):
            fh.write(line.replace('"R"', f'"r{i}"', 1) + "\n")
    proc = subprocess.Popen([sys.executable, "-m", "specdec_core", "ingest", str(tmp_path / "big.jsonl"),
                             "--db", str(db)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=sigint_default)
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("t.duckdb.*.tmp")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.3)
    # Still writing (its copy not yet in the store's place), not merely alive: on a loaded machine a process
    # can be seen alive after it has replaced the store, while it exits, and there is nothing left to stop.
    assert list(tmp_path.glob("t.duckdb.*.tmp")), \
        "the ingest ended before it could be interrupted; make the file larger"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert err == "specdec: interrupted\n"
    assert db.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("t.duckdb")) == ["t.duckdb",
                                                                                          "t.duckdb.lock"]


@pytest.fixture
def python_sigint():
    """SIGINT handled as a fresh `specdec` finds it (Python's own handler), whatever the suite's worker set."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
    interrupts._noted = False


@pytest.mark.parametrize("kind", ["file", "lake"])
def test_a_ctrl_c_a_library_swallowed_still_ends_in_130_and_leaves_the_store_as_it_was(
        kind, tmp_path, monkeypatch, capsys, python_sigint):
    # DuckDB imports pandas the first time it binds a Python value, and drops a KeyboardInterrupt raised inside
    # that import: the command ran on and changed the store. Here the library's part is played by a write
    # that swallows the interrupt its own SIGINT raised.
    db = str(tmp_path / "t.duckdb") if kind == "file" else f"ducklake:{tmp_path / 'cat.sqlite'}"
    ingest(Store(db), [str(write_jsonl(tmp_path / "seed.jsonl", [rec("seed")]))])
    with Store(db).read() as con:
        before = con.execute("SELECT count(*) FROM requests").fetchall()

    def swallowing_ingest(store, paths, **kwargs):
        with store.write() as con:
            con.execute("DELETE FROM requests")
            try:
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(1)  # the handler runs at the next bytecode: long before this ends
            except KeyboardInterrupt:
                pass
        raise AssertionError("the write made its changes visible after a Ctrl-C")

    monkeypatch.setattr("specdec_core.cli.store_cmds.ingest", swallowing_ingest)
    log = write_jsonl(tmp_path / "l.jsonl", [rec("a")])
    assert cli_main(["ingest", str(log), "--db", db]) == 130
    assert capsys.readouterr().err == "specdec: interrupted\n"
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall() == before == [(1,)]


def test_a_full_disk_while_copying_is_one_line_and_the_store_is_untouched(store, tmp_path, monkeypatch, capsys):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    before = store.path.read_bytes()

    def no_space(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(connection, "_copy_database", no_space)
    with pytest.raises(StoreError, match="No space left on device") as err:
        ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b")]))])
    assert "\n" not in str(err.value) and str(store.path) in str(err.value)
    assert store.path.read_bytes() == before
    assert cli_main(["ingest", str(tmp_path / "b.jsonl"), "--db", str(store.path)]) == 1
    assert capsys.readouterr().err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("triage")) == [
        "triage.duckdb", "triage.duckdb.lock"]


def test_the_working_copy_is_the_file_byte_for_byte_and_private(store, tmp_path):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec(f"r{i}") for i in range(50)]))])
    os.chmod(store.path, 0o644)
    copy = tmp_path / "copy.duckdb"
    connection._copy_database(store.path, copy)
    assert copy.read_bytes() == store.path.read_bytes()
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600  # made private; the write gives it the store's mode at the end


@pytest.mark.parametrize("refusal", [errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL])
def test_a_filesystem_that_cannot_copy_ranges_gets_a_byte_copy(refusal, store, tmp_path, monkeypatch):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    tried = []

    def cannot(*args):
        tried.append(args)
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "copy_file_range", cannot)
    result = ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b")]))])
    assert tried and result.accepted == 1
    assert [r[0] for r in loaded(store)] == ["a", "b"]


def test_a_full_disk_inside_the_range_copy_is_one_line_and_the_store_is_untouched(store, tmp_path, monkeypatch):
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    before = store.path.read_bytes()
    real = os.copy_file_range

    def fills_up(src, dst, count, *rest):
        real(src, dst, min(count, 4096))  # part of the file lands, then the disk is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "copy_file_range", fills_up)
    with pytest.raises(StoreError, match="No space left on device") as err:
        ingest(store, [str(write_jsonl(tmp_path / "b.jsonl", [rec("b")]))])
    assert "\n" not in str(err.value)
    assert store.path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("triage")) == [
        "triage.duckdb", "triage.duckdb.lock"]


def test_a_really_full_disk_is_one_line_and_the_store_is_untouched(tiny_disk, tmp_path):
    db = tiny_disk / "t.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    before = db.read_bytes()
    with open(tmp_path / "big.jsonl", "w") as fh:
        for i in range(4000):  # random text: DuckDB would compress a repeated one to nothing
            fh.write(json.dumps(rec(f"r{i}", output_text=os.urandom(1000).hex())) + "\n")
    for leave in (len(before) // 2, len(before) + 1024 * 1024):  # the copy fails; DuckDB's own writes fail
        filler = tiny_disk / "filler"
        filler.unlink(missing_ok=True)
        free = os.statvfs(tiny_disk).f_bavail * os.statvfs(tiny_disk).f_frsize
        filler.write_bytes(b"\0" * max(free - leave, 0))
        done = specdec("ingest", str(tmp_path / "big.jsonl"), "--db", str(db))
        assert done.returncode == 1, done.stderr
        assert done.stderr.count("\n") == 1 and "No space left on device" in done.stderr, done.stderr
        assert db.read_bytes() == before
        assert sorted(p.name for p in tiny_disk.iterdir()) == ["filler", "t.duckdb", "t.duckdb.lock"]


# --- 12: bytes that are not what they seem --------------------------------------------------------


def test_invalid_utf8_inside_a_string_is_quarantined_with_its_bytes_shown(store, tmp_path):
    good = json.dumps(rec("bad-utf8", output_text="aXb")).encode()
    path = tmp_path / "bytes.jsonl"
    path.write_bytes(json.dumps(rec("ok-1")).encode() + b"\n" + good.replace(b"aXb", b"a\xff\xfeb") + b"\n"
                     + json.dumps(rec("ok-2")).encode() + b"\n")
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    [(_, line, reason, raw)] = quarantined(store)
    assert (line, reason) == (2, "invalid UTF-8")
    assert raw == good.decode().replace("aXb", "a\\xff\\xfeb")


@pytest.mark.parametrize(("name", "encoding", "said"), [("ps.jsonl", "utf-16", "UTF-16"), ("excel.csv", "utf-16-be", None),
                                                   ("wide.jsonl.gz", "utf-32", "UTF-32")])
def test_a_log_in_utf16_or_utf32_is_refused_in_one_line_naming_the_conversion(tmp_path, name, encoding, said):
    """PowerShell 5's `>` and Excel's "Unicode Text" save UTF-16: read as UTF-8, every line was quarantined as bad
    JSON or invalid UTF-8, and nothing said why. Refused before anything is written, with the fix."""
    csv = name.endswith(".csv")
    text = (write_csv(tmp_path / "utf8.csv", [rec("a")]) if csv else write_jsonl(tmp_path / "utf8.jsonl", [rec("a")])
            ).read_text(encoding="utf-8")
    bom = "\ufeff" if encoding == "utf-16-be" else ""  # utf-16 and utf-32 write their own, utf-16-be none
    path = tmp_path / name
    pack = gzip.compress if name.endswith(".gz") else bytes
    path.write_bytes(pack((bom + text).encode(encoding)))
    db = tmp_path / "s.duckdb"
    done = run_cli("ingest", str(tmp_path / ("utf8.csv" if csv else "utf8.jsonl")), str(path), "--db", str(db))
    assert done.returncode == 1, done.stderr
    [line] = done.stderr.strip().splitlines()
    conversion = "zcat FILE | iconv" if name.endswith(".gz") else "iconv"
    assert line == (f"specdec ingest: {path}: {said or 'UTF-16'} text (its byte order mark says so); specdec reads "
                    f"UTF-8: convert it first, e.g. {conversion} -f {said or 'UTF-16'} -t UTF-8 FILE > FILE.utf8")
    assert not db.exists()  # the good file beside it waits for the whole ingest
    # The same text in UTF-8 with its byte order mark loads.
    path.write_bytes(pack(b"\xef\xbb\xbf" + text.encode()))
    assert ingest(Store(db), [str(path)]).accepted == 1


def test_invalid_utf8_in_a_csv_cell_is_quarantined_too(store, tmp_path):
    path = write_csv(tmp_path / "bytes.csv", [rec("ok"), rec("bad", output_text="aXb")])
    path.write_bytes(path.read_bytes().replace(b"aXb", b"a\xffb"))
    result = ingest(store, [str(path)])
    assert (result.accepted, result.quarantined) == (1, 1)
    [(_, line, reason, raw)] = quarantined(store)
    assert (line, reason) == (2, "invalid UTF-8") and json.loads(raw)["output_text"] == "a\\xffb"


@pytest.mark.parametrize("name", ["cr.jsonl", "cr.jsonl.gz"])
def test_a_raw_carriage_return_inside_a_line_does_not_split_it(store, tmp_path, name):
    inside_string = json.dumps(rec("cr-string", output_text="aXb")).replace("aXb", "a\rb")
    between_tokens = json.dumps(rec("cr-space")).replace(", ", ",\r", 1)
    text = "\n".join([json.dumps(rec("one")), inside_string, between_tokens, json.dumps(rec("four"))]) + "\r\n"
    if name.endswith(".gz"):
        with gzip.open(tmp_path / name, "wb") as fh:
            fh.write(text.encode())
    else:
        (tmp_path / name).write_bytes(text.encode())
    result = ingest(store, [str(tmp_path / name)])
    assert (result.read, result.accepted, result.quarantined) == (4, 3, 1)
    assert [(r, line) for r, _, line in loaded(store)] == [("cr-space", 3), ("four", 4), ("one", 1)]
    [(_, line, reason, raw)] = quarantined(store)
    assert line == 2 and "bad JSON" in reason and raw == inside_string


def test_a_file_whose_only_line_ends_are_carriage_returns_is_one_line(store, tmp_path):
    # DuckDB's line reader would take each CR for a line end here, and load two records.
    path = tmp_path / "cr-only.jsonl"
    path.write_bytes((json.dumps(rec("a")) + "\r" + json.dumps(rec("b"))).encode())
    result = ingest(store, [str(path)])
    assert (result.read, result.accepted, result.quarantined) == (1, 0, 1)
    [(_, line, reason, _)] = quarantined(store)
    assert line == 1 and "bad JSON" in reason


def test_a_truncated_gzip_loads_what_is_readable_and_quarantines_the_tail(store, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    with gzip.open(logs / "cut.jsonl.gz", "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(rec(f"c{i}", output_text=uuid.UUID(int=i).hex * 8)) + "\n"
                         for i in range(2000)))
    whole = (logs / "cut.jsonl.gz").read_bytes()
    (logs / "cut.jsonl.gz").write_bytes(whole[: len(whole) // 2])
    write_jsonl(logs / "other.jsonl", [rec("other")])
    result = ingest(store, [str(logs)])
    ids = [r for r, _, _ in loaded(store)]
    assert "other" in ids and len(ids) > 100
    [(name, line, reason, raw)] = quarantined(store)
    assert name == "cut.jsonl.gz" and line == len(ids)  # the complete lines before the cut are loaded
    assert reason == f"truncated gzip: file ends mid-stream after line {line - 1}"
    assert raw and '"request_id": "c' in raw
    assert (result.read, result.accepted, result.quarantined) == (len(ids) + 1, len(ids), 1)


def test_the_same_bad_file_from_another_path_is_not_quarantined_again(store, tmp_path):
    lines = [rec("g1"), "{broken", rec("g2", max_tokens=0)]
    (tmp_path / "one").mkdir()
    first = write_jsonl(tmp_path / "one" / "upload.jsonl", lines)
    second = tmp_path / "two" / "upload.jsonl"
    second.parent.mkdir()
    second.write_bytes(first.read_bytes())
    third = tmp_path / "renamed.jsonl"
    third.write_bytes(first.read_bytes())
    counts = [ingest(store, [str(p)]).quarantined for p in (first, second, third)]
    assert counts == [2, 0, 0]
    with store.read() as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchall() == [(2,)]
    both = Store(tmp_path / "both.duckdb")
    result = ingest(both, [str(first), str(second)])  # two copies in one batch
    assert (result.read, result.accepted, result.duplicates, result.quarantined) == (6, 1, 3, 2)


def test_a_log_that_conflicts_with_every_record_of_another_is_quarantined_within_the_memory_limit(
        store, tmp_path, monkeypatch):
    # Two services that logged the same requests with different content: every record of the second conflicts,
    # and each reject is kept with its line. Choosing which rejects were new sorted them with their text: a
    # 2M-line ingest (1M conflicts) ran out of its 1.4 GB. The same here, 120 MB of lines under 180 MB.
    monkeypatch.setattr(load, "WRITER_MEMORY_LIMIT_NATIVE", "180MB")
    n, long = 20_000, "x" * 3000
    first = write_jsonl(tmp_path / "gateway.jsonl", [rec(f"r{i}", output_text=f"{i} {long}") for i in range(n)])
    second = write_jsonl(tmp_path / "service.jsonl", [rec(f"r{i}", output_text=f"{i} {long}!") for i in range(n)])
    result = ingest(store, [str(first), str(second)])
    assert (result.accepted, result.quarantined) == (n, n)
    with store.read() as con:
        assert con.execute("SELECT count(*), count(DISTINCT request_id), min(reason LIKE 'conflict: request_id r% "
                           "appears earlier at %gateway.jsonl:%') FROM quarantine").fetchall() == [(n, n, True)]
