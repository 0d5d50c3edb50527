"""Fields the contract does not name are kept as a JSON object (`requests.extra`).

Records holding exactly the file's usual other fields, last and in its order, keep the tail of their text
as that object (validation.extra_sql); records whose key list is one of the file's layouts get the object
built from the parse's values; all others go through a JSON merge patch. All must give the same JSON (the
same text once DuckDB writes it, as the content hash does), the built object the patch's very text, and the
fields as they came: random records (values on the edges of JSON writing: escapes, control and astral
characters, exponents, integers past 64 bits, nested objects, null; other fields anywhere among the known
ones, named twice, with escaped names) are ingested, and every stored `extra` is compared with the patch of
its line and with the record's own other fields.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import duckdb
from helpers import rec, write_jsonl
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core.ingestion.load import ingest
from specdec_core.ingestion.validation import extra_shapes, patched_sql, usual_extra_keys
from specdec_core.store.connection import Store

TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=10)
NUMBERS = st.one_of(st.integers(min_value=-(2**70), max_value=2**70),
                    st.floats(allow_nan=False, allow_infinity=False),
                    st.sampled_from(["1E2", "-0", "1.50", "0.0000001", "123456789012345678901234567890"]))
SCALARS = st.one_of(st.none(), st.booleans(), TEXT, NUMBERS)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(TEXT, inner, max_size=3)), max_leaves=6)
KEYS = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters='"\\\''), min_size=1, max_size=8)


def _json(value) -> str:
    """JSON text of a value; a string of NUMBERS' samples stands for itself, written as a bare number."""
    if isinstance(value, str) and value in ("1E2", "-0", "1.50", "0.0000001", "123456789012345678901234567890"):
        return value
    if isinstance(value, list):
        return "[" + ", ".join(_json(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k, ensure_ascii=False)}: {_json(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def _line(known: dict, others: list[tuple[str, object]]) -> str:
    parts = [f"{json.dumps(k)}: {_json(v)}" for k, v in known.items()]
    parts += [f"{json.dumps(k, ensure_ascii=False)}: {_json(v)}" for k, v in others]
    return "{" + ", ".join(parts) + "}"


@st.composite
def files(draw) -> list[tuple[str, list[tuple[str, object]]]]:
    usual = draw(st.lists(KEYS.filter(lambda k: k not in rec("x") and not k.startswith("__")),
                          min_size=1, max_size=5, unique_by=str.lower))
    lines = []
    for i in range(draw(st.integers(min_value=3, max_value=30))):
        others = [(k, draw(VALUES)) for k in usual]
        variant = draw(st.sampled_from(["usual", "usual", "usual", "missing", "more", "reordered", "repeated"]))
        if variant == "missing":
            others = others[1:]
        elif variant == "more":
            others.append((draw(KEYS.filter(lambda k: k not in usual and k not in rec("x"))), draw(VALUES)))
        elif variant == "reordered":
            others.reverse()
        elif variant == "repeated":
            others.append((usual[0], draw(VALUES)))
        lines.append((_line(rec(f"r{i}"), others), others))
    return lines


def _as_dict(pairs):  # a key named twice keeps its last value, as json_merge_patch (and Python's json) does
    return dict(pairs)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=files())
def test_extra_is_the_patch_of_each_line_and_the_fields_as_they_came(lines):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "extra.duckdb")
        log = write_jsonl(Path(tmp) / "extra.jsonl", [text for text, _ in lines])
        result = ingest(store, [str(log)])
        assert result.quarantined == 0 and result.accepted == len(lines)
        with store.read() as con:
            stored = dict(con.execute("SELECT request_id, json(extra)::VARCHAR FROM requests").fetchall())
    con = duckdb.connect()
    for i, (text, others) in enumerate(lines):
        patched = con.execute(f"SELECT ({patched_sql()})::VARCHAR FROM (SELECT ?::VARCHAR AS obj)", [text]).fetchone()[0]
        assert stored[f"r{i}"] == patched, text
        if others:
            expected = json.loads(json.dumps(_as_dict(others)), parse_float=float)
            got = json.loads(stored[f"r{i}"])
            assert got.keys() == expected.keys(), text


def _escaped(key: str) -> str:
    """The key as JSON text with its first character written as a \\u escape."""
    head = f"\\u{ord(key[0]):04x}" if ord(key[0]) < 0x10000 else json.dumps(key[0])[1:-1]  # a surrogate pair
    return '"' + head + json.dumps(key[1:], ensure_ascii=False)[1:]


@st.composite
def service_files(draw) -> list[tuple[str, list[tuple[str, object]]]]:
    """Lines as services write them: a few layouts (other fields at places among the known ones, in some
    order), each record one of them with its own values; now and then a name written escaped, named twice,
    equal to another but for case, or a layout of its own."""
    pool = draw(st.lists(KEYS.filter(lambda k: k not in rec("x") and not k.startswith("__")),
                         min_size=1, max_size=6, unique_by=str.lower))
    known = list(rec("x"))
    layouts = []
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=len(pool), unique=True))
        layouts.append([(name, draw(st.integers(min_value=0, max_value=len(known)))) for name in names])
    lines = []
    for i in range(draw(st.integers(min_value=3, max_value=30))):
        layout = list(draw(st.sampled_from(layouts)))
        variant = draw(st.sampled_from(["layout"] * 6 + ["escaped", "twice", "case", "own"]))
        if variant == "twice":
            layout.append((layout[0][0], draw(st.integers(min_value=0, max_value=len(known)))))
        elif variant == "case" and layout[0][0].swapcase() != layout[0][0]:
            layout.append((layout[0][0].swapcase(), len(known)))
        elif variant == "own":
            layout.append((draw(KEYS.filter(lambda k: k not in pool and k not in rec("x"))), 0))
        values = [draw(VALUES) for _ in layout]
        record = rec(f"r{i}")
        parts: list[str] = []
        for place, field in enumerate([*known, None]):
            for (name, at), value in zip(layout, values, strict=True):
                if at == place:
                    key = _escaped(name) if variant == "escaped" else json.dumps(name, ensure_ascii=False)
                    parts.append(f"{key}: {_json(value)}")
            if field is not None:
                parts.append(f"{json.dumps(field)}: {_json(record[field])}")
        # The record's other fields in the order they are written.
        ordered = sorted(zip(layout, values, strict=True), key=lambda pair: pair[0][1])
        lines.append(("{" + ", ".join(parts) + "}", [(name, value) for (name, _), value in ordered]))
    return lines


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(lines=service_files())
def test_other_fields_anywhere_are_the_patchs_text_byte_for_byte(lines):
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "extra.duckdb")
        log = write_jsonl(Path(tmp) / "extra.jsonl", [text for text, _ in lines])
        result = ingest(store, [str(log)])
        assert result.quarantined == 0 and result.accepted == len(lines)
        with store.read() as con:
            stored = dict(con.execute("SELECT request_id, extra::VARCHAR FROM requests").fetchall())
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT unnest(?::VARCHAR[]) AS raw", [[text for text, _ in lines]])
    usual = usual_extra_keys(con, "SELECT raw FROM t")
    for i, (text, others) in enumerate(lines):
        patched = con.execute(f"SELECT ({patched_sql()})::VARCHAR FROM (SELECT ?::VARCHAR AS obj)", [text]).fetchone()[0]
        keys = con.execute("SELECT json_keys(?)", [text]).fetchone()[0]
        first = json.dumps(usual[0], ensure_ascii=False) if usual else None
        tail = "{" + text[text.index(first):] if first and first in text else None
        if (usual and keys[-len(usual):] == list(usual) and len(keys) == len(rec("x")) + len(usual)
                and tail and con.execute("SELECT json_valid(?)", [tail]).fetchone()[0]):
            # The tail path keeps the text as written; the same JSON as the patch's.
            assert stored[f"r{i}"] == tail, text
            assert con.execute("SELECT json(?)::VARCHAR", [tail]).fetchone()[0] == patched, text
        else:
            assert stored[f"r{i}"] == patched, text
        expected = json.loads(json.dumps(_as_dict(others)), parse_float=float)
        assert list(json.loads(stored[f"r{i}"])) == list(expected), text


def test_a_files_layouts_are_its_commonest_key_lists_whose_other_names_can_be_read(tmp_path):
    con = duckdb.connect()
    known = rec("a")
    between = [json.dumps({"request_id": f"a{i}", "host": "h", **{k: v for k, v in known.items() if k != "request_id"},
                           "i": i}) for i in range(5)]
    first = [json.dumps({"level": "info", **rec(f"b{i}")}) for i in range(3)]
    twice = [json.dumps(rec("c"))[:-1] + ', "host": 1, "host": 2}'] * 4
    cased = [json.dumps({**rec(f"d{i}"), "Host": 1}) for i in range(2)]  # "host" is taken: left to the patch
    clean = [json.dumps(rec(f"e{i}")) for i in range(9)]
    con.execute("CREATE TABLE t AS SELECT unnest(?::VARCHAR[]) AS raw, generate_subscripts(?::VARCHAR[], 1) AS seq",
                [between + first + twice + cased + clean] * 2)
    shapes = extra_shapes(con, "SELECT raw, seq FROM t", 23)
    assert [tuple(k for k in layout if k not in known) for layout in shapes.layouts] == [("host", "i"), ("level",)]
    assert shapes.keys == ("host", "i", "level")
    assert shapes.usual == ("host", "i")


def test_the_usual_fields_are_the_commonest_set_and_odd_names_are_left_to_the_patch(tmp_path):
    con = duckdb.connect()
    common = [_line(rec(f"a{i}"), [("trace_id", i), ("region", "eu")]) for i in range(5)]
    rare = [_line(rec(f"b{i}"), [("user", i)]) for i in range(2)]
    con.execute("CREATE TABLE t AS SELECT unnest(?::VARCHAR[]) AS raw", [rare + common])
    assert usual_extra_keys(con, "SELECT raw FROM t") == ("trace_id", "region")
    # A name equal to a known field but for case is left to the patch.
    con.execute("CREATE OR REPLACE TABLE t AS SELECT unnest(?::VARCHAR[]) AS raw",
                [[_line(rec("c"), [("TS", 1)])] * 3])
    assert usual_extra_keys(con, "SELECT raw FROM t") == ()
    con.execute("CREATE OR REPLACE TABLE t AS SELECT unnest(?::VARCHAR[]) AS raw", [[json.dumps(rec("d"))] * 3])
    assert usual_extra_keys(con, "SELECT raw FROM t") == ()


def test_a_field_named_twice_is_found_among_the_usual_other_fields(tmp_path):
    """The repeated-field check is skipped for records with no more keys than fields read; one named twice
    has more, whether it is the contract's (rejected) or one of the usual others (kept, as the patch keeps it)."""
    usual = [("trace_id", 1), ("region", "eu")]
    lines = [_line(rec(f"u{i}"), usual) for i in range(5)]
    lines.append(_line(rec("twice"), usual)[:-1] + ', "max_tokens": 7}')
    lines.append(_line(rec("other-twice"), [*usual, ("trace_id", 2)]))
    lines.append(_line(rec("interleaved"), list(reversed(usual))))
    store = Store(tmp_path / "s.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "t.jsonl", lines))])
    assert (result.accepted, result.quarantined) == (7, 1)
    with store.read() as con:
        assert con.execute("SELECT reason FROM quarantine").fetchone()[0] == \
            "duplicate field: max_tokens appears more than once"
        extra = dict(con.execute("SELECT request_id, extra::VARCHAR FROM requests").fetchall())
    patched = duckdb.connect().execute(f"SELECT ({patched_sql()})::VARCHAR FROM (SELECT ?::VARCHAR AS obj)",
                                       [lines[6]]).fetchone()[0]
    assert extra["other-twice"] == patched and set(json.loads(patched)) == {"trace_id", "region"}
    assert list(json.loads(extra["interleaved"])) == ["region", "trace_id"]
    assert json.loads(extra["u0"]) == {"trace_id": 1, "region": "eu"}


def test_the_tail_of_a_usual_record_is_its_other_fields_even_where_its_first_name_appears_before(tmp_path):
    """The first usual key's text may appear before the key itself: as a string value, as a key nested in a
    known field's object, inside a string, escaped. The record's other fields are still exactly those."""
    usual = [("trace_id", {"trace_id": [1, {"trace_id": 2}]}), ("region", "trace_id")]
    decoys = {
        "value": {**rec("value"), "deployment": "trace_id"},
        "nested": {**rec("nested"), "cached_fingerprint": {"trace_id": "x", "b": 1}},
        "in-text": {**rec("in-text"), "output_text": '"trace_id": 1, "region": "eu"}'},
        "spaced": rec("spaced"),
    }
    lines = [_line(rec(f"u{i}"), usual) for i in range(5)] + [_line(r, usual) for r in decoys.values()]
    lines[-1] = lines[-1].replace('"trace_id": {', '"trace_id"  :\t{', 1)
    lines.append(_line(rec("escaped"), usual).replace('"trace_id": {', '"\\u0074race_id": {', 1))
    store = Store(tmp_path / "s.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "t.jsonl", lines))])
    assert (result.accepted, result.quarantined) == (len(lines), 0)
    with store.read() as con:
        extra = dict(con.execute("SELECT request_id, json(extra)::VARCHAR FROM requests").fetchall())
    want = {"trace_id": {"trace_id": [1, {"trace_id": 2}]}, "region": "trace_id"}
    for name in [*decoys, "escaped", "u0"]:
        assert json.loads(extra[name]) == want, name
        assert list(json.loads(extra[name])) == ["trace_id", "region"], name


def test_records_in_the_usual_shape_but_for_one_field_break_the_rules_a_record_read_whole_breaks(tmp_path):
    """Records that hold the usual other fields last and in order, but also a contract field twice (before
    them or after), a field the file does not usually hold, or no comma before the usual fields: each is
    judged as if read whole, and the other fields kept are those of its own text."""
    usual = [("trace_id", {"span": [1, 2]}), ("region", "eu")]
    lines = [_line(rec(f"u{i}", max_tokens=10 + i), usual) for i in range(5)]
    lines.append(_line(rec("head-twice"), usual).replace("{", '{"max_tokens": 7, ', 1))
    lines.append(_line({**rec("head-other"), "user": {"id": 3}}, usual))
    lines.append(_line(rec("no-comma"), usual).replace(', "trace_id"', ' "trace_id"', 1))
    lines.append(_line(rec("tail-known"), usual)[:-1] + ', "temperature": 0.5}')
    store = Store(tmp_path / "s.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "t.jsonl", lines))])
    assert (result.accepted, result.quarantined) == (6, 3)
    with store.read() as con:
        reasons = dict(con.execute("SELECT source_line, reason FROM quarantine").fetchall())
        rows = {r: (m, json.loads(e)) for r, m, e in
                con.execute("SELECT request_id, max_tokens, extra::VARCHAR FROM requests").fetchall()}
    assert reasons == {6: "duplicate field: max_tokens appears more than once",
                       8: "bad JSON: the line is not valid JSON",
                       9: "duplicate field: temperature appears more than once"}
    assert rows["u3"] == (13, {"trace_id": {"span": [1, 2]}, "region": "eu"})
    assert rows["head-other"][1] == {"user": {"id": 3}, "trace_id": {"span": [1, 2]}, "region": "eu"}


def test_the_markers_another_formats_reader_adds_are_no_other_fields_and_hide_no_repeated_one(tmp_path):
    """A LiteLLM or OTel record nearly always holds `__unknown__` or `__source_request_id__`: such a record is
    not patched for other fields it does not have, and one that also names a field twice is still caught."""
    lines = [
        json.dumps({**rec("m1"), "__unknown__": ["top_p"]}),
        json.dumps({**rec("m2"), "__source_request_id__": "m1", "__unknown__": ["top_p"]}),
        json.dumps({**rec("m3"), "__unknown__": ["top_p"], "trace_id": 5}),
        json.dumps({**rec("m4"), "__unknown__": ["top_p"]})[:-1] + ', "max_tokens": 7}',
        json.dumps({**rec("m5"), "__source_request_id__": "m1"})[:-1] + ', "__source_request_id__": "m2"}',
    ]
    store = Store(tmp_path / "s.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "m.jsonl", lines))])
    assert (result.accepted, result.quarantined) == (4, 1)
    with store.read() as con:
        assert con.execute("SELECT reason FROM quarantine").fetchone()[0] == \
            "duplicate field: max_tokens appears more than once"
        extra = dict(con.execute("SELECT request_id, extra::VARCHAR FROM requests").fetchall())
        unknown = dict(con.execute("SELECT request_id, unknown_fields FROM requests").fetchall())
    assert extra == {"m1": None, "m2": None, "m3": '{"trace_id":5}', "m5": None}
    assert unknown["m1"] == ["top_p"] and unknown["m5"] is None
