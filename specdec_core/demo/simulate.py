"""A demo incident: a realistic workload run through the real DecodeService and SpecDecoder.

Three deployments serve the same traffic. `edge-a` keys its cache by the prompt alone
(Python's built-in hash, the classic bug), `edge-b` by model + prompt, `core` by the full
identity. At `fix_at` the two narrow deployments roll out the full key in a new
namespace with the fingerprint guard on: the charts show contamination stop.

Four tenants (`consumer`) share the traffic, and an A/B test runs on it (`experiment`): `arm-a` uses the
first draft model, `arm-b` the second; under the narrow keys each arm is served the other's outputs.

Misses are decoded by the real decoder and hits come from a real cache, exactly as
production would do it. The simulator records its ground truth beside the log: for
every request, whether the output it was served belongs to another identity and which
request put that output in the cache.
"""

from __future__ import annotations

import gzip
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from specdec_core.cache import Cache, MemoryCache, open_cache
from specdec_core.contract.identity import DecodeRequest, canonicalize_identity, fingerprint, identity
from specdec_core.contract.result import DecodeResult
from specdec_core.service import DecodeService


@dataclass(frozen=True)
class ExperimentConfig:
    """One arm of the traffic: everything in a request's identity but its prompt."""

    name: str
    target_model: str
    draft_model: str | None
    num_speculative_tokens: int | None
    temperature: float
    max_tokens: int
    tokenizer_version: str
    weight: float
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] | None = None


def _family_configs(target: str, draft: str, other_draft: str, tok_v1: str, tok_v2: str
                    ) -> tuple[ExperimentConfig, ...]:
    return (
        ExperimentConfig("greedy-draft", target, draft, 4, 0.0, 32, tok_v1, 30),
        ExperimentConfig("greedy-ngram", target, "ngram-3", 4, 0.0, 48, tok_v1, 15),
        ExperimentConfig("greedy-plain-short", target, None, None, 0.0, 16, tok_v1, 10),
        ExperimentConfig("sampled-other-draft", target, other_draft, 4, 0.7, 32, tok_v1, 15, top_p=0.95, seed=7),
        ExperimentConfig("sampled-ngram-stop", target, "ngram-3", 3, 1.0, 32, tok_v1, 10, top_k=40, seed=42,
                         stop=(".",)),
        ExperimentConfig("greedy-ngram-tok-v2", target, "ngram-3", 4, 0.0, 48, tok_v2, 10),
        ExperimentConfig("greedy-draft-k2-short", target, draft, 2, 0.0, 16, tok_v1, 10, stop=("\n\n",)),
    )


EXPERIMENTS: dict[str, tuple[ExperimentConfig, ...]] = {
    "tiny": _family_configs("tiny-target", "tiny-draft-a", "tiny-draft-b", "tiny-tok-v1", "tiny-tok-v2"),
    "smollm2": _family_configs("smollm2-135m", "smollm2-135m-draft-skip8", "smollm2-135m-draft-l4", "tok-v1",
                               "tok-v2"),
}

# Hot prompts first: the first few take most of the traffic. Several languages, long and short,
# and one whose text is HTML, to show the dashboard renders log text inert.
PROMPTS: tuple[str, ...] = (
    "What is speculative decoding?",
    "Write a haiku about caches.",
    "Explain what a cache key is in one sentence.",
    "List three uses of Redis.",
    "Summarise: the draft model proposes tokens and the target model verifies them.",
    "Qu'est-ce qu'un modèle de langage ?",
    "Erkläre kurz, was ein Cache ist.",
    "¿Por qué es importante la reproducibilidad?",
    "キャッシュとは何ですか？",
    "什么是推测解码？",
    "Translate to French: the output was silently wrong.",
    "Render this as plain text: <b>bold</b> <script>alert('x')</script> & \"quotes\"",
    "Give me a short name for a triage tool.",
    "Why can a hit rate look too good to be true?",
    "Describe, step by step and in some detail, how an on-call engineer should triage an incident in which a "
    "speculative-decoding service returns answers that look plausible but belong to other requests, starting "
    "from the first alert and ending with the post-mortem.",
    "What does temperature do in sampling?",
    "Count from one to ten.",
    "Write one sentence about the sea.",
    "What is 17 times 3?",
    "Name a colour.",
)

DEPLOYMENTS: tuple[tuple[str, str, float], ...] = (
    ("edge-a", "prompt_only", 0.35),
    ("edge-b", "model_prompt", 0.35),
    ("core", "full", 0.30),
)
START = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)

# Who receives the outputs: a few tenants, the first ones busiest.
CONSUMERS: tuple[tuple[str, float], ...] = (
    ("acme-search", 0.4), ("globex-support", 0.3), ("initech-eval", 0.2), ("umbrella-labs", 0.1),
)


def experiment_arm(draft_model: str | None, family: str) -> str | None:
    """The A/B test the demo runs: two arms that differ in draft model, named after it; requests of the other
    configurations (n-gram and plain decoding) are in no experiment."""
    configs = EXPERIMENTS[family]
    arms = {configs[0].draft_model: "arm-a", configs[3].draft_model: "arm-b"}
    return arms.get(draft_model)


def consumer_stream(seed: int) -> random.Random:
    """The consumers' own random stream: drawing them leaves the workload's stream as it was."""
    return random.Random(f"{seed}:consumers")


def next_consumer(stream: random.Random) -> str:
    return stream.choices([c for c, _ in CONSUMERS], weights=[w for _, w in CONSUMERS])[0]


@dataclass
class SimulationSummary:
    requests: int = 0
    decoded: int = 0
    hits: int = 0
    contaminated: int = 0
    contaminated_after_fix: int = 0
    fix_at: str = ""
    log_path: str = ""
    truth_path: str = ""
    per_deployment: dict[str, dict[str, int]] = field(default_factory=dict)


class _IdentityMemo:
    """The decoder is deterministic per identity; decode each identity once across deployments.

    A miss answered from the memo took no decoder time here, but in production it would have taken as long as
    the identity's real decode: `owed_ms` is that time, which the simulator adds to the miss's logged latency
    (without it the demo's misses answered in 0.07 ms, faster than its hits).
    """

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        self.results: dict[str, tuple[DecodeResult, float]] = {}
        self.decoded = 0
        self.owed_ms = 0.0

    def generate(self, req: DecodeRequest) -> DecodeResult:
        key = fingerprint(req)
        if key in self.results:
            result, self.owed_ms = self.results[key]
            return result
        started = time.perf_counter()
        result = self.engine.generate(req)
        self.results[key] = (result, (time.perf_counter() - started) * 1000.0)
        self.decoded += 1
        self.owed_ms = 0.0
        return result


def _zipf_index(rng: random.Random, n: int, s: float = 1.1) -> int:
    weights = [1 / (i + 1) ** s for i in range(n)]
    return rng.choices(range(n), weights=weights)[0]


def _open_writer(path: Path) -> Any:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        return gzip.open(path, "wt", encoding="utf-8")
    return open(path, "w", encoding="utf-8")


def simulate(
    out_path: str | Path,
    *,
    requests: int = 2000,
    seed: int = 7,
    family: str = "smollm2",
    engine: Any | None = None,
    redis_url: str | None = None,
    hours: float = 6.0,
    fix_at_fraction: float = 0.65,
    ttl_s: float = 45 * 60,
    progress: Callable[[int, int], None] | None = None,
) -> SimulationSummary:
    """Run the workload; write the log (contract format) and its ground truth.

    The truth goes to `<log>.truth.json`: JSON Lines, named so that ingesting the folder skips it.
    """
    # Long because it is the incident's script read top to bottom (deployments, arrivals, the fix, the
    # truth); its pieces share the random stream, so splitting would thread that state everywhere.
    if family not in EXPERIMENTS:
        raise ValueError(f"family {family!r} is unknown; known: {', '.join(EXPERIMENTS)}")
    if engine is None:
        from specdec_core.decoding.engine import SpecDecoder

        engine = SpecDecoder()
    rng = random.Random(seed)
    consumers = consumer_stream(seed)
    configs = EXPERIMENTS[family]
    out = Path(out_path)
    truth_path = out.with_name(out.name.split(".")[0] + ".truth.json")
    span = hours * 3600.0
    arrivals = sorted(rng.uniform(0, span) for _ in range(requests))
    fix_at = START.timestamp() + span * fix_at_fraction
    now = [START.timestamp()]
    memo = _IdentityMemo(engine)
    summary = SimulationSummary(fix_at=datetime.fromtimestamp(fix_at, timezone.utc).isoformat(),
                                log_path=str(out), truth_path=str(truth_path))
    # Which request last put an output under each (deployment, namespace, key): the ground truth of "source".
    writers: dict[tuple[str, str], str] = {}

    def make_cache() -> Cache:
        # The simulated clock drives TTL expiry in the in-process cache; Redis expires in real time.
        return open_cache(redis_url) if redis_url else MemoryCache(clock=lambda: now[0])

    with _open_writer(out) as log, open(truth_path, "w", encoding="utf-8") as truth:
        services: dict[str, DecodeService] = {}
        pending: list[dict[str, Any]] = []
        for name, scheme, _ in DEPLOYMENTS:
            services[name] = DecodeService(make_cache(), memo, key_scheme=scheme, namespace=f"{name}-v1",
                                           log_sink=pending.append, deployment=name, ttl_s=ttl_s,
                                           clock=lambda: now[0], guard=scheme == "full")
        fixed = False
        for n, offset in enumerate(arrivals, start=1):
            now[0] = START.timestamp() + offset
            if not fixed and now[0] >= fix_at:
                # The fix: the full key in a fresh namespace, and the guard on every read.
                for name, scheme, _ in DEPLOYMENTS:
                    if scheme != "full":
                        services[name] = DecodeService(services[name].cache, memo, key_scheme="full",
                                                       namespace=f"{name}-v2", log_sink=pending.append,
                                                       deployment=name, ttl_s=ttl_s, clock=lambda: now[0])
                fixed = True
            deployment = rng.choices([d for d, _, _ in DEPLOYMENTS], weights=[w for _, _, w in DEPLOYMENTS])[0]
            config = rng.choices(configs, weights=[c.weight for c in configs])[0]
            prompt = PROMPTS[_zipf_index(rng, len(PROMPTS))]
            req = DecodeRequest(prompt=prompt, target_model=config.target_model, draft_model=config.draft_model,
                                num_speculative_tokens=config.num_speculative_tokens,
                                temperature=config.temperature, top_p=config.top_p, top_k=config.top_k,
                                max_tokens=config.max_tokens, seed=config.seed, stop=config.stop,
                                tokenizer_version=config.tokenizer_version)
            service = services[deployment]
            request_id = f"req-{n:06d}"
            service.decode(req, request_id=request_id, consumer=next_consumer(consumers),
                           experiment=experiment_arm(config.draft_model, family))
            record = pending.pop()
            if not record["cache_hit"]:
                record["latency_ms"] = round(record["latency_ms"] + memo.owed_ms, 3)
            memo.owed_ms = 0.0
            slot = (deployment, record["cache_key"])
            served_by = writers.get(slot) if record["cache_hit"] else request_id
            if not record["cache_hit"]:
                writers[slot] = request_id
            cached = record.get("cached_fingerprint")
            contaminated = bool(record["cache_hit"] and cached is not None
                                and canonicalize_identity(cached) != identity(req))
            if service.key_scheme != "full":
                # The buggy services predate identity logging: their logs never carried it.
                record["cached_fingerprint"] = None
            log.write(json.dumps(record, ensure_ascii=False) + "\n")
            truth.write(json.dumps({"request_id": request_id, "deployment": deployment,
                                    "contaminated": contaminated, "served_by": served_by,
                                    "after_fix": fixed}) + "\n")
            summary.requests += 1
            summary.hits += record["cache_hit"]
            summary.contaminated += contaminated
            summary.contaminated_after_fix += contaminated and fixed
            stats = summary.per_deployment.setdefault(deployment, {"requests": 0, "hits": 0, "contaminated": 0})
            stats["requests"] += 1
            stats["hits"] += record["cache_hit"]
            stats["contaminated"] += contaminated
            if progress:
                progress(n, requests)
    summary.decoded = memo.decoded
    return summary
