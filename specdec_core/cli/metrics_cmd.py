"""`specdec metrics serve|rules|grafana`: the store's figures for Prometheus, its alert rules, a Grafana dashboard."""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
import threading
from types import ModuleType
from typing import Any

from specdec_core.cli.common import UsageError, add_db, existing_store
from specdec_core.config import ConfigError, dashboard_settings
from specdec_core.extras import require
from specdec_core.monitoring.figures import DEFAULT_TOP
from specdec_core.store.connection import Store, StoreError, release_snapshots

DEFAULT_LISTEN = "127.0.0.1:9464"


def exporter_module() -> ModuleType:
    """monitoring.exporter; MissingExtra (says how to install prometheus_client) without the metrics extra."""
    require("metrics", "prometheus_client")
    from specdec_core.monitoring import exporter

    return exporter


def _listen(exporter: ModuleType, listen: str, top: int, flag: str, top_flag: str) -> str:
    """The HOST:PORT to serve on; UsageError for a bad address or a --top below 1."""
    try:
        address = exporter.parse_listen(listen)
    except ValueError as exc:
        raise UsageError(f"{flag} {exc}" if "HOST:PORT" in str(exc) else str(exc)) from None
    if top < 1:
        raise UsageError(f"{top_flag} {top}: expected a number >= 1")
    return address


def add_top(parser: argparse.ArgumentParser, flag: str = "--top") -> None:
    parser.add_argument(flag, type=int, default=DEFAULT_TOP, metavar="N", dest="top",
                        help=f"keep each label's N values with the most requests, fold the rest into \"other\" "
                             f"({DEFAULT_TOP})")


def cmd_serve(args: argparse.Namespace) -> int:
    exporter = exporter_module()
    listen = _listen(exporter, args.listen, args.top, "--listen", "--top")
    store = existing_store(args, "metrics serve")
    if store is None:
        return 1
    try:  # a store that can't be read (another application's database, an older specdec's) is said now, once
        readable(store)
    except StoreError as exc:
        print(f"specdec metrics serve: {exc}", file=sys.stderr)
        return 1
    try:
        server = exporter.serve(store, listen, args.top)
    except OSError as exc:
        print(f"specdec metrics serve: can't listen on {listen}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda _signum, _frame: stop.set())
    bound = dataclasses.replace(listen, port=server.port)  # --listen HOST:0 takes a free port: say which
    print(f"serving {store} at http://{bound}/metrics", file=sys.stderr, flush=True)
    stop.wait()
    server.stop()
    return 0


def readable(store: Store) -> None:
    """A StoreError unless `store` can be read as a specdec store of this version (every scrape reads it)."""
    try:
        with store.read() as con:
            con.execute("SELECT count(*) FROM quarantine").fetchall()
    finally:
        release_snapshots()  # the exporter reads on a thread of its own and opens the view it needs


def start_follower_metrics(store: Store, listen_text: str, top: int) -> Any:
    """`specdec ingest --follow --metrics HOST:PORT`: the running exporter (monitoring.exporter.Running).

    UsageError for a bad address or --metrics-top, MissingExtra without prometheus_client, OSError (one line
    naming the address) when it can't listen there."""
    exporter = exporter_module()
    listen = _listen(exporter, listen_text, top, "--metrics", "--metrics-top")
    try:
        return exporter.serve(store, listen, top)
    except OSError as exc:
        raise OSError(f"--metrics: can't listen on {listen}: {exc.strerror or exc}") from None


def _dashboard_url(args: argparse.Namespace) -> str:
    """The links' base URL, checked once for `rules` and `grafana` alike (ValueError, ConfigError: one line)."""
    from specdec_core.monitoring.rules import DEFAULT_DASHBOARD_URL, check_dashboard_url

    if args.dashboard_url is not None:
        return check_dashboard_url(args.dashboard_url)
    settings = dashboard_settings(args.config)
    if settings.external_url is None:
        return DEFAULT_DASHBOARD_URL
    return check_dashboard_url(settings.external_url, f"{settings.source}: [dashboard] external_url")


def cmd_rules(args: argparse.Namespace) -> int:
    from specdec_core.monitoring.rules import RuleOptions, rules_yaml

    try:
        print(rules_yaml(RuleOptions(_dashboard_url(args), args.window, args.stale_after)), end="")
    except (ValueError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    return 0


def cmd_grafana(args: argparse.Namespace) -> int:
    from specdec_core.monitoring.grafana import dashboard

    try:
        board = dashboard(_dashboard_url(args))
    except (ValueError, ConfigError) as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(board, indent=2))
    return 0


def _add_dashboard_url(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dashboard-url", metavar="URL",
                        help="the triage dashboard's address for links (default: [dashboard] external_url in "
                             "specdec.toml, else http://127.0.0.1:8501)")
    parser.add_argument("--config", metavar="FILE", help="the settings file (default: $SPECDEC_CONFIG or specdec.toml)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("metrics", help="Prometheus metrics, alert rules and a Grafana dashboard",
                              description="Watch a store: metrics for Prometheus, the rules that page, a dashboard.")
    sub = p.add_subparsers(dest="metrics_command", metavar="SUBCOMMAND", parser_class=type(p))
    sub.required = True

    s = sub.add_parser("serve", help="serve the store's figures at http://HOST:PORT/metrics")
    add_db(s)
    s.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT", help=f"({DEFAULT_LISTEN})")
    add_top(s)
    s.set_defaults(func=cmd_serve)

    s = sub.add_parser("rules", help="print the Prometheus alert rules (YAML)")
    _add_dashboard_url(s)
    s.add_argument("--window", default="5m", metavar="DURATION",
                   help="how long a 'new contaminated hit' alert fires after the last one: a Prometheus "
                        "duration such as 90s or 1h30m (5m)")
    s.add_argument("--stale-after", type=int, default=900, metavar="SECONDS",
                   help="SpecdecIngestStale: newest request older than this (900)")
    s.set_defaults(func=cmd_rules)

    s = sub.add_parser("grafana", help="print a Grafana dashboard over these metrics (JSON)")
    _add_dashboard_url(s)
    s.set_defaults(func=cmd_grafana)
