"""`specdec cache plan|purge|restore`: the purge plan from the store, and purging a production Redis with it."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from specdec_core.cli.common import UsageError, add_db, cannot_write, existing_store, warn_unmatched
from specdec_core.contract.names import DEFAULT_KEY_TEMPLATE

# The remediation (and the analysis under its plan: pandas) is imported by the command that runs, not by
# every `specdec` start.
if TYPE_CHECKING:
    from specdec_core.analysis import Filters
    from specdec_core.remediation import RedisTarget


def _instant(text: str, flag: str) -> datetime:
    """--since/--until as `specdec stats --start/--end` read them: --until with a date alone is that whole day,
    one without a fraction of a second that whole second."""
    from specdec_core.analysis.query import selection_time

    try:
        return selection_time(text, end=flag == "--until")
    except ValueError:
        raise ValueError(f"{flag} {text!r}: expected an RFC 3339 time, e.g. 2026-03-01T10:00:00Z") from None


def filters_from_args(args: argparse.Namespace) -> Filters:
    from specdec_core.analysis import Filters

    return Filters(start=_instant(args.since, "--since") if args.since else None,
                   end=_instant(args.until, "--until") if args.until else None,
                   deployments=tuple(args.deployment or ()))


def _fail(command: str, exc: Exception, code: int) -> int:
    print(f"specdec cache {command}: {exc}", file=sys.stderr)
    return code


def cmd_plan(args: argparse.Namespace) -> int:
    from specdec_core.remediation import PlanError, plan_counts, purge_plan, write_plan

    try:
        filters = filters_from_args(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    store = existing_store(args, "cache plan")
    if store is None:
        return 1
    warn_unmatched("cache plan", store, filters)
    try:
        entries = purge_plan(store, filters, args.key_template)
    except PlanError as exc:
        raise UsageError(str(exc)) from None
    try:
        write_plan(entries, args.out)
    except OSError as exc:
        return _fail("plan", cannot_write("--out", args.out, exc), 1)
    counts = plan_counts(entries)
    if args.json:
        print(json.dumps(counts.to_json()))
    else:
        print(f"wrote {counts.keys} keys to {args.out} ({counts.contaminated} contaminated, "
              f"{counts.collision} collision)")
    return 0


def _progress(enabled: bool):
    def show(done: int, total: int | None) -> None:
        if total:
            width = 30
            filled = width * done // max(total, 1)
            line = f"\r[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,} keys"
        else:
            line = f"\r{done:,} keys"
        print(line, end="", file=sys.stderr, flush=True)

    return show if enabled else None


def _target(args: argparse.Namespace) -> RedisTarget:
    from specdec_core.remediation import RedisTarget
    from specdec_core.remediation.target import check_url

    target = RedisTarget(args.redis, cluster=args.cluster, password_env=args.password_env)
    check_url(target.url)
    target.password()  # an unset variable is a usage error before anything is read
    return target


def _raise_interrupt(_signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt


def cmd_purge(args: argparse.Namespace) -> int:
    from specdec_core.remediation import (
        Interrupted,
        PlanError,
        PurgeError,
        PurgeRecord,
        purge_keys,
        purge_namespace,
        read_plan_keys,
        record_purge,
    )

    if (args.plan is None) == (args.namespace is None):
        raise UsageError("give --plan PLAN.jsonl or --namespace PREFIX (one of them)")
    try:
        target = _target(args)
        keys = read_plan_keys(args.plan) if args.plan is not None else None
    except PlanError as exc:
        return _fail("purge", exc, 1)
    except PurgeError as exc:
        return _fail("purge", exc, exc.exit_code)
    store = None
    if args.db is not None:
        store = existing_store(args, "cache purge")
        if store is None:
            return 1
    show = _progress(sys.stderr.isatty())
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)  # a killed purge still says what it did
    interrupted = False
    try:
        options = {"dry_run": args.dry_run, "backup": args.backup, "rate": args.rate, "batch": args.batch,
                   "progress": show}
        result = (purge_keys(target, keys, **options) if keys is not None
                  else purge_namespace(target, args.namespace, **options))
    except Interrupted as stopped:
        result, interrupted = stopped.result, True
    except PurgeError as exc:
        if show is not None:
            print(file=sys.stderr)
        return _fail("purge", exc, exc.exit_code)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if show is not None:
        print(file=sys.stderr)
    out = result.to_json()
    if interrupted:
        out["interrupted"] = True
    print(json.dumps(out), flush=True)
    if store is not None:
        record_purge(store, PurgeRecord(
            ts=datetime.now(timezone.utc), kind="plan" if keys is not None else "namespace", target=target.masked,
            plan=args.plan, namespace=args.namespace, planned=result.planned, deleted=result.deleted,
            missing=result.missing, dry_run=args.dry_run))
    if interrupted:
        print("specdec cache purge: interrupted; run the same command again to delete the rest", file=sys.stderr)
        return 130
    return 0


def cmd_restore(args: argparse.Namespace) -> int:
    from specdec_core.remediation import PurgeError, PurgeRecord, record_purge, restore_backup

    try:
        target = _target(args)
    except PurgeError as exc:
        return _fail("restore", exc, exc.exit_code)
    store = None
    if args.db is not None:
        store = existing_store(args, "cache restore")
        if store is None:
            return 1
    show = _progress(sys.stderr.isatty())
    try:
        result = restore_backup(target, args.backup, batch=args.batch, progress=show)
    except PurgeError as exc:
        return _fail("restore", exc, exc.exit_code)
    finally:
        if show is not None:
            print(file=sys.stderr)
    print(json.dumps({"restored": result.restored}), flush=True)
    if result.expired:
        print(f"specdec cache restore: {result.expired} of {result.entries} entries had outlived their TTL and "
              "were not restored", file=sys.stderr)
    if store is not None:
        record_purge(store, PurgeRecord(
            ts=datetime.now(timezone.utc), kind="restore", target=target.masked, plan=args.backup, namespace=None,
            planned=result.entries, deleted=0, missing=result.expired, dry_run=False))
    return 0


MAX_BATCH = 10_000  # one command's keys: a bigger one keeps the server from every other client meanwhile


def _batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"expected a whole number from 1 to {MAX_BATCH:,}, got {text}")
    return value


def _add_redis(p: argparse.ArgumentParser) -> None:
    p.add_argument("--redis", required=True, metavar="URL",
                   help="redis://[USER@]HOST:PORT[/DB], rediss://... or unix://PATH, without a password")
    p.add_argument("--cluster", action="store_true", help="the URL is any node of a Redis Cluster")
    p.add_argument("--password-env", metavar="NAME",
                   help="the environment variable that holds the password (never the command line)")
    p.add_argument("--batch", type=_batch_size, default=500, metavar="N",
                   help=f"keys a pipelined batch (500, at most {MAX_BATCH:,})")


def register(subparsers: argparse._SubParsersAction) -> None:
    cache = subparsers.add_parser("cache", help="purge poisoned entries from a production cache (plan, purge, "
                                                 "restore)",
                                  description="The purge plan from the store; purge and restore on Redis.")
    commands = cache.add_subparsers(dest="cache_command", metavar="COMMAND", parser_class=type(cache))
    commands.required = True

    p = commands.add_parser("plan", help="write the keys to remove, with why",
                            description="One JSON line per (deployment, cache key) that served a contaminated "
                                        "hit or several identities, in order of first contaminated hit.")
    add_db(p)
    p.add_argument("--out", required=True, metavar="PLAN.jsonl")
    p.add_argument("--deployment", action="append", metavar="D", help="only this deployment (repeatable)")
    p.add_argument("--since", metavar="T", help="only requests at or after this time (RFC 3339)")
    p.add_argument("--until", metavar="T", help="only requests at or before this time (RFC 3339; a date alone: "
                                                "through that day, a time without a fraction: that second)")
    p.add_argument("--key-template", default=DEFAULT_KEY_TEMPLATE, metavar="TEMPLATE",
                   help="the key in the cache for a logged key: {cache_key} and {deployment} are filled in "
                        "(default {cache_key}; e.g. 'myapp:{deployment}:{cache_key}')")
    p.add_argument("--json", action="store_true", help='print {"keys", "contaminated", "collision"}')
    p.set_defaults(func=cmd_plan)

    p = commands.add_parser("purge", help="remove a plan's keys (or a namespace) from Redis",
                            description="Unlink exactly the plan's redis_keys, or every key under --namespace, "
                                        "in pipelined batches; prints one JSON object.")
    p.add_argument("--plan", metavar="PLAN.jsonl", help="the plan `specdec cache plan` wrote")
    p.add_argument("--namespace", metavar="PREFIX",
                   help="instead of a plan: every key that starts with PREFIX (SCAN MATCH, glob characters "
                        "escaped); an empty prefix is refused")
    _add_redis(p)
    p.add_argument("--dry-run", action="store_true", help="change nothing: count the keys that would go")
    p.add_argument("--backup", metavar="FILE",
                   help="first append each existing key's DUMP payload and TTL to FILE (JSON Lines)")
    p.add_argument("--rate", type=float, metavar="N", help="at most N deletions a second (a dry run is not held)")
    p.add_argument("--db", help="record the run in this store's purges table (for the incident report)")
    p.add_argument("--json", action="store_true", help="(the default) print the result as one JSON object")
    p.set_defaults(func=cmd_purge)

    p = commands.add_parser("restore", help="put a purge's backup back",
                            description="RESTORE ... REPLACE each key of a --backup file with what is left of "
                                        "its TTL; prints {\"restored\": N}.")
    p.add_argument("--backup", required=True, metavar="FILE")
    _add_redis(p)
    p.add_argument("--db", help="record the run in this store's purges table")
    p.set_defaults(func=cmd_restore)
