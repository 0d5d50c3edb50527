"""What a hostile log or client can make the exporter hold: label values bounded in length and number, series
bounded in total, counters that never fall when the ranking moves, connections that can't be held open."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from helpers import free_port, rec, write_jsonl
from prometheus_client.parser import text_string_to_metric_families

from specdec_core.ingestion import ingest
from specdec_core.monitoring import exporter
from specdec_core.monitoring.exporter import Listen, serve
from specdec_core.monitoring.figures import MAX_LABEL_CHARS
from specdec_core.store import Store

LONG = 10_000


def _get(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
        return resp.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _long_name(kind: str, n: int) -> str:
    return f"{kind}{n}-" + kind * (LONG - len(f"{kind}{n}-"))


@pytest.fixture(scope="module")
def long_label_store(tmp_path_factory) -> Store:
    """Issue 51's log in small: every deployment x target x draft combination once, each name 10,000 characters."""
    where = tmp_path_factory.mktemp("long")
    records = [rec(f"r{d}-{t}-{m}", deployment=_long_name("d", d), target_model=_long_name("t", t),
                   draft_model=_long_name("m", m), cache_key=f"k{d}-{t}-{m}")
               for d in range(8) for t in range(6) for m in range(6)]
    store = Store(where / "s.duckdb")
    ingest(store, [str(write_jsonl(where / "long.jsonl", records))])
    return store


def test_long_label_values_are_cut_with_a_sha256_digest_and_the_series_bounded(long_label_store):
    running = serve(long_label_store, Listen("127.0.0.1", free_port()), 50, combinations=40)
    try:
        text = _get(running.port)
    finally:
        running.stop()
    samples = _samples(text)
    values = {v for (_, labels) in samples for _, v in labels}
    assert max(len(v) for v in values) <= MAX_LABEL_CHARS
    full = _long_name("d", 3)
    cut = f"{full[:MAX_LABEL_CHARS - 13]}~{hashlib.sha256(full.encode()).hexdigest()[:12]}"
    assert cut in values and len(cut) == MAX_LABEL_CHARS
    deployments = {v for (_, labels) in samples for k, v in labels if k == "deployment"}
    assert len(deployments) == 8 and all(len(d) == MAX_LABEL_CHARS for d in deployments)  # distinct stay distinct
    # 288 label sets: 40 kept, each deployment's others folded into (deployment, "other", "other").
    requests = {labels: v for (name, labels), v in samples.items() if name == "specdec_requests_total"}
    combos = {tuple(v for k, v in labels if k != "cache_hit") for labels in requests}
    assert len(combos) <= 40 + 8
    assert sum(requests.values()) == 8 * 6 * 6  # folded, never dropped
    folded = {dict(labels)["label"]: v for (name, labels), v in samples.items()
              if name == "specdec_label_values_folded"}
    assert folded == {"deployment": 0, "target_model": 0, "draft_model": 0, "combination": 288 - 40}
    assert len(text) < 200_000  # before: 3 labels x 10,000 characters on each of the ~1,800 lines, 54 MB
    assert "SHA-256" in text and f"over {MAX_LABEL_CHARS} characters" in text  # the HELP says so


def _totals(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {k: v for k, v in _samples(_get(port)).items() if k[0].endswith("_total")}


def test_no_total_falls_when_deployments_move_in_and_out_of_the_top(tmp_path):
    """top 1: a, then b (holding most of the hits), then a again, then c have the most requests."""
    store = Store(tmp_path / "s.duckdb")
    batches = [("a", 5, 1), ("b", 1, 3), ("b", 10, 0), ("a", 20, 0), ("c", 1, 2), ("c", 40, 1)]  # misses, hits
    running = None
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    try:
        for n, (dep, misses, hits) in enumerate(batches):
            records = [rec(f"{n}-{i}", deployment=dep, cache_key=f"{dep}-{n}", prompt=f"p{n}") for i in range(misses)]
            records += [rec(f"{n}-hit-{i}", deployment=dep, cache_key=f"{dep}-{n}", prompt="another", cache_hit=True,
                            ts="2026-03-01T11:00:00Z") for i in range(hits)]
            ingest(store, [str(write_jsonl(tmp_path / f"{n}.jsonl", records))])
            if running is None:
                running = serve(store, Listen("127.0.0.1", free_port()), 1)
            now = _totals(running.port)
            fallen = {k: (seen[k], v) for k, v in now.items() if k in seen and v < seen[k]}
            assert not fallen, f"after batch {n} ({dep}): {fallen}"
            assert not set(seen) - set(now), f"after batch {n} ({dep}): a series stopped"
            seen = now
    finally:
        if running is not None:
            running.stop()
    hits = {dict(k[1])["deployment"]: v for k, v in seen.items() if k[0] == "specdec_contaminated_hits_total"}
    assert hits == {"a": 1, "other": 6}  # a was first; b and c were folded at their first scrape and stay folded
    assert sum(v for k, v in seen.items() if k[0] == "specdec_requests_total") == sum(m + h for _, m, h in batches)


@pytest.fixture
def quick_timeouts(monkeypatch):
    monkeypatch.setattr(exporter._Handler, "timeout", 0.5)
    monkeypatch.setattr(exporter, "CONNECTION_DEADLINE_S", 1.5)


def _hung_up(sock: socket.socket, within: float) -> bool:
    """Whether the server closes `sock` within `within` seconds (whatever it sent before)."""
    sock.settimeout(within)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except ConnectionError:
        pass
    return True


def test_clients_that_send_or_read_slowly_or_never_are_cut_off(tmp_path, quick_timeouts, long_label_store):
    running = serve(long_label_store, Listen("127.0.0.1", free_port()), 50)
    try:
        silent = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(3)]
        half = socket.create_connection(("127.0.0.1", running.port))
        half.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers that never end
        trickle = socket.create_connection(("127.0.0.1", running.port))
        stop = threading.Event()

        def drip() -> None:  # a byte per 0.2 s: every read is within the per-read timeout
            for byte in b"GET /metrics HTTP/1.1\r\nX-Slow: " + b"a" * 200:
                if stop.wait(0.2):
                    return
                try:
                    trickle.send(bytes([byte]))
                except OSError:
                    return

        dripping = threading.Thread(target=drip, daemon=True)
        dripping.start()
        reader = socket.socket()
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", running.port))
        reader.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")  # then reads nothing for a while
        started = time.monotonic()
        assert all(_hung_up(s, 5) for s in silent), "a client that sends nothing holds its connection"
        assert _hung_up(half, 5)
        assert _hung_up(trickle, 5), "a client trickling its request holds its connection past the deadline"
        assert time.monotonic() - started < 5
        stop.set()
        time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))  # past the deadline, then read what is left
        assert _hung_up(reader, 5)
        # The slots they held are free: a scrape is answered at once.
        assert "specdec_requests_total" in _get(running.port)
        for s in [*silent, half, trickle, reader]:
            s.close()
    finally:
        running.stop()


def test_more_clients_than_slots_wait_and_are_all_answered(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "a.jsonl", [rec("a")]))])
    running = serve(store, Listen("127.0.0.1", free_port()), 50)
    try:
        results: list[str] = []

        def scrape() -> None:
            results.append(_get(running.port))

        threads = [threading.Thread(target=scrape) for _ in range(exporter.MAX_CONNECTIONS * 2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert len(results) == exporter.MAX_CONNECTIONS * 2
        assert all("specdec_requests_total" in r for r in results)
    finally:
        running.stop()


def test_the_help_and_docs_say_how_values_are_cut():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "monitoring.md").read_text()
    assert "SHA-256" in doc and str(MAX_LABEL_CHARS) in doc and "stays folded" in doc


@pytest.mark.parametrize("value", ["e\u0301" * 100, "\U0001f986" * 200, "a" * 128, "a" * 129, "\x00" * 300])
def test_duckdb_and_python_cut_a_value_alike(value):
    import duckdb

    from specdec_core.monitoring.figures import cut_label, cut_value

    with duckdb.connect() as con:
        cut = con.execute(f"SELECT {cut_label('v')} FROM (SELECT ?::VARCHAR AS v)", [value]).fetchall()[0][0]
    assert cut == cut_value(value) and len(cut) <= MAX_LABEL_CHARS
