"""The contract's fields as OpenTelemetry GenAI span attributes: one table, written by `spans.py` and read
back by `formats/otel.py` (../shared/log-schema.md, "--format otel").

Derived from the field table when used, like the SQL: a field a program adds to the contract travels as
`specdec.<name>` with no other change.
"""

from __future__ import annotations

from typing import Any

from specdec_core.contract import fields

# The fields the GenAI semantic conventions name; every other one is carried as specdec.<field>.
GEN_AI_ATTRIBUTES: dict[str, str] = {
    "target_model": "gen_ai.request.model",
    "temperature": "gen_ai.request.temperature",
    "top_p": "gen_ai.request.top_p",
    "top_k": "gen_ai.request.top_k",
    "max_tokens": "gen_ai.request.max_tokens",
    "seed": "gen_ai.request.seed",
    "stop": "gen_ai.request.stop_sequences",
    "output_tokens": "gen_ai.usage.output_tokens",
    "finish_reason": "gen_ai.response.finish_reasons",
}

# Carried by the span itself rather than as attributes: its start time and its duration.
SPAN_TIMED_FIELDS: frozenset[str] = frozenset({"ts", "latency_ms"})

# How a field's value is spelt as an attribute when it is not the value itself (OpenTelemetry
# attributes hold scalars and lists of scalars, never objects).
AS_LIST = frozenset({"stop"})  # a list of strings (a string is a list of one)
AS_ONE_ELEMENT_LIST = frozenset({"finish_reason"})  # the conventions log the reasons of every choice
AS_JSON_TEXT = frozenset({"cached_fingerprint"})  # an object, as canonical JSON text



@fields.derived
def span_attribute_table(contract: fields.Contract) -> dict[str, str]:
    """record field -> span attribute, in the table's order."""
    return {f.name: GEN_AI_ATTRIBUTES.get(f.name, f"specdec.{f.name}") for f in contract.fields
            if f.name not in SPAN_TIMED_FIELDS}


def __getattr__(name: str) -> Any:
    if name == "SPAN_ATTRIBUTES":  # the table as the contract is at this read
        return span_attribute_table()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
