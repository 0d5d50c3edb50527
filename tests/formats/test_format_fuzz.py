"""Numbers and nesting of any size in the numeric and nested fields of every format: each line is read or
refused with a one-line reason, and an ingest of them ends with read = accepted + duplicates + quarantined +
skipped, every record accounted for. Bounded in time: few examples, each a handful of lines."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from format_lines import MAP, litellm_line, mapped_line, otel_line
from helpers import rec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core import formats
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store

SLOT = "__fuzzed__"  # where a value's JSON text goes in a template line

# JSON number tokens of any size, as numbers and as numeric text; NaN and Infinity as Python writes them.
_EXPONENT = st.from_regex(r"\A-?[0-9]{1,3}(\.[0-9]{1,6})?[eE][+-]?[0-9]{1,8}\Z")
_NUMBER = st.one_of(
    st.integers(-(2**200), 2**200).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(lambda x: json.dumps(x)),
    _EXPONENT,
    _EXPONENT.map(json.dumps),
    st.integers(0, 2**64).map(lambda n: json.dumps(str(n))),
)
# Arrays and objects nested from 0 to 5,000 levels: past Python's recursion, past the depth allowed.
_NESTED = st.one_of(
    st.integers(0, 5000).map(lambda d: "[" * d + "1" + "]" * d),
    st.integers(0, 5000).map(lambda d: '{"a":' * d + "1" + "}" * d),
)
VALUE = st.one_of(_NUMBER, _NESTED, _NESTED.map(json.dumps))  # nested JSON as a value and as JSON text


def fill(template: str, value: str) -> str:
    return template.replace(json.dumps(SLOT), value, 1)


def _otel(key: str | None = None, kind: str = "stringValue", **span) -> str:
    return otel_line("req", attrs={key: {kind: SLOT}} if key else None, **span)


# Per format: its reader, and template lines whose numeric or nested field is the slot.
TEMPLATES: dict[str, tuple] = {
    "contract": (None, [json.dumps(rec("r", **{f: SLOT})) for f in (
        "ts", "latency_ms", "temperature", "top_p", "max_tokens", "seed", "num_speculative_tokens",
        "output_tokens", "draft_tokens", "stop", "cached_fingerprint")]),
    "otel": ("otel", [_otel(startTimeUnixNano=SLOT), _otel(endTimeUnixNano=SLOT),
                      _otel("gen_ai.request.temperature", "doubleValue"), _otel("gen_ai.request.max_tokens", "intValue"),
                      _otel("gen_ai.request.seed", "intValue"), _otel("specdec.cached_fingerprint"),
                      _otel("gen_ai.input.messages"), _otel("gen_ai.request.stop_sequences", "arrayValue")]),
    "litellm": ("litellm", [litellm_line(0, startTime=SLOT), litellm_line(0, response_time=SLOT),
                            litellm_line(0, completion_tokens=SLOT), litellm_line(0, messages=SLOT),
                            litellm_line(0, response=SLOT), litellm_line(0, model_parameters={"temperature": SLOT})]),
    "map": ("map", [mapped_line(start=SLOT), mapped_line(timing={"latency_ms": SLOT}),
                    mapped_line(req={"params": {"temperature": SLOT}}), mapped_line(response=SLOT)]),
}


def reader(fmt: str):
    if fmt == "contract":
        return None
    return formats.load_mapping(MAP).read_line if fmt == "map" else formats.line_reader(fmt, None)


def _lines(fmt: str, picks: list[tuple[int, str]]) -> list[str]:
    templates = TEMPLATES[fmt][1]
    out = []
    for n, (i, value) in enumerate(picks):
        line = fill(templates[i % len(templates)], value)
        # A unique id per line (the templates share one), so nothing is a duplicate.
        for old in ('"r"', '"req"', '"c-1"', '"chatcmpl-a8b3b777-65f0-46b4-9381-dba66c315e2a"'):
            line = line.replace(f'"request_id": {old}', f'"request_id": "u{n}"').replace(
                f'"stringValue": {old}', f'"stringValue": "u{n}"').replace(f'"id": {old}', f'"id": "u{n}"')
        out.append(line)
    return out


PICKS = st.lists(st.tuples(st.integers(0, 20), VALUE), min_size=1, max_size=6)
FAST = settings(max_examples=40, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
INGESTS = settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                         HealthCheck.function_scoped_fixture])


@FAST
@given(picks=PICKS)
def test_every_foreign_line_is_read_or_refused_in_one_line(picks):
    for fmt in ("otel", "litellm", "map"):
        read_line = reader(fmt)
        for line in _lines(fmt, picks):
            try:
                result = read_line(line)
            except ValueError as exc:  # the format's reason: one line
                assert "\n" not in str(exc) and str(exc), (fmt, line[:200])
            else:
                for record in result.records:
                    json.dumps(record)  # what staging writes must be writable


def _ingest(tmp_path: Path, fmt: str, picks: list[tuple[int, str]]) -> None:
    lines = _lines(fmt, picks)
    folder = tmp_path / f"{fmt}-{abs(hash_text(lines))}"
    folder.mkdir(exist_ok=True)
    log = folder / "log.jsonl"
    log.write_text("\n".join(lines) + "\n", encoding="utf-8")
    store = Store(folder / "s.duckdb")
    mapping = formats.load_mapping(MAP) if fmt == "map" else None
    result = ingest(store, [str(log)], log_format="auto" if fmt in ("contract", "map") else fmt, mapping=mapping)
    assert result.read == result.accepted + result.duplicates + result.quarantined + result.skipped
    assert result.duplicates == 0 and result.read >= len(lines)
    with store.read() as con:
        assert con.execute("SELECT count(*) FROM requests").fetchall()[0][0] == result.accepted
        reasons = [r[0] for r in con.execute("SELECT reason FROM quarantine").fetchall()]
    assert len(reasons) == result.quarantined and all("\n" not in r for r in reasons)


def hash_text(lines: list[str]) -> int:
    return int(hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12], 16)


@INGESTS
@given(picks=PICKS)
def test_an_ingest_of_fuzzed_lines_accounts_for_every_record(tmp_path, picks):
    for fmt in TEMPLATES:
        _ingest(tmp_path, fmt, picks)
