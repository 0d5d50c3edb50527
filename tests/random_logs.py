"""Random logs over a small pool of identities spelled many ways (times, redaction, equal values written
differently): what the reference reading of the contract and the incremental store are both held to."""

from __future__ import annotations

import hashlib
import random
from datetime import datetime, timedelta, timezone

from helpers import DROP, rec

from specdec_core.contract.identity import identity

T0 = datetime(2026, 3, 1, 10, 0, tzinfo=timezone.utc)


PROMPTS = ["P1", "P2", "Grüße"]


def spell_ts(ms: int, rng: random.Random) -> object:
    at = T0 + timedelta(milliseconds=ms)
    style = rng.randrange(3)
    if style == 0:
        return int(at.timestamp() * 1000)
    if style == 1:
        return at.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}Z"
    shifted = at.astimezone(timezone(timedelta(hours=2)))
    return shifted.strftime("%Y-%m-%dT%H:%M:%S.") + f"{at.microsecond // 1000:03d}+02:00"


def random_identity(rng: random.Random) -> dict:
    greedy = rng.random() < 0.5
    prompt = rng.choice(PROMPTS)
    fields = {
        "prompt": prompt,
        "target_model": rng.choice(["t8b", "t70b"]),
        "draft_model": rng.choice(["d1", "d2", None, "none"]),
        "num_speculative_tokens": rng.choice([4, 5]),
        "temperature": 0.0 if greedy else rng.choice([0.7, 0.7000000001, 1.0]),
        "top_p": rng.choice([1.0, 0.9]),
        "top_k": rng.choice([None, 0, 40]),
        "max_tokens": rng.choice([16, 64]),
        "seed": rng.choice([None, 1, 2]),
        "stop": rng.choice([None, [], ["b", "a"], ["a", "b", "a"]]),
        "tokenizer_version": rng.choice(["v1", "v1", "v2"]),
    }
    if rng.random() < 0.2:  # redacted: only the prompt's hash is logged
        fields["prompt"] = DROP
        fields["prompt_hash"] = hashlib.sha256(prompt.encode()).hexdigest()
    return fields


def random_log(seed: int, n: int = 400) -> list[dict]:
    rng = random.Random(seed)
    pool = [random_identity(rng) for _ in range(12)]
    records = []
    for i in range(n):
        fields = rng.choice(pool)
        record = rec(
            f"r{i:04d}",
            ts=spell_ts(rng.randrange(0, 60_000, 250), rng),  # 240 instants for 400 rows: many ties
            deployment=rng.choice(["prod", "canary", None]),
            cache_key=rng.choice(["K1", "K2", "K3"]),
            cache_hit=rng.random() < 0.6,
            output_tokens=rng.choice([8, 16, 17, 64, 65]),
            **fields,
        )
        if record["cache_hit"] and rng.random() < 0.3:
            cached = identity(rec("x", **(rng.choice(pool) if rng.random() < 0.5 else fields)))
            if cached.get("top_k", 1) is None and rng.random() < 0.5:
                cached["top_k"] = 0  # the same identity, spelled another way
            record["cached_fingerprint"] = cached
        records.append(record)
    return records
