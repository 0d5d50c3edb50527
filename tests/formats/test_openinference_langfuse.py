"""`--format openinference` (OTLP JSON and Phoenix's span export), `--format langfuse` (blob export and public
API), `auto` telling them apart, and the older GenAI names in `--format otel`. The OpenInference and OpenLLMetry
fixtures are the real instrumentations' spans (tests/fixtures/formats/make_instrumented.py)."""

from __future__ import annotations

import csv
import hashlib
import json
from pathlib import Path

import pytest
from helpers import run_cli
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from specdec_core import formats
from specdec_core.store import Store

FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"
TRUTH = json.loads((FIXTURES / "instrumented_truth.json").read_text())


def ingest(db: Path, *args: str) -> dict:
    done = run_cli("ingest", *args, "--db", str(db), "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def contaminated(db: Path, tmp_path: Path) -> dict[str, list[str]]:
    out = tmp_path / "report.csv"
    assert run_cli("report", "--db", str(db), "--out", str(out)).returncode == 0
    with open(out, newline="", encoding="utf-8") as fh:
        return {r["request_id"]: [r["source_request_id"], r["differing_fields"]]
                for r in csv.DictReader(fh) if r["kind"] == "contaminated_hit"}


def rows(db: Path, columns: str) -> dict[str, tuple]:
    with Store(db).read() as con:
        return {r[0]: r[1:] for r in con.execute(f"SELECT request_id, {columns} FROM requests").fetchall()}


@pytest.mark.parametrize(("name", "fmt"), [("openinference_spans.jsonl", "openinference"),
                                           ("phoenix_spans.json", "openinference"),
                                           ("openllmetry_spans.jsonl", "otel")])
def test_real_instrumentation_spans_show_the_incident(tmp_path: Path, name: str, fmt: str) -> None:
    db = tmp_path / "s.duckdb"
    counts = ingest(db, str(FIXTURES / name))  # auto
    assert counts["formats"] == {str(FIXTURES / name): fmt}
    assert (counts["accepted"], counts["skipped"], counts["quarantined"]) == (5, TRUTH["skipped"], 0)
    assert contaminated(db, tmp_path) == TRUTH["contaminated"]
    got = rows(db, "output_text, prompt_hash, target_model")
    assert got["q1"] == (TRUTH["outputs"]["q1"], hashlib.sha256(TRUTH["prompt_q1"].encode()).hexdigest(),
                         "gpt-4o-mini")


def test_openinference_top_k_and_speculation_are_unknown_not_null(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    ingest(db, str(FIXTURES / "openinference_spans.jsonl"), "--format", "openinference")
    unknown = rows(db, "unknown_fields, top_k, seed")
    assert all(v == (["num_speculative_tokens", "top_k"], None, 7) for v in unknown.values())


def oi_line(attributes: dict) -> str:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("llm", attributes=attributes):
        pass
    return json.dumps(MessageToDict(encode_spans(memory.get_finished_spans())))


def test_openinference_hidden_inputs_need_a_prompt_hash(tmp_path: Path) -> None:
    base = {"openinference.span.kind": "LLM", "input.value": "__REDACTED__", "output.value": "ok",
            "output.mime_type": "text/plain", "llm.model_name": "m",
            "llm.invocation_parameters": '{"temperature": 0, "max_tokens": 8}', "llm.token_count.completion": 1,
            "specdec.cache_key": "k", "specdec.cache_hit": False, "specdec.tokenizer_version": "t"}
    log = tmp_path / "oi.jsonl"
    log.write_text(oi_line({**base, "specdec.request_id": "hidden"}) + "\n"
                   + oi_line({**base, "specdec.request_id": "hashed", "specdec.prompt_hash": "ab" * 32}) + "\n")
    db = tmp_path / "s.duckdb"
    counts = ingest(db, str(log), "--format", "openinference")
    assert (counts["accepted"], counts["quarantined"]) == (1, 1)
    with Store(db).read() as con:
        assert con.execute("SELECT request_id, reason FROM quarantine").fetchall() == [
            ("hidden", "missing required field: one of prompt or prompt_hash")]


def test_phoenix_snake_case_otlp_and_text_input(tmp_path: Path) -> None:
    line = json.dumps({"resource_spans": [{"resource": {"attributes": []}, "scope_spans": [{"spans": [{
        "span_id": "00000000000000AB", "start_time_unix_nano": "1767261600000000000",
        "end_time_unix_nano": "1767261600250000000", "attributes": [
            {"key": "openinference.span.kind", "value": {"string_value": "LLM"}},
            {"key": "input.value", "value": {"string_value": "Tell me a joke"}},
            {"key": "input.mime_type", "value": {"string_value": "text/plain"}},
            {"key": "llm.model_name", "value": {"string_value": "m"}},
            {"key": "llm.prompts.0.prompt.text", "value": {"string_value": "ignored: input.value is last"}}]}]}]}]})
    result = formats.line_reader("openinference")(line)
    (record,) = result.records
    assert record["request_id"] == "00000000000000ab"
    assert record["ts"] == "2026-01-01T10:00:00.000000Z" and record["latency_ms"] == 250.0
    assert record["prompt"] == "ignored: input.value is last"  # llm.prompts comes before input.value
    assert formats.detect(line) == "openinference"


LANGFUSE_BLOB = [
    {"id": "g1", "trace_id": "t1", "project_id": "p", "type": "GENERATION", "name": "chat",
     "start_time": "2026-03-01 10:00:00.000", "end_time": "2026-03-01 10:00:00.400",
     "provided_model_name": "gpt-4o-mini", "model_parameters": '{"temperature":"0","max_tokens":"64"}',
     "input": '[{"role":"user","content":"hi"}]', "output": '{"role":"assistant","content":"hello"}',
     "usage_details": {"input": 3, "output": 2}, "environment": "prod",
     "metadata": {"cache_key": "u:hi", "cache_hit": "false", "tokenizer_version": "o200k-1",
                  "num_speculative_tokens": "4", "draft_model": "eagle", "consumer": "acme"}},
    {"id": "g2", "trace_id": "t2", "project_id": "p", "type": "GENERATION", "name": "chat",
     "start_time": "2026-03-01 10:00:05.000", "end_time": "2026-03-01 10:00:05.010",
     "provided_model_name": "gpt-4o-mini", "model_parameters": '{"temperature":"0.9","max_tokens":"64"}',
     "input": '[{"role":"user","content":"hi"}]', "output": '{"role":"assistant","content":"hello"}',
     "usage_details": {"input": 3, "output": 2}, "environment": "prod",
     "metadata": {"cache_key": "u:hi", "cache_hit": "true", "tokenizer_version": "o200k-1",
                  "num_speculative_tokens": "4", "draft_model": "eagle", "consumer": "beta"}},
    {"id": "s1", "trace_id": "t2", "project_id": "p", "type": "SPAN", "name": "retrieve",
     "start_time": "2026-03-01 10:00:05.000", "end_time": "2026-03-01 10:00:05.010"},
]


def test_langfuse_blob_export_and_public_api_read_alike(tmp_path: Path) -> None:
    blob = tmp_path / "observations.jsonl"
    blob.write_text("".join(json.dumps(o) + "\n" for o in LANGFUSE_BLOB))
    camel = []
    for o in LANGFUSE_BLOB:
        c = {"id": o["id"], "traceId": o["trace_id"], "type": o["type"], "name": o["name"],
             "startTime": o["start_time"].replace(" ", "T") + "Z", "endTime": o["end_time"].replace(" ", "T") + "Z"}
        if o["type"] == "GENERATION":
            c.update({"model": o["provided_model_name"], "modelParameters": json.loads(o["model_parameters"]),
                      "input": json.loads(o["input"]), "output": json.loads(o["output"]),
                      "usageDetails": o["usage_details"], "environment": o["environment"],
                      "metadata": o["metadata"]})
        camel.append(c)
    api = tmp_path / "api.json"
    api.write_text(json.dumps({"data": camel, "meta": {"page": 1}}, indent=2))
    results = {}
    for path in (blob, api):
        db = tmp_path / f"{path.stem}.duckdb"
        counts = ingest(db, str(path))
        assert counts["formats"] == {str(path): "langfuse"}
        assert (counts["accepted"], counts["skipped"], counts["quarantined"]) == (2, 1, 0)
        assert contaminated(db, tmp_path) == {"g2": ["g1", "temperature"]}
        results[path.name] = rows(db, "ts, latency_ms, temperature, max_tokens, prompt, output_text, output_tokens, "
                                      "deployment, cache_hit, num_speculative_tokens")
    assert results["observations.jsonl"] == results["api.json"]
    assert results["api.json"]["g1"][1:] == (400.0, 0.0, 64, '[{"content":"hi","role":"user"}]', "hello", 2,
                                             "prod", False, 4)
    assert [r["consumer"] for r in formats.line_reader("langfuse")(blob.read_text().splitlines()[1]).records] == [
        "beta"]


def test_older_genai_names_from_span_events(tmp_path: Path) -> None:
    from google.protobuf.json_format import MessageToDict
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    memory = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc"}))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    with provider.get_tracer("t").start_as_current_span("chat", attributes={
            "gen_ai.system": "openai", "gen_ai.request.model": "m", "gen_ai.openai.request.seed": 3,
            "llm.top_k": 5.0, "llm.chat.stop_sequences": ["\n"], "gen_ai.usage.completion_tokens": 2,
            "gen_ai.request.temperature": 0.5, "gen_ai.request.max_tokens": 9, "specdec.cache_key": "k",
            "specdec.cache_hit": False, "specdec.tokenizer_version": "t", "specdec.request_id": "e1"}) as span:
        span.add_event("gen_ai.system.message", {"content": "be brief"})
        span.add_event("gen_ai.user.message", {"content": "hi"})
        span.add_event("gen_ai.choice", {"index": 0, "finish_reason": "stop",
                                         "message": json.dumps({"role": "assistant", "content": "hello"})})
    (record,) = formats.line_reader("otel")(json.dumps(MessageToDict(encode_spans(memory.get_finished_spans())))
                                            ).records
    assert record["prompt"] == '[{"content":"be brief","role":"system"},{"content":"hi","role":"user"}]'
    assert (record["output_text"], record["seed"], record["top_k"], record["stop"], record["output_tokens"]) == (
        "hello", 3, 5.0, ["\n"], 2)


def test_phoenix_nested_attributes_read_as_flat_ones() -> None:
    flat = json.loads((FIXTURES / "phoenix_spans.json").read_text())["data"]
    llm = next(span for span in flat if span["span_kind"] == "LLM")
    nested: dict = {}
    for key, value in llm["attributes"].items():  # as older Phoenix versions answer: one level a dot
        *path, last = key.split(".")
        node = nested
        for part in path:
            node = node.setdefault(part, {})
        node[last] = value
    line = json.dumps({"data": [{**llm, "attributes": nested}]})
    assert formats.line_reader("openinference")(line).records == formats.line_reader("openinference")(
        json.dumps({"data": [llm]})).records
