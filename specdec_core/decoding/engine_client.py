"""HTTP to an OpenAI-compatible engine: one JSON call, retried on 429/503, size-limited, one-line errors.

Standard library only (http.client): the library installs without an HTTP stack of its own. A call goes
only to the URL of an `[engines.NAME]` table of the config file; redirects are not followed (a server
must not send replay's requests on to an address nobody configured) and no proxy is used. The API key
is read from the environment variable the table names, for each call, and appears in no message.
"""

from __future__ import annotations

import http.client
import json
import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import urlsplit

from specdec_core.decoding.registry import EngineSpec

# A replay's answer is a few kilobytes; prompt log-probabilities of a long prompt a few megabytes.
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
# What a failed call shows of the server's body: enough to read its reason.
ERROR_TEXT_CHARS = 200
RETRIES = 4
MAX_RETRY_WAIT_S = 30.0
PROBE_TIMEOUT_S = 2.0

# Kinds of failure. After `unreachable` a batch sends nothing more to that engine.
UNREACHABLE, TIMEOUT, HTTP, MALFORMED, UNKNOWN_MODEL, RATE_LIMITED, NO_KEY = (
    "unreachable", "timeout", "http", "malformed", "unknown_model", "rate_limited", "no_key")


def shown(text: Any, limit: int = ERROR_TEXT_CHARS) -> str:
    """Server text as one safe line: control characters escaped, whitespace collapsed, cut to `limit`."""
    text = str(text)
    text = "".join(ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
                   for ch in re.sub(r"\s+", " ", text).strip())
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _once(self, method: str, path: str, payload: bytes | None, timeout: float) -> tuple[int, Any, bytes, float]:
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        started = time.perf_counter()
        deadline = time.monotonic() + timeout
        conn = cls(self._host, self._port, timeout=timeout)
        try:
            conn.request(method, self._base + path, body=payload, headers=self._headers())
            resp = conn.getresponse()
            chunks, size = [], 0
            while True:  # a server that trickles bytes must not hold the call past its timeout
                if time.monotonic() > deadline:
                    raise TimeoutError("timed out")
                chunk = resp.read(65536)
                if not chunk:
                    break
                size += len(chunk)
                if size > self.max_bytes:
                    raise EngineError(self.spec, MALFORMED, f"the response is over {self.max_bytes:,} bytes; "
                                      "not read further", resp.status)
                chunks.append(chunk)
            return resp.status, resp.headers, b"".join(chunks), time.perf_counter() - started
        except TimeoutError:
            raise EngineError(self.spec, TIMEOUT, f"no answer within timeout_s = {timeout:g} s") from None
        except http.client.HTTPException as exc:
            if not isinstance(exc, ConnectionError):  # a server that answers, but not in HTTP
                raise EngineError(self.spec, MALFORMED, f"not an HTTP answer: {shown(exc or type(exc).__name__)}"
                                  ) from None
            raise EngineError(self.spec, UNREACHABLE, f"unreachable: {shown(exc)}") from None
        except OSError as exc:
            reason = shown(getattr(exc, "strerror", None) or exc or type(exc).__name__)
            raise EngineError(self.spec, UNREACHABLE, f"unreachable: {reason}") from None
        finally:
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
        try:
            parsed = json.loads(text)
        except ValueError:
            raise EngineError(self.spec, MALFORMED, f"the answer to {path} is not JSON: {shown(text, 80)!r}",
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
        body = json.loads(text)
    except ValueError:
        return text
    if isinstance(body, dict):
        err = body.get("error", body.get("detail", body.get("message")))
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            return err if isinstance(err, str) else json.dumps(err)
    return text


def probe(spec: EngineSpec, timeout: float = PROBE_TIMEOUT_S) -> tuple[bool, str]:
    """(answers, what it said) for `specdec models list`: the served model names, or the one-line reason."""
    try:
        names = EngineClient(spec).served_models(timeout)
    except EngineError as exc:
        return False, exc.detail
    return True, "serves " + (", ".join(shown(n, 80) for n in names[:8]) or "no model")
