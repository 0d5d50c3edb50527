"""`specdec collect`: an OTLP receiver (HTTP protobuf and JSON, gRPC) that feeds the follow path.

An export is answered with success only once its spans are written to a spool file and fsynced; the spool
folder is then followed as `specdec ingest --follow` follows a log (ingestion/follow.py: batches, positions
committed with the rows), so a collector killed at any moment loses no acknowledged span, and an export
whose answer was lost is sent again and found an exact duplicate. Each spool file opens with a header line
unique to it: a follower tells files apart by their first bytes, and two spool files' first spans may match.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specdec_core import formats
from specdec_core.extras import require
from specdec_core.ingestion.follow import Batch, Follower
from specdec_core.ingestion.http_server import Handler, Server, Server6, byte_count
from specdec_core.ingestion.otlp_decode import (
    BadExport,
    TooLarge,
    gunzip,
    json_line,
    message_line,
    protobuf_line,
    trace_service,
)
from specdec_core.ingestion.spool import SPOOL_PREFIX, Spool, SpoolInUse
from specdec_core.ingestion.staging import IngestLimits
from specdec_core.store.connection import Store, StoreError
from specdec_core.text import host_and_port

DEFAULT_LISTEN = "127.0.0.1:4318"
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_BACKLOG_BYTES = 256 << 20
TRACES_PATH = "/v1/traces"
# What a refused exporter is told to wait: about one batch's ingest, after which the backlog has moved.
RETRY_AFTER_SECONDS = 2


class CollectError(ValueError):
    """A collector that can't start as asked; the message is one line saying why."""


@dataclass(frozen=True)
class CollectOptions:
    listen: str = DEFAULT_LISTEN
    grpc: str | None = None
    spool: Path | None = None  # default: beside the store, <store>.spool
    token: str | None = None  # with it, every export needs `Authorization: Bearer <token>`
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_backlog_bytes: int = DEFAULT_MAX_BACKLOG_BYTES
    batch_rows: int = 1_000  # exports (spool lines) per ingest batch at most
    every: float = 0.5  # seconds between polls when no export wakes the ingest sooner


def split_host_port(text: str, what: str) -> tuple[str, int]:
    address = host_and_port(text)
    if address is None:
        raise CollectError(f"{what} {text!r}: expected HOST:PORT")
    return address


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (a name that resolves nowhere is not)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def default_spool(store: Store) -> Path:
    return Path(f"{store.path}.spool")


# ---- the collector: receivers, spool, ingest -------------------------------------------------------------


@dataclass
class Counters:
    exports: int = 0
    spans: int = 0
    refused_busy: int = 0
    refused_auth: int = 0
    refused_large: int = 0
    refused_bad: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, name: str, n: int = 1) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def summary(self) -> str:
        refused = (f"refused {self.refused_busy} busy, {self.refused_large} too large, {self.refused_auth} "
                   f"unauthorized, {self.refused_bad} unreadable")
        return f"received {self.exports} exports ({self.spans} spans); {refused}"


class Collector:
    """Receives exports, spools them, and ingests the spool; `run` blocks until `stop` (a signal) is called."""

    def __init__(self, store: Store, options: CollectOptions, limits: IngestLimits | None = None,
                 on_batch: Callable[[Batch], None] | None = None,
                 on_problem: Callable[[str], None] | None = None) -> None:
        self.store, self.options = store, options
        try:
            self.spool = Spool(options.spool or default_spool(store))
        except SpoolInUse as exc:
            raise CollectError(str(exc)) from None
        self.follower = Follower(store, [str(self.spool.folder)], log_format=formats.LIVE_FORMAT, limits=limits,
                                 batch_rows=options.batch_rows, on_problem=on_problem)
        self.counters = Counters()
        self._on_batch, self._on_problem = on_batch, on_problem or (lambda _: None)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._backlog_base = self._spooled_unread()  # unread bytes at the last look, and written since then
        self._written_at_look = 0
        self._http: Server | None = None
        self._grpc: Any = None
        self.grpc_port: int | None = None  # the port bound (--grpc HOST:0 takes any free one)

    # -- back-pressure

    def _spooled_unread(self) -> int:
        unread = 0
        for path in self.spool.folder.glob(f"{SPOOL_PREFIX}*.jsonl"):
            try:
                st = path.stat()
            except OSError:
                continue
            position = self.follower.positions.get(f"{st.st_dev}:{st.st_ino}")
            unread += st.st_size - (position.byte_offset if position else 0)
        return unread

    def backlog_bytes(self) -> int:
        return self._backlog_base + self.spool.written - self._written_at_look

    def busy(self) -> bool:
        return self.backlog_bytes() > self.options.max_backlog_bytes

    def retry_after(self) -> int:
        return RETRY_AFTER_SECONDS

    def authorized(self, header: str | None) -> bool:
        if self.options.token is None:
            return True
        scheme, _, token = (header or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(token.strip().encode(), self.options.token.encode())

    def accept(self, line: bytes, spans: int) -> None:
        """Spool one export durably; the caller answers success only after this returns."""
        if spans:
            self.spool.append(line)
            self._wake.set()
        self.counters.add("exports")
        self.counters.add("spans", spans)

    # -- listening

    def start(self) -> None:
        trace_service()  # the collect extra: said before listening, not at the first export
        host, port = split_host_port(self.options.listen, "--listen")
        handler = type("Handler", (_Handler,), {"collector": self})
        try:
            server = Server6 if ":" in host else Server
            self._http = server((host, port), handler)
            self._http.on_problem = self._on_problem
        except OSError as exc:
            raise CollectError(f"--listen {self.options.listen}: can't listen: {exc.strerror or exc}") from None
        threading.Thread(target=self._http.serve_forever, name="otlp-http", daemon=True).start()
        if self.options.grpc:
            self._grpc, self.grpc_port = _start_grpc(self, self.options.grpc)

    @property
    def http_port(self) -> int:
        assert self._http is not None
        return self._http.server_address[1]

    def stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _stop_listening(self) -> None:
        if self._grpc is not None:
            self._grpc.stop(grace=10).wait()  # in-flight exports finish (and are acknowledged) first
        if self._http is not None:
            self._http.shutdown()
            self._http.close_idle()  # an exporter's pooled connection, idle, would keep server_close waiting
            self._http.server_close()  # waits for the requests under way

    # -- ingesting

    def poll(self) -> Batch | None:
        """Ingest what the spool holds beyond the last batch (at most batch_rows exports), then tidy the spool."""
        written = self.spool.written
        batch = self.follower.poll()
        self._forget_ingested()
        self._backlog_base, self._written_at_look = self._spooled_unread(), written
        if batch is not None and self._on_batch is not None:
            self._on_batch(batch)
        return batch

    def _forget_ingested(self) -> None:
        """Delete spool files read to their end that no longer take appends; an open handle keeps the inode
        from being reused until the follower lets go of it."""
        current = self.spool.current
        for path in self.spool.folder.glob(f"{SPOOL_PREFIX}*.jsonl"):
            if current is not None and path == current:
                continue
            try:
                st = path.stat()
            except OSError:
                continue
            position = self.follower.positions.get(f"{st.st_dev}:{st.st_ino}")
            if position is not None and position.byte_offset == st.st_size:
                path.unlink(missing_ok=True)

    def run(self) -> None:
        """Ingest until stopped; then stop listening, ingest everything acknowledged, and return."""
        failing_since: float | None = None
        while not self._stopping.is_set():
            self._wake.wait(self.options.every)
            self._wake.clear()
            try:
                while self.poll() is not None and not self._stopping.is_set():
                    pass
                failing_since = None
            except StoreError as exc:
                # What is spooled stays there: said once, tried again; the backlog bound sheds load meanwhile.
                if failing_since is None:
                    self._on_problem(f"{exc}; the spool keeps what was received, retrying")
                    failing_since = time.monotonic()
        self._stop_listening()
        self.spool.close()
        while self.poll() is not None:
            pass
        self.follower.close()
        self._forget_ingested()
        self.spool.release()


class _Handler(Handler):
    collector: Collector
    server_version = "specdec-collect"

    def _answer(self, status: int, body: bytes = b"", content_type: str = "application/json",
                headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        # OTLP/HTTP answers errors with a google.rpc.Status; its JSON form is readable by both kinds of client.
        self._answer(status, json.dumps({"code": status, "message": message}).encode(), headers=headers)

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._error(405, f"POST OTLP exports to {TRACES_PATH}")

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        c = self.collector
        if self.path.split("?", 1)[0] != TRACES_PATH:
            self.discard()
            self._error(404, f"{self.path}: not found; this collector takes traces at {TRACES_PATH}")
            return
        if not c.authorized(self.headers.get("Authorization")):
            c.counters.add("refused_auth")
            self.discard()
            self._error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            return
        chunked = self.chunked
        length_text = self.headers.get("Content-Length")
        if not chunked and length_text is None:
            self.close_connection = True
            self._error(411, "Content-Length required")
            return
        length = 0 if chunked else byte_count(length_text)
        if length is None:
            c.counters.add("refused_bad")
            self.close_connection = True  # where the body ends is not known: nothing after it can be read
            self._error(400, f"Content-Length {length_text[:40]!r} is not a number of bytes")
            return
        if not chunked and length > c.options.max_body_bytes:
            c.counters.add("refused_large")
            self.discard(length)  # read off, not kept: a client that sends it all then reads the answer
            self._error(413, f"body of {length:,} bytes is over the limit of {c.options.max_body_bytes:,}")
            return
        if c.busy():
            c.counters.add("refused_busy")
            if chunked:
                self.close_connection = True
            else:
                self.discard(length)
            self._error(429, "backlog full: retry later", {"Retry-After": str(c.retry_after())})
            return
        try:
            body = self.read_chunked(c.options.max_body_bytes) if chunked else self.read_exactly(length)
        except TooLarge:
            c.counters.add("refused_large")
            self.close_connection = True
            self._error(413, f"body is over the limit of {c.options.max_body_bytes:,} bytes")
            return
        except ValueError as exc:  # a part of an export is not an export: none of it is spooled
            c.counters.add("refused_bad")
            self.close_connection = True
            self._error(400, str(exc))
            return
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        encoding = (self.headers.get("Content-Encoding") or "identity").strip().lower()
        if encoding not in ("gzip", "identity"):  # OTLP/HTTP compresses with gzip or not at all
            self._error(415, f"Content-Encoding {encoding[:40]!r}: expected gzip or none")
            return
        try:
            if encoding == "gzip":
                body = gunzip(body, c.options.max_body_bytes)
            if content_type == "application/x-protobuf":
                line, spans = protobuf_line(body)
            elif content_type == "application/json":
                line, spans = json_line(body)
            else:
                self._error(415, f"Content-Type {content_type or '(none)'}: expected application/x-protobuf "
                                 "or application/json")
                return
        except TooLarge:
            c.counters.add("refused_large")
            self._error(413, f"body inflates past the limit of {c.options.max_body_bytes:,} bytes")
            return
        except BadExport as exc:
            c.counters.add("refused_bad")
            self._error(400, str(exc))
            return
        try:
            c.accept(line, spans)
        except OSError as exc:
            self._error(503, f"could not spool the export: {exc}", {"Retry-After": str(c.retry_after())})
            return
        if content_type == "application/json":
            self._answer(200, b"{}")
        else:
            self._answer(200, b"", "application/x-protobuf")


def _start_grpc(collector: Collector, listen: str) -> tuple[Any, int]:
    """The gRPC server, started, and the port it bound."""
    grpc = require("collect", "grpc")
    service_pb2 = trace_service()
    trace_grpc = require("collect", "opentelemetry.proto.collector.trace.v1.trace_service_pb2_grpc")
    from concurrent.futures import ThreadPoolExecutor

    from google.protobuf import duration_pb2
    from google.rpc import code_pb2, error_details_pb2, status_pb2

    class Servicer(trace_grpc.TraceServiceServicer):
        def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the service's name
            metadata = dict(context.invocation_metadata())
            if not collector.authorized(metadata.get("authorization")):
                collector.counters.add("refused_auth")
                context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
            if collector.busy():
                collector.counters.add("refused_busy")
                # RetryInfo tells an OTLP exporter how long to wait, as Retry-After does over HTTP.
                retry = error_details_pb2.RetryInfo(retry_delay=duration_pb2.Duration(seconds=collector.retry_after()))
                detail = status_pb2.Status(code=code_pb2.RESOURCE_EXHAUSTED, message="backlog full: retry later")
                detail.details.add().Pack(retry)
                context.set_trailing_metadata((("grpc-status-details-bin", detail.SerializeToString()),))
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "backlog full: retry later")
            line, spans = message_line(request)
            try:
                collector.accept(line, spans)
            except OSError as exc:
                context.abort(grpc.StatusCode.UNAVAILABLE, f"could not spool the export: {exc}")
            return service_pb2.ExportTraceServiceResponse()

    host, port = split_host_port(listen, "--grpc")
    server = grpc.server(ThreadPoolExecutor(max_workers=8), options=[
        ("grpc.max_receive_message_length", collector.options.max_body_bytes)])
    trace_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound:
        raise CollectError(f"--grpc {listen}: can't listen there")
    server.start()
    return server, bound


def check_listen(options: CollectOptions, metrics: str | None = None) -> None:
    """Without a token, every address must be a loopback one: anything else could feed the store."""
    if options.token is not None:
        return
    for what, text in (("--listen", options.listen), ("--grpc", options.grpc)):
        if text is None:
            continue
        host, _ = split_host_port(text, what)
        if not is_loopback(host):
            raise CollectError(f"{what} {text}: not a loopback address; listening there needs --token-env NAME "
                               "(exports must then carry Authorization: Bearer <token>)")
