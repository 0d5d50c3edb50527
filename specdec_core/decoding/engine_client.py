"""HTTP to an OpenAI-compatible engine: one JSON call, retried on 429/503, size-limited, one-line errors.

Standard library only (http.client): the library installs without an HTTP stack of its own. A call goes
only to the URL of an `[engines.NAME]` table of the config file; redirects are not followed (a server
must not send replay's requests on to an address nobody configured) and no proxy is used. The API key
is read from the environment variable the table names, for each call, and appears in no message.
"""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from specdec_core.decoding.registry import EngineSpec
from specdec_core.text import escape_controls

# A replay's answer is a few kilobytes; prompt log-probabilities of a long prompt a few megabytes.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# What a failed call shows of the server's body: enough to read its reason.
ERROR_TEXT_CHARS = 200
RETRIES = 4
MAX_RETRY_WAIT_S = 30.0
PROBE_TIMEOUT_S = 2.0
# An answer nested deeper than this is no completion: Python's parser would recurse past its stack.
MAX_JSON_DEPTH = 64

# Kinds of failure. After `unreachable` (or a timeout, a missing key, a rate limit retries did not outlast) a
# batch sends nothing more to that engine.
UNREACHABLE, TIMEOUT, HTTP, MALFORMED, UNKNOWN_MODEL, RATE_LIMITED, NO_KEY, CLOSED = (
    "unreachable", "timeout", "http", "malformed", "unknown_model", "rate_limited", "no_key", "closed")


def shown(text: Any, limit: int = ERROR_TEXT_CHARS) -> str:
    """Server text as one safe line: control characters escaped, whitespace collapsed, cut to `limit`."""
    text = escape_controls(re.sub(r"\s+", " ", str(text)).strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def parse_json(text: str) -> Any:
    """Strict JSON (no NaN or Infinity) nested at most MAX_JSON_DEPTH deep; ValueError otherwise."""
    try:
        value = json.loads(text, parse_constant=_no_constant)
    except RecursionError:  # the parser's own guard, far past any depth allowed here
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} deep") from None
    if _too_deep(value):
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} deep")
    return value


def _too_deep(value: Any) -> bool:
    """Whether lists and objects nest past MAX_JSON_DEPTH: walked without recursion, so that what reads the
    value afterwards (str, json.dumps) can't recurse past Python's stack."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else ()
        for child in children:
            if isinstance(child, (dict, list)):
                if depth >= MAX_JSON_DEPTH:
                    return True
                stack.append((child, depth + 1))
    return False


def key_problem(value: str) -> str | None:
    """Why an API key can't go in an Authorization header, without showing any of it; None when it can."""
    if value != value.strip():
        return "it starts or ends with whitespace (a trailing newline from a file?)"
    if not all(0x21 <= ord(ch) <= 0x7E or ch == " " for ch in value):
        return "it holds a character an HTTP header can't carry (a control character or non-ASCII)"
    return None


class EngineError(RuntimeError):
    """A call to an engine that failed: nothing it returned may become a verdict. The message is one line."""

    def __init__(self, engine: EngineSpec, kind: str, detail: str, status: int | None = None) -> None:
        self.engine, self.kind, self.detail, self.status = engine, kind, detail, status
        super().__init__(f"engine {engine.name} ({engine.url}): {detail}")


@dataclass(frozen=True)
class Response:
    status: int
    body: dict[str, Any]
    headers: Mapping[str, str]
    seconds: float


def retry_after(value: str | None, attempt: int, now: float | None = None) -> float:
    """Seconds to wait before the next try: the server's Retry-After (seconds or an HTTP date), else backoff."""
    backoff = min(0.25 * 2**attempt, MAX_RETRY_WAIT_S)
    if not value:
        return backoff
    value = value.strip()
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return min(float(value), MAX_RETRY_WAIT_S)
    try:
        when = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return backoff
    return min(max(when - (time.time() if now is None else now), 0.0), MAX_RETRY_WAIT_S)


class EngineClient:
    """Calls one engine. Thread-safe: each call opens its own connection."""

    def __init__(self, spec: EngineSpec, *, sleep: Callable[[float], None] = time.sleep,
                 max_bytes: int = MAX_RESPONSE_BYTES) -> None:
        self.spec, self._sleep, self.max_bytes = spec, sleep, max_bytes
        parts = urlsplit(spec.url)
        self._https = parts.scheme == "https"
        self._host, self._port = parts.hostname or "", parts.port
        self._base = parts.path.rstrip("/")
        self.retries_done = 0

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.spec.api_key_env:
            key = os.environ.get(self.spec.api_key_env)
            if not key:
                raise EngineError(self.spec, NO_KEY, f"the environment variable {self.spec.api_key_env} "
                                  "(api_key_env) is not set")
            problem = key_problem(key)
            if problem:  # http.client's own error would quote the key
                raise EngineError(self.spec, NO_KEY, f"the environment variable {self.spec.api_key_env} "
                                  f"(api_key_env) can't be sent as a key: {problem}")
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _once(self, method: str, path: str, payload: bytes | None, timeout: float) -> tuple[int, Any, bytes, float]:
        headers = self._headers()
        cls = _HTTPSConnection if self._https else _HTTPConnection
        started = time.perf_counter()
        conn = cls(self._host, self._port, deadline=time.monotonic() + timeout)
        resp: http.client.HTTPResponse | None = None
        try:
            conn.request(method, self._base + path, body=payload, headers=headers)
            resp = conn.getresponse()
            chunks, size = [], 0
            while True:
                chunk = resp.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_bytes:
                    raise EngineError(self.spec, MALFORMED, f"the response is over {self.max_bytes:,} bytes; "
                                      "not read further", resp.status)
                chunks.append(chunk)
            if resp.length:  # read(amt) returns b"" where the server closed before its Content-Length
                raise http.client.IncompleteRead(b"", resp.length)
            return resp.status, resp.headers, b"".join(chunks), time.perf_counter() - started
        except TimeoutError:
            raise EngineError(self.spec, TIMEOUT, f"no answer within timeout_s = {timeout:g} s") from None
        except http.client.IncompleteRead:
            raise EngineError(self.spec, CLOSED, "connection closed before the answer was complete") from None
        except http.client.RemoteDisconnected:
            raise EngineError(self.spec, CLOSED, "connection closed without an answer") from None
        except http.client.HTTPException as exc:
            if not isinstance(exc, ConnectionError):  # a server that answers, but not in HTTP
                raise EngineError(self.spec, MALFORMED, f"not an HTTP answer: {shown(exc or type(exc).__name__)}"
                                  ) from None
            raise EngineError(self.spec, UNREACHABLE, f"unreachable: {shown(exc)}") from None
        except OSError as exc:
            reason = shown(getattr(exc, "strerror", None) or exc or type(exc).__name__)
            raise EngineError(self.spec, UNREACHABLE, f"unreachable: {reason}") from None
        finally:
            if resp is not None:
                resp.close()
            conn.close()

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
             timeout: float | None = None, retries: int = RETRIES) -> Response:
        """One JSON call; 429 and 503 are retried (Retry-After honoured), any other failure raises EngineError."""
        payload = None if body is None else json.dumps(body).encode("utf-8")
        timeout = self.spec.timeout_s if timeout is None else timeout
        attempt = 0
        while True:
            status, headers, raw, seconds = self._once(method, path, payload, timeout)
            if status in (429, 503) and attempt < retries:
                self.retries_done += 1
                self._sleep(retry_after(headers.get("Retry-After"), attempt))
                attempt += 1
                continue
            break
        text = raw.decode("utf-8", errors="replace")
        if status >= 400:
            kind = RATE_LIMITED if status in (429, 503) else HTTP
            what = " after retries" if kind == RATE_LIMITED else ""
            raise EngineError(self.spec, kind, f"HTTP {status}{what}: {shown(_error_text(text))}", status)
        if not 200 <= status < 300:  # a redirect's body is not the answer, and redirects are not followed
            where = headers.get("Location")
            to = f" to {shown(where, 80)}" if where else ""
            raise EngineError(self.spec, HTTP, f"HTTP {status}{to}: not an answer (redirects are not followed; "
                              "give the final address as url)", status)
        try:
            parsed = parse_json(text)
        except (ValueError, RecursionError) as exc:
            why = shown(exc, 80) if "deep" in str(exc) or "JSON number" in str(exc) else shown(text, 80)
            raise EngineError(self.spec, MALFORMED, f"the answer to {path} is not JSON: {why!r}",
                              status) from None
        if not isinstance(parsed, dict):
            raise EngineError(self.spec, MALFORMED, f"the answer to {path} is JSON but not an object", status)
        return Response(status, parsed, headers, seconds)

    def served_models(self, timeout: float = PROBE_TIMEOUT_S) -> list[str]:
        """The model names GET /models lists (a short timeout: this answers `is the engine there`)."""
        body = self.call("GET", "/models", timeout=timeout, retries=0).body
        data = body.get("data")
        if not isinstance(data, list):
            raise EngineError(self.spec, MALFORMED, "GET /models has no `data` list")
        return [str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id") is not None]


def _error_text(text: str) -> str:
    """The reason in an error body: OpenAI's {"error": {"message": ...}}, FastAPI's {"detail": ...}, else the text."""
    try:
        body = parse_json(text)
    except (ValueError, RecursionError):
        return text
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return err if isinstance(err, str) else json.dumps(err)
    return text


@dataclass(frozen=True)
class Probe:
    """What `specdec models list` learnt of an engine: whether it answers, what it said, the names it serves."""

    answers: bool
    said: str
    names: tuple[str, ...] = ()


def probe(spec: EngineSpec, timeout: float = PROBE_TIMEOUT_S) -> Probe:
    """GET /models with a short timeout: the served model names, or the one-line reason."""
    try:
        names = EngineClient(spec).served_models(timeout)
    except EngineError as exc:
        return Probe(False, exc.detail)
    return Probe(True, "serves " + (", ".join(shown(n, 80) for n in names[:8]) or "no model"), tuple(names))


class _DeadlineSocket:
    """A connected socket whose every send and receive gets the time left to one deadline as its timeout.

    http.client reads a status line, headers and chunks in many small reads; a timeout per read lets a
    server that sends one byte a second hold a call for ever, a timeout to the deadline does not.
    """

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock, self._deadline = sock, deadline
        # As socket.makefile does: http.client closes the connection once it has the response, whose reader
        # still reads the body; the socket closes when both are closed.
        self._readers, self._closed = 0, False

    def _arm(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)

    def recv_into(self, buffer: Any, nbytes: int = 0) -> int:
        self._arm()
        return self._sock.recv_into(buffer, nbytes)

    def recv(self, nbytes: int) -> bytes:
        self._arm()
        return self._sock.recv(nbytes)

    def sendall(self, data: Any) -> None:
        self._arm()
        self._sock.sendall(data)

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        self._readers += 1
        return io.BufferedReader(_DeadlineReader(self))

    def reader_closed(self) -> None:
        self._readers -= 1
        if self._closed and self._readers <= 0:
            self._sock.close()

    def close(self) -> None:
        self._closed = True
        if self._readers <= 0:
            self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class _DeadlineReader(io.RawIOBase):
    def __init__(self, sock: _DeadlineSocket) -> None:
        self._sock = sock

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._sock.recv_into(buffer)

    def close(self) -> None:
        if not self.closed:
            self._sock.reader_closed()
        super().close()


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, host: str, port: int | None, *, deadline: float) -> None:
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self._deadline = deadline

    def connect(self) -> None:
        self.timeout = max(self._deadline - time.monotonic(), 0.001)
        super().connect()
        self.sock = _DeadlineSocket(self.sock, self._deadline)  # type: ignore[assignment]


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, host: str, port: int | None, *, deadline: float) -> None:
        super().__init__(host, port, timeout=max(deadline - time.monotonic(), 0.001))
        self._deadline = deadline

    def connect(self) -> None:
        self.timeout = max(self._deadline - time.monotonic(), 0.001)
        super().connect()  # the TLS handshake runs under the connect's timeout, itself the time left
        self.sock = _DeadlineSocket(self.sock, self._deadline)  # type: ignore[assignment]
