"""Pieces shared by the foreign-log readers: errors, the per-line result, JSON and time helpers.

Field names come from the contract's one table.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from itertools import accumulate
from typing import Any

from specdec_core.contract import fields as contract

UNKNOWN_KEY = "__unknown__"
SOURCE_KEY = "__source_request_id__"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
# Microseconds per unit; DuckDB's TIMESTAMPTZ stops at microseconds, so that is where we stop too.
_US_PER_UNIT: dict[str, Decimal] = {
    "s": Decimal(1_000_000),
    "ms": Decimal(1_000),
    "us": Decimal(1),
    "ns": Decimal("0.001"),
}
TIME_UNITS: tuple[str, ...] = ("s", "ms", "us", "ns", "rfc3339")
# Far deeper than any log nests, far shallower than Python's JSON reader and writer can recurse (about 1,000
# levels less the caller's stack): a value nested deeper is refused here, not met as a RecursionError later.
MAX_JSON_DEPTH = 256
TOO_DEEP = "bad JSON: nested too deeply to read"
# Numbers at or past 1e308 are past a double; Decimal arithmetic on them overflows its context, and int() of
# 1e9999999 builds ten million digits (minutes of CPU). No time, duration or count is anywhere near.
_MAX_ADJUSTED_EXPONENT = 307
# A number as text: a sign, ASCII digits, a fraction, an exponent. Python's int(), float() and Decimal() also read
# "1_6" as 16, "0_5" as 5.0 and other scripts' digits ("١٦") as 16: text no log writes for a number, which a
# format's reader would have made one silently (a CSV's max_tokens "1_6" was 16) where validation names it.
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_INTEGER_TEXT = re.compile(r"[+-]?[0-9]+")
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_BRACKET_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


class FormatError(ValueError):
    """A line that cannot be read in the chosen format; the message is a one-line reason."""


class MappingError(ValueError):
    """A ``--map`` TOML file that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class LineResult:
    records: tuple[dict, ...]  # contract records found on the line
    skipped: int = 0  # spans/entries that are not model requests
    # Each record's input as it was (a span with its resource), to quote it if the record is quarantined;
    # empty: the line itself is each record's input. Kept as objects: written out only for a record that
    # is quarantined, not for the million that load.
    origin_values: tuple[Any, ...] = ()

    @property
    def origins(self) -> tuple[str, ...]:
        return tuple(json.dumps(v, ensure_ascii=False, separators=(",", ":")) for v in self.origin_values)


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _json_kind(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return "JSON " + json.dumps(value)
    if isinstance(value, (int, float)):
        return "JSON number"
    if isinstance(value, str):
        return "JSON string"
    return "JSON array"


def too_deep(text: str) -> bool:
    """Whether JSON text nests arrays and objects more than MAX_JSON_DEPTH levels (brackets in strings aside).

    Counting the brackets first keeps this free for nearly every text; only one with that many is scanned."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    return max(accumulate(map(_BRACKET_STEP.__getitem__, brackets)), default=0) > MAX_JSON_DEPTH


def loads(text: str) -> Any:
    """``json.loads`` bounded in depth: FormatError(TOO_DEEP) past MAX_JSON_DEPTH levels, ValueError if not JSON.

    Every reader of JSON text from a log goes through here, so how deep a value may nest is decided once."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise FormatError(TOO_DEEP) from None
    if too_deep(text):
        raise FormatError(TOO_DEEP)
    return value


def load_object(line: str, what: str) -> dict:
    """Parse one line that must hold a JSON object; ``what`` names the expected shape in errors."""
    try:
        obj = loads(line)
    except json.JSONDecodeError as exc:
        # An error at the very end of the text means the writer stopped mid-object.
        if exc.pos >= len(line.rstrip()):
            raise FormatError("bad JSON: the line ends before its JSON does (truncated)") from None
        raise FormatError("bad JSON: the line is not valid JSON") from None
    except FormatError:
        raise
    except ValueError as exc:  # e.g. an integer of more digits than Python converts
        raise FormatError("bad JSON: " + " ".join(str(exc).split())) from None
    if not isinstance(obj, dict):
        raise FormatError(f"not {what}: the line is a {_json_kind(obj)}, not an object")
    return obj


def parse_json_text(value: Any) -> tuple[bool, Any]:
    """(True, parsed) when ``value`` is JSON text; (False, value) otherwise.

    JSON text nested past MAX_JSON_DEPTH raises FormatError(TOO_DEEP): its record can't be read."""
    if not isinstance(value, str):
        return False, value
    try:
        return True, loads(value)
    except FormatError:
        raise
    except ValueError:
        return False, value


def number_text(text: str, integer: bool = False) -> bool:
    """Whether `text` (spaces around it aside) is a number as logs write them: an integer, with `integer`."""
    return (_INTEGER_TEXT if integer else _NUMBER_TEXT).fullmatch(text.strip()) is not None


def to_decimal(value: Any) -> Decimal | None:
    """A finite number (or numeric text) below 1e308 in size as an exact Decimal, else None.

    ``repr`` of a float is the shortest text that round-trips, which is what ``json.dumps`` wrote,
    so the digits the producer logged survive without binary rounding. Every format reads its numbers
    (times, durations) through here, so none meets a number its arithmetic can't take.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = repr(value)
    if isinstance(value, str) and not number_text(value):
        return None
    if isinstance(value, (int, str)):
        try:
            number = Decimal(str(value).strip())
        except (InvalidOperation, ValueError):  # ValueError: an int of more digits than str() writes
            return None
        if not number.is_finite() or (number and number.adjusted() > _MAX_ADJUSTED_EXPONENT):
            return None
        return number
    return None


def format_utc(moment: datetime) -> str:
    """RFC 3339 UTC with exactly six fraction digits, the precision DuckDB keeps."""
    return moment.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def epoch_to_rfc3339(value: Any, unit: str) -> str | None:
    """Epoch ``value`` in ``unit`` as RFC 3339 UTC, truncated to microseconds; None if not a time."""
    number = to_decimal(value)
    if number is None:
        return None
    micros = int((number * _US_PER_UNIT[unit]).to_integral_value(rounding=ROUND_FLOOR))
    try:
        return format_utc(_EPOCH + timedelta(microseconds=micros))
    except OverflowError:
        return None


def datetime_text_to_rfc3339(text: str) -> str | None:
    """A datetime's text (e.g. ``str(datetime)``) as RFC 3339 UTC; naive means UTC."""
    candidate = text.strip()
    if candidate.endswith(("Z", "z")):
        candidate = candidate[:-1] + "+00:00"
    try:
        moment = datetime.fromisoformat(candidate)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return format_utc(moment)


def __getattr__(name: str) -> Any:
    if name == "CONTRACT_FIELDS":  # the contract's field names, as the contract is at this read
        return contract.FIELD_NAMES
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
