"""The correct cache key covers the full identity and nothing else; the narrow schemes don't."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specdec_core.contract import IDENTITY_FIELDS
from specdec_core.contract.identity import DecodeRequest, sha256_hex
from specdec_core.keys.schemes import (
    KEY_SCHEMA_VERSION,
    KEY_SCHEMES,
    cache_key,
    key_scheme,
    model_prompt_key,
    namespace_prefix,
    prompt_only_key,
)

BASE = DecodeRequest(
    prompt="Summarise the incident.",
    target_model="llama-3-8b",
    draft_model="llama-3-1b",
    num_speculative_tokens=4,
    temperature=0.7,
    top_p=0.9,
    top_k=40,
    max_tokens=128,
    seed=1234,
    stop=("\n\n",),
    tokenizer_version="hf-4.44",
)

FIELD_CHANGES = {
    "prompt": "Summarise the incident!",
    "target_model": "llama-3-70b",
    "draft_model": "eagle-head",
    "num_speculative_tokens": 5,
    "temperature": 0.8,
    "top_p": 0.95,
    "top_k": 50,
    "max_tokens": 129,
    "seed": 1235,
    "stop": ("\n\n", "###"),
    "tokenizer_version": "hf-4.46",
}


def test_every_identity_field_has_a_key_change_case():
    assert set(FIELD_CHANGES) == set(IDENTITY_FIELDS)


@pytest.mark.parametrize(("field", "value"), sorted(FIELD_CHANGES.items()))
def test_changing_an_identity_field_changes_the_cache_key(field, value):
    changed = dataclasses.replace(BASE, **{field: value})
    assert cache_key(changed) != cache_key(BASE)


def test_cache_key_carries_namespace_and_schema_version():
    key = cache_key(BASE, "exp-42")
    assert key.startswith(namespace_prefix("exp-42") + KEY_SCHEMA_VERSION + ":")
    assert cache_key(BASE, "exp-42") != cache_key(BASE, "exp-43")


@pytest.mark.parametrize("namespace", ["", "a:b", "a*", "what?", "x[1]"])
def test_namespace_that_would_break_prefix_matching_is_rejected(namespace):
    with pytest.raises(ValueError, match="namespace"):
        cache_key(BASE, namespace)


def _same_key(a, b) -> bool:
    return cache_key(a) == cache_key(b)


def test_prompt_and_its_hash_give_the_same_key():
    hashed = dataclasses.replace(BASE, prompt=None, prompt_hash=sha256_hex(BASE.prompt))
    assert _same_key(BASE, hashed)


def test_draft_model_none_string_and_null_give_the_same_key():
    assert _same_key(
        dataclasses.replace(BASE, draft_model="none"), dataclasses.replace(BASE, draft_model=None)
    )
    assert not _same_key(BASE, dataclasses.replace(BASE, draft_model=None))


def test_top_k_zero_and_null_give_the_same_key():
    assert _same_key(dataclasses.replace(BASE, top_k=0), dataclasses.replace(BASE, top_k=None))


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_numbers_equal_to_six_decimals_give_the_same_key(field):
    assert _same_key(
        dataclasses.replace(BASE, **{field: 0.7}), dataclasses.replace(BASE, **{field: 0.7000000001})
    )


@pytest.mark.parametrize("field", ["temperature", "top_p"])
def test_numbers_differing_in_the_sixth_decimal_give_different_keys(field):
    assert not _same_key(
        dataclasses.replace(BASE, **{field: 0.7}), dataclasses.replace(BASE, **{field: 0.700001})
    )


def test_stop_order_and_repeats_do_not_change_the_key():
    a = dataclasses.replace(BASE, stop=("###", "\n\n", "User:"))
    b = dataclasses.replace(BASE, stop=("User:", "\n\n", "###", "User:"))
    assert _same_key(a, b)


def test_stop_null_and_empty_list_give_the_same_key():
    assert _same_key(dataclasses.replace(BASE, stop=None), dataclasses.replace(BASE, stop=()))
    assert _same_key(
        DecodeRequest.from_record({**_record(), "stop": None}), DecodeRequest.from_record(_record())
    )


def _record() -> dict:
    return {
        "prompt": "hi",
        "target_model": "t",
        "tokenizer_version": "v",
        "max_tokens": 4,
        "temperature": 0.2,
        "stop": [],
    }


@pytest.mark.parametrize(("field", "value"), [("seed", 99), ("top_p", 0.5), ("top_k", 7), ("top_k", None)])
def test_greedy_requests_ignore_sampling_fields_in_the_key(field, value):
    greedy = dataclasses.replace(BASE, temperature=0.0)
    assert _same_key(greedy, dataclasses.replace(greedy, **{field: value}))


@pytest.mark.parametrize(("field", "value"), [("draft_model", "eagle-head"), ("num_speculative_tokens", 8)])
def test_greedy_requests_still_key_on_the_draft(field, value):
    greedy = dataclasses.replace(BASE, temperature=0.0)
    assert not _same_key(greedy, dataclasses.replace(greedy, **{field: value}))


def test_narrow_schemes_collide_where_the_full_key_does_not():
    other = dataclasses.replace(BASE, draft_model="eagle-head", temperature=0.2, max_tokens=16)
    assert prompt_only_key(BASE, "default") == prompt_only_key(other, "default")
    assert model_prompt_key(BASE, "default") == model_prompt_key(other, "default")
    assert cache_key(BASE) != cache_key(other)


def test_key_scheme_resolves_names_and_rejects_unknown_ones():
    assert key_scheme("full")(BASE, "default") == cache_key(BASE)
    assert set(KEY_SCHEMES) == {"prompt_only", "model_prompt", "full"}
    with pytest.raises(ValueError, match="unknown"):
        key_scheme("prompt+model")


_KEYS_IN_CHILD = """
import json
from specdec_core.keys.schemes import cache_key, prompt_only_key
from specdec_core.contract.identity import DecodeRequest
req = DecodeRequest(prompt="Summarise the incident.", target_model="t", tokenizer_version="v",
                    max_tokens=8, temperature=0.7, stop=("b", "a"))
print(json.dumps({"full": cache_key(req), "prompt_only": prompt_only_key(req, "default")}))
"""


def _keys_in_subprocess(hash_seed: str) -> dict:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    root = Path(__file__).resolve().parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    out = subprocess.run(
        [sys.executable, "-c", _KEYS_IN_CHILD],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return json.loads(out.stdout)


def test_cache_key_is_stable_across_processes_while_prompt_only_hash_is_not():
    first, second = _keys_in_subprocess("1"), _keys_in_subprocess("2")
    assert first["full"] == second["full"]
    # The classic bug: Python's hash() differs per process, so replicas never share entries.
    assert first["prompt_only"] != second["prompt_only"]
