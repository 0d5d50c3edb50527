"""A large file of another log format is read by worker processes (formats/parallel.py): the store it makes
equals the one read line by line here, bad lines and their reasons included, and a reader's error, a
worker that dies and a caller's script without a main guard behave."""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from helpers import contents, rec, write_jsonl

from specdec_core.formats import jsonl as readers
from specdec_core.formats import line_reader, load_mapping, parallel
from specdec_core.ingestion import ingest
from specdec_core.store import Store

FORMATS = Path(__file__).parents[1] / "fixtures" / "formats"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def in_workers(monkeypatch):
    """Every file read by two workers, in slices of three lines: many slices, answers out of step."""
    monkeypatch.setattr(parallel, "PARALLEL_FROM_BYTES", 0)
    monkeypatch.setattr(parallel, "SLICE_LINES", 3)
    monkeypatch.setattr(parallel, "workers_for", _two_workers(parallel.workers_for))


def _two_workers(chosen):
    return lambda size, reader: 2 if chosen(size, reader) else 0


def _log(tmp_path: Path, *names: str) -> Path:
    """Fixture files one after the other in one log: good records and bad lines mixed."""
    log = tmp_path / "log.jsonl"
    log.write_text("".join((FORMATS / n).read_text(encoding="utf-8") for n in names), encoding="utf-8")
    return log


CASES = [("otel", ("otel_spans.jsonl", "otel_bad.jsonl", "otel_spans.jsonl"), None),
         ("litellm", ("litellm_payloads.jsonl", "litellm_bad.jsonl"), None),
         ("map", ("mapping/custom.jsonl",), "mapping/custom_map.toml")]


@pytest.mark.parametrize(("fmt", "names", "mapping"), CASES, ids=[c[0] for c in CASES])
def test_a_file_read_by_workers_makes_the_store_a_line_by_line_read_makes(fmt, names, mapping, tmp_path, monkeypatch):
    log = _log(tmp_path, *names)
    chosen = load_mapping(FORMATS / mapping) if mapping else None
    shape = "auto" if fmt == "map" else fmt
    here = ingest(Store(tmp_path / "here.duckdb"), [str(log)], log_format=shape, mapping=chosen)
    calls = []
    monkeypatch.setattr(parallel, "PARALLEL_FROM_BYTES", 0)
    monkeypatch.setattr(parallel, "SLICE_LINES", 3)
    original = parallel.read_in_workers
    monkeypatch.setattr(parallel, "read_in_workers", lambda *a: calls.append(a[2]) or original(*a))
    monkeypatch.setattr(parallel, "workers_for", _two_workers(parallel.workers_for))
    there = ingest(Store(tmp_path / "there.duckdb"), [str(log)], log_format=shape, mapping=chosen)
    assert calls == [2], "the file was read by two workers"
    assert here.quarantined > 0 or fmt == "map"
    assert (there.read, there.accepted, there.quarantined, there.skipped) == \
        (here.read, here.accepted, here.quarantined, here.skipped)
    assert contents(str(tmp_path / "there.duckdb")) == contents(str(tmp_path / "here.duckdb"))


def broken_reader(line: str):
    if "b-3" in line:
        raise KeyError("a reader's bug, not a bad line")
    return line_reader("litellm")(line)


def test_a_workers_error_that_is_not_a_bad_line_stops_the_read(in_workers, tmp_path):
    log = write_jsonl(tmp_path / "l.jsonl", [{"id": f"b-{i}", "call_type": "completion"} for i in range(9)])
    with pytest.raises(KeyError, match="a reader's bug"):
        list(readers.read_foreign(log, "l", broken_reader))


def killing_reader(line: str):
    os._exit(3)


def test_a_worker_that_dies_is_an_error_not_a_hang(in_workers, tmp_path):
    log = write_jsonl(tmp_path / "l.jsonl", [rec(f"r{i}") for i in range(5)])
    with pytest.raises(RuntimeError, match="worker process ended"):
        list(readers.read_foreign(log, "l", killing_reader))


def test_a_script_that_ingests_at_its_top_level_starts_its_workers_once(tmp_path):
    # multiprocessing's spawn would run such a script again in every worker.
    script = tmp_path / "load.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        from specdec_core.formats import parallel
        from specdec_core.store import Store
        from specdec_core.ingestion import ingest
        parallel.PARALLEL_FROM_BYTES = 0
        parallel.SLICE_LINES = 2
        print("started", flush=True)
        r = ingest(Store(sys.argv[1]), [{str(FORMATS / 'litellm_payloads.jsonl')!r}], log_format="litellm")
        print("accepted", r.accepted)
    """), encoding="utf-8")
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "s.duckdb")], capture_output=True, text=True,
                          timeout=120, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("started") == 1
    here = ingest(Store(tmp_path / "here.duckdb"), [str(FORMATS / "litellm_payloads.jsonl")], log_format="litellm")
    assert f"accepted {here.accepted}" in done.stdout


def test_workers_that_cannot_start_leave_the_read_to_this_process(in_workers, tmp_path, monkeypatch, caplog):
    # An interpreter that can't import specdec_core (a frozen app, a broken path): the read still happens.
    monkeypatch.setattr(parallel, "_BOOT", "import sys; sys.exit(3)")
    log = _log(tmp_path, "litellm_payloads.jsonl", "litellm_bad.jsonl")
    reader = line_reader("litellm")
    got = [(b.line_numbers, b.raws, b.reasons) for b in readers.read_foreign(log, "l", reader)]
    assert "workers could not start" in caplog.text
    monkeypatch.setattr(parallel, "PARALLEL_FROM_BYTES", 1 << 62)
    assert got == [(b.line_numbers, b.raws, b.reasons) for b in readers.read_foreign(log, "l", reader)]
    assert sum(len(g[0]) for g in got) > 10


def test_what_crosses_the_pipes_is_json_and_keeps_every_text_as_it_was():
    # Lines of bytes that are not UTF-8 hold lone surrogates; records hold any Unicode, quotes and line ends.
    texts = ["", "plain", 'a "quoted" \\ text\n', "é漢字🙂", "\udcff\udc80 half", "\ud800", "x" * 100_000]
    read_end, write_end = os.pipe()

    def send() -> None:  # from a thread: a pipe holds less than the frame
        with os.fdopen(write_end, "wb") as out:
            parallel._send(out, {"numbers": [1, 2], "reasons": [None, "bad JSON: \udcff"]}, texts)

    sender = threading.Thread(target=send)
    sender.start()
    with os.fdopen(read_end, "rb") as inp:
        head, got = parallel._receive(inp)
        sender.join()
        assert got == texts
        assert head == {"numbers": [1, 2], "reasons": [None, "bad JSON: \udcff"]}
        with pytest.raises(EOFError):
            parallel._receive(inp)
    head_bytes = b'{"lengths": []}'
    cut = len(head_bytes).to_bytes(8, "little") + head_bytes + (10).to_bytes(8, "little") + b"abc"
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "wb") as out:
        out.write(cut)
    with os.fdopen(read_end, "rb") as inp, pytest.raises(EOFError, match="mid-frame"):
        parallel._receive(inp)


class NotBuiltin(Exception):
    pass


def failing_reader(line: str):
    raise NotBuiltin("made here", object())


def test_a_reader_is_sent_by_name_and_only_one_a_worker_can_find_is_sent(tmp_path):
    mapping = load_mapping(FORMATS / "mapping" / "custom_map.toml")
    again = parallel._reader_from(json.loads(json.dumps(parallel.describe_reader(mapping.read_line))))
    assert again.__self__ == mapping
    assert parallel._reader_from(parallel.describe_reader(line_reader("otel"))) is line_reader("otel")
    assert parallel.describe_reader(broken_reader) == {"function": [__name__, "broken_reader"]}
    big = 1 << 40
    assert parallel.workers_for(big, line_reader("litellm")) == parallel.workers_for(big, broken_reader) > 0 \
        or (os.cpu_count() or 1) < 2
    def nested(line: str):
        return line_reader("litellm")(line)

    for unsendable in (lambda line: line, functools.partial(line_reader("litellm")), nested):
        assert parallel.describe_reader(unsendable) is None
        assert parallel.workers_for(big, unsendable) == 0


def test_a_workers_error_of_its_own_kind_comes_back_as_what_it_said(in_workers, tmp_path):
    log = write_jsonl(tmp_path / "l.jsonl", [{"id": f"b-{i}"} for i in range(9)])
    with pytest.raises(RuntimeError, match="NotBuiltin.*made here"):
        list(readers.read_foreign(log, "l", failing_reader))
