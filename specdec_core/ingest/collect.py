"""`specdec collect`: an OTLP receiver (HTTP protobuf and JSON, gRPC) that feeds the follow path.

An export is answered with success only once its spans are written to a spool file and fsynced; the spool
folder is then followed as `specdec ingest --follow` follows a log (store/follow.py: batches, positions
committed with the rows), so a collector killed at any moment loses no acknowledged span, and an export
whose answer was lost is sent again and found an exact duplicate. Each spool file opens with a header line
unique to it: a follower tells files apart by their first bytes, and two spool files' first spans may match.
"""

from __future__ import annotations

import base64
import fcntl
import hmac
import ipaddress
import json
import math
import os
import socket
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from specdec_core import formats
from specdec_core.extras import require
from specdec_core.formats.openinference import camel_keys
from specdec_core.store.connection import Store, StoreError
from specdec_core.store.follow import Batch, Follower
from specdec_core.store.staging import IngestLimits

DEFAULT_LISTEN = "127.0.0.1:4318"
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_BACKLOG_BYTES = 256 << 20
SPOOL_PREFIX = "spool-"
# A spool file is closed for a new one past this size, so what has been ingested can be deleted.
ROTATE_BYTES = 64 << 20
TRACES_PATH = "/v1/traces"
# What a refused exporter is told to wait: about one batch's ingest, after which the backlog has moved.
RETRY_AFTER_SECONDS = 2
# A refused body is read off the connection up to this size (so the client reads the answer), else cut.
_MOST_DISCARDED = 1 << 30


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
    host, sep, port = text.rpartition(":")
    host = host.strip("[]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise CollectError(f"{what} {text!r}: expected HOST:PORT")
    return host, int(port)


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback one (a name that resolves nowhere is not)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(info[4][0].split("%")[0]).is_loopback for info in infos)


def default_spool(store: Store) -> Path:
    return Path(f"{store.path}.spool")


# ---- the spool: what is acknowledged, durably -----------------------------------------------------------


class Spool:
    """Append-only spool files in one folder, written with group commit: each append returns once it is
    fsynced, and appends that arrive while one fsync runs share the next."""

    def __init__(self, folder: Path, rotate_bytes: int = ROTATE_BYTES) -> None:
        self.folder = folder
        self.rotate_bytes = rotate_bytes
        folder.mkdir(parents=True, exist_ok=True)
        # One collector a spool: a second would cut the first's line under way as a dead one's partial tail.
        self._lock_fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(self._lock_fd)
            raise CollectError(f"{folder}: another specdec collect is using this spool") from None
        _cut_partial_tails(folder)
        self._lock = threading.Lock()
        self._synced = threading.Condition(self._lock)
        self._fd: int | None = None
        self._path: Path | None = None
        self._size = 0
        self._written = 0  # bytes appended by this process, in order
        self._synced_to = 0  # of those, bytes known durable
        self._syncing = False
        self._failed: OSError | None = None

    @property
    def current(self) -> Path | None:
        return self._path

    @property
    def written(self) -> int:
        return self._written

    def _open_new(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)
            os.close(self._fd)
            self._synced_to = self._written
        name = f"{SPOOL_PREFIX}{time.time_ns():020d}-{os.getpid()}.jsonl"
        path = self.folder / name
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        header = json.dumps({"resourceSpans": [], "specdec_spool": name}).encode() + b"\n"
        os.write(fd, header)
        os.fsync(fd)
        dir_fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)  # the file's name is durable too, not only its bytes
        finally:
            os.close(dir_fd)
        self._fd, self._path, self._size = fd, path, len(header)

    def append(self, line: bytes) -> None:
        """Write one line and return once it is on disk; OSError if it could not be made durable."""
        with self._lock:
            if self._failed is not None:
                raise OSError(f"spool {self.folder}: {self._failed}")
            if self._fd is None or self._size >= self.rotate_bytes:
                self._open_new()
            os.write(self._fd, line)
            self._size += len(line)
            self._written += len(line)
            mine = self._written
            while self._synced_to < mine:
                if self._syncing:
                    self._synced.wait()
                    if self._failed is not None:
                        raise OSError(f"spool {self.folder}: {self._failed}")
                    continue
                self._syncing, target, fd = True, self._written, self._fd
                self._lock.release()
                try:
                    os.fsync(fd)
                except OSError as exc:
                    self._failed = exc
                finally:
                    self._lock.acquire()
                    self._syncing = False
                    if self._failed is None:
                        self._synced_to = max(self._synced_to, target)
                    self._synced.notify_all()
                if self._failed is not None:
                    raise OSError(f"spool {self.folder}: {self._failed}")

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)
                os.close(self._fd)
                self._fd, self._path = None, None

    def release(self) -> None:
        """Let another collector use the spool (after close, once what it holds is ingested)."""
        os.close(self._lock_fd)


def _cut_partial_tails(folder: Path) -> None:
    """A spool file left by a collector killed mid-write ends in a part of a line it never acknowledged:
    cut it, so the file ends in whole lines (a new collector writes to a new file)."""
    for path in sorted(folder.glob(f"{SPOOL_PREFIX}*.jsonl")):
        with open(path, "rb+") as fh:
            size = fh.seek(0, os.SEEK_END)
            if not size:
                continue
            fh.seek(size - 1)
            if fh.read(1) == b"\n":
                continue
            at = size
            while at > 0:
                step = min(1 << 16, at)
                fh.seek(at - step)
                block = fh.read(step)
                end = block.rfind(b"\n")
                if end >= 0:
                    at = at - step + end + 1
                    break
                at -= step
            fh.truncate(at)
            os.fsync(fh.fileno())


# ---- an export's body as one OTLP JSON line --------------------------------------------------------------


class BadExport(ValueError):
    """An export that can't be read: answered 400 (gRPC INVALID_ARGUMENT), nothing spooled."""


def _trace_service() -> Any:
    return require("collect", "opentelemetry.proto.collector.trace.v1.trace_service_pb2")


def _any_value(value: Any) -> dict:
    """An AnyValue message as OTLP JSON (int64 as text, bytes as base64, NaN and infinities as text)."""
    kind = value.WhichOneof("value")
    if kind == "string_value":
        return {"stringValue": value.string_value}
    if kind == "int_value":
        return {"intValue": str(value.int_value)}
    if kind == "double_value":
        number = value.double_value
        return {"doubleValue": number if math.isfinite(number) else
                ("NaN" if number != number else "Infinity" if number > 0 else "-Infinity")}
    if kind == "bool_value":
        return {"boolValue": value.bool_value}
    if kind == "array_value":
        return {"arrayValue": {"values": [_any_value(v) for v in value.array_value.values]}}
    if kind == "kvlist_value":
        return {"kvlistValue": {"values": _key_values(value.kvlist_value.values)}}
    if kind == "bytes_value":
        return {"bytesValue": base64.b64encode(value.bytes_value).decode()}
    return {}


def _key_values(items: Any) -> list[dict]:
    return [{"key": kv.key, "value": _any_value(kv.value)} for kv in items]


def _span(span: Any) -> dict:
    out: dict[str, Any] = {"traceId": span.trace_id.hex(), "spanId": span.span_id.hex(), "name": span.name,
                           "kind": span.kind, "startTimeUnixNano": str(span.start_time_unix_nano),
                           "endTimeUnixNano": str(span.end_time_unix_nano),
                           "attributes": _key_values(span.attributes)}
    if span.parent_span_id:
        out["parentSpanId"] = span.parent_span_id.hex()
    if span.trace_state:
        out["traceState"] = span.trace_state
    if span.events:
        out["events"] = [{"timeUnixNano": str(e.time_unix_nano), "name": e.name,
                          "attributes": _key_values(e.attributes)} for e in span.events]
    if span.links:
        out["links"] = [{"traceId": link.trace_id.hex(), "spanId": link.span_id.hex(),
                         "attributes": _key_values(link.attributes)} for link in span.links]
    if span.HasField("status"):
        out["status"] = {"code": span.status.code, "message": span.status.message}
    return out


def message_line(message: Any) -> tuple[bytes, int]:
    """An ExportTraceServiceRequest message as one OTLP JSON line, as the Collector's file exporter writes it
    (hex ids, camelCase), and how many spans it holds. Walked field by field: protobuf's generic JSON mapping
    took five times as long, the most of what an export costs here."""
    spans = 0
    resource_spans = []
    for rs in message.resource_spans:
        scopes = []
        for ss in rs.scope_spans:
            spans += len(ss.spans)
            scopes.append({"scope": {"name": ss.scope.name, "version": ss.scope.version,
                                     "attributes": _key_values(ss.scope.attributes)},
                           "spans": [_span(span) for span in ss.spans]})
        resource_spans.append({"resource": {"attributes": _key_values(rs.resource.attributes)},
                               "scopeSpans": scopes})
    if not spans:
        return b"", 0
    return json.dumps({"resourceSpans": resource_spans}, ensure_ascii=False, separators=(",", ":")).encode() + b"\n", \
        spans


def protobuf_line(body: bytes) -> tuple[bytes, int]:
    message = _trace_service().ExportTraceServiceRequest()
    try:
        message.ParseFromString(body)
    except Exception as exc:  # protobuf's DecodeError, whatever the backend names it
        raise BadExport(f"not an OTLP ExportTraceServiceRequest: {exc}") from None
    return message_line(message)


def json_line(body: bytes) -> tuple[bytes, int]:
    """OTLP/HTTP JSON: hex ids and camelCase, as it came (its spans read by the otel and OpenInference readers)."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        raise BadExport("not JSON") from None
    if isinstance(request, dict) and "resource_spans" in request:
        request = camel_keys(request)  # protobuf's JSON parsers take its field names as written in the .proto too
    if not isinstance(request, dict) or not isinstance(request.get("resourceSpans", []), list):
        raise BadExport("not an OTLP ExportTraceServiceRequest: no resourceSpans list")
    spans = 0
    for rs in request.get("resourceSpans") or ():
        for scope in (rs.get("scopeSpans") or ()) if isinstance(rs, dict) else ():
            spans += len(scope.get("spans") or ()) if isinstance(scope, dict) else 0
    if not spans:
        return b"", 0
    return json.dumps(request, ensure_ascii=False, separators=(",", ":")).encode() + b"\n", spans


def gunzip(body: bytes, limit: int) -> bytes:
    """A gzip body, never more than `limit` bytes of it: a small body can inflate to gigabytes."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error:
        raise BadExport("Content-Encoding gzip, but the body is not gzip") from None
    if len(out) > limit:
        raise TooLarge()
    return out


class TooLarge(Exception):
    """A body past --max-body-bytes (413, gRPC RESOURCE_EXHAUSTED)."""


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
        self.spool = Spool(options.spool or default_spool(store))
        self.follower = Follower(store, [str(self.spool.folder)], log_format=formats.LIVE_FORMAT, limits=limits,
                                 batch_rows=options.batch_rows, on_problem=on_problem)
        self.counters = Counters()
        self._on_batch, self._on_problem = on_batch, on_problem or (lambda _: None)
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._backlog_base = self._spooled_unread()  # unread bytes at the last look, and written since then
        self._written_at_look = 0
        self._http: ThreadingHTTPServer | None = None
        self._grpc: Any = None

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
        _trace_service()  # the collect extra: said before listening, not at the first export
        host, port = split_host_port(self.options.listen, "--listen")
        handler = type("Handler", (_Handler,), {"collector": self})
        try:
            server = _Server6 if ":" in host else _Server
            self._http = server((host, port), handler)
        except OSError as exc:
            raise CollectError(f"--listen {self.options.listen}: can't listen: {exc.strerror or exc}") from None
        threading.Thread(target=self._http.serve_forever, name="otlp-http", daemon=True).start()
        if self.options.grpc:
            self._grpc = _start_grpc(self, self.options.grpc)

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


class _Server(ThreadingHTTPServer):
    daemon_threads = False  # server_close waits for the exports under way: they are acknowledged before exit
    block_on_close = True
    request_queue_size = 128


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    collector: Collector
    protocol_version = "HTTP/1.1"
    server_version = "specdec-collect"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass  # one line per export would drown the batch lines

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
            self._discard()
            self._error(404, f"{self.path}: not found; this collector takes traces at {TRACES_PATH}")
            return
        if not c.authorized(self.headers.get("Authorization")):
            c.counters.add("refused_auth")
            self._discard()
            self._error(401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"})
            return
        chunked = (self.headers.get("Transfer-Encoding") or "").strip().lower() == "chunked"
        length = self.headers.get("Content-Length")
        if not chunked and (length is None or not length.isdigit()):
            self.close_connection = True
            self._error(411, "Content-Length required")
            return
        if not chunked and int(length) > c.options.max_body_bytes:
            c.counters.add("refused_large")
            self._discard(int(length))  # read off, not kept: a client that sends it all then reads the answer
            self._error(413, f"body of {int(length):,} bytes is over the limit of {c.options.max_body_bytes:,}")
            return
        if c.busy():
            c.counters.add("refused_busy")
            if chunked:
                self.close_connection = True
            else:
                self._discard(int(length))
            self._error(429, "backlog full: retry later", {"Retry-After": str(c.retry_after())})
            return
        try:
            body = self._read_chunked(c.options.max_body_bytes) if chunked else self.rfile.read(int(length))
        except TooLarge:
            c.counters.add("refused_large")
            self.close_connection = True
            self._error(413, f"body is over the limit of {c.options.max_body_bytes:,} bytes")
            return
        except ValueError:
            self.close_connection = True
            self._error(400, "bad chunked body")
            return
        content_type = (self.headers.get("Content-Type") or "").split(";", 1)[0].strip().lower()
        try:
            if (self.headers.get("Content-Encoding") or "").strip().lower() == "gzip":
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

    def _read_chunked(self, limit: int) -> bytes:
        """A body sent with Transfer-Encoding: chunked, never more than `limit` bytes of it."""
        parts: list[bytes] = []
        held = 0
        while True:
            size = int(self.rfile.readline(1024).split(b";", 1)[0].strip() or b"x", 16)
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            held += size
            if held > limit:
                raise TooLarge()
            parts.append(self.rfile.read(size))
            self.rfile.readline(16)  # the CRLF after each chunk

    def _discard(self, length: int | None = None) -> None:
        """Read a refused body off the connection (up to the limit), so the client reads the answer."""
        if length is None:
            text = self.headers.get("Content-Length") or ""
            length = int(text) if text.isdigit() else 0
        if length > _MOST_DISCARDED:
            self.close_connection = True
            return
        while length > 0:
            got = self.rfile.read(min(length, 1 << 20))
            if not got:
                break
            length -= len(got)


def _start_grpc(collector: Collector, listen: str) -> Any:
    grpc = require("collect", "grpc")
    trace_service = require("collect", "opentelemetry.proto.collector.trace.v1.trace_service_pb2")
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
            return trace_service.ExportTraceServiceResponse()

    host, port = split_host_port(listen, "--grpc")
    server = grpc.server(ThreadPoolExecutor(max_workers=8), options=[
        ("grpc.max_receive_message_length", collector.options.max_body_bytes)])
    trace_grpc.add_TraceServiceServicer_to_server(Servicer(), server)
    address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(address)
    except RuntimeError:
        bound = 0
    if not bound and port:
        raise CollectError(f"--grpc {listen}: can't listen there")
    server.start()
    return server


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
