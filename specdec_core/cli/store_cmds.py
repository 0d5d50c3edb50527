"""`specdec ingest`, `specdec report`, `specdec stats`: thin wrappers over store, metrics and report."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from dataclasses import replace
from datetime import datetime
from typing import TYPE_CHECKING

from specdec_core import formats
from specdec_core.cli.common import (
    RAW_HELP,
    UsageError,
    add_db,
    cannot_write,
    existing_store,
    out_target,
    said_written,
    show_batch,
    warn_unmatched,
)
from specdec_core.config import ConfigError
from specdec_core.contract.names import REPORT_KINDS
from specdec_core.formats import object_store
from specdec_core.ingestion import IngestLimits, ingest
from specdec_core.ingestion.follow import DEFAULT_BATCH_ROWS
from specdec_core.monitoring.figures import DEFAULT_TOP
from specdec_core.store import LogReadError, Store, StoreError
from specdec_core.store.lake_files import damaged_files, damaged_message
from specdec_core.store.working_copy import copy_cost_note
from specdec_core.text import escape_controls

if TYPE_CHECKING:  # the analysis (pandas) is imported by the commands that ask questions, not by every start
    from specdec_core.analysis import Filters


def _progress_bar(enabled: bool):
    def show(done: int, total: int, current: str) -> None:
        width = 30
        filled = width * done // max(total, 1)
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {escape_controls(current)[-50:]:<50}",
              end="" if done < total else "\n", file=sys.stderr, flush=True)

    return show if enabled else None


def _limits(args: argparse.Namespace) -> IngestLimits:
    limits = IngestLimits.from_env()
    for name in ("max_record_bytes", "max_fields"):
        value = getattr(args, name)
        if value is not None:
            if value < 1:
                raise ValueError(f"--{name.replace('_', '-')}: expected a number >= 1, got {value}")
            limits = replace(limits, **{name: value})
    return limits


def cmd_ingest(args: argparse.Namespace) -> int:
    store = Store(args.db)
    show_progress = not args.json and sys.stderr.isatty()
    try:
        limits = _limits(args)
        mapping = formats.load_mapping(args.map, limits.max_record_bytes) if args.map else None
    except (ValueError, OSError) as exc:  # a bad limit or mapping file: a usage error, nothing read
        raise UsageError(exc) from exc
    if args.metrics and not args.follow:
        raise UsageError("--metrics serves a follower's figures; use it with --follow "
                         "(or `specdec metrics serve --db FILE`)")
    if args.follow:
        return _follow(store, args, limits, mapping)
    try:
        result = ingest(store, args.paths, progress=_progress_bar(show_progress), limits=limits,
                        log_format=args.format, mapping=mapping)
    except (LogReadError, StoreError) as exc:  # the message names the file, as the folder or bucket called it
        print(f"specdec ingest: {escape_controls(exc)}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(result.to_json()))
    else:
        if args.format == "auto" and not args.map:
            for path, fmt in result.formats:
                print(f"{escape_controls(path)}: {fmt} (the format --format auto chose)", file=sys.stderr)
        skipped = f", skipped {result.skipped}" if result.skipped else ""
        print(f"read {result.read}, accepted {result.accepted}, duplicates {result.duplicates}, "
              f"quarantined {result.quarantined}{skipped} ({result.files} file{'s' if result.files != 1 else ''}, "
              f"db {store.mask(str(store.path))})")
        if result.quarantined:
            print("quarantined records and their reasons: table `quarantine`, or the dashboard's sidebar",
                  file=sys.stderr)
    return 0


def _follow(store: Store, args: argparse.Namespace, limits: IngestLimits, mapping: formats.Mapping | None) -> int:
    """`--follow`: one status line per committed batch until interrupted (or idle for --idle-exit seconds)."""
    import signal

    from specdec_core.ingestion.follow import Follower, follow

    # NaN compares false with everything (it polled without pause); inf can't be slept.
    if not (math.isfinite(args.every) and args.every > 0) or args.batch_rows < 1 or (
            args.idle_exit is not None and not args.idle_exit >= 0):
        raise UsageError("--every must be a finite number of seconds > 0, --idle-exit >= 0 and --batch-rows >= 1")
    stopping: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stopping.append(signum))  # stop after the batch under way

    def show(batch) -> None:
        show_batch(batch, args.json, metrics)

    metrics = None
    if args.metrics:
        from specdec_core.cli.metrics_cmd import start_follower_metrics

        metrics = start_follower_metrics(store, args.metrics, args.metrics_top)
    note = copy_cost_note(store)
    if note:
        print(f"specdec ingest: {note}", file=sys.stderr)
    make = Follower
    if any(object_store.is_s3(p) for p in args.paths):  # s3:// objects are loaded whole, once they hold still
        from specdec_core.ingestion.object_follow import ObjectFollower

        make = ObjectFollower
    follower = make(store, args.paths, log_format=args.format, mapping=mapping, limits=limits,
                        batch_rows=args.batch_rows,
                        on_problem=lambda problem: print(f"specdec ingest: {problem}", file=sys.stderr, flush=True))
    try:
        follow(follower, every=args.every, idle_exit=args.idle_exit, on_batch=show, stop=lambda: bool(stopping))
    except (LogReadError, StoreError) as exc:
        print(f"specdec ingest: {exc}", file=sys.stderr)
        return 1
    finally:
        follower.close()
        if metrics is not None:
            metrics.stop()
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    store = existing_store(args, "report")
    if store is None:
        return 1
    target = out_target(args.out, store, "the report")
    from specdec_core.analysis.report import configured_external_url, write_report

    kinds = args.kind or list(REPORT_KINDS)
    chosen = stats_filters(args)
    warn_unmatched("report", store, chosen)
    try:
        rows = write_report(store, target, chosen, kinds=kinds, raw=args.raw, external_url=configured_external_url())
    except OSError as exc:
        print(f"specdec report: {cannot_write('--out', args.out, exc)}", file=sys.stderr)
        return 1
    except (StoreError, ConfigError) as exc:
        print(f"specdec report: {exc}", file=sys.stderr)
        return 1
    said_written(f"wrote {rows} rows", args.out)
    return 0


def utc_time(text: str, end: bool = False) -> datetime:
    """--start: an ISO 8601 time; one without a zone is UTC, as every time the tool shows (analysis.selection_time)."""
    from specdec_core.analysis.query import selection_time

    try:
        return selection_time(text, end=end)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an ISO 8601 time, e.g. 2026-11-20T10:50:00Z") from None


def utc_end(text: str) -> datetime:
    """--end: a time as utc_time reads it, through the last instant of what it names: a date alone is that whole
    day (`--start 2026-11-20 --end 2026-11-20`), a time to the second that whole second."""
    return utc_time(text, end=True)


def add_filters(p: argparse.ArgumentParser) -> None:
    """The dashboard's sidebar filters, as its URL names them (read back by stats_filters)."""
    p.add_argument("--start", type=utc_time, metavar="TIME", help="from this time (ISO 8601; UTC unless it says)")
    p.add_argument("--end", type=utc_end, metavar="TIME",
                   help="through this time: a date alone, that whole day; a time without a fraction, that whole second")
    p.add_argument("--deployment", action="append", metavar="NAME", help="only this deployment (repeatable)")
    p.add_argument("--target-model", action="append", metavar="NAME", help="only this target model (repeatable)")
    p.add_argument("--draft-model", action="append", metavar="NAME",
                   help="only this draft model, 'none' for requests without one (repeatable)")


def stats_filters(args: argparse.Namespace) -> Filters:
    """The dashboard's filters, from the command line: the same numbers for the same selection."""
    from specdec_core.analysis import Filters

    return Filters(start=args.start, end=args.end, deployments=tuple(args.deployment or ()),
                   target_models=tuple(args.target_model or ()), draft_models=tuple(args.draft_model or ()))


def cmd_stats(args: argparse.Namespace) -> int:
    store = existing_store(args, "stats")
    if store is None:
        return 1
    from specdec_core.analysis import fix_stats, fix_status, headline, logging_gaps, red_flags
    from specdec_core.analysis.impact import rfc3339
    from specdec_core.analysis.status import fmt_time

    if store.lake is not None:
        # Its numbers come from the summaries, which a lost or overwritten file of the requests leaves readable:
        # say the lake is damaged, as every command that reads the rows does, before answering from them.
        with store.read() as con:
            damaged = damaged_files(con)
        if damaged:
            raise StoreError(damaged_message(damaged, str(store)))
    chosen = stats_filters(args)
    warn_unmatched("stats", store, chosen)
    h = headline(store, chosen)
    gaps = logging_gaps(store, chosen)
    if args.json:
        flags = red_flags(store, chosen, head=h)
        print(json.dumps({**dataclasses.asdict(h),
                          "red_flags": [{"id": f.id, "flagged": f.flagged, "evidence": f.evidence} for f in flags],
                          "logging_gaps": [{**dataclasses.asdict(g), "sentence": g.sentence} for g in gaps],
                          **fix_stats(store, chosen)},
                         default=lambda v: rfc3339(v) if isinstance(v, datetime) else str(v)))  # as impact writes times
        return 0

    def pct(v: float | None) -> str:
        return "n/a" if v is None else f"{v:.1%}"

    rows = [
        ("requests", h.requests),
        ("hit rate", pct(h.hit_rate)),
        ("contaminated hits", f"{h.contaminated_hits} ({pct(h.contaminated_rate)} of hits)"),
        ("length violations", h.length_violations),
        ("key collisions", h.key_collisions),
        ("unique keys / identities", f"{h.unique_keys} / {h.unique_identities}"),
        ("quarantined records", h.quarantined),
        ("time range", "no requests" if h.first_ts is None else f"{fmt_time(h.first_ts)} .. {fmt_time(h.last_ts)}"),
    ]
    for name, value in rows:
        print(f"{name:<26}{value}")
    for gap in gaps:  # the sentences quote deployments and key prefixes as the log wrote them
        print(f"{'logging gap':<26}{escape_controls(gap.sentence)}")
    for status in fix_status(store, chosen):
        print(f"{'key fix':<26}{escape_controls(status.sentence)}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("ingest", help="load request logs (JSONL, JSONL.gz, CSV, Parquet; OTel, LiteLLM)",
                              description="Load request logs; bad records go to quarantine with their reason.")
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help="a file, a folder or a glob; or s3://bucket/prefix/ (a glob too): see [logs] in specdec.toml")
    add_db(p)
    p.add_argument("--json", action="store_true", help="print the counts as one JSON object")
    p.add_argument("--format", choices=("auto", *formats.FORMATS), default="auto",
                   help="the logs' shape: our contract, OpenTelemetry GenAI spans (OTLP JSON), OpenInference spans "
                        "(OTLP JSON or Phoenix's export), LiteLLM payloads, Langfuse observations; "
                        "auto (default) decides per file from its first record")
    p.add_argument("--map", metavar="FILE.toml", help="read any JSON Lines through a mapping file")
    p.add_argument("--max-record-bytes", type=int, metavar="N",
                   help="quarantine a record longer than this (default: $SPECDEC_MAX_RECORD_BYTES or 16 MiB)")
    p.add_argument("--max-fields", type=int, metavar="N",
                   help="quarantine a record with more fields than this (default: $SPECDEC_MAX_FIELDS or 1000)")
    p.add_argument("--follow", action="store_true",
                   help="keep loading what is appended to the files and folders (new files, rotated files; "
                        "gzip, CSV and Parquet files whole, once complete), one batch at most every --every seconds; resumes where it "
                        "stopped")
    p.add_argument("--every", type=float, default=1.0, metavar="SECONDS", help="--follow: poll interval (1)")
    p.add_argument("--batch-rows", type=int, default=DEFAULT_BATCH_ROWS, metavar="N",
                   help=f"--follow: most lines a batch ({DEFAULT_BATCH_ROWS})")
    p.add_argument("--idle-exit", type=float, metavar="SECONDS",
                   help="--follow: stop after this long with nothing new (default: run until interrupted)")
    p.add_argument("--metrics", metavar="HOST:PORT",
                   help="--follow: serve the store's figures for Prometheus at http://HOST:PORT/metrics, current "
                        "after every batch (needs prometheus_client: the [metrics] extra)")
    p.add_argument("--metrics-top", type=int, default=DEFAULT_TOP, metavar="N",
                   help="--metrics: keep each label's N values with the most requests, fold the rest into "
                        f"\"other\" ({DEFAULT_TOP})")
    p.set_defaults(func=cmd_ingest)

    p = subparsers.add_parser("report", help="write the mismatch report CSV",
                              description="One row per (flagged request, kind).")
    add_db(p)
    p.add_argument("--out", required=True, metavar="FILE.csv", help="the CSV file to write; - for standard output")
    p.add_argument("--kind", action="append", choices=REPORT_KINDS, help="only this kind (repeatable)")
    p.add_argument("--raw", action="store_true", help=RAW_HELP)
    add_filters(p)  # the Export page's selection
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser("stats", help="the headline numbers in the terminal")
    add_db(p)
    p.add_argument("--json", action="store_true")
    add_filters(p)
    p.set_defaults(func=cmd_stats)
