"""The `process` check: does a key function give the same key in fresh interpreters?

Three children compute the key of the example: two with the same PYTHONHASHSEED and one
with another. Which of them disagree tells the cause: randomness (same seed, other key),
the hash seed (other seed only), or state of this process (the children agree, this one not).
Keys are compared by a canonical text, so tuples and other non-string keys can be compared too.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from typing import Any

from specdec_core.keys.render import clip, two_keys

KeyFn = Callable[[dict[str, Any]], Any]

# (label, PYTHONHASHSEED) of the fresh interpreters; the first two share a seed on purpose.
CHILDREN: tuple[tuple[str, str], ...] = (("a", "1"), ("b", "1"), ("c", "2"))

ADVICE = {
    "randomness": "derive the key from the request only: no uuid4, random, time or id() in it "
    "(a uuid5 namespace must be a fixed constant)",
    "hash_seed": "derive the key with hashlib over a canonical serialisation; Python's built-in hash of str "
    "and bytes changes with every process (PYTHONHASHSEED)",
    "this_process": "derive the key from the request only: no module-level caches or counters, environment "
    "or working directory in it, and no pickle of the request (the children got it decoded from JSON)",
}

_SCALARS = (str, bytes, int, float, bool, type(None))


def canonical_key_text(key: Any) -> str | None:
    """A text that is equal for equal keys in any process, or None when the key has none
    (an object whose repr names its address, say). Sets and dicts are sorted: == ignores their order."""
    if type(key) in _SCALARS:
        return repr(key)
    if type(key) in (tuple, list):
        parts = [canonical_key_text(item) for item in key]
        if any(part is None for part in parts):
            return None
        body = ", ".join(parts)  # type: ignore[arg-type]
        return f"({body},)" if type(key) is tuple else f"[{body}]"
    if type(key) in (frozenset, set):
        parts = [canonical_key_text(item) for item in key]
        if any(part is None for part in parts):
            return None
        return f"{type(key).__name__}({{{', '.join(sorted(parts))}}})"  # type: ignore[arg-type]
    if type(key) is dict:
        items = [(canonical_key_text(k), canonical_key_text(v)) for k, v in key.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return "{" + ", ".join(sorted(f"{k}: {v}" for k, v in items)) + "}"
    return None


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
from specdec_core.keys.process_check import canonical_key_text
key = fn(job["example"])
sys.stdout.write("\n@@specdec-key@@" + json.dumps(canonical_key_text(key)) + "\n")
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


def _run_children(job: str, timeout: float) -> dict[str, str | None] | str:
    """label -> the key's canonical text in that child, or why the children could not tell."""
    procs = {
        label: subprocess.Popen(
            [sys.executable, "-c", _CHILD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        )
        for label, seed in CHILDREN
    }
    keys: dict[str, str | None] = {}
    failure: str | None = None
    for label, proc in procs.items():
        try:
            stdout, stderr = proc.communicate(job, timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failure = failure or f"a fresh interpreter took longer than {timeout:g}s to compute the key"
            continue
        marked = [line for line in stdout.splitlines() if line.startswith(_MARK)]
        if proc.returncode != 0 or not marked:
            last = (stderr.strip().splitlines() or ["no output"])[-1]
            failure = failure or f"key_fn failed in a fresh interpreter: {last}"
            continue
        keys[label] = json.loads(marked[-1][len(_MARK) :])
    return failure or keys


def check_across_processes(
    key_fn: KeyFn, example: dict[str, Any], base: Any, importable: str | None, timeout: float
) -> tuple[str | None, str | None]:
    """(finding, None) when unstable, (None, reason) when skipped, (None, None) when stable."""
    here = canonical_key_text(base)
    if here is None:
        return None, (
            f"key_fn returns {type(base).__name__} {clip(repr(base))}, which has no stable text to compare "
            "across processes; return str, bytes, int, float or tuples of them"
        )
    how = _how_to_load(key_fn, importable)
    if isinstance(how, str):
        return None, how
    job = json.dumps(
        {"path": [p or os.getcwd() for p in sys.path], "how": how[0], "target": how[1], "example": example}
    )
    keys = _run_children(job, timeout)
    if isinstance(keys, str):
        return None, keys
    if any(key is None for key in keys.values()):
        return None, "in a fresh interpreter key_fn returned a key with no stable text to compare"
    same_seed = CHILDREN[0][1]
    other_seed = CHILDREN[2][1]
    if keys["a"] != keys["b"]:
        shown_a, shown_b, where = two_keys(keys["a"], keys["b"], shown_as_is=True)
        finding = (
            f"process: two fresh interpreters with the same PYTHONHASHSEED={same_seed} gave {shown_a} and "
            f"{shown_b}{where}: the key depends on randomness or the clock; {ADVICE['randomness']}"
        )
    elif keys["a"] != keys["c"]:
        shown_a, shown_c, where = two_keys(keys["a"], keys["c"], shown_as_is=True)
        finding = (
            f"process: the key is the same for the same hash seed but differs between "
            f"PYTHONHASHSEED={same_seed} ({shown_a}) and PYTHONHASHSEED={other_seed} ({shown_c}){where}; "
            + ADVICE["hash_seed"]
        )
    elif keys["a"] != here:
        shown_a, shown_here, where = two_keys(keys["a"], here, shown_as_is=True)
        finding = (
            f"process: fresh interpreters agree on {shown_a} but this one gave {shown_here}{where}; "
            + ADVICE["this_process"]
        )
    else:
        return None, None
    return finding, None
