"""The request log contract's fields, defined once (../shared/log-schema.md, "One record").

Everything that needs a list of fields derives it from `FIELDS`: validation and its SQL,
the store's DDL and migrations, CSV cell parsing, the identity and its fingerprint, the
differing-fields comparison, the key auditor's variants and the pages' field lists.
Adding a row here adds a validated, stored field; with `identity=True` it is part of
every request's identity too.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

# Validation kinds: what a field's value must be. The SQL checks and the one-line reasons are
# written per kind (ingestion/validation.py); so are the store's column type and CSV parsing.
KINDS: dict[str, tuple[str, str]] = {
    # kind: (what a value must be, in a reason; the store's column type)
    "str": ("a string", "VARCHAR"),
    "nonempty_str": ("a non-empty string", "VARCHAR"),
    "hex64": ("64 hex characters", "VARCHAR"),
    "int": ("an integer", "HUGEINT"),  # a seed may need more than 64 bits
    "int>=0": ("an integer >= 0", "BIGINT"),
    "int>=1": ("an integer >= 1", "BIGINT"),
    "num": ("a number", "DOUBLE"),
    "num>=0": ("a number >= 0", "DOUBLE"),
    "top_p": ("a number in (0, 1]", "DOUBLE"),
    "bool": ("a boolean", "BOOLEAN"),
    "ts": ("an RFC 3339 string or integer epoch milliseconds, in the years 1 to 9999", "TIMESTAMPTZ"),
    "str_list": ("a list of strings or a string", "VARCHAR[]"),
    "object": ("a JSON object", "JSON"),
}

# How an identity field is canonicalised before two identities are compared.
CANONICAL_FORMS = (
    "sha256",  # the prompt: compared as its SHA-256, so a redacted log compares with a full one
    "text",  # as it is
    "none_is_null",  # the string "none" and null are the same (no speculation)
    "integer",  # as it is; null stays null
    "zero_is_null",  # 0 and null are the same (top_k: off)
    "number",  # rounded to 6 decimal places, never coarser
    "string_set",  # order and repeats don't matter; null and [] are the same
)


@dataclass(frozen=True)
class Field:
    name: str
    kind: str
    required: bool = False
    identity: bool = False
    canonical: str = "text"  # for identity fields: one of CANONICAL_FORMS
    sampling_only: bool = False  # left out of a greedy request's identity: it cannot change the output
    # Part of the identity, yet under greedy decoding it cannot change the output either: speculative
    # decoding is lossless, so a greedy output shared across drafts is harmless.
    lossless_when_greedy: bool = False
    default: Any = None  # the value an absent optional field stands for

    @property
    def expected(self) -> str:
        return KINDS[self.kind][0]

    @property
    def sql_type(self) -> str:
        return KINDS[self.kind][1]

    @property
    def is_integer(self) -> bool:
        return self.kind.startswith("int")

    @property
    def is_number(self) -> bool:
        return self.kind in ("num", "num>=0", "top_p")


_CONTRACT_FIELDS: tuple[Field, ...] = (
    Field("request_id", "nonempty_str", required=True),
    Field("ts", "ts", required=True),
    # One of prompt and prompt_hash is required: checked as a rule of its own, not per field.
    Field("prompt", "str", identity=True, canonical="sha256"),
    Field("prompt_hash", "hex64"),
    Field("target_model", "nonempty_str", required=True, identity=True),
    Field("draft_model", "str", identity=True, canonical="none_is_null", lossless_when_greedy=True),
    Field("num_speculative_tokens", "int>=0", identity=True, canonical="integer", lossless_when_greedy=True),
    Field("temperature", "num>=0", required=True, identity=True, canonical="number"),
    Field("top_p", "top_p", identity=True, canonical="number", sampling_only=True, default=1.0),
    Field("top_k", "int>=0", identity=True, canonical="zero_is_null", sampling_only=True),
    Field("max_tokens", "int>=1", required=True, identity=True, canonical="integer"),
    Field("seed", "int", identity=True, canonical="integer", sampling_only=True),
    Field("stop", "str_list", identity=True, canonical="string_set"),
    Field("tokenizer_version", "str", required=True, identity=True),
    Field("deployment", "str"),
    Field("cache_key", "str", required=True),
    Field("cache_hit", "bool", required=True),
    Field("cached_fingerprint", "object"),
    Field("output_text", "str", required=True),
    Field("output_tokens", "int>=0", required=True),
    Field("finish_reason", "str"),
    Field("latency_ms", "num"),  # the contract sets no range: a skewed clock can log a negative one
    Field("draft_tokens", "int>=0"),
    Field("accepted_tokens", "int>=0"),
    # Who received the output and the experiment arm it belongs to (remediation.md): never identity.
    Field("consumer", "str"),
    Field("experiment", "str"),
)


@dataclass(frozen=True)
class Contract:
    """The table of fields and every list derived from it: the one contract the library reads.

    Read it where it is used (`current()`, or the module attributes below), never copied at import: a
    program that extends the table (`define`) then sees the same fields everywhere.
    """

    fields: tuple[Field, ...]

    def __post_init__(self) -> None:
        for f in self.fields:
            if f.kind not in KINDS:
                raise ValueError(f"contract field {f.name}: unknown kind {f.kind!r}")
            if f.identity and f.canonical not in CANONICAL_FORMS:
                raise ValueError(f"contract field {f.name}: unknown canonical form {f.canonical!r}")
        derived = {
            "by_name": {f.name: f for f in self.fields},
            "field_names": tuple(f.name for f in self.fields),
            "identity_fields": tuple(f.name for f in self.fields if f.identity),
            "sampling_only_fields": frozenset(f.name for f in self.fields if f.sampling_only),
            # What identity and fingerprinting read from a record: the identity fields and the prompt's hash.
            "identity_input": tuple(f.name for f in self.fields if f.identity or f.name == "prompt_hash"),
            "non_identity_fields": tuple(f.name for f in self.fields if not f.identity and f.name != "prompt_hash"),
        }
        # Fields a log may mark unknown (not null: LiteLLM logs no sampling parameters on a cache hit). An unknown
        # field is never compared and never a reason to quarantine; a miss's cache key may be unknown until a
        # hit names it.
        derived["unknowable_fields"] = (*derived["identity_fields"], "cache_key")
        for name, value in derived.items():
            object.__setattr__(self, name, value)

    # Set in __post_init__ (frozen: a contract never changes; `define` makes another).
    by_name: dict[str, Field] = field(init=False, repr=False, compare=False)
    field_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    identity_fields: tuple[str, ...] = field(init=False, repr=False, compare=False)
    sampling_only_fields: frozenset[str] = field(init=False, repr=False, compare=False)
    identity_input: tuple[str, ...] = field(init=False, repr=False, compare=False)
    non_identity_fields: tuple[str, ...] = field(init=False, repr=False, compare=False)
    unknowable_fields: tuple[str, ...] = field(init=False, repr=False, compare=False)


_current = Contract(_CONTRACT_FIELDS)
_lock = threading.Lock()

# The module attributes every caller reads (`fields.IDENTITY_FIELDS`): the current contract's, at each read.
_ATTRIBUTES = {
    "FIELDS": "fields", "BY_NAME": "by_name", "FIELD_NAMES": "field_names", "IDENTITY_FIELDS": "identity_fields",
    "SAMPLING_ONLY_FIELDS": "sampling_only_fields", "IDENTITY_INPUT": "identity_input",
    "NON_IDENTITY_FIELDS": "non_identity_fields", "UNKNOWABLE_FIELDS": "unknowable_fields",
}


def __getattr__(name: str) -> Any:
    if name in _ATTRIBUTES:
        return getattr(_current, _ATTRIBUTES[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def current() -> Contract:
    """The contract the library reads now."""
    return _current


def define(fields: tuple[Field, ...]) -> Contract:
    """Make `fields` the contract: validated, stored and (with `identity=True`) part of every identity.

    Everything derived from the table (the SQL of validation and the store, CSV parsing, span attributes) is
    derived from the current contract when it is used, once per contract, so this takes effect everywhere.
    """
    global _current
    contract = Contract(tuple(fields))
    with _lock:
        _current = contract
    return contract


@contextmanager
def extended(*added: Field) -> Iterator[Contract]:
    """The contract with `added` fields for the block, the previous one after it (a test's, or a script's)."""
    global _current
    previous = _current
    try:
        yield define(previous.fields + added)
    finally:
        with _lock:
            _current = previous  # the same object: what was derived from it is still good


T = TypeVar("T")


def derived(build: Callable[[Contract], T]) -> Callable[[], T]:
    """`build(contract)` made once per contract and read when used: what a module derives from the table."""
    made: list[tuple[Contract, T]] = []

    @functools.wraps(build)
    def get() -> T:
        contract = _current
        if made and made[0][0] is contract:
            return made[0][1]
        value = build(contract)
        made[:] = [(contract, value)]
        return value

    return get
