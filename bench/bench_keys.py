"""Keys per second: the correct cache key vs the floor, a bare SHA-256 of the already
serialised canonical JSON (what any key must at least do).

    .venv/bin/python bench/bench_keys.py [--requests 5000] [--rounds 7]

Prints one row per stage so a regression shows where the time went.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specdec_core.keys import cache_key, model_prompt_key  # noqa: E402
from specdec_core.request import (  # noqa: E402
    DecodeRequest,
    canonical_json,
    fingerprint,
    fingerprint_of_identity,
    identity,
)


def workload(n: int, seed: int = 0) -> list[DecodeRequest]:
    """A varied production-like mix: prompts of 50-2000 characters, greedy and sampled, with and without drafts."""
    rnd = random.Random(seed)
    words = "the cache key must cover every field that changes the output of speculative decoding".split()
    requests = []
    for i in range(n):
        prompt = " ".join(rnd.choice(words) for _ in range(rnd.randint(8, 300))) + f" #{i}"
        greedy = rnd.random() < 0.4
        requests.append(
            DecodeRequest(
                prompt=prompt,
                target_model=rnd.choice(["llama-3-8b", "qwen2.5-7b", "smollm2-360m"]),
                draft_model=rnd.choice([None, "none", "llama-3-1b", "smollm2-135m", "eagle-head"]),
                num_speculative_tokens=rnd.choice([None, 3, 4, 5, 8]),
                temperature=0.0 if greedy else round(rnd.uniform(0.1, 1.5), 2),
                top_p=rnd.choice([1.0, 0.9, 0.95]),
                top_k=rnd.choice([None, 0, 20, 50]),
                max_tokens=rnd.choice([16, 64, 256, 1024]),
                seed=rnd.choice([None, rnd.randint(0, 2**31)]),
                stop=rnd.choice([None, (), ("\n\n",), ("###", "</s>", "###")]),
                tokenizer_version=rnd.choice(["hf-4.44", "hf-4.46"]),
            )
        )
    return requests


def best_rates(stages: dict[str, Callable[[], None]], count: int, rounds: int) -> dict[str, float]:
    """Best rate of each stage; stages interleave within a round so load drift on a
    shared machine hits them alike."""
    best = dict.fromkeys(stages, float("inf"))
    for _ in range(rounds):
        for name, fn in stages.items():
            started = time.perf_counter()
            fn()
            best[name] = min(best[name], time.perf_counter() - started)
    return {name: count / seconds for name, seconds in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    requests = workload(args.requests)
    payloads = [canonical_json(identity(r)).encode("utf-8") for r in requests]
    prompts = [r.prompt.encode("utf-8") for r in requests]
    n = len(requests)
    sha256 = hashlib.sha256

    def floor() -> None:
        for p in payloads:
            sha256(p).hexdigest()

    def floor_with_prompt() -> None:
        for prompt, p in zip(prompts, payloads, strict=True):
            sha256(prompt).hexdigest()
            sha256(p).hexdigest()

    def identities() -> None:
        for r in requests:
            identity(r)

    def fingerprints() -> None:
        for r in requests:
            fingerprint(r)

    def generic_fingerprints() -> None:
        for r in requests:
            fingerprint_of_identity(identity(r))

    def full_keys() -> None:
        for r in requests:
            cache_key(r, "default")

    def narrow_keys() -> None:
        for r in requests:
            model_prompt_key(r, "default")

    rows = list(
        best_rates(
            {
                "floor: sha256(canonical JSON bytes)": floor,
                "floor + sha256(prompt)": floor_with_prompt,
                "identity(req)": identities,
                "fingerprint(req)": fingerprints,
                "  same via identity dict + json.dumps": generic_fingerprints,
                "cache_key(req)  [ours]": full_keys,
                "model_prompt_key(req)  [narrow, for scale]": narrow_keys,
            },
            n,
            args.rounds,
        ).items()
    )
    base = rows[0][1]
    mean_prompt = sum(map(len, prompts)) / n
    mean_payload = sum(map(len, payloads)) / n
    print(
        f"{n} requests, prompts {mean_prompt:.0f} B, canonical JSON {mean_payload:.0f} B, best of {args.rounds}"
    )
    print(f"{'stage':<46}{'keys/s':>12}{'us/key':>9}{'x floor':>9}")
    for name, rate in rows:
        print(f"{name:<46}{rate:>12,.0f}{1e6 / rate:>9.2f}{base / rate:>9.2f}")
    ours = dict(rows)["cache_key(req)  [ours]"]
    ratio = base / ours
    verdict = "within" if ratio <= 4 else "NOT within"
    print(f"\ncache_key is {ratio:.2f}x slower than the floor ({verdict} the 4x target);")
    print(
        f"{dict(rows)['floor + sha256(prompt)'] / ours:.2f}x slower than the floor plus the prompt hash the contract requires"
    )


if __name__ == "__main__":
    main()
