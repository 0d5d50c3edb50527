"""`specdec demo`: write a demo incident log (real decoder, narrow keys) or a large synthetic one."""

from __future__ import annotations

import argparse
import sys
import time

DEFAULT_OUT = "data/demo/requests.jsonl.gz"


def cmd_demo(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    if args.synthetic:
        from specdec_core.demo.synthetic import make_synthetic_log

        out = args.out if args.out != DEFAULT_OUT else f"bench/out/synthetic-{args.rows}.jsonl"
        make_synthetic_log(out, args.rows, seed=args.seed)
        print(f"wrote {args.rows:,} synthetic rows to {out} in {time.perf_counter() - started:.1f} s")
        return 0
    from specdec_core.extras import require

    torch = require("replay", "torch")
    from specdec_core.decoding.engine import LogitRounding, SpecDecoder
    from specdec_core.decoding.registry import RegistryError
    from specdec_core.demo.simulate import simulate

    def show(n: int, total: int) -> None:
        if sys.stderr.isatty() and (n % 10 == 0 or n == total):
            print(f"\r{n}/{total} requests", end="\n" if n == total else "", file=sys.stderr, flush=True)

    # Production is emulated as a half-precision GPU deployment; replay runs float32, as a laptop would.
    dtypes = {"fp16": torch.float16, "bf16": torch.bfloat16}
    processors = [LogitRounding(dtypes[args.production_numerics])] if args.production_numerics in dtypes else []
    try:
        summary = simulate(args.out, requests=args.requests, seed=args.seed, family=args.family,
                           engine=SpecDecoder(device=args.device, logits_processors=processors),
                           redis_url=args.redis_url, progress=show)
    except (RegistryError, ValueError) as exc:
        print(f"specdec demo: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {summary.requests} requests to {summary.log_path} in {time.perf_counter() - started:.0f} s: "
          f"{summary.decoded} identities decoded, {summary.hits} hits, {summary.contaminated} contaminated "
          f"(fix rolled out at {summary.fix_at}); ground truth in {summary.truth_path}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("demo", help="write a demo incident log",
                              description="Run a workload through the real decode service with narrow cache "
                                          "keys (or, with --synthetic, generate a large log without a model).")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"log file (default {DEFAULT_OUT})")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--family", default="smollm2", choices=("tiny", "smollm2"))
    p.add_argument("--redis-url", help="use this Redis for the caches (default: in-process)")
    p.add_argument("--device", default="auto")
    p.add_argument("--production-numerics", default="bf16", choices=("bf16", "fp16", "exact"),
                   help="production's logits rounded to this precision, so near-ties can flip "
                        "(exact: production computes as replay does)")
    p.add_argument("--synthetic", action="store_true", help="no model: realistic distributions at DuckDB speed")
    p.add_argument("--rows", type=int, default=1_000_000, help="with --synthetic")
    p.set_defaults(func=cmd_demo)
