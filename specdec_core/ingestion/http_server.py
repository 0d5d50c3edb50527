"""The HTTP side of `specdec collect`: a threaded HTTP/1.1 server whose connections end when it stops, and the
reading of a request's body (a Content-Length's, a chunked one's, a refused one's) that its handler shares.

An exporter keeps its connection open between exports (OTLP/HTTP exporters pool them, as any HTTP/1.1 client
does): the server serves MAX_CONNECTIONS at once, closes a connection idle past IDLE_TIMEOUT_S, and on stop
closes every connection waiting for its next request at once, while one in the middle of a request gets its
answer first. Stopping waited for every connection to end, and a service's exporter, alive, kept one open for
as long as it ran: SIGTERM left `specdec collect` running until it was killed.
"""

from __future__ import annotations

import socket
import string
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from specdec_core.connections import BoundedThreads, cut
from specdec_core.ingestion.otlp_decode import TooLarge
from specdec_core.text import ascii_digits

# A refused body is read off the connection up to this size (so the client reads the answer), else cut.
_MOST_DISCARDED = 1 << 30
# A Content-Length or a chunk's size longer than this is no size any export has: refused, not converted (int()
# of a 5,000-digit number raises, and one of a Unicode digit such as "²" too).
_MOST_SIZE_DIGITS = 18
_HEX_DIGITS = frozenset(string.hexdigits)
# A connection that sends nothing for this long is closed (a read of a request's line or body that waits
# longer ends it): an exporter opens another for its next export, and an idle client holds no thread.
IDLE_TIMEOUT_S = 60
# Connections served at once (each an exporter's, kept between its exports); the next waits this long for
# one of them to end, then is closed, and its exporter sends again later.
MAX_CONNECTIONS = 256
SLOT_WAIT_S = 10.0


def byte_count(text: str, base: int = 10) -> int | None:
    """A Content-Length (base 10) or a chunk's size (base 16) as a number of bytes; None where it is not one:
    a sign, a space inside, a digit other than ASCII's, more than 18 digits, nothing."""
    text = text.strip()
    digits = ascii_digits(text) if base == 10 else bool(text) and set(text) <= _HEX_DIGITS
    return int(text, base) if digits and len(text) <= _MOST_SIZE_DIGITS else None


class Server(BoundedThreads, ThreadingHTTPServer):
    daemon_threads = False  # server_close waits for the exports under way: they are acknowledged before exit
    block_on_close = True
    request_queue_size = 128
    max_connections = MAX_CONNECTIONS
    slot_wait_s = SLOT_WAIT_S
    on_problem: Callable[[str], None] = staticmethod(lambda _: None)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self._connections: dict[Handler, bool] = {}  # each open connection's handler: whether mid-request
        self._connections_lock = threading.Lock()
        self.stopping = False
        super().__init__(*args, **kwargs)

    def mark(self, handler: Handler, busy: bool | None) -> bool:
        """A connection is between requests (False), in one (True) or gone (None); returns whether the server is
        stopping, after which a connection's answer is its last."""
        with self._connections_lock:
            if busy is None:
                self._connections.pop(handler, None)
            else:
                self._connections[handler] = busy
            return self.stopping

    def close_idle(self) -> None:
        """Take no further request: close each connection between requests now; one in a request closes after
        its answer (Handler.handle_one_request). Call after shutdown(), before server_close() waits for them."""
        with self._connections_lock:
            self.stopping = True
            for handler, busy in self._connections.items():
                if not busy:
                    cut(handler.connection)  # its wait for a request line ends

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, not socketserver's traceback, for an export that broke off: a client that left before its
        answer is not a problem of the collector (an exporter sends again; what was spooled is then found a
        duplicate), anything else is said with the address it came from."""
        exc = sys.exc_info()[1]
        if isinstance(exc, (BrokenPipeError, ConnectionResetError, TimeoutError)):
            return
        host, port = client_address[:2]
        self.on_problem(f"an export from {host}:{port} failed: {type(exc).__name__}: {exc}")


class Server6(Server):
    address_family = socket.AF_INET6


class Handler(BaseHTTPRequestHandler):
    """HTTP/1.1 with its connection known to the Server (Server.close_idle), and the reading of bodies."""

    server: Server
    protocol_version = "HTTP/1.1"
    timeout = IDLE_TIMEOUT_S

    def setup(self) -> None:
        super().setup()
        if self.server.mark(self, False):  # accepted as the server stopped: no request is read from it
            cut(self.connection)

    def parse_request(self) -> bool:
        self.server.mark(self, True)  # a request line came: it is answered even if the server stops meanwhile
        return super().parse_request()

    def handle_one_request(self) -> None:
        super().handle_one_request()
        if self.server.mark(self, False):
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.mark(self, None)

    @property
    def chunked(self) -> bool:
        """Whether the request's body comes in chunks (Transfer-Encoding: chunked), not by its Content-Length."""
        return (self.headers.get("Transfer-Encoding") or "").strip().lower() == "chunked"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        pass  # one line per export would drown the batch lines

    def read_exactly(self, length: int) -> bytes:
        body = self.rfile.read(length)
        if len(body) < length:
            raise ValueError(f"body ended after {len(body):,} of its {length:,} bytes")
        return body

    def read_chunked(self, limit: int) -> bytes:
        """A body sent with Transfer-Encoding: chunked, never more than `limit` bytes of it. A size that is not
        one (a negative size read everything up to the connection's end, past the limit) or a chunk cut short
        raises ValueError("bad chunked body")."""
        parts: list[bytes] = []
        held = 0
        while True:
            size = byte_count(self.rfile.readline(1024).split(b";", 1)[0].decode("latin-1"), 16)
            if size is None:
                raise ValueError("bad chunked body")
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            held += size
            if held > limit:
                raise TooLarge()
            parts.append(self.rfile.read(size))
            if len(parts[-1]) < size:
                raise ValueError("bad chunked body")
            self.rfile.readline(16)  # the CRLF after each chunk

    def discard(self, length: int | None = None) -> None:
        """Read a refused body off the connection (up to the limit), so the client reads the answer; where its
        end can't be found (chunked, a size that is none), the connection closes after the answer."""
        if length is None:
            length = None if self.chunked else byte_count(self.headers.get("Content-Length") or "0")
        if length is None or length > _MOST_DISCARDED:
            self.close_connection = True
            return
        while length > 0:
            got = self.rfile.read(min(length, 1 << 20))
            if not got:
                break
            length -= len(got)
