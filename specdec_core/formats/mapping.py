"""``--map FILE.toml``: any other JSON Lines, mapped field by field onto the contract record."""

from __future__ import annotations

import copy
import datetime as dt
import json
from dataclasses import dataclass
from os import PathLike
from typing import Any

from specdec_core.contract import fields as contract
from specdec_core.text import ascii_digits

from .common import (
    MAX_JSON_DEPTH,
    TIME_UNITS,
    LineResult,
    MappingError,
    epoch_to_rfc3339,
    format_utc,
    load_object,
    too_deep,
)

try:
    import tomllib
except ImportError:  # Python 3.10: the project allows it, and tomli is tomllib's backport
    try:
        import tomli as tomllib  # type: ignore[no-redef]
    except ImportError:
        tomllib = None  # type: ignore[assignment]

_TABLE_KEYS = ("path", "unit", "value")


@dataclass(frozen=True)
class FieldRule:
    field: str
    path: tuple[str, ...] = ()  # empty when the rule is a constant
    unit: str | None = None  # ts only
    value: Any = None
    constant: bool = False


@dataclass(frozen=True)
class Mapping:
    source: str  # the file, as named on the command line, for messages
    rules: tuple[FieldRule, ...]

    @property
    def constant_bytes(self) -> int:
        """What the constants add to every record, as JSON: the reader sizes its batches of records by it."""
        return sum(len(json.dumps(r.value, ensure_ascii=False).encode()) for r in self.rules if r.constant)

    def apply(self, obj: dict) -> dict:
        """The contract record of one JSON object; a path that leads nowhere leaves its field absent."""
        record: dict[str, Any] = {}
        for rule in self.rules:
            if rule.constant:
                record[rule.field] = copy.deepcopy(rule.value)  # records must not share mutable constants
                continue
            found, value = resolve(obj, rule.path)
            if found:
                record[rule.field] = convert_time(value, rule.unit) if rule.unit else value
        return record

    def read_line(self, line: str) -> LineResult:
        return LineResult(records=(self.apply(load_object(line, "a JSON object")),))


def resolve(obj: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    """Follow a dotted path; a number segment selects a list element. (found, value)."""
    current = obj
    for segment in path:
        if isinstance(current, dict) and segment in current:
            current = current[segment]
        elif isinstance(current, list) and ascii_digits(segment) and int(segment) < len(current):
            current = current[int(segment)]
        else:
            return False, None
    return True, current


def convert_time(value: Any, unit: str) -> Any:
    """Epoch numbers in ``unit`` as RFC 3339 UTC (microseconds); anything else goes on for validation."""
    if unit == "rfc3339":
        return value
    return epoch_to_rfc3339(value, unit) or value


def _toml_constant(value: Any) -> Any:
    # TOML has date/time types that JSON records cannot hold; keep them as their RFC 3339 text.
    if isinstance(value, dt.datetime):
        return format_utc(value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc))
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, list):
        return [_toml_constant(v) for v in value]
    if isinstance(value, dict):
        return {k: _toml_constant(v) for k, v in value.items()}
    return value


def _rule(source: str, field: str, spec: Any, max_value_bytes: int | None = None) -> FieldRule:
    def fail(reason: str) -> MappingError:
        return MappingError(f"{source}: field '{field}': {reason}")

    if field not in contract.FIELD_NAMES:
        raise MappingError(f"{source}: '{field}' is not a contract field")
    if isinstance(spec, str):
        spec = {"path": spec}
    if not isinstance(spec, dict):
        raise fail(f'give a path ("a.b.0") or a table {{ path = ... }} / {{ value = ... }}, not {spec!r}')
    extra = sorted(set(spec) - set(_TABLE_KEYS))
    if extra:
        raise fail(f"unknown key '{extra[0]}' (use path, unit or value)")
    if "path" in spec and "value" in spec:
        raise fail("give either path or value, not both")
    if "unit" in spec:
        if field != "ts":
            raise fail("unit applies only to ts")
        if spec["unit"] not in TIME_UNITS:
            raise fail(f"unit '{spec['unit']}' is not one of {', '.join(TIME_UNITS)}")
        if "path" not in spec:
            raise fail("unit goes with a path")
    if "value" in spec:
        value = _toml_constant(spec["value"])
        text = json.dumps(value, ensure_ascii=False)
        if too_deep(text):
            raise fail(f"value nests more than {MAX_JSON_DEPTH} levels")
        # Copied into every record: one past a record's size would make each record too large to load.
        if max_value_bytes is not None and len(text.encode()) > max_value_bytes:
            raise fail(f"value is {len(text.encode()):,} bytes, more than a record may hold "
                       f"({max_value_bytes:,} bytes)")
        return FieldRule(field=field, value=value, constant=True)
    if "path" not in spec:
        raise fail("give a path or a value")
    path = spec["path"]
    if not isinstance(path, str) or not path.strip():
        raise fail("empty path" if isinstance(path, str) else "path must be text")
    segments = tuple(path.split("."))
    if "" in segments:
        raise fail(f"path '{path}' has an empty segment")
    return FieldRule(field=field, path=segments, unit=spec.get("unit"))


def load_mapping(path: str | PathLike[str], max_value_bytes: int | None = None) -> Mapping:
    """Read and check a ``--map`` TOML file; every problem is one MappingError line naming the field.

    ``max_value_bytes``: the most a constant may take as JSON (the ingest's record size limit)."""
    source = str(path)
    if tomllib is None:
        raise MappingError(f"{source}: reading TOML needs Python 3.11 or the tomli package")
    try:
        with open(path, "rb") as handle:
            table = tomllib.load(handle)
    except OSError as exc:
        raise MappingError(f"{source}: cannot read: {exc.strerror or exc}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        reason = " ".join(str(exc).split())  # tomllib messages may span lines; ours may not
        raise MappingError(f"{source}: not valid TOML: {reason}") from None
    except RecursionError:  # tomllib recurses once a level of nested arrays or tables
        raise MappingError(f"{source}: not valid TOML: nested too deeply to read") from None
    try:
        rules = tuple(_rule(source, field, spec, max_value_bytes) for field, spec in table.items())
    except RecursionError:
        raise MappingError(f"{source}: a value nests more than {MAX_JSON_DEPTH} levels") from None
    if not rules:
        raise MappingError(f"{source}: maps no contract field")
    return Mapping(source=source, rules=rules)
