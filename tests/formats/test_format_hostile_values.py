"""One hostile value in one record of any format is that record's quarantine, never the ingest's end: numbers
past what Decimal's context or a float holds, numeric text whose int() would never end, JSON nested past what
Python's reader recurses to. The records around it load."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from format_lines import MAP, litellm_line, mapped_line, otel_line
from helpers import rec, run_cli, write_jsonl

from specdec_core import formats
from specdec_core.formats.common import MAX_JSON_DEPTH, epoch_to_rfc3339, to_decimal
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

FIXTURES = Path(__file__).parents[1] / "fixtures" / "formats"
ROOT = Path(__file__).resolve().parents[2]


def load(tmp_path: Path, lines: list[str], fmt: str = "auto", mapping=None):
    store = Store(tmp_path / "s.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", lines))], log_format=fmt, mapping=mapping)
    with store.read() as con:
        reasons = con.execute("SELECT source_line, reason FROM quarantine ORDER BY source_line").fetchall()
        ids = sorted(r[0] for r in con.execute("SELECT request_id FROM requests").fetchall())
    return result, reasons, ids


# --- item 2: a value nested 5,000 deep, and numbers past Decimal's context or a double ---------------------

@pytest.mark.parametrize("nested", ['{"a":' + "[" * 5000 + "]" * 5000 + "}", '{"a":' * 3000 + "1" + "}" * 3000])
@pytest.mark.parametrize("as_text", [False, True])
def test_a_cached_fingerprint_nested_thousands_deep_is_one_quarantined_record(tmp_path, nested, as_text):
    hit = json.dumps(rec("deep", cache_hit=True, cached_fingerprint=None))
    value = json.dumps(nested) if as_text else nested  # a Parquet or CSV writer holds it as JSON text
    hit = hit.replace('"cached_fingerprint": null', f'"cached_fingerprint": {value}')
    result, reasons, ids = load(tmp_path, [json.dumps(rec("before")), hit, json.dumps(rec("after"))])
    assert (result.read, result.accepted, result.quarantined) == (3, 2, 1)
    assert reasons == [(2, "cached_fingerprint: nested too deeply to read")]
    assert ids == ["after", "before"]


def test_an_otel_cached_fingerprint_text_nested_thousands_deep_is_its_line_quarantined(tmp_path):
    deep = otel_line(attrs={"specdec.cached_fingerprint": {"stringValue": '{"a":' + "[" * 5000 + "]" * 5000 + "}"}})
    result, reasons, ids = load(tmp_path, [deep, otel_line("otel-2")], "otel")
    assert reasons == [(1, "bad JSON: nested too deeply to read")]
    assert ids == ["otel-2"]


def test_nesting_up_to_the_limit_is_read_and_one_level_more_is_not():
    ok, over = "[" * MAX_JSON_DEPTH + "]" * MAX_JSON_DEPTH, "[" * (MAX_JSON_DEPTH + 1) + "]" * (MAX_JSON_DEPTH + 1)
    assert formats.common.parse_json_text(ok)[0] is True
    with pytest.raises(formats.FormatError, match="nested too deeply"):
        formats.common.parse_json_text(over)
    # Brackets inside strings are text, not nesting.
    assert formats.common.parse_json_text(json.dumps(["[" * 5000]))[0] is True


@pytest.mark.parametrize("end", ["1e400", "1e9999999"])
def test_an_otel_end_time_past_a_double_leaves_latency_unknown_and_the_rest_loads(tmp_path, end):
    result, reasons, ids = load(tmp_path, [otel_line(endTimeUnixNano=end), otel_line("otel-2")], "otel")
    assert reasons == [] and ids == ["otel-1", "otel-2"]
    with Store(tmp_path / "s.duckdb").read() as con:
        assert con.execute("SELECT count(*) FROM requests WHERE latency_ms IS NULL").fetchall() == [(1,)]


@pytest.mark.parametrize(("fields", "reason"), [
    ({"startTime": "1e9999999"}, "ts: expected"),
    ({"startTime": 1e308}, "ts: expected"),
    ({"startTime": "-1e9999999"}, "ts: expected"),
])
def test_a_litellm_time_past_every_range_is_quarantined_and_the_rest_loads(tmp_path, fields, reason):
    result, reasons, _ = load(tmp_path, [litellm_line(0, **fields), litellm_line(1)], "litellm")
    assert [line for line, _ in reasons] == [1] and reasons[0][1].startswith(reason), reasons
    assert result.accepted == 1


def test_a_litellm_response_time_past_decimal_s_context_leaves_latency_unknown(tmp_path):
    result, reasons, _ = load(tmp_path, [litellm_line(0, response_time="1e999999"), litellm_line(1)], "litellm")
    assert reasons == [] and result.accepted == 2


@pytest.mark.parametrize("start", ["1e9999999", "1e-9999999", "-1e400", 1e308])
def test_a_mapped_time_past_every_range_is_quarantined_and_the_rest_loads(tmp_path, start):
    mapping = formats.load_mapping(MAP)
    result, reasons, ids = load(tmp_path, [mapped_line(start=start), mapped_line(id="c-next")], mapping=mapping)
    if start == "1e-9999999":  # a tiny number is a time: the epoch
        assert reasons == [] and result.accepted == 2
    else:
        assert [line for line, _ in reasons] == [1] and reasons[0][1].startswith("ts: expected"), reasons
        assert ids == ["c-next"]


def test_numbers_past_a_double_are_not_numbers_and_times_stay_exact_below():
    assert to_decimal("1e9999999") is None and to_decimal("1e308") is None and to_decimal(10**400) is None
    assert to_decimal("-1.7e307") is not None and to_decimal("1e-9999999") is not None
    assert epoch_to_rfc3339("1748779200.123456", "s") == "2025-06-01T12:00:00.123456Z"
    assert epoch_to_rfc3339("1e9999999", "ns") is None and epoch_to_rfc3339("1e300", "s") is None


# --- item 3: ten bytes that made int() build ten million digits ---------------------------------------------

def test_an_otel_start_time_of_1e9999999_is_quarantined_at_once_not_spun_on(tmp_path):
    log = write_jsonl(tmp_path / "log.jsonl", [otel_line(startTimeUnixNano="1e9999999"), otel_line("otel-2")])
    done = run_cli("ingest", str(log), "--db", str(tmp_path / "s.duckdb"), "--format", "otel", "--json", cwd=ROOT,
                   timeout=60)
    assert done.returncode == 0, done.stderr
    counts = json.loads(done.stdout)
    assert (counts["read"], counts["accepted"], counts["quarantined"]) == (2, 1, 1)
    with Store(tmp_path / "s.duckdb").read() as con:
        [(reason,)] = con.execute("SELECT reason FROM quarantine").fetchall()
    assert reason.startswith("ts: expected") and "1e9999999" in reason


# --- item 10: values of the wrong kind are named, not taken for another ---------------------------------------

@pytest.mark.parametrize(("key", "value", "reason"), [
    ("gen_ai.request.model", {"bytesValue": "bGxhbWE="}, "target_model: expected"),
    ("gen_ai.request.stop_sequences", {"arrayValue": "x"}, "stop: expected"),
    ("gen_ai.request.stop_sequences", {"arrayValue": {"values": "x"}}, "stop: expected"),
])
def test_an_otel_value_of_the_wrong_kind_is_quarantined_with_its_field_named(tmp_path, key, value, reason):
    result, reasons, ids = load(tmp_path, [otel_line(attrs={key: value}), otel_line("otel-2")], "otel")
    assert [line for line, _ in reasons] == [1] and reasons[0][1].startswith(reason), reasons
    assert ids == ["otel-2"]


def test_a_map_index_in_other_digits_selects_nothing(tmp_path):
    mapping_file = tmp_path / "map.toml"
    mapping_file.write_text(MAP.read_text(encoding="utf-8").replace(
        'finish_reason = "response.choices.0.finish_reason"', 'finish_reason = "response.choices.\u0660.finish_reason"'),
        encoding="utf-8")
    mapping = formats.load_mapping(mapping_file)
    assert "finish_reason" not in mapping.apply(json.loads(mapped_line()))
    assert formats.load_mapping(MAP).apply(json.loads(mapped_line()))["finish_reason"] == "stop"


@pytest.mark.parametrize("depth", [300, 3000])
def test_a_map_constant_nested_thousands_deep_is_refused_in_one_line(tmp_path, depth):
    mapping_file = tmp_path / "map.toml"
    mapping_file.write_text(f'request_id = "id"\nprompt = {{ value = {"[" * depth}1{"]" * depth} }}\n',
                            encoding="utf-8")
    with pytest.raises(formats.MappingError, match="nest") as refused:
        formats.load_mapping(mapping_file)
    assert "\n" not in str(refused.value) and str(mapping_file) in str(refused.value)


def test_a_map_constant_larger_than_a_record_is_refused_before_anything_is_read(tmp_path, capsys):
    from specdec_core.cli import main as cli_main

    mapping_file = tmp_path / "map.toml"
    mapping_file.write_text(MAP.read_text(encoding="utf-8").replace(
        'output_text = "response.choices.0.message.content"', f'output_text = {{ value = "{"x" * 2_000_000}" }}'),
        encoding="utf-8")
    log = write_jsonl(tmp_path / "log.jsonl", [mapped_line()])
    code = cli_main(["ingest", str(log), "--db", str(tmp_path / "s.duckdb"), "--map", str(mapping_file),
                     "--max-record-bytes", "1000000"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "output_text" in err and "2,000,002 bytes" in err, err
    assert not (tmp_path / "s.duckdb").exists()


def test_a_large_map_constant_makes_smaller_batches_of_records(tmp_path):
    from specdec_core.ingestion.staging import FOREIGN_CHUNK_BYTES, FOREIGN_CHUNK_ROWS, foreign_chunk_rows

    mapping_file = tmp_path / "map.toml"
    mapping_file.write_text(MAP.read_text(encoding="utf-8").replace(
        'output_text = "response.choices.0.message.content"', f'output_text = {{ value = "{"x" * 1_000_000}" }}'),
        encoding="utf-8")
    rows = foreign_chunk_rows(formats.load_mapping(mapping_file).read_line)
    assert rows * 1_000_000 <= FOREIGN_CHUNK_BYTES < (rows + 1) * 1_000_002
    assert foreign_chunk_rows(formats.load_mapping(MAP).read_line) == FOREIGN_CHUNK_ROWS  # its one constant: small
    assert foreign_chunk_rows(formats.line_reader("otel", None)) == FOREIGN_CHUNK_ROWS


# --- a message index in other digits than ASCII's -------------------------------------------------------------

def _with_attrs(line: str, attrs: dict[str, str]) -> str:
    """The export's first span with these string attributes added."""
    request = json.loads(line)
    span = request["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    span["attributes"] += [{"key": k, "value": {"stringValue": v}} for k, v in attrs.items()]
    return json.dumps(request)


@pytest.mark.parametrize(("fixture", "prefix"), [("openinference_spans.jsonl", "llm.input_messages.{}.message"),
                                                 ("openllmetry_spans.jsonl", "gen_ai.prompt.{}")])
def test_a_message_index_written_in_other_digits_is_no_message(tmp_path, fixture, prefix):
    """`²` passes str.isdigit() and int() refuses it: the span was quarantined for Python's words. `٣` int() reads
    as 3: the prompt gained a message no instrumentation wrote, and its fingerprint changed. Neither is an index
    of the flattened messages; both are other attributes, as a name that is no index at all would be."""
    line = (FIXTURES / fixture).read_text(encoding="utf-8").splitlines()[0]
    hostile = _with_attrs(line, {f"{prefix.format(d)}.{part}": "injected"
                                 for d in ("\u00b2", "\u0663") for part in ("role", "content")})
    stored = []
    for name, text in (("clean", line), ("hostile", hostile)):
        (tmp_path / name).mkdir()
        result, reasons, _ = load(tmp_path / name, [text])
        assert (result.quarantined, reasons) == (0, []), name
        with Store(tmp_path / name / "s.duckdb").read() as con:
            stored.append(con.execute("SELECT request_id, prompt, fingerprint FROM requests ORDER BY 1").fetchall())
    assert stored[1] == stored[0] and stored[0]
    assert all("injected" not in prompt for _, prompt, _ in stored[1])


def test_numbers_python_reads_and_logs_do_not_write_are_quarantined_with_their_spelling(tmp_path):
    """int(), float() and Decimal() read "1_6" as 16, "0_5" as 5.0 and "١٦" as 16: a CSV's cells and an OTel
    span's numbers in text went into the store as those numbers. They are text no log writes for a number."""
    records = [rec("under", max_tokens="1_6"), rec("arabic", max_tokens="\u0661\u0666"),
               rec("float", temperature="0_5"), rec("plain", max_tokens=" 16 ", temperature="0.5")]
    path = tmp_path / "log.csv"
    with path.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows({k: json.dumps(v) if isinstance(v, (list, dict)) else v for k, v in r.items()}
                         for r in records)
    store = Store(tmp_path / "csv.duckdb")
    result = ingest(store, [str(path)])
    with store.read() as con:
        reasons = con.execute("SELECT source_line, reason FROM quarantine ORDER BY source_line").fetchall()
        stored = con.execute("SELECT request_id, max_tokens, temperature FROM requests").fetchall()
    assert (result.accepted, result.quarantined) == (1, 3)
    assert reasons == [(1, 'max_tokens: expected an integer >= 1, got "1_6"'),
                       (2, 'max_tokens: expected an integer >= 1, got "\u0661\u0666"'),
                       (3, 'temperature: expected a number >= 0, got "0_5"')]
    assert stored == [("plain", 16, 0.5)]
    spans = [otel_line("otel-under", {"gen_ai.request.max_tokens": {"intValue": "1_6"}}),
             otel_line("otel-float", {"gen_ai.request.temperature": {"doubleValue": "0_5"}}),
             otel_line("otel-plain", {"gen_ai.request.max_tokens": {"intValue": "16"}})]
    result, reasons, ids = load(tmp_path, spans, "otel")
    assert [reason.split(",")[0] for _, reason in reasons] == ["max_tokens: expected an integer >= 1",
                                                               "temperature: expected a number >= 0"]
    assert ids == ["otel-plain"]
