"""Guarded RedisCache get/set throughput vs raw redis-py GET/SET of the same JSON values,
on a redis-server this script starts on a free port and stops at the end.

    .venv/bin/python bench/bench_redis_cache.py [--entries 5000] [--rounds 5]

The difference is what the guard and the entry format cost: building and
parsing the JSON entry, the result object, and the identity comparison.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import free_port, start_redis  # noqa: E402  (the tests' own launcher)

from specdec_core.cache import CacheStats, RedisCache, decode_entry, encode_entry  # noqa: E402
from specdec_core.contract.identity import DecodeRequest, identity  # noqa: E402
from specdec_core.contract.result import DecodeResult  # noqa: E402
from specdec_core.keys.schemes import cache_key  # noqa: E402


def workload(n: int, seed: int = 0) -> tuple[list[str], list[dict], list[DecodeResult]]:
    rnd = random.Random(seed)
    keys, identities, results = [], [], []
    for i in range(n):
        req = DecodeRequest(
            prompt=f"request {i}: " + "explain the cache incident " * rnd.randint(2, 40),
            target_model="llama-3-8b",
            draft_model=rnd.choice([None, "llama-3-1b", "eagle-head"]),
            num_speculative_tokens=4,
            temperature=rnd.choice([0.0, 0.7]),
            seed=i,
            max_tokens=256,
            tokenizer_version="hf-4.44",
        )
        n_tokens = rnd.randint(16, 256)
        keys.append(cache_key(req, "bench"))
        identities.append(identity(req))
        results.append(
            DecodeResult(
                text="word " * n_tokens,
                token_ids=tuple(rnd.randrange(32000) for _ in range(n_tokens)),
                finish_reason="length",
                draft_tokens=n_tokens * 2,
                accepted_tokens=n_tokens,
                accepted_per_step=tuple(rnd.randint(0, 4) for _ in range(n_tokens // 3)),
                latency_ms=12.5,
                environment={"torch": "2.4.0", "device": "cpu"},
            )
        )
    return keys, identities, results


def best_rate(fn: Callable[[], None], count: int, rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return count / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    keys, identities, results = workload(args.entries)
    values = [encode_entry(r, ident).encode("utf-8") for r, ident in zip(results, identities, strict=True)]
    n = len(keys)

    with tempfile.TemporaryDirectory() as workdir:
        port = free_port()
        server = start_redis(port, workdir)
        try:
            raw = redis.Redis(port=port)
            cache = RedisCache(f"redis://127.0.0.1:{port}/0", socket_timeout=5.0)

            def raw_set() -> None:
                for key, value in zip(keys, values, strict=True):
                    raw.set(key, value)

            def raw_get() -> None:
                for key in keys:
                    raw.get(key)

            def ours_set() -> None:
                for key, result, ident in zip(keys, results, identities, strict=True):
                    cache.set(key, result, ident)

            def ours_get() -> None:
                for key, ident in zip(keys, identities, strict=True):
                    cache.get(key, ident)

            # Interleave so drift on a shared machine hits both sides alike.
            rates: dict[str, list[float]] = {"set": [], "get": []}
            for _ in range(args.rounds):
                rates["set"].append((best_rate(raw_set, n, 1), best_rate(ours_set, n, 1)))
                rates["get"].append((best_rate(raw_get, n, 1), best_rate(ours_get, n, 1)))
            stats = cache.stats.as_dict()
            assert stats["hits"] == n * args.rounds and stats["errors"] == 0, stats
            raw.close()
            cache.close()
        finally:
            server.terminate()
            server.wait(timeout=10)

    # The guard's own CPU, without Redis: what the ratio above pays for.
    stats = CacheStats()
    texts = [v.decode("utf-8") for v in values]

    def encode_only() -> None:
        for result, ident in zip(results, identities, strict=True):
            encode_entry(result, ident)

    def decode_only() -> None:
        for key, text, ident in zip(keys, texts, identities, strict=True):
            decode_entry(text, key, ident, stats)

    cpu = {
        "set": 1e6 / best_rate(encode_only, n, args.rounds),
        "get": 1e6 / best_rate(decode_only, n, args.rounds),
    }

    mean_value = sum(map(len, values)) / n
    print(f"{n} entries of {mean_value:.0f} B JSON, redis-server on 127.0.0.1:{port}, best of {args.rounds}")
    print(
        f"{'op':<6}{'raw redis-py ops/s':>20}{'guarded RedisCache ops/s':>26}{'ours/raw':>10}"
        f"{'raw us/op':>11}{'ours us/op':>12}{'entry CPU us':>14}"
    )
    worst = 1.0
    for op in ("set", "get"):
        raw_rate = max(r for r, _ in rates[op])
        ours_rate = max(o for _, o in rates[op])
        worst = min(worst, ours_rate / raw_rate)
        print(
            f"{op:<6}{raw_rate:>20,.0f}{ours_rate:>26,.0f}{ours_rate / raw_rate:>10.2f}"
            f"{1e6 / raw_rate:>11.1f}{1e6 / ours_rate:>12.1f}{cpu[op]:>14.1f}"
        )
    print("entry CPU: encode_entry (set) / decode_entry with the guard (get), no Redis involved")
    verdict = "meets" if worst >= 0.7 else "MISSES"
    print(f"\nworst ratio {worst:.2f}: {verdict} the >= 0.7x target")


if __name__ == "__main__":
    main()
