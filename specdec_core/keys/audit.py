"""Audit any cache-key function: which request fields it ignores, and whether it is stable.

A key narrower than the request's identity lets different requests share one cached
output; a key that changes with dict order, object identity, between calls or between
processes never hits, or hits for the wrong request after a restart. Both are found here
by calling the key function on an example request, on semantic variants of it
(keys/changes.py) and on copies that are the same request (keys/variants.py); the
cross-process check is keys/process_check.py.

The auditor is generic: it knows no key scheme of ours (keys/schemes.py adapts those to it).
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from specdec_core.keys.changes import Change, changes, is_ignored
from specdec_core.keys.process_check import KeyFn, check_across_processes, resolve_importable
from specdec_core.keys.render import fmt, two_keys
from specdec_core.keys.variants import (
    distinct_strings,
    has_reorderable,
    json_round_trip,
    reordered,
    shared_strings,
)

__all__ = [
    "INSTABILITY_KINDS",
    "KeyAudit",
    "KeyAuditError",
    "KeyFn",
    "audit_key_function",
    "resolve_importable",
    "unknown_ignore_names",
]

INSTABILITY_KINDS: tuple[str, ...] = ("identity", "process", "reorder", "repeat")

_ADVICE = {
    "reorder": "serialise the request with sorted keys at every depth (json.dumps(..., sort_keys=True))",
    "repeat": "make the key a pure function of its argument: no caches keyed on part of the request, "
    "no counters or clocks, and never modify the argument",
    "identity": "serialise the request to canonical text (json.dumps(..., sort_keys=True)) before hashing; "
    "pickle, marshal and id() see which equal objects are shared, which JSON decoding changes",
}


class KeyAuditError(ValueError):
    """The audit could not run: the key function failed on the example, or returned no key."""


@dataclass(frozen=True)
class KeyAudit:
    """What `audit_key_function` found.

    `missing`: top-level fields whose semantic change left the key unchanged.
    `unstable`: kinds of instability found, among `INSTABILITY_KINDS`.
    `skipped`: kind -> why that check could not run (it neither passed nor failed).
    `unchecked`: field -> why no change of it could be tried (the key function rejected all).
    `untried`: fields a request holds (`expected`) that the example holds nowhere: whether they change the key
    is not known (said, not a finding: a request of another shape may name them otherwise).
    `details`: one sentence per finding, missing fields first.
    """

    missing: list[str] = field(default_factory=list)
    unstable: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    unchecked: dict[str, str] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    checked_fields: list[str] = field(default_factory=list)
    untried: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.missing and not self.unstable

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "missing": list(self.missing),
            "unstable": list(self.unstable),
            "skipped": dict(self.skipped),
            "unchecked": dict(self.unchecked),
            "details": list(self.details),
            "checked_fields": list(self.checked_fields),
            "untried": list(self.untried),
        }

    def __str__(self) -> str:
        problems = len(self.missing) + len(self.unstable)
        if self.ok:
            stable = [k for k in INSTABILITY_KINDS if k not in self.skipped]
            n = len(self.checked_fields)
            tried = " of those tried" if self.untried else ""
            head = f"key audit: ok ({n} field{'' if n == 1 else 's'}{tried} change{'s' if n == 1 else ''} the key"
            head += f"; stable under {', '.join(stable)})" if stable else ")"
        else:
            head = f"key audit: {problems} problem(s)"
        lines = [head, *(f"  - {d}" for d in self.details)]
        if self.untried:
            lines.append(f"  not tried: {', '.join(self.untried)}: not in the example, so whether they change the "
                         "key is not known; add them to it, or --ignore those your requests never carry")
        if self.missing:
            lines.append(
                "  fix: include every missing field in the key; if a field truly cannot change the "
                "output, pass it in ignore"
            )
        lines += [f"  skipped {kind}: {reason}" for kind, reason in sorted(self.skipped.items())]
        lines += [f"  unchecked field {name}: {reason}" for name, reason in sorted(self.unchecked.items())]
        return "\n".join(lines)


# --- the audit ----------------------------------------------------------------------------


def _call(key_fn: KeyFn, params: dict[str, Any]) -> Any:
    key = key_fn(params)
    # Any value that compares with == can be a key (libraries use tuples), as long as a cache can hold it.
    if key is None or not isinstance(key, Hashable):
        raise KeyAuditError(
            f"key_fn returned {type(key).__name__} {fmt(key)}; a cache key must be a hashable value "
            "(str, bytes, int or a tuple of them)"
        )
    return key


def _key_or_error(key_fn: KeyFn, params: dict[str, Any]) -> Any:
    """The key, or a text naming the exception: a call that raises where the first did not
    is a different key."""
    try:
        return _call(key_fn, params)
    except KeyAuditError:
        raise
    except Exception as exc:
        return f"<raised {type(exc).__name__}: {exc}>"


def unknown_ignore_names(example: Mapping[str, Any], ignore: Iterable[str]) -> dict[str, str | None]:
    """Names in `ignore` whose field is not in `example`, each with the closest field name (or None).

    A misspelled name ignores nothing, silently; sub-paths (`meta.trace`, `stop[0]`) count by their field.
    """
    fields = [str(name) for name in example]
    unknown: dict[str, str | None] = {}
    for name in ignore:
        top = name.split(".", 1)[0].split("[", 1)[0]
        if top not in example:
            close = difflib.get_close_matches(top, fields, n=1)
            unknown[name] = close[0] if close else None
    return unknown


def audit_key_function(
    key_fn: KeyFn,
    example: Mapping[str, Any],
    *,
    ignore: Iterable[str] = (),
    importable: str | None = None,
    check_process: bool = True,
    process_timeout: float = 60.0,
    expected: Iterable[str] = (),
) -> KeyAudit:
    """Audit `key_fn` (one dict of request parameters -> a hashable key: str, bytes, int, a tuple)
    around `example`.

    Each top-level field of `example` not in `ignore` is changed semantically (numbers
    +1 / x2 / +-0.1, strings extended, booleans flipped, lists appended to and edited,
    nested leaves changed, null replaced); a field is *missing* when such a change leaves
    the key unchanged. `ignore` names fields (or sub-paths like `meta.trace`) that cannot
    change the output. Instability kinds: `reorder` (another key order at any depth),
    `identity` (another key for the request decoded from JSON, or with its equal strings
    shared or distinct objects), `repeat` (another key on a second call, or the argument
    modified), `process` (another key in fresh interpreters, whose seeds tell randomness from
    PYTHONHASHSEED; needs key_fn defined at module level, or `importable="module:function"`,
    and a key with a stable text; see process_check.canonical_key_text). `expected`: fields a request
    holds (the CLI passes the contract's identity fields): each one the example holds at no depth, and
    `ignore` does not name, is `untried`: no change of it was tried.

    Raises KeyAuditError when key_fn fails on the example itself or returns no key.
    """
    # One pass over the checks in the order a reader of the audit expects them; each step is a call into changes/variants/process_check, so the length is the list, not logic.
    if not isinstance(example, Mapping):
        raise KeyAuditError(f"example: expected a JSON object, got {type(example).__name__}")
    example = copy.deepcopy(dict(example))
    ignore = tuple(ignore)
    missing: dict[str, str] = {}
    unstable: dict[str, str] = {}
    skipped: dict[str, str] = {}
    unchecked: dict[str, str] = {}

    argument = copy.deepcopy(example)
    try:
        base = _call(key_fn, argument)
    except KeyAuditError:
        raise
    except Exception as exc:
        raise KeyAuditError(f"key_fn raised on the example: {type(exc).__name__}: {exc}") from exc
    if finding := _check_repeat(key_fn, example, argument, base):
        unstable["repeat"] = finding

    checked: list[str] = []
    for name in example:
        if is_ignored(name, ignore):
            continue
        tried = False
        for change in changes(example[name], name):
            if is_ignored(change.path, ignore):
                continue
            outcome = _try_change(key_fn, example, name, change, base)
            if outcome is None:
                continue
            tried = True
            if outcome is False and name not in missing:
                what = change.description if change.path == name else f"{change.path}: {change.description}"
                missing[name] = f"missing {name}: {what} left the key unchanged"
        if tried:
            if name not in missing:
                checked.append(name)
        elif any(not is_ignored(c.path, ignore) for c in changes(example[name], name)):
            unchecked[name] = "key_fn rejected every change tried; give an example where it can vary"

    held = _names_at_any_depth(example)
    untried = [name for name in expected if name not in held and not is_ignored(name, ignore)]

    if not has_reorderable(example):
        skipped["reorder"] = "no object in the example has two or more keys"
    elif finding := _check_same_request(
        key_fn, base, reordered(example), "the same request with its keys in reverse order", "reorder"
    ):
        unstable["reorder"] = finding

    for label, copied in _identity_copies(example):
        if finding := _check_same_request(key_fn, base, copied, label, "identity"):
            unstable["identity"] = finding
            break

    if not check_process:
        skipped["process"] = "disabled by check_process=False"
    else:
        finding, reason = check_across_processes(key_fn, example, base, importable, process_timeout)
        if finding:
            unstable["process"] = finding
        elif reason:
            skipped["process"] = reason

    return KeyAudit(
        missing=sorted(missing),
        unstable=sorted(unstable),
        skipped=skipped,
        unchecked=unchecked,
        details=[missing[k] for k in sorted(missing)] + [unstable[k] for k in sorted(unstable)],
        checked_fields=sorted(checked),
        untried=sorted(untried),
    )


def _names_at_any_depth(value: Any) -> set[str]:
    """Every key of every object in `value` (a request may nest its parameters: `{"params": {...}}`)."""
    if isinstance(value, Mapping):
        return {str(k) for k in value}.union(*(_names_at_any_depth(v) for v in value.values()))
    if isinstance(value, (list, tuple)):
        return set().union(*(_names_at_any_depth(v) for v in value))
    return set()


def _try_change(key_fn: KeyFn, example: dict[str, Any], name: str, change: Change, base: Any) -> bool | None:
    """True: the key changed; False: the key function accepted the change but kept the key;
    None: it rejected every alternative (an invalid request for it, so no evidence)."""
    accepted = False
    for alternative in change.alternatives:
        params = copy.deepcopy(example)
        params[name] = copy.deepcopy(alternative)
        try:
            key = _call(key_fn, params)
        except KeyAuditError:
            raise
        except Exception:
            continue
        if key != base:
            return True
        accepted = True
    return False if accepted else None




def _check_repeat(key_fn: KeyFn, example: dict[str, Any], argument: dict[str, Any], base: Any) -> str | None:
    if repr(argument) != repr(example):
        now = fmt(argument, 100)
        return f"repeat: key_fn modified the request it was given (now {now}); " + _ADVICE["repeat"]
    for label, params in (("a second call", argument), ("a call with a copy", copy.deepcopy(example))):
        other = _key_or_error(key_fn, params)
        if other != base:
            shown_base, shown_other, where = two_keys(base, other)
            return (
                f"repeat: the same request gave {shown_base}, then {shown_other} on {label}{where}; "
                + _ADVICE["repeat"]
            )
    return None


def _check_same_request(
    key_fn: KeyFn, base: Any, params: dict[str, Any], label: str, kind: str
) -> str | None:
    other = _key_or_error(key_fn, params)
    if other == base:
        return None
    shown_other, shown_base, where = two_keys(other, base)
    return f"{kind}: {label} gave {shown_other} instead of {shown_base}{where}; " + _ADVICE[kind]


def _identity_copies(example: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    copies = [
        ("the same request with its equal strings as one object", shared_strings(example)),
        ("the same request with every string a distinct object", distinct_strings(example)),
    ]
    decoded = json_round_trip(example)
    if decoded is not None:
        copies.insert(0, ("the same request decoded from JSON", decoded))
    return copies
