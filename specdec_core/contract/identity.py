"""A decode request's semantic identity, as ../shared/log-schema.md defines it.

Two requests may share a cached output only when their canonical identity
objects are equal. Everything that compares requests (the cache guard, the
store, replay) goes through `identity()` so there is exactly one definition.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring as _json_str
from typing import Any

from specdec_core.contract import fields as contract
from specdec_core.contract.fields import Field
from specdec_core.contract.values import as_int, as_str, checked_extra, is_number

NUMBER_DECIMALS = 6

_SHA256_HEX = re.compile(r"^[0-9a-fA-F]{64}$")


_sha256 = hashlib.sha256


def sha256_hex(text: str) -> str:
    return _sha256(text.encode("utf-8")).hexdigest()


def _round(value: float) -> float:
    # `+ 0.0` turns -0.0 into 0.0: they compare equal, so they must serialise alike.
    return float(round(float(value), NUMBER_DECIMALS)) + 0.0


@dataclass(frozen=True)
class DecodeRequest:
    """Every field that decides what a speculative decoder returns.

    `prompt` may be None for a redacted log, in which case `prompt_hash` holds
    the SHA-256 of the prompt and the request can be compared but not decoded.
    """

    target_model: str
    tokenizer_version: str
    max_tokens: int
    temperature: float = 0.0
    prompt: str | None = None
    prompt_hash: str | None = None
    draft_model: str | None = None
    num_speculative_tokens: int | None = None
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    # The canonical identity JSON, filled on first use: the service needs it for the
    # key, the guard and the log's prompt hash, and the request cannot change.
    _identity_json: str | None = field(default=None, init=False, compare=False, repr=False)
    _prompt_sha256: str | None = field(default=None, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.prompt is None and self.prompt_hash is None:
            raise ValueError("prompt: one of prompt or prompt_hash is required")
        as_str("prompt", self.prompt)
        if self.prompt_hash is not None:
            if not isinstance(self.prompt_hash, str) or not _SHA256_HEX.match(self.prompt_hash):
                raise ValueError(f"prompt_hash: expected 64 hex characters, got {self.prompt_hash!r}")
            object.__setattr__(self, "prompt_hash", self.prompt_hash.lower())
            if self.prompt is not None and sha256_hex(self.prompt) != self.prompt_hash:
                raise ValueError("prompt_hash: does not match the SHA-256 of prompt")
        if not as_str("target_model", self.target_model, optional=False):
            raise ValueError("target_model: must not be empty")
        as_str("draft_model", self.draft_model)
        as_str("tokenizer_version", self.tokenizer_version, optional=False)
        # Store the normalised ints: a log read through pandas writes 4.0 for 4, and the
        # fingerprint serialises the value, so 4.0 must not survive as a float.
        object.__setattr__(
            self, "num_speculative_tokens", as_int("num_speculative_tokens", self.num_speculative_tokens, minimum=0)
        )
        object.__setattr__(self, "max_tokens", as_int("max_tokens", self.max_tokens, minimum=1, optional=False))
        object.__setattr__(self, "top_k", as_int("top_k", self.top_k, minimum=0))
        object.__setattr__(self, "seed", as_int("seed", self.seed))
        if not is_number(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature: expected a number >= 0, got {self.temperature!r}")
        if not is_number(self.top_p) or not (0 < self.top_p <= 1):
            raise ValueError(f"top_p: expected a number in (0, 1], got {self.top_p!r}")
        if self.stop is not None:
            stop = (self.stop,) if isinstance(self.stop, str) else self.stop  # a string is a list of one
            if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
                raise ValueError(f"stop: expected a list of strings or a string, got {self.stop!r}")
            object.__setattr__(self, "stop", tuple(stop))
        if _tables().extra_identity:
            object.__setattr__(self, "extra", checked_extra(self.extra, _tables().extra_identity))

    @property
    def prompt_sha256(self) -> str:
        if self.prompt_hash is not None:  # validated equal to the prompt's hash when both are given
            return self.prompt_hash
        digest = self._prompt_sha256
        if digest is None:
            digest = sha256_hex(str(self.prompt))
            self.__dict__["_prompt_sha256"] = digest  # frozen: memo fields are written directly
        return digest

    @property
    def is_greedy(self) -> bool:
        return _round(self.temperature) == 0.0

    @property
    def speculation(self) -> str | None:
        """The draft model in canonical form: None when there is no speculation."""
        return None if self.draft_model in (None, "none") else self.draft_model

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> DecodeRequest:
        """Build a request from one log record; raise ValueError naming the bad field."""
        if not isinstance(record, Mapping):
            raise ValueError(f"record: expected a JSON object, got {type(record).__name__}")
        tables = _tables()
        for name in tables.required_input:
            if name not in record:
                raise ValueError(f"{name}: required field is missing")
        stop = record.get("stop")
        if stop is not None and not isinstance(stop, (str, list, tuple)):
            raise ValueError(f"stop: expected a list of strings, a string or null, got {type(stop).__name__}")
        values = {name: record.get(name) for name in tables.dataclass_input}
        for name in tables.dataclass_input:
            if values[name] is None and contract.BY_NAME[name].default is not None:
                values[name] = contract.BY_NAME[name].default
        values["stop"] = None if stop is None else (stop,) if isinstance(stop, str) else tuple(stop)
        return cls(**values, extra={k: v for k, v in record.items() if k not in tables.dataclass_input})

    def to_record(self) -> dict[str, Any]:
        """The request's fields as a log record fragment (the contract's names)."""
        rec: dict[str, Any] = {
            "target_model": self.target_model,
            "draft_model": self.draft_model,
            "num_speculative_tokens": self.num_speculative_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "max_tokens": self.max_tokens,
            "seed": self.seed,
            "stop": None if self.stop is None else list(self.stop),
            "tokenizer_version": self.tokenizer_version,
        }
        for f in _tables().extra_identity:
            rec[f.name] = self.extra.get(f.name)
        if self.prompt is not None:
            rec["prompt"] = self.prompt
        rec["prompt_hash"] = self.prompt_sha256
        return rec


def _coerce(req: DecodeRequest | Mapping[str, Any]) -> DecodeRequest:
    return req if isinstance(req, DecodeRequest) else DecodeRequest.from_record(req)


def _value(r: DecodeRequest, name: str) -> Any:
    """A field's value: a dataclass attribute, or (for a field the contract added) from `extra`."""
    return r.__dict__[name] if name in _tables().dataclass_input else r.extra.get(name)


def _canonical(f: Field, r: DecodeRequest) -> Any:
    return r.prompt_sha256 if f.canonical == "sha256" else canonical_value(f, _value(r, f.name))


def canonical_value(f: Field, value: Any) -> Any:
    """An identity field's value in canonical form (not the prompt's: that is its SHA-256)."""
    if value is None:
        return [] if f.canonical == "string_set" else None
    if f.canonical == "none_is_null":
        return None if value == "none" else value
    if f.canonical == "zero_is_null":
        return value or None
    if f.canonical == "number":
        return _round(value)
    if f.canonical == "string_set":
        return sorted(set(value))
    return value


def identity(req: DecodeRequest | Mapping[str, Any]) -> dict[str, Any]:
    """The canonical identity object of a request or a log record."""
    r = _coerce(req)
    greedy = r.is_greedy
    return {f.name: _canonical(f, r) for f in _tables().identity if not (greedy and f.sampling_only)}


# Stand-ins for unknown fields while a request is built; the identity leaves those fields out again.
_PLACEHOLDERS = {"str": "", "nonempty_str": "?", "int": 0, "int>=0": 0, "int>=1": 1, "num": 0.0, "num>=0": 1.0,
                 "top_p": 1.0, "str_list": None, "hex64": None}


def identity_with_unknown(record: Mapping[str, Any], unknown: Collection[str]) -> dict[str, Any]:
    """The identity of a record some of whose fields are unknown (not null): those are left out, so two
    identities compare only on the fields both know. An unknown temperature counts as sampled, keeping
    whatever sampling fields are known."""
    if not unknown:
        return identity(record)
    filled = dict(record)
    for name in unknown:
        if name == "prompt":
            filled["prompt"], filled["prompt_hash"] = "", None
        elif name in contract.BY_NAME:
            filled[name] = _PLACEHOLDERS[contract.BY_NAME[name].kind]
    obj = identity(filled)
    for name in unknown:
        obj.pop(name, None)
    return obj


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint_of_identity(identity_obj: Mapping[str, Any]) -> str:
    return sha256_hex(canonical_json(identity_obj))


# Canonical JSON of the values that repeat across requests (temperatures, top_p,
# stop lists): rounding and repr cost far more than a dict lookup. Bounded, and
# equal keys (1 and 1.0, -0.0 and 0.0, equal tuples) have equal canonical text.
_NUMBER_JSON: dict[float, str] = {}
_STOP_JSON: dict[tuple[str, ...] | None, str] = {}
_MEMO_MAX = 4096


def _number_json(value: float) -> str:
    text = _NUMBER_JSON.get(value)
    if text is None:
        if len(_NUMBER_JSON) >= _MEMO_MAX:
            _NUMBER_JSON.clear()
        text = _NUMBER_JSON[value] = repr(_round(value))
    return text


def _stop_json(stop: tuple[str, ...] | None) -> str:
    text = _STOP_JSON.get(stop)
    if text is None:
        if len(_STOP_JSON) >= _MEMO_MAX:
            _STOP_JSON.clear()
        text = _STOP_JSON[stop] = "[" + ",".join([_json_str(x) for x in sorted(set(stop or ()))]) + "]"
    return text


def value_json(f: Field) -> Callable[[Any], str]:
    """The canonical JSON text of a value of identity field `f` (not the prompt): what `identity_json` writes,
    and what the store writes for each distinct value of a batch (ingestion/identities.py)."""
    s = _json_str
    if f.canonical == "number":
        return lambda v: _NUMBER_JSON.get(v) or _number_json(v)
    if f.canonical == "string_set":
        return lambda v: _STOP_JSON.get(v) or _stop_json(v)
    if f.canonical == "none_is_null":
        return lambda v: "null" if v in (None, "none") else s(v)
    if f.canonical == "zero_is_null":
        return lambda v: str(v or "null")
    if f.canonical == "integer":
        return lambda v: "null" if v is None else str(v)
    return lambda v: "null" if v is None else s(v)


def _json_encoder(f: Field, dataclass_input: tuple[str, ...]) -> Callable[[DecodeRequest], str]:
    """The canonical JSON text of one identity field, straight from a request (see `identity_json`)."""
    name = f.name
    if f.canonical == "sha256":
        return lambda r: f'"{r.prompt_sha256}"'
    encode = value_json(f)
    if name in dataclass_input:
        return lambda r: encode(r.__dict__[name])
    return lambda r: encode(r.extra.get(name))


def _composer(identity_fields: tuple[Field, ...], dataclass_input: tuple[str, ...], greedy: bool
              ) -> tuple[tuple[str, Callable[[DecodeRequest], str]], ...]:
    kept = sorted((f for f in identity_fields if not (greedy and f.sampling_only)), key=lambda f: f.name)
    return tuple((_json_str(f.name) + ":", _json_encoder(f, dataclass_input)) for f in kept)


def identity_json(req: DecodeRequest | Mapping[str, Any]) -> str:
    """`canonical_json(identity(req))`, written out directly, once per request.

    Every request computes its key, and building the dict then running the generic
    encoder costs several times as much: each field's text comes from an encoder made
    from the contract table once, keys in sorted order, strings through json's own (C)
    encoder with non-ASCII kept, numbers through repr as json does. test_request pins
    it equal to the generic path.
    """
    r = req if type(req) is DecodeRequest else _coerce(req)
    text = r.__dict__.get("_identity_json")
    if text is None:
        tables = _tables()
        parts = tables.greedy_json if r.is_greedy else tables.sampled_json
        text = "{" + ",".join([key + encode(r) for key, encode in parts]) + "}"
        r.__dict__["_identity_json"] = text
    return text


def fingerprint(req: DecodeRequest | Mapping[str, Any]) -> str:
    """Lowercase hex SHA-256 of the canonical identity object."""
    return _sha256(identity_json(req).encode("utf-8")).hexdigest()


def canonicalize_identity(obj: Mapping[str, Any]) -> dict[str, Any]:
    """Re-canonicalise an identity object written by someone else (a `cached_fingerprint`).

    Its `prompt` already holds the prompt's SHA-256, so it is read as `prompt_hash`;
    a writer that spelled an equivalence differently (`[]` for null, 0 for top_k)
    still compares equal.
    """
    if not isinstance(obj, Mapping):
        raise ValueError(f"cached_fingerprint: expected an object, got {type(obj).__name__}")
    record = {k: v for k, v in obj.items() if k != "prompt"}
    record["prompt_hash"] = obj.get("prompt")
    return identity(record)


def differing_fields(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Identity fields whose canonical values differ; a field absent from either (greedy) is not listed."""
    return sorted(k for k in contract.IDENTITY_FIELDS if k in a and k in b and a[k] != b[k])


@dataclass(frozen=True)
class _Tables:
    """What identity derives from the contract table; rebuilt if a program extends the table (`fields.define`)."""

    source: tuple[Field, ...]
    identity: tuple[Field, ...]
    # The contract fields DecodeRequest carries as attributes; others (a field added to the contract) go in `extra`.
    dataclass_input: tuple[str, ...]
    required_input: tuple[str, ...]
    extra_identity: tuple[Field, ...]
    greedy_json: tuple[tuple[str, Callable[[DecodeRequest], str]], ...]
    sampled_json: tuple[tuple[str, Callable[[DecodeRequest], str]], ...]


_TABLES: _Tables | None = None


def _tables() -> _Tables:
    global _TABLES
    if _TABLES is None or _TABLES.source is not contract.FIELDS:
        ident = tuple(f for f in contract.FIELDS if f.identity)
        fields = DecodeRequest.__dataclass_fields__
        data_in = tuple(f.name for f in contract.FIELDS if f.name in fields and f.name != "extra")
        _TABLES = _Tables(
            contract.FIELDS, ident, data_in,
            tuple(f.name for f in ident if f.required),
            tuple(f for f in ident if f.name not in data_in),
            _composer(ident, data_in, greedy=True), _composer(ident, data_in, greedy=False),
        )
    return _TABLES
