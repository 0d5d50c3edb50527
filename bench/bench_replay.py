"""Replay on the smollm2 demo models: a warm 64-token replay, and a batch of 20 that loads nothing twice.

Target: a warm single replay of a 64-token request under 10 s here. The baseline beside it is
the bare decode (`SpecDecoder.generate`) of the same request: replay adds the diff, the
teacher-forced scoring and the database write.

    .venv/bin/python bench/bench_replay.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_core.cache import MemoryCache  # noqa: E402
from specdec_core.contract.identity import DecodeRequest  # noqa: E402
from specdec_core.decoding.engine import SpecDecoder  # noqa: E402
from specdec_core.demo.models import fetch  # noqa: E402
from specdec_core.demo.simulate import PROMPTS  # noqa: E402
from specdec_core.ingestion.load import ingest  # noqa: E402
from specdec_core.replay.run import replay, replay_many  # noqa: E402
from specdec_core.service import DecodeService  # noqa: E402
from specdec_core.store.connection import Store  # noqa: E402

SPECULATION = {"plain": (None, None), "ngram-3": ("ngram-3", 4), "draft-skip8": ("smollm2-135m-draft-skip8", 4)}


def main() -> None:
    fetch("smollm2", ROOT / "data" / "models")
    decoder = SpecDecoder()
    tmp = Path(tempfile.mkdtemp(prefix="bench-replay-"))
    log = tmp / "log.jsonl"
    service = DecodeService(MemoryCache(), decoder, log_sink=str(log), deployment="bench")
    requests = {}
    with service:
        for kind, (draft, k) in SPECULATION.items():
            req = DecodeRequest(prompt=PROMPTS[0], target_model="smollm2-135m", draft_model=draft,
                                num_speculative_tokens=k, temperature=0.0, max_tokens=64, tokenizer_version="tok-v1")
            service.decode(req, request_id=f"{kind}-0")
            requests[f"{kind}-0"] = req
        for n, prompt in enumerate(PROMPTS[:20]):  # the batch: 20 distinct requests
            req = DecodeRequest(prompt=prompt, target_model="smollm2-135m", draft_model="ngram-3",
                                num_speculative_tokens=4, temperature=0.0, max_tokens=32, tokenizer_version="tok-v1")
            service.decode(req, request_id=f"batch-{n}")
    store = Store(tmp / "bench.duckdb")
    ingest(store, [str(log)])

    print(f"{'64-token greedy request':28}{'decode s':>10}{'replay s':>10}  verdict")
    for kind in SPECULATION:
        rid = f"{kind}-0"
        t = time.perf_counter()
        decoder.generate(requests[rid])
        decode_s = time.perf_counter() - t
        t = time.perf_counter()
        result = replay(store, rid, decoder)
        replay_s = time.perf_counter() - t
        met = "met" if replay_s < 10 else "NOT met (< 10 s)"
        print(f"{kind:28}{decode_s:>10.2f}{replay_s:>10.2f}  {result.classification}, "
              f"{len(result.replay_token_ids)} tokens, target {met}")

    ids = [f"batch-{n}" for n in range(20)]
    loads_before = decoder.load_count
    t = time.perf_counter()
    results = replay_many(store, ids, decoder)
    batch_s = time.perf_counter() - t
    verdicts = sorted({r.classification for r in results})
    print(f"\nbatch of {len(results)} replays ({', '.join(verdicts)}): {batch_s:.1f} s, "
          f"models loaded during the batch: {decoder.load_count - loads_before} (loaded before it: {loads_before})")


if __name__ == "__main__":
    main()
