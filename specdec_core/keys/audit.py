"""Audit any cache-key function: which request fields it ignores, and whether it is stable.

A key narrower than the request's identity lets different requests share one cached
output; a key that changes with dict order, between calls or between processes never
hits, or hits for the wrong request after a restart. Both are found here by calling
the key function on an example request and on semantic variants of it.

The auditor is generic: it knows no key scheme of ours (keys/schemes.py adapts those to it).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

KeyFn = Callable[[dict[str, Any]], Any]

INSTABILITY_KINDS: tuple[str, ...] = ("process", "reorder", "repeat")
# Seeds of the two fresh interpreters the `process` check compares.
HASH_SEEDS: tuple[str, str] = ("1", "2")

_ADVICE = {
    "reorder": "serialise the request with sorted keys at every depth (json.dumps(..., sort_keys=True))",
    "repeat": "make the key a pure function of its argument: no caches keyed on part of the request, "
    "no counters or clocks, and never modify the argument",
    "process": "derive the key with hashlib over a canonical serialisation; Python's built-in hash of str and "
    "bytes changes with every process (PYTHONHASHSEED)",
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
    `details`: one sentence per finding, missing fields first.
    """

    missing: list[str] = field(default_factory=list)
    unstable: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    unchecked: dict[str, str] = field(default_factory=dict)
    details: list[str] = field(default_factory=list)
    checked_fields: list[str] = field(default_factory=list)

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
        }

    def __str__(self) -> str:
        problems = len(self.missing) + len(self.unstable)
        if self.ok:
            stable = [k for k in INSTABILITY_KINDS if k not in self.skipped]
            head = f"key audit: ok ({len(self.checked_fields)} fields change the key"
            head += f"; stable under {', '.join(stable)})" if stable else ")"
        else:
            head = f"key audit: {problems} problem(s)"
        lines = [head, *(f"  - {d}" for d in self.details)]
        if self.missing:
            lines.append(
                "  fix: include every missing field in the key; if a field truly cannot change the "
                "output, pass it in ignore"
            )
        lines += [f"  skipped {kind}: {reason}" for kind, reason in sorted(self.skipped.items())]
        lines += [f"  unchecked field {name}: {reason}" for name, reason in sorted(self.unchecked.items())]
        return "\n".join(lines)


# --- semantic variants -------------------------------------------------------------------


@dataclass(frozen=True)
class _Change:
    """One semantic change of a field. `path` is what changed (`stop[0]`, `meta.trace`),
    `alternatives` are candidate new values of the whole top-level field. The change counts
    as covered when any alternative the key function accepts changes the key; there are
    several only where the value's type is unknown (null, an empty list)."""

    path: str
    description: str
    alternatives: tuple[Any, ...]


# Candidates for a value of unknown type: the key function rejects those of the wrong type.
_ANY_TYPE: tuple[Any, ...] = (1, "x", ["x"], 0.5, True, {"x": 1})


def _fmt(value: Any, limit: int = 60) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return _clip(text, limit)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _scalar_changes(value: Any) -> list[tuple[str, tuple[Any, ...]]]:
    """(description, alternatives) for a leaf value; each is a clearly semantic change."""
    if value is None:
        return [("null -> a value", _ANY_TYPE)]
    if isinstance(value, bool):
        return [(f"{_fmt(value)} -> {_fmt(not value)}", (not value,))]
    if isinstance(value, int):
        news: list[Any] = [value + 1, value * 2]
    elif isinstance(value, float):
        # Far above the 6-decimal rounding a correct key may apply.
        news = [round(value + 0.1, 9), round(value - 0.1, 9), value * 2, value / 2]
    elif isinstance(value, str):
        news = [value + "-x", "x-" + value] if value else ["x"]
    else:
        return []
    out: list[tuple[str, tuple[Any, ...]]] = []
    seen: list[Any] = []
    for new in news:
        if new != value and new not in seen:
            seen.append(new)
            out.append((f"{_fmt(value)} -> {_fmt(new)}", (new,)))
    return out


def _new_element(items: list[Any]) -> tuple[Any, ...]:
    """Candidates for an element to append: new (a list may be a set), of the last element's type."""
    last = items[-1]
    if isinstance(last, str):
        candidate, n = last + "-x", 0
        while candidate in items:
            n += 1
            candidate = f"{last}-x{n}"
        return (candidate,)
    if isinstance(last, (int, float)) and not isinstance(last, bool):
        return (max(x for x in items if isinstance(x, (int, float))) + 1,)
    if isinstance(last, dict):
        changed = next(_changes(last, "_"), None)
        return (changed.alternatives[0],) if changed else ({"x": 1},)
    return _ANY_TYPE


def _changes(value: Any, path: str) -> Iterator[_Change]:
    """Every semantic change of `value` found at `path`; alternatives are new values of `value`."""
    if isinstance(value, dict):
        if not value:
            yield _Change(path, '{} -> {"x": 1}', ({"x": 1},))
        for key in value:
            for sub in _changes(value[key], f"{path}.{key}"):
                yield _Change(
                    sub.path, sub.description, tuple({**value, key: alt} for alt in sub.alternatives)
                )
    elif isinstance(value, list):
        if not value:
            yield _Change(path, "[] -> one element", tuple([alt] for alt in _ANY_TYPE))
            return
        new = _new_element(value)
        what = f"appending {_fmt(new[0])}" if len(new) == 1 else "appending an element"
        yield _Change(f"{path}[+]", what, tuple(value + [e] for e in new))
        for index in sorted({0, len(value) - 1}):
            for sub in _changes(value[index], f"{path}[{index}]"):
                yield _Change(
                    sub.path,
                    sub.description,
                    tuple(value[:index] + [alt] + value[index + 1 :] for alt in sub.alternatives),
                )
    else:
        for description, alternatives in _scalar_changes(value):
            yield _Change(path, description, alternatives)


def _is_ignored(path: str, ignore: Iterable[str]) -> bool:
    return any(path == ig or path.startswith((ig + ".", ig + "[")) for ig in ignore)


# --- the audit ----------------------------------------------------------------------------


def _call(key_fn: KeyFn, params: dict[str, Any]) -> Any:
    key = key_fn(params)
    if isinstance(key, bool) or not isinstance(key, (str, bytes, int)):
        raise KeyAuditError(
            f"key_fn returned {type(key).__name__} {_fmt(key)}; a cache key must be str, bytes or int"
        )
    return key


def _reordered(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _reordered(value[k]) for k in reversed(list(value))}
    if isinstance(value, list):
        return [_reordered(v) for v in value]
    return value


def _has_reorderable(value: Any) -> bool:
    if isinstance(value, dict):
        return len(value) > 1 or any(_has_reorderable(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_reorderable(v) for v in value)
    return False


def _key_or_error(key_fn: KeyFn, params: dict[str, Any]) -> Any:
    """The key, or a text naming the exception: a call that raises where the first did not is a different key."""
    try:
        return _call(key_fn, params)
    except KeyAuditError:
        raise
    except Exception as exc:
        return f"<raised {type(exc).__name__}: {exc}>"


def audit_key_function(
    key_fn: KeyFn,
    example: Mapping[str, Any],
    *,
    ignore: Iterable[str] = (),
    importable: str | None = None,
    check_process: bool = True,
    process_timeout: float = 60.0,
) -> KeyAudit:
    """Audit `key_fn` (one dict of request parameters -> str, bytes or int) around `example`.

    Each top-level field of `example` not in `ignore` is changed semantically (numbers
    +1 / x2 / +-0.1, strings extended, booleans flipped, lists appended to and edited,
    nested leaves changed, null replaced); a field is *missing* when such a change leaves
    the key unchanged. `ignore` names fields (or sub-paths like `meta.trace`) that cannot
    change the output. Instability kinds: `reorder` (another key order at any depth),
    `repeat` (another key on a second call, or the argument modified), `process` (another
    key in fresh interpreters with other PYTHONHASHSEEDs; needs key_fn picklable by
    reference, i.e. defined at module level, or `importable="module:function"`).

    Raises KeyAuditError when key_fn fails on the example itself or returns no key.
    """
    if not isinstance(example, Mapping):
        raise KeyAuditError(f"example: expected a JSON object, got {type(example).__name__}")
    example = copy.deepcopy(dict(example))
    ignore = tuple(ignore)
    missing: dict[str, str] = {}
    unstable: dict[str, str] = {}
    skipped: dict[str, str] = {}
    unchecked: dict[str, str] = {}

    before = repr(example)
    argument = copy.deepcopy(example)
    try:
        base = _call(key_fn, argument)
    except KeyAuditError:
        raise
    except Exception as exc:
        raise KeyAuditError(f"key_fn raised on the example: {type(exc).__name__}: {exc}") from exc
    if repr(argument) != before:
        unstable["repeat"] = (
            f"repeat: key_fn modified the request it was given (now {_fmt(argument, 100)}); "
            + _ADVICE["repeat"]
        )
    else:
        for label, params in (("a second call", argument), ("a call with a copy", copy.deepcopy(example))):
            other = _key_or_error(key_fn, params)
            if other != base:
                unstable["repeat"] = (
                    f"repeat: the same request gave {_fmt(base)}, then {_fmt(other)} on {label}; "
                    + _ADVICE["repeat"]
                )
                break

    checked: list[str] = []
    for name in example:
        if _is_ignored(name, ignore):
            continue
        tried = False
        for change in _changes(example[name], name):
            if _is_ignored(change.path, ignore):
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
        elif any(not _is_ignored(c.path, ignore) for c in _changes(example[name], name)):
            unchecked[name] = "key_fn rejected every change tried; give an example where it can vary"

    if not _has_reorderable(example):
        skipped["reorder"] = "no object in the example has two or more keys"
    else:
        reordered = _key_or_error(key_fn, _reordered(example))
        if reordered != base:
            unstable["reorder"] = (
                f"reorder: the same request with its keys in reverse order gave {_fmt(reordered)} "
                f"instead of {_fmt(base)}; " + _ADVICE["reorder"]
            )

    if not check_process:
        skipped["process"] = "disabled by check_process=False"
    else:
        finding, reason = _check_process(key_fn, example, base, importable, process_timeout)
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
    )


def _try_change(key_fn: KeyFn, example: dict[str, Any], name: str, change: _Change, base: Any) -> bool | None:
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


# --- the process check --------------------------------------------------------------------

_CHILD = r"""
import importlib, importlib.util, json, sys
job = json.loads(sys.stdin.read())
sys.path[:] = job["path"]
how, target = job["how"], job["target"]
if how == "instance":
    module, _, qualname = target[0].partition(":")
    cls = importlib.import_module(module)
    for part in qualname.split("."):
        cls = getattr(cls, part)
    fn = cls(**target[1])
else:
    if how == "file":
        spec = importlib.util.spec_from_file_location("_specdec_audited", target[0])
        obj = importlib.util.module_from_spec(spec)
        sys.modules["_specdec_audited"] = obj
        spec.loader.exec_module(obj)
        qualname = target[1]
    else:
        module, _, qualname = target.partition(":")
        obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    fn = obj
key = fn(job["example"])
sys.stdout.write("\n@@specdec-key@@" + json.dumps(repr(key)) + "\n")
"""
_MARK = "@@specdec-key@@"


def resolve_importable(spec: str) -> KeyFn:
    """Import `module:function` (a dotted attribute path after the colon).

    Raises ModuleNotFoundError, ImportError or AttributeError naming what was not found,
    and ValueError when `spec` has no colon or names something not callable.
    """
    module_name, sep, qualname = spec.partition(":")
    if not sep or not module_name or not qualname:
        raise ValueError(f"expected MODULE:FUNCTION, got {spec!r}")
    obj: Any = importlib.import_module(module_name)
    for part in qualname.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise AttributeError(f"module {module_name!r} has no attribute {qualname!r}") from None
    if not callable(obj):
        raise ValueError(f"{spec} is a {type(obj).__name__}, not a function")
    return obj


def _how_to_load(key_fn: KeyFn, importable: str | None) -> tuple[str, Any] | str:
    """How a fresh interpreter gets key_fn: ("import"|"file"|"instance", target), or why it can't."""
    if importable:
        return "import", importable
    qualname = getattr(key_fn, "__qualname__", "")
    if "<lambda>" in qualname or "<locals>" in qualname:
        kind = "a lambda" if "<lambda>" in qualname else "a function defined inside another"
        return (
            f"key_fn is {kind} ({qualname}), which a fresh interpreter cannot import; "
            "define it at module level or pass importable='module:function'"
        )
    if getattr(key_fn, "__module__", None) == "__main__":
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
        if not main_file or getattr(sys.modules["__main__"], qualname.split(".")[0], None) is None:
            return (
                "key_fn lives in __main__ without a file to import it from; pass importable='module:function'"
            )
        return "file", [os.path.abspath(main_file), qualname]
    module = getattr(key_fn, "__module__", None)
    if module and qualname:
        spec = f"{module}:{qualname}"
        try:
            if resolve_importable(spec) is key_fn:
                return "import", spec
        except (ImportError, AttributeError, ValueError):
            pass
    # A callable dataclass instance (such as dict_key_adapter's) is rebuilt from its class and JSON fields.
    if dataclasses.is_dataclass(key_fn) and not isinstance(key_fn, type):
        cls = type(key_fn)
        spec = f"{cls.__module__}:{cls.__qualname__}"
        fields = {f.name: getattr(key_fn, f.name) for f in dataclasses.fields(key_fn)}
        try:
            json.dumps(fields)
            if resolve_importable(spec) is cls:
                return "instance", [spec, fields]
        except (TypeError, ImportError, AttributeError, ValueError):
            pass
    return (
        f"key_fn ({type(key_fn).__name__} {qualname or key_fn!r}) cannot be imported by a fresh interpreter; "
        "define it at module level or pass importable='module:function'"
    )


def _check_process(
    key_fn: KeyFn, example: dict[str, Any], base: Any, importable: str | None, timeout: float
) -> tuple[str | None, str | None]:
    """(finding, None) when unstable, (None, reason) when skipped, (None, None) when stable."""
    how = _how_to_load(key_fn, importable)
    if isinstance(how, str):
        return None, how
    job = json.dumps(
        {"path": [p or os.getcwd() for p in sys.path], "how": how[0], "target": how[1], "example": example}
    )
    keys: dict[str, str] = {}
    for seed in HASH_SEEDS:
        env = {**os.environ, "PYTHONHASHSEED": seed}
        try:
            done = subprocess.run(
                [sys.executable, "-c", _CHILD],
                input=job,
                capture_output=True,
                text=True,
                env=env,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return None, f"a fresh interpreter took longer than {timeout:g}s to compute the key"
        marked = [line for line in done.stdout.splitlines() if line.startswith(_MARK)]
        if done.returncode != 0 or not marked:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return None, f"key_fn failed in a fresh interpreter: {last}"
        keys[seed] = json.loads(marked[-1][len(_MARK) :])
    here = repr(base)
    if len({here, *keys.values()}) == 1:
        return None, None
    seen = ", ".join(f"PYTHONHASHSEED={s}: {_clip(k)}" for s, k in keys.items())
    finding = f"process: the key differs between interpreters ({seen}; this one: {_clip(here)}); "
    return finding + _ADVICE["process"], None
