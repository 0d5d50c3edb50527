"""What many tests share: hand-built log records and files, running the CLI (fixtures are in conftest.py)."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from forked_cli import run_forked, startup_settings

from specdec_core.contract import DecodeRequest, DecodeResult, fingerprint
from specdec_core.derived.hit_sources import last_miss_sql
from specdec_core.store.connection import Store

BASE: dict[str, Any] = {
    "ts": "2026-03-01T10:00:00Z",
    "prompt": "Summarise the incident.",
    "target_model": "llama-8b",
    "draft_model": "llama-1b",
    "num_speculative_tokens": 4,
    "temperature": 0.0,
    "top_p": 1.0,
    "top_k": None,
    "max_tokens": 64,
    "seed": None,
    "stop": None,
    "tokenizer_version": "tok-v1",
    "deployment": "prod",
    "cache_key": "k-1",
    "cache_hit": False,
    "cached_fingerprint": None,
    "output_text": "An output.",
    "output_tokens": 3,
    "finish_reason": "stop",
    "latency_ms": 120.0,
    "draft_tokens": 8,
    "accepted_tokens": 6,
}


def rec(request_id: str, **overrides: Any) -> dict[str, Any]:
    record = {"request_id": request_id, **BASE, **overrides}
    return {k: v for k, v in record.items() if v is not _DROP}


class _Drop:
    def __repr__(self) -> str:
        return "DROP"


_DROP = _Drop()
DROP: Any = _DROP  # rec(..., field=DROP) leaves the field out of the record


def write_jsonl(path: Path, records: list[Any]) -> Path:
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_csv(path: Path, records: list[dict[str, Any]], drop_column: str | None = None) -> Path:
    """Records as the contract's CSV: every field any record has, stop and cached_fingerprint as JSON text."""
    fields = ["request_id", *sorted({k for r in records for k in r} - {"request_id"})]
    if drop_column:
        fields.remove(drop_column)
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(fields)
        for r in records:
            row: list[Any] = []
            for f in fields:
                v = r.get(f)
                if f in ("stop", "cached_fingerprint"):
                    row.append("" if v is None else json.dumps(v))
                elif isinstance(v, bool):
                    row.append("true" if v else "false")
                else:
                    row.append("" if v is None else v)
            writer.writerow(row)
    return path


def sigint_default() -> None:
    """A child's preexec_fn for a test that interrupts it: Ctrl-C's default action, whatever the suite inherited.
    A shell starts background jobs with SIGINT ignored, and Python installs no KeyboardInterrupt handler in a
    process that starts so: the child would ignore the test's SIGINT."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def bare_env(**extra: str) -> dict[str, str]:
    """A user's bare environment for a command (a short PATH, the model hub offline, `extra`), with the
    interpreter settings the suite runs under (forked_cli.startup_settings): the command is then forked as the
    others are, and its torch keeps to the worker's one thread (a new interpreter with none ran two, spinning,
    for 2.5x the CPU of the same replay)."""
    return {**startup_settings(dict(os.environ)), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", **extra}


def run_cli(*args: str, timeout: float = 300, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """`specdec ARGS...` in a process of its own, as a user runs it: forked from one that has imported the
    libraries every command imports (forked_cli.py), or a new interpreter where that can't be."""
    if set(kwargs) <= {"cwd", "env", "input"}:
        done = run_forked(list(args), timeout, **kwargs)
        if done is not None:
            return done
    return subprocess.run([sys.executable, "-m", "specdec_core", *args], capture_output=True, text=True,
                          timeout=timeout, **kwargs)


class DeterministicEngine:
    """A stand-in decoder (the real one is tested elsewhere): its output names the
    parameters it decoded with, so a cached output served to the wrong request shows."""

    def __init__(self, delay_s: float = 0.0, fail: bool = False) -> None:
        self.calls: list[DecodeRequest] = []
        self.delay_s = delay_s
        self.fail = fail
        self._lock = threading.Lock()

    def generate(self, request: DecodeRequest) -> DecodeResult:
        with self._lock:
            self.calls.append(request)
        if self.fail:
            raise RuntimeError("CUDA out of memory")
        time.sleep(self.delay_s)
        n = request.max_tokens
        return DecodeResult(
            text=f"draft={request.draft_model} T={request.temperature} max={request.max_tokens} "
            f"[{fingerprint(request)[:8]}]",
            token_ids=tuple(range(n)),
            finish_reason="length",
            draft_tokens=2 * n,
            accepted_tokens=n,
        )


# The ports the tests' servers listen on come from below the range the kernel hands out as the local end of
# outgoing connections (ip_local_port_range). A port from a bind to 0 is in that range, and any connection of
# any process could take it before the server bound it: under load, CI saw a collector's gRPC port "already
# in use" a moment after it was chosen. Each xdist worker draws from a slice of its own, so two workers never
# hold the same port between choosing and binding it.
_PORT_SLICE = 2048  # at most: the ports from 1024 up to the range are shared out among the workers


def free_port() -> int:
    """A port on 127.0.0.1 that nothing is bound to, outside the kernel's range for outgoing connections."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 0
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    size = min(_PORT_SLICE, (low - 1024) // max(workers, 1))
    start = low - size * (1 + (int(worker) if worker.isdigit() else 0))
    candidates = random.sample(range(start, start + size), size) if size >= 64 and start >= 1024 else []
    for port in candidates:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as s:  # no such range here: the kernel's choice, as before
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(port: int, workdir: str | Path) -> subprocess.Popen:
    """A redis-server of our own on 127.0.0.1:`port` (no persistence), once it answers PING.

    For tests that kill or stop it, and for the benchmarks; other tests use pytest-redis.
    """
    import redis

    executable = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen([executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port, socket_connect_timeout=0.2)
    deadline = time.monotonic() + 10
    try:
        while True:
            try:
                client.ping()
                return proc
            except redis.ConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    proc.kill()
                    raise RuntimeError(f"redis-server did not start on port {port}; is {executable} installed?") \
                        from None
                time.sleep(0.05)
    finally:
        client.close()


# A decode result with every field set, for cache and entry tests.
SAMPLE_RESULT = DecodeResult(
    text="A draft proposes, the target verifies.",
    token_ids=(5, 6, 7),
    finish_reason="stop",
    draft_tokens=8,
    accepted_tokens=6,
    accepted_per_step=(4, 2),
    environment={"torch": "2.4.0"},
)


# A sampled request with every identity field set, for cache and entry tests.
SAMPLE_REQUEST = DecodeRequest(
    prompt="Explain speculative decoding.",
    target_model="llama-3-8b",
    draft_model="llama-3-1b",
    num_speculative_tokens=4,
    temperature=0.7,
    seed=1,
    max_tokens=64,
    tokenizer_version="hf-4.44",
)


def instant(ts: object) -> datetime:
    """A logged `ts` (RFC 3339 text, or epoch milliseconds) as an aware UTC datetime."""
    if isinstance(ts, int):
        return datetime.fromtimestamp(ts / 1000, tz=timezone.utc)
    return datetime.fromisoformat(str(ts).replace("Z", "+00:00")).astimezone(timezone.utc)


# Every stored table, in an order that does not depend on how it was written.
STORE_TABLES = {
    "requests": "SELECT * EXCLUDE (ingest_id) FROM requests ORDER BY request_id",
    "identities": "SELECT * FROM identities ORDER BY fingerprint",
    "quarantine": "SELECT * EXCLUDE (ingest_id) FROM quarantine ORDER BY source_file, source_line, reason",
    "hit_sources": "SELECT * FROM hit_sources ORDER BY request_id",
    "identity_first_seen": "SELECT * FROM identity_first_seen ORDER BY ALL",
    "key_last_miss": last_miss_sql("SELECT * FROM key_last_miss") + " ORDER BY ALL",
    "summary_minute": "SELECT * FROM summary_minute ORDER BY ALL",
    "summary_keys": "SELECT * EXCLUDE (key_id, fp_id) FROM summary_keys ORDER BY ALL",
    "identity_aliases": "SELECT * EXCLUDE (key_id, fp_id, alias_fp_id) FROM identity_aliases ORDER BY ALL",
    "summary_contaminated": "SELECT * FROM summary_contaminated ORDER BY ALL",
    "summary_lengths": "SELECT * FROM summary_lengths ORDER BY ALL",
    "summary_violations": "SELECT * FROM summary_violations ORDER BY ALL",
    "contaminated_first_verdicts": "SELECT * FROM contaminated_first_verdicts ORDER BY ALL",
    "summary_first_verdicts": "SELECT * FROM summary_first_verdicts ORDER BY ALL",
    "ingests": "SELECT ingest_id, n_read, n_accepted, n_duplicates, n_quarantined FROM ingests ORDER BY ingest_id",
}


def contents(name: str) -> dict[str, list[tuple]]:
    with Store(name).read() as con:
        return {table: con.execute(sql).fetchall() for table, sql in STORE_TABLES.items()}


class StandInDecoder:
    """The decoder a test hands to replay jobs whose replay functions are stand-ins: its registry names no
    engine, so every request goes to the stand-in as an in-process replay would."""

    class _Registry:
        def engine_of(self, model: str) -> None:
            return None

    registry = _Registry()

    def __repr__(self) -> str:
        return "STAND_IN_DECODER"


STAND_IN_DECODER = StandInDecoder()
