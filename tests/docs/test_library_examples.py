"""The examples of docs/library.md run as written: on a real Redis, with the decoder on the tiny models under the
example's model names, and the test function the key-audit example defines passes (and fails on a narrow key)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import redis
from helpers import free_port, start_redis

from specdec_core import DecodeResult, cache_key, fingerprint

PAGE = Path(__file__).resolve().parents[2] / "docs" / "library.md"
EXAMPLE_REDIS = "redis://localhost:6379/0"


def python_blocks() -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), flags=re.S | re.M)


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    port = free_port()
    server = start_redis(port, tmp_path_factory.mktemp("redis"))
    yield f"redis://127.0.0.1:{port}/0"
    server.terminate()
    server.wait(10)


@pytest.fixture
def example_models(tiny_registry, tmp_path, monkeypatch):
    """A registry file naming the tiny models as the examples do; the example runs in its own folder."""
    target, draft = tiny_registry.models["tiny-target"].path, tiny_registry.models["tiny-draft-a"].path
    tokenizer = tiny_registry.tokenizers["tiny-tok-v1"].path
    (tmp_path / "specdec.toml").write_text(
        f'[models.smollm2-135m]\npath = {json.dumps(str(target))}\n'
        f'[models.smollm2-135m-draft-l4]\npath = {json.dumps(str(draft))}\n'
        f'[tokenizers.tok-v1]\npath = {json.dumps(str(tokenizer))}\nchat_template = false\n', encoding="utf-8")
    monkeypatch.setenv("SPECDEC_CONFIG", str(tmp_path / "specdec.toml"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def run_block(block: str, **replace: str) -> dict:
    for old, new in replace.items():
        assert old in block, old
        block = block.replace(old, new)
    namespace: dict = {"__name__": "library_example"}
    exec(compile(block, str(PAGE), "exec"), namespace)
    return namespace


def test_the_page_has_its_three_examples():
    blocks = python_blocks()
    assert len(blocks) == 3 and "DecodeService(" in blocks[0] and "invalidate(" in blocks[1]
    assert "assert_key_covers" in blocks[2]


def test_the_service_example_keys_decodes_and_logs_through_redis(redis_url, example_models):
    ns = run_block(python_blocks()[0], **{EXAMPLE_REDIS: redis_url})
    req, result, service = ns["req"], ns["result"], ns["service"]
    assert cache_key(req, namespace="prod") == f"specdec:prod:v1:{fingerprint(req)}"  # as its comment says
    assert isinstance(result, DecodeResult) and result.output_tokens == len(result.token_ids)
    assert result.environment["seed"] is not None  # decoded here, by the speculative decoder
    assert redis.Redis.from_url(redis_url).exists(cache_key(req, namespace="prod")) == 1
    again = service.decode(req)  # the read-through cache now holds it, in Redis
    assert again.text == result.text and service.counters()["hits"] == 1
    service.close()
    logged = [json.loads(line) for line in (example_models / "requests.jsonl").read_text().splitlines()]
    assert [r["cache_hit"] for r in logged] == [False, True] and logged[0]["deployment"] == "prod"


def test_the_key_audit_example_passes_and_would_fail_a_narrow_key():
    ns = run_block(python_blocks()[2])
    tests = [f for name, f in ns.items() if name.startswith("test_")]
    assert len(tests) == 1
    tests[0]()
    ns["our_cache_key"] = lambda params: params["prompt"]  # a key as narrow as the incident's
    with pytest.raises(AssertionError, match="missing max_tokens"):
        ns["test_our_cache_key_covers_the_request"]()
