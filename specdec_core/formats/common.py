"""Pieces shared by the foreign-log readers: errors, the per-line result, JSON and time helpers.

Field names come from the contract's one table.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

from specdec_core.contract.fields import FIELD_NAMES as CONTRACT_FIELDS  # noqa: E402, F401 (the one table)

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


def load_object(line: str, what: str) -> dict:
    """Parse one line that must hold a JSON object; ``what`` names the expected shape in errors."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        # An error at the very end of the text means the writer stopped mid-object.
        if exc.pos >= len(line.rstrip()):
            raise FormatError("bad JSON: the line ends before its JSON does (truncated)") from None
        raise FormatError("bad JSON: the line is not valid JSON") from None
    if not isinstance(obj, dict):
        raise FormatError(f"not {what}: the line is a {_json_kind(obj)}, not an object")
    return obj


def parse_json_text(value: Any) -> tuple[bool, Any]:
    """(True, parsed) when ``value`` is JSON text; (False, value) otherwise."""
    if not isinstance(value, str):
        return False, value
    try:
        return True, json.loads(value)
    except (ValueError, RecursionError):
        return False, value


def to_decimal(value: Any) -> Decimal | None:
    """A finite number (or numeric text) as an exact Decimal, else None.

    ``repr`` of a float is the shortest text that round-trips, which is what ``json.dumps`` wrote,
    so the digits the producer logged survive without binary rounding.
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, float):
        value = repr(value)
    if isinstance(value, (int, str)):
        try:
            number = Decimal(str(value).strip())
        except InvalidOperation:
            return None
        return number if number.is_finite() else None
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
