"""The contract checked in SQL: each field's typed value, why a record is rejected, its stored columns.

One pass over a file's lines computes every field's JSON type and text, then its typed value and
the first rule the record breaks, as a one-line reason. The rules come from the contract's field
table: a field added there is checked here with no other change.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import duckdb

from specdec_core.contract import fields as contract
from specdec_core.store.sql import list_literal, literal

_EXPECTED = {kind: expected for kind, (expected, _) in contract.KINDS.items()}


def field_type(name: str) -> str:
    return f"t_{name}"  # the field's JSON type, NULL when absent


def field_text(name: str) -> str:
    return f"s_{name}"  # the field as text: strings unquoted, anything else as JSON


def is_unknown(name: str) -> str:
    """Whether the record's log marks the field unknown (not null): true or false, never NULL."""
    return f"coalesce(list_contains(unknown_fields, '{name}'), false)"


_RFC3339_RE = (r"\s*[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
               r"([Zz]|[+-]([01][0-9]|2[0-3])(:?[0-5][0-9])?)?\s*")
_EPOCH_MS_MIN, _EPOCH_MS_MAX = -62135596800000, 253402300799999  # 0001-01-01 to 9999-12-31, UTC
_BIGINT_MAX = 2**63 - 1
_BIGINT_KINDS = ("int>=0", "int>=1")  # stored as BIGINT; `int` (the seed) is HUGEINT


def _value_sql(name: str, kind: str) -> str:
    """The field's typed value, or NULL when it is absent, null or of the wrong JSON type."""
    t, s = field_type(name), field_text(name)
    integral = (f"CASE WHEN {t} IN ('BIGINT', 'UBIGINT') THEN try_cast({s} AS HUGEINT) "
                # Digits beyond 64 bits come as a DOUBLE holding their exact text: read the text.
                f"WHEN {t} = 'DOUBLE' AND regexp_full_match({s}, '-?[0-9]+') THEN try_cast({s} AS HUGEINT) "
                # An integral double (64.0) is accepted: CSV and some writers produce them.
                f"WHEN {t} = 'DOUBLE' AND try_cast({s} AS DOUBLE) = floor(try_cast({s} AS DOUBLE)) "
                f"THEN try_cast(try_cast({s} AS DOUBLE) AS HUGEINT) END")
    if kind in ("str", "nonempty_str", "hex64"):
        return f"CASE WHEN {t} = 'VARCHAR' THEN {s} END"
    if kind == "bool":
        return f"CASE WHEN {t} = 'BOOLEAN' THEN try_cast({s} AS BOOLEAN) END"
    # A writer that could only store text (a Parquet string column) may hold these two as JSON text,
    # as CSV does: text that is itself a JSON object or array counts as one.
    text_json = f"CASE WHEN {t} = 'VARCHAR' AND json_valid({s}) THEN {s} ELSE 'null' END"
    if kind == "object":
        return (f"CASE WHEN {t} = 'OBJECT' THEN {s} "
                f"WHEN {t} = 'VARCHAR' AND json_type({text_json}) = 'OBJECT' THEN {s} END")
    if kind == "str_list":
        array = (f"CASE WHEN {t} = 'ARRAY' THEN {s} WHEN {t} = 'VARCHAR' AND json_type({text_json}) = 'ARRAY' "
                 f"THEN {s} ELSE '[]' END")
        # A string is a list of one (log-schema.md), unless it is the JSON text of a list (as above).
        return (f"CASE WHEN ({t} = 'ARRAY' OR ({t} = 'VARCHAR' AND json_type({text_json}) = 'ARRAY')) "
                f"THEN CASE WHEN len(list_filter(json_type({array}, '$[*]'), lambda x: x <> 'VARCHAR')) = 0 "
                f"THEN json_extract_string({array}, '$[*]') END "
                f"WHEN {t} = 'VARCHAR' THEN [{s}] END")
    if kind.startswith("int"):
        return integral
    if kind in ("num", "num>=0", "top_p"):
        return f"CASE WHEN {t} IN ('BIGINT', 'UBIGINT', 'DOUBLE') THEN try_cast({s} AS DOUBLE) END"
    if kind == "ts":
        # The text must look like an RFC 3339 date-time before DuckDB's cast, which also takes a bare
        # date, 'epoch' and 'infinity'. No offset is read as UTC. Epoch milliseconds are bounded to
        # the years an RFC 3339 string can name, so a wild integer is rejected, not an error.
        return (f"CASE WHEN {t} = 'VARCHAR' THEN CASE WHEN regexp_full_match({s}, '{_RFC3339_RE}') "
                f"THEN try_cast(upper({s}) AS TIMESTAMPTZ) END "
                f"WHEN ({integral}) BETWEEN {_EPOCH_MS_MIN} AND {_EPOCH_MS_MAX} "
                f"THEN try_cast(epoch_ms(try_cast(({integral}) AS BIGINT)) AS TIMESTAMPTZ) END")
    raise AssertionError(kind)


def _valid_sql(name: str, kind: str) -> str:
    """True when the field's typed value `f_<name>` is acceptable."""
    v = f"f_{name}"
    extra = {
        "nonempty_str": f" AND length({v}) > 0",
        "hex64": f" AND regexp_full_match({v}, '[0-9a-fA-F]{{64}}')",
        "int>=0": f" AND {v} >= 0 AND {v} <= {_BIGINT_MAX}",
        "int>=1": f" AND {v} >= 1 AND {v} <= {_BIGINT_MAX}",
        "num": f" AND isfinite({v})",
        "num>=0": f" AND isfinite({v}) AND {v} >= 0",
        "top_p": f" AND isfinite({v}) AND {v} > 0 AND {v} <= 1",
    }.get(kind, "")
    return f"({v} IS NOT NULL{extra})"


def values_sql() -> str:
    return ",\n".join(f"{_value_sql(f.name, f.kind)} AS f_{f.name}" for f in contract.FIELDS)


def _in_list(names: tuple[str, ...]) -> str:
    """Names as the right side of IN: inside a lambda, cheaper than a list constant built for every key."""
    return "(" + ", ".join(literal(n) for n in names) + ")"


def reason_sql() -> str:
    """The first rule a record breaks, as a one-line reason; NULL when it breaks none."""
    branches = [
        "WHEN NOT valid THEN 'bad JSON: the line is not valid JSON'",
        "WHEN root <> 'OBJECT' THEN 'not a JSON object: got ' || lower(root)",
        # From the keys already read: json_exists would parse every record once more.
        "WHEN list_contains(keys, '__csv_error__') THEN 'bad CSV row: ' || (obj ->> '$.__csv_error__')",
        # A field named twice: this store would read the first value, most JSON readers the last.
        "WHEN repeated_field IS NOT NULL THEN 'duplicate field: ' || repeated_field || ' appears more than once'",
    ]
    for f in contract.FIELDS:
        name, kind, required, t = f.name, f.kind, f.required, field_type(f.name)
        if required:
            # A field the log marks unknown (not null) is no reason to reject the record.
            unknown = (f" AND NOT {is_unknown(name)}"
                       if name in contract.UNKNOWABLE_FIELDS else "")
            branches.append(f"WHEN {t} IS NULL{unknown} THEN 'missing required field: {name}'")
            branches.append(f"WHEN {t} = 'NULL' THEN '{name}: required, got null'")
        got = f"left(CASE WHEN {t} = 'VARCHAR' THEN to_json({field_text(name)})::VARCHAR ELSE {field_text(name)} END, 80)"
        if kind in _BIGINT_KINDS:
            # Past 2^127 even the wide integer read fails: a finite number that large is out of range too.
            huge = f"(f_{name} IS NULL AND {t} = 'DOUBLE' AND try_cast({field_text(name)} AS DOUBLE) > {_BIGINT_MAX} " \
                   f"AND isfinite(try_cast({field_text(name)} AS DOUBLE)))"
            branches.append(f"WHEN f_{name} > {_BIGINT_MAX} OR {huge} THEN '{name}: out of range "
                            f"(at most {_BIGINT_MAX}), got ' || {got}")
        cond = f"{t} IS NOT NULL AND {t} <> 'NULL' AND NOT {_valid_sql(name, kind)}"
        branches.append(
            f"WHEN {cond} THEN '{name}: expected {_EXPECTED[kind]}, got ' || {got}"
        )
    branches.append(
        f"WHEN f_prompt IS NULL AND f_prompt_hash IS NULL AND NOT {is_unknown('prompt')} "
        "THEN 'missing required field: one of prompt or prompt_hash'"
    )
    branches.append(
        "WHEN f_prompt IS NOT NULL AND f_prompt_hash IS NOT NULL AND sha256(f_prompt) <> lower(f_prompt_hash) "
        "THEN 'prompt_hash: does not match the SHA-256 of prompt'"
    )
    return "CASE " + "\n".join(branches) + " END"


def paths_literal() -> str:
    """The contract's fields as JSON Pointers ('~' and '/' escaped): DuckDB finds them as it finds the JSONPath
    '$."name"', the first of a name given twice, at 70% of its cost (1M records: 1.33 CPU-s against 1.89)."""
    return list_literal("/" + name.replace("~", "~0").replace("/", "~1") for name in contract.FIELD_NAMES)


def text_in_texts(struct: str, name: str) -> str:
    """A field's text from the struct that texts_type reads."""
    return f"struct_extract({struct}, {literal(name)})"


def _typed_column(f: contract.Field) -> str:
    value = f"f_{f.name}"
    if f.name == "prompt_hash":
        value = "lower(f_prompt_hash)"  # the prompt's own hash is computed once per distinct identity, not per row
    elif f.sql_type == "BIGINT":
        value = f"try_cast({value} AS BIGINT)"
    elif f.sql_type == "JSON":
        value = f"{value}::JSON"
    if f.default is not None:  # an absent optional field is its default; an unknown one stays unknown
        value = (f"CASE WHEN {is_unknown(f.name)} THEN NULL "
                 f"ELSE coalesce({value}, {f.default!r}) END")
    return f"{value} AS {f.name}"


def typed_columns_sql() -> str:
    """The stored columns of a valid record, from its typed values; then the fields the contract does not name."""
    return ",\n".join([*(_typed_column(f) for f in contract.FIELDS), "extra", "unknown_fields", "source_link"])


# Keys another log format's reader adds to a record (formats.UNKNOWN_KEY, formats.SOURCE_KEY): fields it
# marks unknown, and a logged source link. Only records with keys beyond the known fields can hold them.
UNKNOWN_KEY, SOURCE_KEY = "__unknown__", "__source_request_id__"
# Each JSON function parses the whole record again: only records whose key list holds the marker pay for it.
UNKNOWN_SQL = (f"CASE WHEN list_contains(keys, '{UNKNOWN_KEY}') "
               f"THEN nullif(json_extract_string(obj, '$.{UNKNOWN_KEY}[*]'), []) END AS unknown_fields")
SOURCE_LINK_SQL = f"CASE WHEN list_contains(keys, '{SOURCE_KEY}') THEN obj ->> '$.{SOURCE_KEY}' END AS source_link"
# How many of the two markers a record holds: keys that are neither a contract field nor another field to keep.
MARKERS_SQL = (f"(list_contains(keys, '{UNKNOWN_KEY}')::INT + list_contains(keys, '{SOURCE_KEY}')::INT)")


# Fields the contract does not name are kept: a JSON merge patch with null deletes the known ones.
# Only records with more keys than known fields and markers present have any, so only they are patched (a
# LiteLLM or OTel record holds a marker nearly always, and the patch copied each whole record to find none).
def _patched(known_keys: tuple[str, ...]) -> str:
    return "nullif(json_merge_patch(obj, '{" + ",".join(f'"{n}":null' for n in known_keys) + "}')::VARCHAR, '{}')::JSON"

# A service writes the same fields on every line. The patch copies and writes the whole record, long prompt
# and output included, and pays for every field of it; a record whose other fields are exactly the file's
# usual ones, last and in its order, holds them as the tail of its text: that tail is its object, read once
# (tests/store/test_extra_fields.py holds it equal to the patch's), and costs nothing per field.
#
# Real loggers put other fields anywhere (first, between known ones, last) and not the same ones on every
# line, but a service writes few different key lists (its layouts). A record whose key list is one of the
# file's layouts, seen in a sample, names no field twice (a layout that did is not taken), so it needs no
# repeated-field check, and its other fields are known without looking at its keys one by one: they are read
# by the one parse that reads the contract's (from_json, as JSON values) and put back in their order as an
# object, the patch's text without its copy of the whole record. Records of a layout not in the sample, and
# layouts whose names DuckDB's struct would confuse, go through the patch.
_SHAPE_KEY = re.compile(r"[^\x00-\x1f\"\\']{1,200}")
MAX_SHAPE_KEYS = 100  # other fields read by the parse, all layouts together
MAX_LAYOUTS = 32  # each one more comparison for every record that holds other fields
USUAL_SAMPLE = 1000  # records whose commonest other fields are the usual ones (the tail path)
LAYOUT_SAMPLE = 2000  # records read for their layouts beyond the first, spread evenly over the file



# The first contract field that a record names twice. Each contract field read by path accounts for at least
# one key, and each marker another's reader adds (n_markers, MARKERS_SQL) for one, so a record with no more keys
# than those names none twice (nearly all do); nor does one in the file's usual layout (usual_layout_sql) or
# whose key list is one of the file's layouts (layout_sql). Only the others list their other keys: the rest
# are contract names and markers, and only records that hold more of those than fields and markers found pay
# for finding which is twice. An IN list, not a list constant: a constant list inside a lambda is built again
# for every key of every record (3x slower).
def _repeated_field(names: tuple[str, ...], known_in: str) -> str:
    contract_names = _in_list(names)
    return (f"CASE WHEN n_keys > n_known + n_markers AND NOT usual_layout AND layout = 0 "
            # Keys that are not other fields are the contract's and the markers: more of them than fields and
            # markers found means one is named twice.
            f"AND n_keys - len(list_filter(keys, lambda k: k NOT IN {known_in})) > n_known + n_markers THEN "
            "list_filter(keys, lambda k, i: list_position(keys, k) < i "
            f"AND k IN {contract_names})[1] END")


@dataclass(frozen=True)
class _Derived:
    """The validation SQL's parts that list the contract's fields, made once per contract."""

    index: dict[str, int]  # each field's place in the lists of types and texts (DuckDB lists are 1-based)
    repeated_field: str
    known_keys: tuple[str, ...]  # the contract's fields and the markers
    known_in: str
    patched: str


@contract.derived
def _derived(table: contract.Contract) -> _Derived:
    known = (*table.field_names, UNKNOWN_KEY, SOURCE_KEY)
    return _Derived({name: i + 1 for i, name in enumerate(table.field_names)},
                    _repeated_field(table.field_names, _in_list(known)), known, _in_list(known), _patched(known))


def field_index() -> dict[str, int]:
    """Each contract field's place in the lists `paths_literal` and `texts_type` read (1-based)."""
    return _derived().index


def repeated_field_sql() -> str:
    return _derived().repeated_field


def patched_sql() -> str:
    """A record's object without the contract's fields and the markers: the fields kept as `extra`."""
    return _derived().patched


def _others(keys: tuple[str, ...]) -> tuple[str, ...]:
    known = _derived().known_keys
    return tuple(k for k in keys if k not in known)


@dataclass(frozen=True)
class Shapes:
    """What a file's records hold besides the contract's fields: `usual`, the other fields that most of its
    first records hold in their order, when they qualify for the tail path (usual_layout_sql), else ();
    `layouts`, the commonest key lists that hold other fields (see above)."""

    usual: tuple[str, ...] = ()
    layouts: tuple[tuple[str, ...], ...] = ()

    @property
    def keys(self) -> tuple[str, ...]:
        """Every layout's other fields, each once: the other fields the parse reads."""
        return tuple(dict.fromkeys(k for layout in self.layouts for k in _others(layout)))


NO_SHAPES = Shapes()


def _readable(keys: tuple[str, ...], taken: set[str]) -> bool:
    """Whether other fields can be read by path and by struct field: no quotes, backslashes or control
    characters, none named twice, none equal to another name (known, or taken already) but for case
    (DuckDB's struct fields and from_json match names without case)."""
    if not keys or len(keys) > MAX_SHAPE_KEYS or not all(_SHAPE_KEY.fullmatch(k) for k in keys):
        return False
    others = {n.lower() for n in _derived().known_keys} | {t.lower() for t in taken if t not in keys}
    lowered = [k.lower() for k in keys]
    return len(set(lowered)) == len(keys) and not others.intersection(lowered)


def _layout_counts(con: duckdb.DuckDBPyConnection, lines_sql: str, where: str, limit: str = ""
                   ) -> dict[tuple[str, ...], int]:
    # Lines that are no JSON object are left out here, not by a filter on the keys: DuckDB would push that
    # filter down before `where` and parse every line of the file.
    rows = con.execute(f"""
        SELECT k, count(*) FROM (SELECT TRY(json_keys(raw)) AS k FROM ({lines_sql})
                                 WHERE raw[1] = '{{' AND {where} {limit})
        GROUP BY k
    """).fetchall()
    return {tuple(k): n for k, n in rows if k is not None}


def _usual(first: dict[tuple[str, ...], int]) -> tuple[str, ...]:
    """The other fields most of these records hold, in their order (ties: the first by name), if they qualify."""
    counts: dict[tuple[str, ...], int] = {}
    for keys, n in first.items():
        if others := _others(keys):
            counts[others] = counts.get(others, 0) + n
    usual = min(counts, key=lambda k: (-counts[k], k), default=())
    return usual if _readable(usual, set()) else ()


def usual_extra_keys(con: duckdb.DuckDBPyConnection, lines_sql: str) -> tuple[str, ...]:
    """The fields beyond the contract's that most of a file's first USUAL_SAMPLE records hold, in their
    order; () when they hold none, or names left to the patch."""
    return _usual(_layout_counts(con, lines_sql, "true", f"LIMIT {USUAL_SAMPLE}"))


def extra_shapes(con: duckdb.DuckDBPyConnection, lines_sql: str, count: int) -> Shapes:
    """The usual other fields and the layouts of a file's `count` lines (see above), commonest first, from
    its first USUAL_SAMPLE records and LAYOUT_SAMPLE more spread evenly over it (by `seq`)."""
    first = _layout_counts(con, lines_sql, "true", f"LIMIT {USUAL_SAMPLE}")
    seen = dict(first)
    if count > USUAL_SAMPLE:
        for keys, n in _layout_counts(con, lines_sql, f"seq % {max(1, count // LAYOUT_SAMPLE)} = 0").items():
            seen[keys] = seen.get(keys, 0) + n
    layouts: list[tuple[str, ...]] = []
    taken: set[str] = set()
    for keys in sorted(seen, key=lambda k: (-seen[k], k)):
        if len(layouts) == MAX_LAYOUTS:
            break
        others = _others(keys)
        if (len(set(keys)) == len(keys) and _readable(others, taken)
                and len(taken | set(others)) <= MAX_SHAPE_KEYS):
            layouts.append(keys)
            taken |= set(others)
    return Shapes(_usual(first), tuple(layouts))


def texts_type(shapes: Shapes = NO_SHAPES) -> str:
    """from_json's type for the contract's fields as text: each as json_extract_string reads it (a string
    unquoted, anything else as JSON, null and absent as NULL; a name given twice: its first value); and the
    shapes' other fields as JSON values, as the patch writes them."""
    return literal(json.dumps({**{name: "VARCHAR" for name in contract.FIELD_NAMES},
                               **{name: "JSON" for name in shapes.keys}}, ensure_ascii=False))


def usual_layout_sql(usual: tuple[str, ...]) -> str:
    """Whether a record's keys are the contract's fields it holds, once each, then the usual others in order.

    Each contract field found by path accounts for a key, so a key list that long, ending in the usual
    ones, leaves no room for another key or one named twice."""
    if not usual:
        return "false"
    listed = list_literal(usual)
    return f"(n_keys = n_known + {len(usual)} AND keys[n_known + 1:] = {listed})"


def other_value(i: int) -> str:
    return f"x_{i}"  # the i-th of the shapes' other fields (Shapes.keys) as JSON, NULL when absent


def other_values_sql(shapes: Shapes, struct: str) -> str:
    """The shapes' other fields, each a column, from the struct that texts_type(shapes) reads."""
    return "".join(f", {text_in_texts(struct, k)} AS {other_value(i)}" for i, k in enumerate(shapes.keys))


def layout_sql(shapes: Shapes) -> str:
    """Which of the file's layouts a record's key list is, from 1; 0: none (or its other fields are the usual
    ones, last: the tail path's)."""
    if not shapes.layouts:
        return "0"
    listed = "[" + ", ".join(list_literal(layout) for layout in shapes.layouts) + "]"
    return (f"CASE WHEN n_keys > n_known + n_markers AND NOT usual_layout "
            f"THEN coalesce(list_position({listed}, keys), 0) ELSE 0 END")


def extra_sql(shapes: Shapes) -> str:
    """The record's fields that the contract does not name, as a JSON object; NULL when there are none.

    In the usual layout (usual_layout_sql) the object is the record's text from its first usual key on,
    behind a '{': the key's text first found is a key at the top level exactly when that text is JSON. A
    match nested deeper leaves a brace unclosed or one too many, a string value has no colon after it, a
    key JSON escapes is not found: those records go through the patch. A record of one of the file's
    layouts (`layout`) gets the object of its other fields' values from the parse; any other goes through
    the patch.
    """
    branches = ["CASE WHEN n_keys <= n_known + n_markers THEN NULL"]
    if shapes.usual:
        first = literal(json.dumps(shapes.usual[0], ensure_ascii=False))
        tail = f"TRY_CAST('{{' || substr(obj, strpos(obj, {first})) AS JSON)"
        branches.append(f"WHEN usual_layout THEN coalesce({tail}, {patched_sql()})")
    column = {k: other_value(i) for i, k in enumerate(shapes.keys)}
    for i, layout in enumerate(shapes.layouts, start=1):
        built = ", ".join(f"{literal(k)}, {column[k]}" for k in _others(layout))
        branches.append(f"WHEN layout = {i} THEN json_object({built})")
    return " ".join([*branches, f"ELSE {patched_sql()} END"])
