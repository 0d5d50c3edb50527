"""Readers that turn one line of a foreign log (OTel, OpenInference, LiteLLM, Langfuse, a ``--map`` file) into
contract records.

A produced record holds contract fields plus, where they apply, ``__unknown__`` (sorted names of
fields whose value is unknown, not null; those fields are absent) and ``__source_request_id__`` (a
logged source link). Validation of the values is left to the ingest's SQL pass.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from . import common, langfuse, litellm, openinference, otel
from .common import (
    SOURCE_KEY,
    UNKNOWN_KEY,
    FormatError,
    LineResult,
    MappingError,
    canonical_json,
)
from .litellm import backfill_cache_keys
from .mapping import FieldRule, Mapping, load_mapping

FORMATS: tuple[str, ...] = ("contract", "otel", "openinference", "litellm", "langfuse")
# Read by `specdec collect` alone: OTLP JSON whose spans are GenAI and OpenInference spans alike.
LIVE_FORMAT = "otlp"

# Keys every StandardLoggingPayload carries; two of them tell it from a JSON line of some other shape.
_LITELLM_MARKERS = frozenset(
    {"hidden_params", "model_parameters", "call_type", "response_time", "startTime", "saved_cache_cost"}
)


def detect(first_line: str) -> str:
    """The format of a file, one of FORMATS, from its first non-blank line's JSON shape.

    Anything else, including a line that is not JSON, is "contract": its validation quarantines it.
    """
    try:
        obj = json.loads(first_line)
    except (ValueError, RecursionError):
        return "contract"
    if not isinstance(obj, dict):
        return "contract"
    if "resourceSpans" in obj or "resource_spans" in obj:
        # OpenInference spans say so in every span; the GenAI conventions' don't.
        return "openinference" if openinference.KIND in first_line or "resource_spans" in obj else "otel"
    data = obj.get("data")
    first = data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else obj
    if langfuse.looks_like(first):
        return "langfuse"
    if "attributes" in first and ("span_kind" in first or "context" in first or "span_id" in first):
        return "openinference"  # Phoenix's span export
    if "request_id" not in obj and len(_LITELLM_MARKERS & obj.keys()) >= 2:
        return "litellm"
    return "contract"


def line_reader(fmt: str, mapping: Mapping | None = None) -> Callable[[str], LineResult]:
    """The per-line reader of ``fmt`` ("otel", "litellm", or "map" with a mapping).

    "contract" lines are read by the ingest itself, so asking for them here is a ValueError.
    """
    if mapping is not None and fmt != "map":
        raise ValueError(f"a mapping goes with format 'map', not '{fmt}'")
    if fmt == "otel":
        return otel.read_line
    if fmt == "litellm":
        return litellm.read_line
    if fmt == "openinference":
        return openinference.read_line
    if fmt == "langfuse":
        return langfuse.read_line
    if fmt == LIVE_FORMAT:
        return openinference.read_any_otlp_line
    if fmt == "map":
        if mapping is None:
            raise ValueError("format 'map' needs a mapping (load_mapping)")
        return mapping.read_line
    if fmt == "contract":
        raise ValueError("contract lines are read by the ingest, not by specdec_core.formats")
    raise ValueError(f"unknown format '{fmt}': expected one of {', '.join(FORMATS + ('map',))}")


__all__ = [
    "CONTRACT_FIELDS",
    "FORMATS",
    "LIVE_FORMAT",
    "SOURCE_KEY",
    "UNKNOWN_KEY",
    "FieldRule",
    "FormatError",
    "LineResult",
    "Mapping",
    "MappingError",
    "backfill_cache_keys",
    "canonical_json",
    "detect",
    "line_reader",
    "load_mapping",
]


def __getattr__(name: str) -> Any:
    if name == "CONTRACT_FIELDS":  # the contract's field names, as the contract is at this read
        return common.CONTRACT_FIELDS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
