"""The request identity and fingerprint, pinned against ../shared/log-schema.md."""

from __future__ import annotations

import dataclasses
import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from specdec_core.contract import IDENTITY_FIELDS
from specdec_core.contract.identity import (
    DecodeRequest,
    canonical_json,
    canonicalize_identity,
    differing_fields,
    fingerprint,
    fingerprint_of_identity,
    identity,
    identity_json,
)

HELLO_SHA256 = "185f8db32271fe25f561a6fc938b2e264306ec304eda518007d1764826381969"


def test_fingerprint_of_a_greedy_request_is_sha256_of_the_literal_canonical_json():
    req = DecodeRequest(
        target_model="t", tokenizer_version="tok-1", max_tokens=8, temperature=0, prompt="Hello"
    )
    literal = (
        '{"draft_model":null,"max_tokens":8,"num_speculative_tokens":null,'
        '"prompt":"185f8db32271fe25f561a6fc938b2e264306ec304eda518007d1764826381969",'
        '"stop":[],"target_model":"t","temperature":0.0,"tokenizer_version":"tok-1"}'
    )
    assert canonical_json(identity(req)) == literal
    assert fingerprint(req) == hashlib.sha256(literal.encode("utf-8")).hexdigest()
    assert fingerprint(req) == "7dca63c17cc9505ed6e0a804c7f5474dc8aaca4d407b886eb180080c93296f82"


def test_fingerprint_of_a_sampled_request_keeps_non_ascii_and_sorts_stop():
    req = DecodeRequest(
        target_model="modèle-7b",
        tokenizer_version="tok-2",
        max_tokens=32,
        temperature=0.5,
        prompt="Grüße",
        draft_model="none",
        num_speculative_tokens=4,
        top_p=0.95,
        top_k=0,
        seed=3,
        stop=("b", "a", "b"),
    )
    prompt_sha = hashlib.sha256("Grüße".encode()).hexdigest()
    literal = (
        '{"draft_model":null,"max_tokens":32,"num_speculative_tokens":4,'
        f'"prompt":"{prompt_sha}","seed":3,"stop":["a","b"],"target_model":"modèle-7b",'
        '"temperature":0.5,"tokenizer_version":"tok-2","top_k":null,"top_p":0.95}'
    )
    assert canonical_json(identity(req)) == literal
    assert fingerprint(req) == hashlib.sha256(literal.encode("utf-8")).hexdigest()


def test_a_stop_string_is_a_list_of_one():
    """log-schema.md: `stop` is a list of strings, a string, or null (a string is a list of one)."""
    record = {"prompt": "p", "target_model": "t", "tokenizer_version": "v", "max_tokens": 4, "temperature": 0.5}
    one = fingerprint({**record, "stop": "###"})
    assert one == fingerprint({**record, "stop": ["###"]}) == fingerprint(DecodeRequest(**record, stop="###"))
    assert one != fingerprint({**record, "stop": ["#"]}) and one != fingerprint(record)
    assert DecodeRequest.from_record({**record, "stop": "###"}).stop == ("###",)


def test_identity_of_a_record_with_only_the_prompt_hash_equals_that_of_the_prompt():
    with_prompt = {
        "prompt": "Hello",
        "target_model": "t",
        "tokenizer_version": "v",
        "max_tokens": 4,
        "temperature": 0,
    }
    with_hash = {**with_prompt, "prompt_hash": HELLO_SHA256.upper()}
    del with_hash["prompt"]
    assert identity(with_prompt) == identity(with_hash)
    assert identity(with_hash)["prompt"] == HELLO_SHA256


GOOD = {"prompt": "p", "target_model": "t", "tokenizer_version": "v", "max_tokens": 4, "temperature": 0.5}


@pytest.mark.parametrize(
    ("field", "change"),
    [
        ("record", None),
        ("target_model", {"target_model": None}),
        ("target_model", {"target_model": ""}),
        ("target_model", {"target_model": 7}),
        ("tokenizer_version", {"tokenizer_version": None}),
        ("max_tokens", {"max_tokens": 0}),
        ("max_tokens", {"max_tokens": "10"}),
        ("max_tokens", {"max_tokens": True}),
        ("max_tokens", {"max_tokens": 2.5}),
        ("temperature", {"temperature": -0.1}),
        ("temperature", {"temperature": "hot"}),
        ("temperature", {"temperature": float("nan")}),
        ("top_p", {"top_p": 0}),
        ("top_p", {"top_p": 1.5}),
        ("top_k", {"top_k": -1}),
        ("seed", {"seed": 1.5}),
        ("num_speculative_tokens", {"num_speculative_tokens": "4"}),
        ("stop", {"stop": 5}),
        ("stop", {"stop": ["ok", 3]}),
        ("prompt", {"prompt": None}),
        ("prompt", {"prompt": 42}),
        ("prompt_hash", {"prompt": None, "prompt_hash": "not-a-hash"}),
        ("prompt_hash", {"prompt_hash": HELLO_SHA256}),  # does not match prompt "p"
        ("draft_model", {"draft_model": 1}),
    ],
)
def test_from_record_rejects_bad_input_naming_the_field(field, change):
    record = None if change is None else {**GOOD, **change}
    with pytest.raises(ValueError, match=rf"^{field}:"):
        DecodeRequest.from_record(record)


@pytest.mark.parametrize("missing", ["target_model", "tokenizer_version", "max_tokens", "temperature"])
def test_from_record_names_a_missing_required_field(missing):
    record = {k: v for k, v in GOOD.items() if k != missing}
    with pytest.raises(ValueError, match=rf"^{missing}: required"):
        DecodeRequest.from_record(record)


def test_from_record_keeps_fields_it_does_not_know_out_of_the_identity():
    req = DecodeRequest.from_record({**GOOD, "request_id": "r1", "cache_hit": True})
    assert req.extra == {"request_id": "r1", "cache_hit": True}
    assert identity(req) == identity(GOOD)


def test_differing_fields_skips_fields_left_out_of_a_greedy_identity():
    sampled = identity({**GOOD, "seed": 1, "max_tokens": 9})
    greedy = identity({**GOOD, "temperature": 0, "seed": 2})
    assert differing_fields(sampled, greedy) == ["max_tokens", "temperature"]


# --- properties ------------------------------------------------------------------------------

MICRO = 10**6
noise = st.floats(min_value=-9e-8, max_value=9e-8, allow_nan=False)
names = st.text(min_size=1, max_size=12)  # quotes, backslashes, control and non-ASCII characters
stops = st.none() | st.lists(
    st.sampled_from(["\n", "###", "</s>", "é", "User:"]) | st.text(max_size=5), max_size=4
)


@st.composite
def requests(draw) -> DecodeRequest:
    # Numbers on the 6-decimal grid, so float noise added later can't cross a rounding boundary.
    greedy = draw(st.booleans())
    temperature = 0.0 if greedy else draw(st.integers(1, 2 * MICRO)) / MICRO
    return DecodeRequest(
        prompt=draw(st.text(max_size=40)),
        target_model=draw(st.sampled_from(["llama-3-8b", "qwen2.5-7b", "smollm2-360m"]) | names),
        draft_model=draw(st.sampled_from([None, "none", "smollm2-135m", "eagle-head"]) | names),
        num_speculative_tokens=draw(st.none() | st.integers(0, 16)),
        temperature=temperature,
        top_p=draw(st.integers(1, MICRO)) / MICRO,
        top_k=draw(st.none() | st.integers(0, 100)),
        max_tokens=draw(st.integers(1, 4096)),
        seed=draw(st.none() | st.integers(-(2**31), 2**31)),
        stop=draw(stops),
        tokenizer_version=draw(st.sampled_from(["hf-4.44", "hf-4.46"]) | names),
    )


def _nudge(value: float, delta: float, *, low_open: bool, high: float | None) -> float:
    nudged = value + delta
    if nudged < 0 or (low_open and nudged <= 0) or (high is not None and nudged > high):
        return value
    return nudged


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(req=requests(), rnd=st.randoms(use_true_random=False), dt=noise, dp=noise)
def test_identity_is_invariant_under_the_contract_equivalences(req, rnd, dt, dp):
    stop = None
    if req.stop:
        shuffled = list(req.stop) + rnd.sample(list(req.stop), k=len(req.stop))
        rnd.shuffle(shuffled)
        stop = tuple(shuffled)
    elif req.stop is None:
        stop = ()
    equivalent = dataclasses.replace(
        req,
        prompt=None,
        prompt_hash=req.prompt_sha256,
        draft_model={None: "none", "none": None}.get(req.draft_model, req.draft_model),
        top_k={None: 0, 0: None}.get(req.top_k, req.top_k),
        temperature=_nudge(req.temperature, dt, low_open=False, high=None),
        top_p=_nudge(req.top_p, dp, low_open=True, high=1.0),
        stop=stop,
    )
    assert identity(equivalent) == identity(req)
    assert fingerprint(equivalent) == fingerprint(req)


@settings(max_examples=500, deadline=None)
@given(req=requests())
def test_fast_identity_json_equals_the_generic_canonical_json(req):
    assert identity_json(req) == canonical_json(identity(req))
    assert fingerprint(req) == fingerprint_of_identity(identity(req))


@pytest.mark.parametrize("field", ["num_speculative_tokens", "top_k", "seed", "max_tokens"])
def test_integer_fields_written_as_floats_have_the_same_identity(field):
    # pandas turns a nullable integer column into floats: 4 comes back as 4.0.
    assert fingerprint({**GOOD, field: 4.0}) == fingerprint({**GOOD, field: 4})
    assert isinstance(DecodeRequest.from_record({**GOOD, field: 4.0}).to_record()[field], int)


@settings(max_examples=300, deadline=None)
@given(req=requests())
def test_identity_round_trips_through_its_canonical_json(req):
    ident = identity(req)
    assert json.loads(canonical_json(ident)) == ident
    rebuilt = canonicalize_identity(json.loads(canonical_json(ident)))
    assert rebuilt == ident
    assert fingerprint_of_identity(rebuilt) == fingerprint(req)


@settings(max_examples=200, deadline=None)
@given(req=requests(), seed=st.integers(0, 10**6), top_p=st.integers(1, MICRO), top_k=st.integers(0, 50))
def test_greedy_identity_ignores_seed_top_p_and_top_k(req, seed, top_p, top_k):
    greedy = dataclasses.replace(req, temperature=0.0)
    other = dataclasses.replace(greedy, seed=seed, top_p=top_p / MICRO, top_k=top_k)
    assert identity(other) == identity(greedy)
    assert not {"seed", "top_p", "top_k"} & identity(greedy).keys()
    assert set(identity(greedy)) == set(IDENTITY_FIELDS) - {"seed", "top_p", "top_k"}


@settings(max_examples=300, deadline=None)
@given(
    req=requests(),
    temperature=st.floats(min_value=0, max_value=10, allow_nan=False) | st.sampled_from([-0.0, 0.0, 1, 2]),
    top_p=st.floats(min_value=1e-9, max_value=1.0) | st.sampled_from([1, 0.5]),
)
def test_fast_identity_json_equals_the_generic_path_for_any_number(req, temperature, top_p):
    # Off the 6-decimal grid too: the fast path's memo of rounded numbers must agree with json.dumps.
    changed = dataclasses.replace(req, temperature=temperature, top_p=top_p)
    assert identity_json(changed) == canonical_json(identity(changed))


def test_negative_zero_temperature_is_greedy_and_keys_like_zero():
    zero = DecodeRequest.from_record({**GOOD, "temperature": 0.0})
    negative = DecodeRequest.from_record({**GOOD, "temperature": -0.0})
    assert fingerprint(negative) == fingerprint(zero)
    assert '"temperature":0.0' in identity_json(negative)


def test_the_memoised_identity_leaves_equality_alone_and_is_not_copied():
    a = DecodeRequest.from_record(GOOD)
    b = DecodeRequest.from_record(GOOD)
    first = fingerprint(a)
    assert a == b and len({a, b}) == 1  # the memo fields are not part of eq or the dataclass hash
    assert fingerprint(a) == first == fingerprint(b)
    # A changed copy starts without the memo, so its key follows its own fields.
    changed = dataclasses.replace(a, max_tokens=a.max_tokens + 1)
    assert fingerprint(changed) != first
    assert fingerprint(changed) == fingerprint_of_identity(identity(changed))
