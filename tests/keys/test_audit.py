"""The key auditor: each kind of narrow or unstable key is caught with the right field or kind."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from helpers import run_cli
from hypothesis import given, settings
from hypothesis import strategies as st
from keyfns import (
    _digest,
    correct_key,
    counting_key,
    first_stop_only,
    ignores_max_tokens,
    ignores_nested_tags,
    ignores_prompt,
    ignores_seed,
    ignores_stop,
    ignores_stream,
    ignores_temperature_decimals,
    memoized_on_prompt,
    mutating_key,
    order_dependent_at_depth_2,
    python_hash_key,
    raises_on_everything,
    returns_a_list,
)

import specdec_core
from specdec_core.contract import NON_IDENTITY_FIELDS
from specdec_core.keys import dict_key_adapter
from specdec_core.keys.audit import KeyAuditError, audit_key_function
from specdec_core.testing import assert_key_covers

# A generic request with one field of each shape the auditor has to change.
EXAMPLE: dict[str, Any] = {
    "request_id": "r-1",
    "prompt": "Explain speculative decoding.",
    "temperature": 0.7,
    "max_tokens": 128,
    "stream": False,
    "stop": ["\n\n", "###"],
    "options": {"sampling": {"top_k": 40, "top_p": 0.9}, "tags": ["a", "b"]},
    "seed": None,
}

# A sampled request: with temperature 0 our identity drops seed/top_p/top_k on purpose.
RECORD: dict[str, Any] = {
    "request_id": "r-1",
    "ts": "2024-05-01T12:00:00Z",
    "deployment": "prod",
    "prompt": "Explain speculative decoding.",
    "target_model": "smollm2-360m",
    "draft_model": "smollm2-135m",
    "num_speculative_tokens": 4,
    "temperature": 0.7,
    "top_p": 0.9,
    "top_k": 40,
    "max_tokens": 128,
    "seed": 1234,
    "stop": ["\n\n", "###"],
    "tokenizer_version": "smollm2-v1",
}


# --- missing fields ---------------------------------------------------------------------------


def test_correct_key_yields_no_finding():
    audit = audit_key_function(correct_key, EXAMPLE)
    assert audit.ok
    assert (audit.missing, audit.unstable, audit.skipped) == ([], [], {})
    assert audit.checked_fields == sorted(EXAMPLE)
    assert str(audit).startswith("key audit: ok")


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(st.dictionaries(st.text(max_size=8), _json, min_size=1, max_size=5))
def test_a_correct_key_is_never_flagged_whatever_the_request(example):
    audit = audit_key_function(correct_key, example, check_process=False)
    assert audit.ok, str(audit)


@pytest.mark.parametrize(
    ("key_fn", "field"),
    [
        (ignores_max_tokens, "max_tokens"),
        (ignores_temperature_decimals, "temperature"),
        (ignores_prompt, "prompt"),
        (ignores_stream, "stream"),
        (ignores_stop, "stop"),
        (first_stop_only, "stop"),
        (ignores_nested_tags, "options"),
        (ignores_seed, "seed"),
    ],
)
def test_a_key_that_ignores_a_field_reports_that_field_only(key_fn, field):
    audit = audit_key_function(key_fn, EXAMPLE, check_process=False)
    assert audit.missing == [field]
    assert audit.unstable == []
    assert not audit.ok
    assert f"missing {field}:" in str(audit)


def test_a_nested_miss_names_the_sub_path():
    audit = audit_key_function(ignores_nested_tags, EXAMPLE, check_process=False)
    assert "options.tags" in audit.details[0]


def test_ignore_is_respected_for_fields_and_sub_paths():
    assert audit_key_function(ignores_max_tokens, EXAMPLE, ignore=["max_tokens"], check_process=False).ok
    audit = audit_key_function(ignores_nested_tags, EXAMPLE, ignore=["options.tags"], check_process=False)
    assert audit.ok and "options" in audit.checked_fields
    # Ignoring a field the key does use changes nothing else.
    assert audit_key_function(
        ignores_max_tokens, EXAMPLE, ignore=["prompt"], check_process=False
    ).missing == ["max_tokens"]


def test_a_field_every_change_of_which_is_rejected_is_unchecked_not_covered():
    def strict(params: dict[str, Any]) -> str:
        if params["prompt_hash"] != "ab" * 32:
            raise ValueError("prompt_hash: must match")
        return _digest(params)

    audit = audit_key_function(strict, {"prompt_hash": "ab" * 32, "n": 1}, check_process=False)
    assert audit.ok and audit.checked_fields == ["n"]
    assert "prompt_hash" in audit.unchecked
    assert "unchecked field prompt_hash" in str(audit)


# --- instability --------------------------------------------------------------------------------


def test_dict_order_at_depth_2_is_reorder():
    audit = audit_key_function(order_dependent_at_depth_2, EXAMPLE, check_process=False)
    assert audit.unstable == ["reorder"]
    assert audit.missing == []


def test_python_hash_is_process():
    audit = audit_key_function(python_hash_key, EXAMPLE)
    assert audit.unstable == ["process"]
    assert "PYTHONHASHSEED" in str(audit)


def test_memoizing_on_part_of_the_request_is_caught():
    audit = audit_key_function(memoized_on_prompt, EXAMPLE, check_process=False)
    assert not audit.ok
    assert set(audit.missing) == set(EXAMPLE) - {"prompt"}


def test_a_key_that_changes_per_call_is_repeat():
    audit = audit_key_function(counting_key, EXAMPLE, check_process=False)
    assert "repeat" in audit.unstable


def test_a_key_that_modifies_its_argument_is_repeat():
    audit = audit_key_function(mutating_key, EXAMPLE, check_process=False)
    assert audit.unstable == ["repeat"]
    assert "modified the request" in str(audit)
    assert "request_id" in audit.missing  # it drops request_id from the key as well


def test_a_lambda_skips_process_and_says_so():
    audit = audit_key_function(lambda p: _digest(p), EXAMPLE)
    assert audit.ok
    assert "process" in audit.skipped and "process" not in audit.unstable
    assert "lambda" in audit.skipped["process"]
    assert "skipped process" in str(audit)
    assert "process" not in str(audit).splitlines()[0]  # never claimed stable across processes


def test_a_local_function_skips_process_unless_importable_is_given():
    def local(params: dict[str, Any]) -> str:
        return python_hash_key(params)

    assert "process" in audit_key_function(local, EXAMPLE).skipped
    audit = audit_key_function(local, EXAMPLE, importable=f"{__name__}:python_hash_key")
    assert audit.unstable == ["process"]


def test_a_module_in_a_tmp_dir_is_checked_across_processes(tmp_path, monkeypatch):
    (tmp_path / "tmp_keys.py").write_text(
        "import hashlib, json\n"
        "def stable(p): return hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()\n"
        "def salted(p): return hash(p['prompt'] + json.dumps(p, sort_keys=True))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import tmp_keys

    assert audit_key_function(tmp_keys.stable, EXAMPLE).skipped == {}
    assert audit_key_function(tmp_keys.salted, EXAMPLE).unstable == ["process"]


def test_a_key_function_that_fails_on_the_example_is_an_error():
    with pytest.raises(KeyAuditError, match="raised on the example"):
        audit_key_function(raises_on_everything, EXAMPLE)
    with pytest.raises(KeyAuditError, match="must be a hashable value"):
        audit_key_function(returns_a_list, EXAMPLE)


# --- our own keys --------------------------------------------------------------------------------


def test_our_cache_key_is_clean_through_the_adapter():
    audit = audit_key_function(dict_key_adapter("full"), RECORD, ignore=NON_IDENTITY_FIELDS)
    assert audit.ok, str(audit)
    assert audit.skipped == {}
    assert audit.checked_fields == sorted(set(RECORD) - set(NON_IDENTITY_FIELDS))


def test_prompt_only_scheme_is_caught_missing_and_process():
    audit = audit_key_function(dict_key_adapter("prompt_only"), RECORD, ignore=NON_IDENTITY_FIELDS)
    assert audit.missing == sorted(set(RECORD) - set(NON_IDENTITY_FIELDS) - {"prompt"})
    assert audit.unstable == ["process"]


def test_model_prompt_scheme_is_caught_missing():
    audit = audit_key_function(dict_key_adapter("model_prompt"), RECORD, ignore=NON_IDENTITY_FIELDS)
    assert audit.missing == sorted(set(RECORD) - set(NON_IDENTITY_FIELDS) - {"prompt", "target_model"})
    assert audit.unstable == []


def test_importing_the_library_or_keys_loads_neither_the_auditor_nor_subprocess():
    # keys used to re-export the auditor (a cycle keys <-> audit that loaded subprocess on `import specdec_core`).
    code = ("import sys, specdec_core, specdec_core.keys; "
            "print(sorted(m for m in ('specdec_core.keys.audit', 'subprocess') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    assert specdec_core.audit_key_function is audit_key_function  # the public surface still offers it, lazily
    with pytest.raises(ValueError, match="unknown"):
        dict_key_adapter("no_such_scheme")


def test_assert_key_covers_raises_with_the_audit_text():
    assert_key_covers(correct_key, EXAMPLE)
    with pytest.raises(AssertionError, match="missing max_tokens") as failure:
        assert_key_covers(ignores_max_tokens, EXAMPLE, ignore=["request_id"])
    assert str(failure.value) == str(audit_key_function(ignores_max_tokens, EXAMPLE, ignore=["request_id"]))


# --- command line ------------------------------------------------------------------------------

_KEYS_MODULE = textwrap.dedent(
    """
    import hashlib, json

    def good(p):
        return hashlib.sha256(json.dumps(p, sort_keys=True).encode()).hexdigest()

    def narrow(p):
        return hashlib.sha256(p["prompt"].encode()).hexdigest()

    def salted(p):
        return str(hash(json.dumps(p, sort_keys=True)))

    NOT_A_FUNCTION = 3
    """
)


@pytest.fixture
def cli_dir(tmp_path: Path) -> Path:
    (tmp_path / "mykeys.py").write_text(_KEYS_MODULE)
    (tmp_path / "example.json").write_text(json.dumps(EXAMPLE))
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "bad.json").write_text("{not json")
    return tmp_path


def _specdec(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("audit-key", *args, cwd=cwd)


def test_cli_exits_0_with_a_clean_json_object(cli_dir):
    done = _specdec(cli_dir, "mykeys:good", "--example", "example.json", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] is True
    assert (result["missing"], result["unstable"], result["skipped"]) == ([], [], {})


def test_cli_exits_1_and_lists_findings_sorted(cli_dir):
    done = _specdec(
        cli_dir, "mykeys:narrow", "--example", "example.json", "--ignore", "request_id,stream", "--json"
    )
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert result["ok"] is False
    assert result["missing"] == ["max_tokens", "options", "seed", "stop", "temperature"]
    assert result["unstable"] == []

    done = _specdec(cli_dir, "mykeys:salted", "--example", "example.json", "--json")
    assert done.returncode == 1, done.stderr
    assert json.loads(done.stdout)["unstable"] == ["process"]


def test_cli_text_output_names_the_finding(cli_dir):
    done = _specdec(cli_dir, "mykeys:narrow", "--example", "example.json")
    assert done.returncode == 1
    assert "missing max_tokens" in done.stdout


def test_cli_names_the_identity_fields_the_example_lacks_as_not_tried(cli_dir):
    """An example that holds only a prompt can't show a prompt-only key narrow: the audit says which of the log
    contract's identity fields it never varied, instead of a bare ok."""
    (cli_dir / "prompt_only.json").write_text(json.dumps({"prompt": "hi"}))
    done = _specdec(cli_dir, "mykeys:narrow", "--example", "prompt_only.json")
    assert done.returncode == 0, done.stderr
    head, *rest = done.stdout.splitlines()
    assert head.startswith("key audit: ok (1 field of those tried changes the key")
    assert any(line.startswith("  not tried: draft_model, max_tokens,") and "temperature" in line for line in rest)
    # Fields the requests never carry may be ignored though the example lacks them; others still may not.
    done = _specdec(cli_dir, "mykeys:narrow", "--example", "prompt_only.json", "--json", "--ignore", "top_k,seed")
    untried = json.loads(done.stdout)["untried"]
    assert "temperature" in untried and "top_k" not in untried and "seed" not in untried
    assert _specdec(cli_dir, "mykeys:narrow", "--example", "prompt_only.json", "--ignore", "tempreature").returncode == 2
    # A fuller example leaves fewer untried: its nested options.sampling holds top_k and top_p.
    assert json.loads(_specdec(cli_dir, "mykeys:good", "--example", "example.json", "--json").stdout)["untried"] == [
        "draft_model", "num_speculative_tokens", "target_model", "tokenizer_version"]
    assert audit_key_function(correct_key, {"prompt": "hi"}, check_process=False).untried == []  # the library's default

@pytest.mark.parametrize(
    ("target", "example", "reason"),
    [
        ("nosuchmodule:good", "example.json", "not found"),
        ("mykeys:nosuchfunction", "example.json", "no attribute"),
        ("mykeys:NOT_A_FUNCTION", "example.json", "not a function"),
        ("mykeys", "example.json", "MODULE:FUNCTION"),
        ("mykeys:good", "missing.json", "cannot read"),
        ("mykeys:good", "bad.json", "not valid JSON"),
        ("mykeys:good", "list.json", "JSON object"),
    ],
)
def test_cli_usage_errors_exit_2_with_one_line(cli_dir, target, example, reason):
    done = _specdec(cli_dir, target, "--example", example)
    assert done.returncode == 2
    assert done.stdout == ""
    assert reason in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
