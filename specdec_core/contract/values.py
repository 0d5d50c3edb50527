"""Checking a request's values by the contract's kinds: one-line errors that name the field."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from specdec_core.contract.fields import Field


def is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)


def as_int(name: str, value: Any, *, minimum: int | None = None, optional: bool = True) -> int | None:
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name}: required, got null")
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not is_int(value):
        raise ValueError(f"{name}: expected an integer, got {type(value).__name__} {value!r}")
    value = int(value)  # an int subclass (IntEnum) would format as its name
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def as_str(name: str, value: Any, *, optional: bool = True) -> str | None:
    if value is None:
        if optional:
            return None
        raise ValueError(f"{name}: required, got null")
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a string, got {type(value).__name__} {value!r}")
    return value


def checked_extra(extra: Mapping[str, Any], fields: tuple[Field, ...]) -> dict[str, Any]:
    """Validate (and normalise) the identity fields that travel in `extra`, by their kind."""
    out = dict(extra)
    for f in fields:
        value = out.get(f.name)
        if value is None:
            if f.required:
                raise ValueError(f"{f.name}: required field is missing")
            continue
        if f.is_integer:
            out[f.name] = as_int(f.name, value, minimum=1 if f.kind == "int>=1" else 0 if f.kind == "int>=0" else None)
        elif f.is_number:
            if not is_number(value):
                raise ValueError(f"{f.name}: expected {f.expected}, got {value!r}")
        elif f.kind == "str_list":
            listed = (value,) if isinstance(value, str) else value  # a string is a list of one
            if not isinstance(listed, (list, tuple)) or not all(isinstance(s, str) for s in listed):
                raise ValueError(f"{f.name}: expected {f.expected}, got {value!r}")
            out[f.name] = tuple(listed)
        elif f.kind in ("str", "nonempty_str") and not isinstance(value, str):
            raise ValueError(f"{f.name}: expected {f.expected}, got {value!r}")
    return out
