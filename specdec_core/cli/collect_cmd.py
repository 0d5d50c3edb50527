"""`specdec collect`: receive OTLP spans live and ingest them as a followed log (specdec_core.ingestion.collect)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from specdec_core.cli.common import UsageError, add_db, show_batch
from specdec_core.ingestion import IngestLimits
from specdec_core.store import Store, StoreError


def cmd_collect(args: argparse.Namespace) -> int:
    from specdec_core.ingestion.collect import CollectError, CollectOptions, Collector, check_listen

    token = None
    if args.token_env:
        token = os.environ.get(args.token_env, "")
        if not token.strip():
            raise UsageError(f"--token-env {args.token_env}: that environment variable is empty or unset")
    for name in ("max_body_bytes", "max_backlog_bytes", "batch_rows"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name.replace('_', '-')}: expected a number >= 1")
    store = Store(args.db)
    options = CollectOptions(listen=args.listen, grpc=args.grpc, spool=Path(args.spool) if args.spool else None,
                             token=token, max_body_bytes=args.max_body_bytes,
                             max_backlog_bytes=args.max_backlog_bytes, batch_rows=args.batch_rows)
    try:
        check_listen(options)
    except CollectError as exc:
        raise UsageError(str(exc)) from None

    metrics = None

    def show(batch) -> None:
        show_batch(batch, args.json, metrics)

    def problem(text: str) -> None:
        print(f"specdec collect: {text}", file=sys.stderr, flush=True)

    try:
        collector = Collector(store, options, limits=IngestLimits.from_env(), on_batch=show, on_problem=problem)
        collector.start()
    except CollectError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:
        print(f"specdec collect: {exc}", file=sys.stderr)
        return 1
    if args.metrics:
        from specdec_core.cli.metrics_cmd import start_follower_metrics

        try:
            metrics = start_follower_metrics(store, args.metrics, args.metrics_top)
        except BaseException:  # what was acknowledged already is ingested before the command says why it stops
            collector.stop()
            collector.run()
            raise
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: collector.stop())  # stop taking exports, ingest, exit 0
    where = f"http://{options.listen.rpartition(':')[0]}:{collector.http_port}/v1/traces"
    grpc = f", OTLP/gRPC on {options.grpc.rpartition(':')[0]}:{collector.grpc_port}" if options.grpc else ""
    print(f"specdec collect: OTLP/HTTP on {where}{grpc}; spool {collector.spool.folder}; db {store.path}",
          file=sys.stderr, flush=True)
    try:
        collector.run()
    except StoreError as exc:
        print(f"specdec collect: {exc}; what was received stays in the spool and is loaded on the next start",
              file=sys.stderr)
        return 1
    finally:
        if metrics is not None:
            metrics.stop()
        print(f"specdec collect: {collector.counters.summary()}", file=sys.stderr, flush=True)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "collect", help="receive OTLP spans (HTTP, gRPC) live and load them into the store",
        description="An OTLP receiver: exports are acknowledged once durably spooled, then ingested as "
                    "`ingest --follow` ingests a log (GenAI and OpenInference spans; other spans are skipped).")
    add_db(p)
    p.add_argument("--listen", default="127.0.0.1:4318", metavar="HOST:PORT",
                   help="OTLP/HTTP address: POST /v1/traces, protobuf or JSON, gzip or not (127.0.0.1:4318)")
    p.add_argument("--grpc", metavar="HOST:PORT", help="also take OTLP/gRPC (TraceService/Export) here")
    p.add_argument("--token-env", metavar="NAME",
                   help="require `Authorization: Bearer <token>`, the token read from this environment variable; "
                        "without it only loopback addresses are allowed")
    p.add_argument("--max-body-bytes", type=int, default=16 << 20, metavar="N",
                   help="refuse a larger export body (after gzip) with 413 (16 MiB)")
    p.add_argument("--max-backlog-bytes", type=int, default=256 << 20, metavar="N",
                   help="spooled but not yet ingested bytes past which exports get 429 / RESOURCE_EXHAUSTED "
                        "with Retry-After (256 MiB)")
    p.add_argument("--spool", metavar="DIR", help="where acknowledged exports wait for the ingest (DB.spool)")
    p.add_argument("--batch-rows", type=int, default=1000, metavar="N", help="most exports an ingest batch (1000)")
    p.add_argument("--json", action="store_true", help="print each batch as one JSON object")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="serve the store's figures for Prometheus at http://HOST:PORT/metrics, current after every "
                        "batch (the [metrics] extra)")
    p.add_argument("--metrics-top", type=int, default=50, metavar="N",
                   help="--metrics: keep each label's N values with the most requests (50)")
    p.set_defaults(func=cmd_collect)
