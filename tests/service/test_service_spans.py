"""DecodeService speaks OpenTelemetry too: its GenAI spans, exported as the Collector's file exporter writes
them and read back with `--format otel`, are the same records as its JSON Lines log."""

from __future__ import annotations

import base64
import json

from google.protobuf.json_format import MessageToDict
from helpers import DeterministicEngine, run_cli
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from specdec_core import DecodeRequest
from specdec_core.cache import MemoryCache
from specdec_core.service import DecodeService
from specdec_core.store import Store

BASE = {"prompt": "Summarise.", "target_model": "t-8b", "tokenizer_version": "tok-v1", "max_tokens": 8,
        "temperature": 0.0}
REQUESTS = [
    {**BASE, "draft_model": "d-1b", "num_speculative_tokens": 4},
    {**BASE, "draft_model": "d-3b", "num_speculative_tokens": 4},  # a hit on the first one's output
    {**BASE, "temperature": 0.7, "seed": 3, "top_k": 40, "top_p": 0.9, "stop": ["\n", "END"]},
    {**BASE, "prompt": "Something else.", "max_tokens": 4},
]


def _collector_line(spans) -> str:
    """One ExportTraceServiceRequest as the Collector's file exporter writes it: hex ids, not base64."""
    obj = MessageToDict(encode_spans(spans))
    for resource in obj["resourceSpans"]:
        for scope in resource["scopeSpans"]:
            for span in scope["spans"]:
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in span:
                        span[key] = base64.b64decode(span[key]).hex()
    return json.dumps(obj)


def test_spans_read_back_with_format_otel_equal_the_json_lines_log(tmp_path):
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "decode-svc"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    log = tmp_path / "log.jsonl"
    # A narrow key (model + prompt) so one request is served another's output, as in production.
    with DecodeService(MemoryCache(), DeterministicEngine(), key_scheme="model_prompt", guard=False,
                       log_sink=log, deployment="edge-a", tracer=provider.get_tracer("test")) as service:
        for n, req in enumerate(REQUESTS):
            service.decode(DecodeRequest.from_record(req), request_id=f"r{n}")
    spans = exporter.get_finished_spans()
    assert len(spans) == len(REQUESTS)
    otel = tmp_path / "spans.jsonl"
    otel.write_text(_collector_line(spans) + "\n")

    stores = {}
    for name, path, fmt in (("log", log, "contract"), ("otel", otel, "otel")):
        db = tmp_path / f"{name}.duckdb"
        done = run_cli("ingest", str(path), "--db", str(db), "--format", fmt, "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["accepted"] == len(REQUESTS)
        with Store(db).read() as con:
            stores[name] = con.execute(
                "SELECT * EXCLUDE (source_file, source_line, ingest_id, extra) FROM requests ORDER BY request_id"
            ).fetchall()
    assert stores["otel"] == stores["log"]
    assert [row[0] for row in stores["otel"]] == ["r0", "r1", "r2", "r3"]


def test_without_a_tracer_no_span_is_made_and_the_log_is_unchanged(tmp_path):
    log = tmp_path / "log.jsonl"
    with DecodeService(MemoryCache(), DeterministicEngine(), log_sink=log) as service:
        service.decode(DecodeRequest.from_record(REQUESTS[0]), request_id="r0")
    assert service._tracer is None
    assert json.loads(log.read_text())["request_id"] == "r0"


def test_span_ids_in_protobufs_own_json_mapping_are_the_same_requests_as_the_collectors_hex(tmp_path):
    """MessageToDict(encode_spans(...)) writes ids as base64, the Collector's file exporter as hex: a span
    without specdec.request_id is the request named by its span id, in lowercase hex, either way."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "gw"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    for n in range(20):
        with tracer.start_as_current_span("chat t-8b") as span:
            span.set_attributes({"gen_ai.operation.name": "chat", "gen_ai.request.model": "t-8b",
                                 "gen_ai.request.temperature": 0.0, "gen_ai.request.max_tokens": 8,
                                 "specdec.tokenizer_version": "tok-v1", "specdec.cache_key": f"k{n % 3}",
                                 "specdec.cache_hit": n >= 3, "specdec.prompt": f"p{n % 3}",
                                 "specdec.output_text": "out", "gen_ai.usage.output_tokens": 1})
    spans = exporter.get_finished_spans()
    expected = sorted(f"{s.context.span_id:016x}" for s in spans)
    as_protobuf = tmp_path / "protobuf.jsonl"
    as_protobuf.write_text(json.dumps(MessageToDict(encode_spans(spans))) + "\n")
    assert len(json.loads(as_protobuf.read_text())["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["spanId"]) == 12
    as_collector = tmp_path / "collector.jsonl"
    as_collector.write_text(_collector_line(spans) + "\n")
    for path in (as_protobuf, as_collector):
        db = tmp_path / f"{path.stem}.duckdb"
        done = run_cli("ingest", str(path), "--db", str(db), "--format", "otel", "--json")
        assert done.returncode == 0, done.stderr
        assert json.loads(done.stdout)["accepted"] == len(spans)
        with Store(db).read() as con:
            assert [r[0] for r in con.execute("SELECT request_id FROM requests ORDER BY 1").fetchall()] == expected
