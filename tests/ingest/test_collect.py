"""`specdec collect` as a real process fed by the OpenTelemetry SDK's own exporters (OTLP/HTTP protobuf and
JSON, gzip, OTLP/gRPC): acknowledged spans land in the store exactly once, through a kill -9 mid-stream too;
back-pressure (429 + Retry-After), the body limit (413), the bearer token (401) and the loopback rule."""

from __future__ import annotations

import gzip
import http.client
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from google.protobuf.json_format import MessageToDict
from helpers import free_port, run_cli
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http import Compression
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc import TraceServiceStub
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from specdec_core.store.connection import Store

# What `specdec collect` says once it listens: the ports it bound, which port 0 leaves to the kernel.
LISTENING = re.compile(r"^specdec collect: OTLP/HTTP on http://127\.0\.0\.1:(\d+)/v1/traces, "
                       r"OTLP/gRPC on 127\.0\.0\.1:(\d+); ")


class Collect:
    """A `specdec collect` subprocess on ports of the kernel's choosing (HOST:0), read from what it says: ports
    chosen here first could be taken before it bound them."""

    def __init__(self, db: Path, *extra: str, env: dict[str, str] | None = None) -> None:
        self.db = db
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "specdec_core", "collect", "--db", str(db), "--listen", "127.0.0.1:0",
             "--grpc", "127.0.0.1:0", *extra],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
        self.said: list[str] = []  # stderr read before stop(): given back with the rest
        # A receiver that neither listens nor exits within 60 s is killed, which ends the read below.
        watchdog = threading.Timer(60, self.proc.kill)
        watchdog.start()
        try:
            for line in iter(self.proc.stderr.readline, ""):  # said once both ports are bound and listening
                self.said.append(line)
                if said := LISTENING.match(line):
                    self.http_port, self.grpc_port = int(said[1]), int(said[2])
                    break
            else:
                why = ("killed: it neither listened nor exited within 60 s" if self.proc.wait() == -signal.SIGKILL
                       else f"it exited with status {self.proc.returncode}")
                raise RuntimeError(f"specdec collect did not start ({why}): {''.join(self.said)}")
        finally:
            watchdog.cancel()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}/v1/traces"

    def stop(self) -> tuple[int, str, str]:
        self.proc.send_signal(signal.SIGTERM)
        out, err = self.proc.communicate(timeout=120)
        return self.proc.returncode, out, "".join(self.said) + err

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


def genai_attrs(n: int, kind: str) -> dict:
    return {"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-8b", "gen_ai.request.temperature": 0.0,
            "gen_ai.request.max_tokens": 16, "gen_ai.usage.output_tokens": 3, "specdec.prompt": f"prompt {n % 7}",
            "specdec.output_text": f"out {n % 7}", "specdec.tokenizer_version": "tok-1",
            "specdec.cache_key": f"k{n % 7}", "specdec.cache_hit": n >= 7, "specdec.request_id": f"{kind}-{n:05d}"}


def openinference_attrs(n: int) -> dict:
    return {"openinference.span.kind": "LLM", "llm.model_name": "gpt-4o-mini",
            "llm.invocation_parameters": json.dumps({"model": "gpt-4o-mini", "temperature": 0.7, "max_tokens": 32}),
            "llm.input_messages.0.message.role": "user", "llm.input_messages.0.message.content": f"hi {n}",
            "llm.output_messages.0.message.role": "assistant", "llm.output_messages.0.message.content": "hello",
            "llm.token_count.completion": 1, "specdec.tokenizer_version": "tok-1", "specdec.cache_key": f"oi{n}",
            "specdec.cache_hit": False, "specdec.request_id": f"oi-{n:05d}"}


def emit(exporter, kind: str, count: int, start: int = 0) -> None:
    """`count` request spans and as many other spans, through the SDK and `exporter`, one export each."""
    provider = TracerProvider(resource=Resource.create({"service.name": "edge-a"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for n in range(start, start + count):
        with tracer.start_as_current_span("chat llama-8b", attributes=genai_attrs(n, kind)):
            with tracer.start_as_current_span("tokenize"):
                pass
    provider.shutdown()


def finished_spans(attrs_of, count: int, start: int = 0) -> list:
    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "edge-a"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracer = provider.get_tracer("test")
    for n in range(start, start + count):
        with tracer.start_as_current_span("llm", attributes=attrs_of(n)):
            pass
    provider.shutdown()
    return list(memory.get_finished_spans())


def post(url: str, body: bytes, content_type: str = "application/x-protobuf", **headers: str
         ) -> tuple[int, dict, bytes]:
    request = urllib.request.Request(url, data=body, method="POST", headers={"Content-Type": content_type, **headers})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


def request_ids(db: Path) -> list[str]:
    with Store(db).read() as con:
        return [r[0] for r in con.execute("SELECT request_id FROM requests ORDER BY request_id").fetchall()]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path / "store.duckdb"


def test_sdk_exports_over_http_grpc_and_json_land_once_and_sigterm_drains(db: Path) -> None:
    metrics_port = free_port()
    collect = Collect(db, "--json", "--metrics", f"127.0.0.1:{metrics_port}")
    try:
        emit(HttpExporter(endpoint=collect.url), "http", 20)
        emit(HttpExporter(endpoint=collect.url, compression=_gzip()), "gz", 10)
        emit(GrpcExporter(endpoint=f"127.0.0.1:{collect.grpc_port}", insecure=True), "grpc", 15)
        # OTLP/HTTP JSON with OpenInference spans, gzipped, as a JSON exporter (or a Collector) sends it.
        spans = finished_spans(openinference_attrs, 5)
        body = json.dumps(MessageToDict(encode_spans(spans))).encode()
        status, _, answer = post(collect.url, gzip.compress(body), "application/json", **{"Content-Encoding": "gzip"})
        assert (status, json.loads(answer)) == (200, {})
        # The same export again (an answer the client never got): stored once.
        assert post(collect.url, gzip.compress(body), "application/json", **{"Content-Encoding": "gzip"})[0] == 200
        # A body sent in chunks, without a Content-Length.
        chunks = encode_spans(finished_spans(lambda n: genai_attrs(n, "chunked"), 3)).SerializeToString()
        conn = http.client.HTTPConnection("127.0.0.1", collect.http_port, timeout=30)
        conn.request("POST", "/v1/traces", iter([chunks[:10], chunks[10:]]),
                     {"Content-Type": "application/x-protobuf"}, encode_chunked=True)
        assert conn.getresponse().status == 200
        conn.close()
        deadline = time.monotonic() + 60
        while (scraped := _requests_total(metrics_port)) < 53 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert scraped == 53  # --metrics serves the figures of what was collected, batch by batch
    finally:
        code, out, err = collect.stop()
    assert code == 0, err
    ids = request_ids(db)
    assert ids == sorted([f"http-{n:05d}" for n in range(20)] + [f"gz-{n:05d}" for n in range(10)]
                         + [f"grpc-{n:05d}" for n in range(15)] + [f"oi-{n:05d}" for n in range(5)]
                         + [f"chunked-{n:05d}" for n in range(3)])
    batches = [json.loads(line) for line in out.splitlines()]
    assert sum(b["skipped"] for b in batches) == 45  # the tokenize spans
    assert sum(b["duplicates"] for b in batches) == 5
    with Store(db).read() as con:
        oi = con.execute("SELECT target_model, temperature, deployment, unknown_fields FROM requests "
                         "WHERE request_id = 'oi-00000'").fetchall()
    assert oi == [("gpt-4o-mini", 0.7, "edge-a", ["num_speculative_tokens", "top_k"])]
    assert not list(Path(f"{db}.spool").glob("spool-*.jsonl"))  # all ingested: the spool is emptied


def test_sigterm_ends_connections_a_live_exporter_keeps_open(db: Path) -> None:
    """A service's exporter, still running, keeps its connection open between exports, and a client may connect
    and send nothing: SIGTERM still ends the collector, with the exports it acknowledged stored. It waited for
    every connection to close, and ran until it was killed."""
    collect = Collect(db, "--json")
    provider = TracerProvider(resource=Resource.create({"service.name": "edge-a"}))
    provider.add_span_processor(SimpleSpanProcessor(HttpExporter(endpoint=collect.url)))  # its session pools one
    tracer = provider.get_tracer("test")
    for n in range(3):
        with tracer.start_as_current_span("chat llama-8b", attributes=genai_attrs(n, "alive")):
            pass
    idle = socket.create_connection(("127.0.0.1", collect.http_port))
    try:
        collect.proc.send_signal(signal.SIGTERM)
        try:
            out, err = collect.proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            collect.kill()
            pytest.fail("specdec collect still ran 30 s after SIGTERM, an exporter's connection open")
        assert collect.proc.returncode == 0, err
        idle.settimeout(10)
        assert idle.recv(1) == b""  # closed by the collector, not left to the client
    finally:
        idle.close()
        provider.shutdown()
    assert request_ids(db) == ["alive-00000", "alive-00001", "alive-00002"]
    assert sum(json.loads(line)["accepted"] for line in out.splitlines()) == 3


def test_an_idle_connection_is_closed_and_one_mid_request_is_answered_before_the_server_stops() -> None:
    """The collector's HTTP server (in this process, its idle limit cut to 0.5 s): a connection that sends nothing
    is closed once the limit passes; one whose request is being read when the server stops gets its answer,
    then closes; a connection between requests closes at the stop."""
    from specdec_core.ingestion import http_server

    assert http_server.Handler.timeout == http_server.IDLE_TIMEOUT_S > 0  # the collector's own limit is set
    reading = threading.Event()

    class Echo(http_server.Handler):
        timeout = 0.5

        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            reading.set()
            body = self.read_exactly(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http_server.Server(("127.0.0.1", 0), Echo)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    try:
        idle = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        assert idle.recv(1) == b"" and time.monotonic() - started < 5  # closed after 0.5 s of nothing
        Echo.timeout = 30  # the connections below wait on the test, and on shutdown()'s half-second poll
        busy = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        busy.putrequest("POST", "/")
        busy.putheader("Content-Length", "4")
        busy.endheaders(b"ab")  # half of its body: the handler waits for the rest
        between = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        between.request("POST", "/", b"xy")
        assert between.getresponse().read() == b"xy"
        assert reading.wait(10)
        server.shutdown()
        server.close_idle()
        assert between.sock.recv(1) == b""  # waiting for its next request: closed at once
        busy.send(b"cd")
        answer = busy.getresponse()
        assert (answer.status, answer.read(), answer.getheader("Connection")) == (200, b"abcd", None)
        assert busy.sock is None or busy.sock.recv(1) == b""  # its answer was its last
    finally:
        server.server_close()


def test_connections_past_the_bound_wait_for_a_slot_then_are_closed() -> None:
    """The collector's HTTP server (in this process, bound cut to two connections and a 0.5 s wait): two idle
    clients take both slots, a third is closed after the wait, and once one leaves the next is served."""
    from specdec_core.ingestion import http_server

    assert http_server.Server.max_connections == http_server.MAX_CONNECTIONS > 0  # the collector's own bound

    class Two(http_server.Server):
        max_connections = 2
        slot_wait_s = 0.5

    class Ok(http_server.Handler):
        timeout = 30

        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = Two(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(2)]
    try:
        third = socket.create_connection(("127.0.0.1", port), timeout=10)
        started = time.monotonic()
        assert third.recv(1) == b"" and time.monotonic() - started < 5  # closed once the wait ran out
        third.close()
        held.pop().close()
        served = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        served.request("GET", "/")
        assert served.getresponse().status == 204
        served.close()
    finally:
        for client in held:
            client.close()
        server.shutdown()
        server.close_idle()
        server.server_close()


def _requests_total(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("specdec_requests_total{"))


def _gzip() -> Compression:
    return Compression.Gzip


def test_killed_mid_stream_loses_no_acknowledged_span_and_stores_none_twice(db: Path) -> None:
    bodies = [encode_spans(finished_spans(lambda n: genai_attrs(n, "kill"), 20, start=i * 20)).SerializeToString()
              for i in range(30)]
    acked: list[int] = []
    collect = Collect(db)
    url = collect.url
    killed = threading.Event()

    def send() -> None:
        for i, body in enumerate(bodies):
            while True:  # an exporter's retry: until the export is acknowledged
                try:
                    if post(url, body)[0] == 200:
                        acked.append(i)
                        break
                except OSError:
                    pass
                time.sleep(0.02)
            if i == 12:
                killed.wait(30)

    sender = threading.Thread(target=send)
    sender.start()
    deadline = time.monotonic() + 60
    while len(acked) < 13 and time.monotonic() < deadline:
        time.sleep(0.01)
    collect.proc.send_signal(signal.SIGKILL)  # mid-stream: some exports spooled, few or none ingested
    collect.proc.wait()
    assert len(acked) >= 13
    killed.set()
    time.sleep(0.3)  # the sender meets a closed port and retries
    collect = Collect(db)
    url = collect.url  # noqa: F841 - the sender reads the new port through the closure
    sender.join(120)
    code, _, err = collect.stop()
    assert code == 0, err
    assert acked == list(range(30))
    ids = request_ids(db)
    assert ids == [f"kill-{n:05d}" for n in range(600)]
    with Store(db).read() as con:
        assert con.execute("SELECT count(*) FROM quarantine").fetchall() == [(0,)]


def test_backpressure_body_limit_and_token(db: Path) -> None:
    body = encode_spans(finished_spans(lambda n: genai_attrs(n, "bp"), 50)).SerializeToString()
    collect = Collect(db, "--max-backlog-bytes", "1", "--max-body-bytes", str(len(body) + 10),
                      "--token-env", "SPECDEC_TEST_TOKEN", env={"SPECDEC_TEST_TOKEN": "s3cret"})
    try:
        auth = {"Authorization": "Bearer s3cret"}
        assert post(collect.url, body)[0] == 401
        assert post(collect.url, body, Authorization="Bearer wrong")[0] == 401
        status, headers, _ = post(collect.url, body + b"\0" * 20, **auth)
        assert status == 413
        statuses = [post(collect.url, body, **auth) for _ in range(20)]
        busy = [h for s, h, _ in statuses if s == 429]
        assert busy and all(int(h["Retry-After"]) >= 1 for h in busy)
        assert {s for s, _, _ in statuses} <= {200, 429}
        second = run_cli("collect", "--db", str(db), "--listen", "127.0.0.1:0", timeout=60)
        assert second.returncode != 0 and "another specdec collect is using this spool" in second.stderr
        with grpc.insecure_channel(f"127.0.0.1:{collect.grpc_port}") as channel:
            stub = TraceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.Export(ExportTraceServiceRequest.FromString(body), timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    finally:
        code, _, err = collect.stop()
    assert code == 0, err
    assert request_ids(db) == [f"bp-{n:05d}" for n in range(50)]
    assert f"refused {len(busy)} busy, 1 too large, 3 unauthorized, 0 unreadable" in err


def test_a_port_in_other_digits_is_one_line(tmp_path: Path) -> None:
    done = run_cli("collect", "--db", str(tmp_path / "s.duckdb"), "--listen", "127.0.0.1:\u00b2", timeout=60)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "specdec collect: --listen '127.0.0.1:\u00b2': expected HOST:PORT"], done.stderr


def test_refuses_a_non_loopback_address_without_a_token(tmp_path: Path) -> None:
    done = run_cli("collect", "--db", str(tmp_path / "s.duckdb"), "--listen", "0.0.0.0:0", timeout=60)
    assert done.returncode == 2
    assert "--token-env" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def _raw_post(port: int, head: bytes, body: bytes = b"", close_write: bool = False) -> tuple[int, bytes]:
    """A POST to /v1/traces as bytes on a socket (what urllib would not send): the answer's status and body."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n" + head
                  + b"\r\n\r\n" + body)
        if close_write:
            s.shutdown(socket.SHUT_WR)
        answer = http.client.HTTPResponse(s)
        answer.begin()
        return answer.status, answer.read()


def test_sizes_that_are_no_sizes_and_cut_bodies_are_refused_and_spool_nothing(db: Path) -> None:
    # Two exports in one body: protobuf reads the first alone as a whole export, so a body cut after it parses.
    first, second = (encode_spans(finished_spans(lambda n: genai_attrs(n, "cut"), 3, start=s)).SerializeToString()
                     for s in (0, 3))
    collect = Collect(db)
    try:
        for size in ("\u00b2".encode("latin-1"), b"9" * 5000, b"-1", b"1 2"):
            status, answer = _raw_post(collect.http_port, b"Content-Length: " + size)
            assert (status, b"is not a number of bytes" in answer) == (400, True), (size[:9], answer)
        # A body that ends before its Content-Length: the exporter gave up, and its part is not an export.
        status, answer = _raw_post(collect.http_port, f"Content-Length: {len(first + second)}".encode(), first,
                                   close_write=True)
        assert (status, f"ended after {len(first):,} of its".encode() in answer) == (400, True), answer
        # A negative chunk size read everything to the connection's end, past --max-body-bytes: refused at once.
        assert _raw_post(collect.http_port, b"Transfer-Encoding: chunked", b"-1\r\n" + first) == (
            400, b'{"code": 400, "message": "bad chunked body"}')
        assert _raw_post(collect.http_port, b"Transfer-Encoding: chunked",
                         f"{len(first + second):x}\r\n".encode() + first, close_write=True)[0] == 400
        # An exporter that resets the connection before its answer: no traceback (it sends again; if its export
        # was spooled, the retry is found a duplicate).
        left = encode_spans(finished_spans(lambda n: genai_attrs(n, "left"), 1)).SerializeToString()
        with socket.create_connection(("127.0.0.1", collect.http_port), timeout=20) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Type: application/x-protobuf\r\n"
                      + f"Content-Length: {len(left)}\r\n\r\n".encode() + left)
        # A compression OTLP does not use is named in a 415: a deflated export was "Wire format was corrupt",
        # and a body labelled br was read as if it were not compressed.
        for encoding, packed in (("deflate", zlib.compress(first)), ("br", first)):
            status, _, answer = post(collect.url, packed, **{"Content-Encoding": encoding})
            assert (status, json.loads(answer)["message"]) == (
                415, f"Content-Encoding {encoding!r}: expected gzip or none"), answer
        assert post(collect.url, second)[0] == 200  # still serving, and the reset connection's thread is done
    finally:
        code, _, err = collect.stop()
    assert code == 0, err
    assert [i for i in request_ids(db) if not i.startswith("left-")] == [f"cut-{n:05d}" for n in range(3, 6)]
    assert "refused 0 busy, 0 too large, 0 unauthorized, 7 unreadable" in err
    assert "Traceback" not in err and "failed" not in err
