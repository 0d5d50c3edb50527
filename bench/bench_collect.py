"""`specdec collect` beside `specdec ingest` of the same spans: throughput, and lag under steady traffic.

Throughput: N GenAI request spans (500 a export, as an SDK's BatchSpanProcessor sends them) are written as
OTLP JSON lines and loaded with `specdec ingest FILE --format otel`; then the same exports, as OTLP/HTTP
protobuf, are posted by four senders to `specdec collect` on a fresh store, timed from the first post to the
batch that holds the last span. Target: the collector's spans/s within 2x of the file ingest's.

Lag: 1,000 spans/s (an export of 100 spans every 0.1 s, each span started when it is sent) for `--seconds`;
each batch the collector commits says how far its newest span lags behind now. Target: under 5 s.

    .venv/bin/python bench/bench_collect.py [--spans 96000] [--seconds 30]
"""

from __future__ import annotations

import argparse
import http.client
import json
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import OUT, ROOT  # noqa: E402

PER_EXPORT = 500


def _value(v: object) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


def export(first: int, count: int, start_ns: int | None = None, tag: str = "b") -> ExportTraceServiceRequest:
    """`count` request spans as a GenAI instrumentation with specdec attributes writes them."""
    spans = []
    for n in range(first, first + count):
        start = start_ns if start_ns is not None else 1_767_261_600_000_000_000 + n * 1_000_000
        attrs = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "llama-8b",
                 "gen_ai.request.temperature": 0.7 if n % 3 else 0.0, "gen_ai.request.max_tokens": 64,
                 "gen_ai.request.seed": n % 11, "gen_ai.usage.output_tokens": 12,
                 "specdec.prompt": f"prompt number {n % 5000} " + "lorem ipsum " * 8,
                 "specdec.output_text": f"output {n % 5000} " + "dolor sit amet " * 6,
                 "specdec.tokenizer_version": "tok-1", "specdec.draft_model": "llama-1b",
                 "specdec.num_speculative_tokens": 4, "specdec.cache_key": f"k{n % 5000}",
                 "specdec.cache_hit": n >= 5000, "specdec.request_id": f"{tag}-{n:08d}"}
        spans.append(Span(trace_id=n.to_bytes(16, "big"), span_id=(n + 1).to_bytes(8, "big"), name="chat llama-8b",
                          kind=Span.SPAN_KIND_CLIENT, start_time_unix_nano=start,
                          end_time_unix_nano=start + 40_000_000,
                          attributes=[KeyValue(key=k, value=_value(v)) for k, v in attrs.items()]))
    resource = Resource(attributes=[KeyValue(key="service.name", value=_value("edge-a"))])
    return ExportTraceServiceRequest(resource_spans=[ResourceSpans(resource=resource,
                                                                   scope_spans=[ScopeSpans(spans=spans)])])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_collector(db: Path) -> tuple[subprocess.Popen, int, list[dict]]:
    """A collector on a free port; its batch lines, as they come, in the returned list (with their times)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "specdec_core", "collect", "--db", str(db), "--listen",
                             f"127.0.0.1:{port}", "--json"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    batches: list[dict] = []

    def read() -> None:
        for line in proc.stdout:
            batches.append({**json.loads(line), "at": time.monotonic()})

    threading.Thread(target=read, daemon=True).start()
    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, port, batches
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(proc.stderr.read()) from None
            time.sleep(0.05)


def post_all(port: int, bodies: list[bytes], senders: int) -> None:
    def send(mine: list[bytes]) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        for body in mine:
            while True:
                conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
                answer = conn.getresponse()
                answer.read()
                if answer.status == 200:
                    break
                time.sleep(float(answer.getheader("Retry-After") or 1))
        conn.close()

    threads = [threading.Thread(target=send, args=(bodies[i::senders],)) for i in range(senders)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)


def throughput(spans: int, folder: Path) -> dict:
    exports = [export(i, min(PER_EXPORT, spans - i)) for i in range(0, spans, PER_EXPORT)]
    log = folder / "spans.jsonl"
    with open(log, "w", encoding="utf-8") as fh:
        for e in exports:
            fh.write(json.dumps(MessageToDict(e), separators=(",", ":")) + "\n")
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", "specdec_core", "ingest", str(log), "--db", str(folder / "file.duckdb"),
                    "--format", "otel", "--json"], cwd=ROOT, check=True, capture_output=True)
    file_s = time.perf_counter() - started

    bodies = [e.SerializeToString() for e in exports]
    proc, port, batches = start_collector(folder / "collect.duckdb")
    started = time.monotonic()
    post_all(port, bodies, senders=4)
    acked_s = time.monotonic() - started
    while sum(b["accepted"] for b in batches) < spans and proc.poll() is None:
        time.sleep(0.05)
    collect_s = batches[-1]["at"] - started
    stop(proc)
    return {"spans": spans, "file_s": file_s, "collect_s": collect_s, "acked_s": acked_s,
            "batches": len(batches)}


def lag(seconds: float, folder: Path, rate: int = 1000, per_export: int = 100) -> dict:
    proc, port, batches = start_collector(folder / "lag.duckdb")
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    started = time.monotonic()
    n = 0
    while time.monotonic() - started < seconds:
        due = int((time.monotonic() - started) * rate)
        while n < due:
            body = export(n, per_export, start_ns=time.time_ns(), tag="lag").SerializeToString()
            conn.request("POST", "/v1/traces", body, {"Content-Type": "application/x-protobuf"})
            answer = conn.getresponse()
            answer.read()
            n += per_export
        time.sleep(per_export / rate / 2)
    conn.close()
    deadline = time.monotonic() + 60
    while sum(b["accepted"] for b in batches) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    stop(proc)
    lags = sorted(b["lag_seconds"] for b in batches if b.get("lag_seconds") is not None)
    return {"spans": n, "stored": sum(b["accepted"] for b in batches), "batches": len(batches),
            "p50": statistics.median(lags), "p95": lags[int(0.95 * (len(lags) - 1))], "max": lags[-1]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spans", type=int, default=96_000)
    parser.add_argument("--seconds", type=float, default=30)
    args = parser.parse_args()
    folder = OUT / "collect"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    t = throughput(args.spans, folder)
    file_rate, collect_rate = t["spans"] / t["file_s"], t["spans"] / t["collect_s"]
    print(f"{t['spans']:,} spans: file ingest {t['file_s']:.1f} s ({file_rate:,.0f} spans/s); "
          f"collect {t['collect_s']:.1f} s ({collect_rate:,.0f} spans/s, all acknowledged after "
          f"{t['acked_s']:.1f} s, {t['batches']} batches): {t['collect_s'] / t['file_s']:.2f}x the file ingest "
          f"(target <= 2x)")
    lag_figures = lag(args.seconds, folder)
    print(f"lag at 1,000 spans/s for {args.seconds:.0f} s: p50 {lag_figures['p50']:.2f} s, p95 "
          f"{lag_figures['p95']:.2f} s, max {lag_figures['max']:.2f} s over {lag_figures['batches']} batches; "
          f"{lag_figures['stored']:,} of {lag_figures['spans']:,} spans stored (target < 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
