"""Hardening of the key auditor: object identity, nested order, tuple keys, the cause of a process
difference, misspelled --ignore names, and where two long keys differ."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import uuid
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli

from specdec_core.keys.audit import INSTABILITY_KINDS, audit_key_function

# A chat request: equal strings ("user", "hi") repeat, objects nest inside a list.
CHAT: dict[str, Any] = {
    "model": "llama-3-8b",
    "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "hi"},
    ],
    "temperature": 0.7,
    "max_tokens": 64,
}


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


# --- key functions under audit: module level, so a fresh interpreter can load them ----------


def correct_key(params: dict[str, Any]) -> str:
    return _digest(params)


def pickled_key(params: dict[str, Any]) -> str:
    # Sorted at every depth, so only pickle's memo of shared objects can change it.
    return hashlib.sha256(pickle.dumps(_sorted(params))).hexdigest()


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def top_level_sorted_key(params: dict[str, Any]) -> str:
    # Sorts the top level only: each message's keys are serialised in their given order.
    return hashlib.sha256(repr(sorted(params.items())).encode()).hexdigest()


def tuple_key(params: dict[str, Any]) -> tuple[Any, ...]:
    return ("v1", params["model"], json.dumps(params["messages"], sort_keys=True), params["temperature"])


def hashed_tuple_key(params: dict[str, Any]) -> tuple[Any, ...]:
    return ("v1", hash(json.dumps(params, sort_keys=True)))


class OpaqueKey:
    """Equal by value, but its repr names its address: no stable text to compare across processes."""

    def __init__(self, digest: str) -> None:
        self.digest = digest

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueKey) and other.digest == self.digest

    def __hash__(self) -> int:
        return int(self.digest[:15], 16)


def opaque_key(params: dict[str, Any]) -> OpaqueKey:
    return OpaqueKey(_digest(params))


_NAMESPACE = uuid.uuid4()  # a new namespace in every process


def uuid4_namespace_key(params: dict[str, Any]) -> str:
    return str(uuid.uuid5(_NAMESPACE, json.dumps(params, sort_keys=True)))


def python_hash_key(params: dict[str, Any]) -> str:
    return f"{hash(json.dumps(params, sort_keys=True)) & 0xFFFFFFFFFFFFFFFF:016x}"


_CALLS = [0]


def long_counting_key(params: dict[str, Any]) -> str:
    _CALLS[0] += 1
    return "k" * 100 + str(_CALLS[0])


# --- 15: keys that depend on object identity -------------------------------------------------


def test_a_pickling_key_is_identity_unstable_for_a_request_decoded_from_json():
    audit = audit_key_function(pickled_key, json.loads(json.dumps(CHAT)), check_process=False)
    assert audit.unstable == ["identity"]
    assert "identity" in INSTABILITY_KINDS
    assert audit.to_dict()["unstable"] == ["identity"]
    assert "identity:" in str(audit) and "pickle" in str(audit)


def test_a_pickling_key_is_identity_unstable_for_a_request_built_in_code():
    audit = audit_key_function(pickled_key, CHAT, check_process=False)
    assert audit.unstable == ["identity"]


def test_a_correct_key_is_stable_under_identity_and_says_so():
    audit = audit_key_function(correct_key, CHAT, check_process=False)
    assert audit.ok, str(audit)
    assert "identity" in str(audit).splitlines()[0]  # "stable under identity, reorder, repeat"


# --- 16: order at every depth ----------------------------------------------------------------


def test_dict_order_inside_a_list_of_messages_is_reorder():
    audit = audit_key_function(top_level_sorted_key, CHAT, check_process=False)
    assert audit.unstable == ["reorder"]


# --- 17: keys that are not strings -------------------------------------------------------------


def test_a_tuple_key_is_audited_and_checked_across_processes():
    audit = audit_key_function(tuple_key, CHAT)
    assert audit.missing == ["max_tokens"]
    assert audit.unstable == []
    assert "process" not in audit.skipped


def test_a_tuple_key_with_a_python_hash_inside_is_process():
    assert audit_key_function(hashed_tuple_key, CHAT).unstable == ["process"]


def test_a_key_without_a_stable_text_skips_the_process_check_with_a_reason():
    audit = audit_key_function(opaque_key, CHAT)
    assert audit.ok, str(audit)
    assert "stable" in audit.skipped["process"] and "OpaqueKey" in audit.skipped["process"]


# --- 18: randomness or the hash seed -----------------------------------------------------------


def test_a_uuid4_namespace_is_blamed_on_randomness_not_the_hash_seed():
    audit = audit_key_function(uuid4_namespace_key, CHAT)
    assert audit.unstable == ["process"]
    (detail,) = audit.details
    assert "same PYTHONHASHSEED" in detail and "uuid4" in detail
    assert "built-in hash" not in detail


def test_a_python_hash_is_blamed_on_the_hash_seed():
    audit = audit_key_function(python_hash_key, CHAT)
    assert audit.unstable == ["process"]
    (detail,) = audit.details
    assert "built-in hash" in detail and "uuid4" not in detail


# --- 19: where two keys differ; misspelled --ignore names ----------------------------------------


def test_two_long_keys_that_differ_late_show_where_they_differ():
    audit = audit_key_function(long_counting_key, CHAT, check_process=False)
    detail = next(d for d in audit.details if d.startswith("repeat:"))
    assert "position 101" in detail
    assert "kk1" in detail and "kk2" in detail


def _specdec(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("audit-key", *args, cwd=cwd)


def test_cli_rejects_a_misspelled_ignore_name_listing_the_known_fields(tmp_path):
    (tmp_path / "mykeys.py").write_text(
        "import hashlib, json\n"
        "def good(p): return hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()\n"
    )
    (tmp_path / "example.json").write_text(json.dumps(CHAT))
    done = _specdec(
        tmp_path, "mykeys:good", "--example", "example.json", "--ignore", "max_tokens,tempreature"
    )
    assert done.returncode == 2
    assert done.stdout == ""
    (line,) = done.stderr.strip().splitlines()
    assert "tempreature" in line and "temperature" in line
    assert "max_tokens, messages, model, temperature" in line

    # A sub-path of a known field is fine.
    done = _specdec(tmp_path, "mykeys:good", "--example", "example.json", "--ignore", "messages.role")
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("returned", [None])
def test_a_key_function_returning_none_is_still_an_error(returned):
    from specdec_core.keys.audit import KeyAuditError

    with pytest.raises(KeyAuditError, match="returned None"):
        audit_key_function(lambda p: returned, CHAT)
