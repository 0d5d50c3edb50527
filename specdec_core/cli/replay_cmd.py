"""`specdec replay`: replay one request, or the N most suspicious, and print what decided the verdict."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from specdec_core.decoding.engine_client import EngineError
from specdec_core.decoding.registry import RegistryError
from specdec_core.text import escape_controls

from .common import UsageError
from .store_cmds import existing_store

if TYPE_CHECKING:  # the replay (and the analysis under it) is imported by `specdec replay`, not by every start
    from specdec_core.replay.run import ReplayResult


def _print_result(r: ReplayResult) -> None:
    # Logged text and engine answers reach the terminal with every control character escaped: a log could
    # otherwise clear the screen, retitle the window, hide a link or overwrite a line with a forged verdict.
    say = escape_controls
    print(f"{say(r.request_id)}: {r.classification}")
    print(f"  {say(r.message)}")
    for key, value in r.evidence.items():
        print(f"  {say(key)}: {say(value)}")
    if r.draft_tokens is not None:
        print(f"  draft tokens {r.draft_tokens}, accepted {r.accepted_tokens}")
    if r.diff is not None and not r.diff.identical:
        print(f"  similarity {r.diff.similarity:.3f}, common prefix {r.diff.common_prefix_tokens} tokens, "
              f"first divergent token {r.diff.first_divergent_token}")
        print("  diff ([-production-]{+replay+}):")
        for line in r.diff.render().split("\n"):
            print(f"    {say(line)}")


def _progress(n: int, total: int, result: ReplayResult) -> None:
    width = 30
    filled = width * n // max(total, 1)
    print(f"\r[{'#' * filled}{'.' * (width - filled)}] {n}/{total} {escape_controls(result.request_id)}: "
          f"{result.classification}", end="\n" if n == total else "", file=sys.stderr, flush=True)


def cmd_replay(args: argparse.Namespace) -> int:
    from specdec_core.analysis import suspicious_requests
    from specdec_core.replay.run import ReplayError, replay, replay_many

    if args.suspicious is not None and args.suspicious < 1:  # 0 found nothing and said the log was clean
        raise UsageError(f"--suspicious {args.suspicious}: expected a number of requests >= 1")
    store = existing_store(args, "replay")
    if store is None:
        return 1
    failures: list[str] = []
    try:
        from specdec_core.decoding.engine import SpecDecoder
        from specdec_core.decoding.router import DecoderRouter

        decoder = DecoderRouter(SpecDecoder(device=args.device))
        if args.request_id is not None:
            results = [replay(store, args.request_id, decoder, prompt=args.prompt)]
        else:
            ids = list(suspicious_requests(store, args.suspicious)["request_id"])
            if not ids:
                print("no suspicious request: no contaminated hit and no length violation in this log")
                return 0
            results = replay_many(store, ids, decoder, progress=_progress if sys.stderr.isatty() else None,
                                  failures=failures)
    except (ReplayError, RegistryError, EngineError) as exc:
        print(f"specdec replay: {escape_controls(exc)}", file=sys.stderr)
        return 1
    if args.json:  # strict JSON: to_json makes a non-finite score null
        payload = [r.to_json() for r in results]
        print(json.dumps(payload[0] if args.request_id is not None else payload, default=str, allow_nan=False))
    else:
        for r in results:
            _print_result(r)
    for line in failures:  # one line per kind of failure and engine, however many rows it hit
        print(f"specdec replay: {escape_controls(line)}", file=sys.stderr)
    return 1 if failures else 0


def _request_id(text: str) -> str:
    if not text:  # an empty id is no request, not "every suspicious one"
        raise argparse.ArgumentTypeError("give a request id, not an empty one")
    return text


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("replay", help="replay requests with their full identity and diff against production",
                              description="Replay through the local speculative decoder, or the engine specdec.toml "
                                          "names for the model (no cache), and classify "
                                          "the difference: match, near_tie, sampled, foreign, diverged, unavailable.")
    p.add_argument("--db", help="DuckDB file (default: $SPECDEC_DB or data/specdec.duckdb)")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--request-id", metavar="ID", type=_request_id)
    which.add_argument("--suspicious", type=int, metavar="N", help="the N most suspicious (contaminated hits first)")
    p.add_argument("--prompt", help="the prompt of a redacted request (checked against its prompt_hash)")
    p.add_argument("--device", default="auto", help="auto (CUDA when available), cpu or cuda")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_replay)
