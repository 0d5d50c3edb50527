"""`specdec migrate`: bring a store written by an older specdec up to date (reads never do it themselves)."""

from __future__ import annotations

import argparse
import sys

from specdec_core.store import Store, migrate


def cmd_migrate(args: argparse.Namespace) -> int:
    store = Store(args.db)
    if not store.exists:
        print(f"specdec migrate: {store.path}: no such database", file=sys.stderr)
        return 1
    rebuilt = migrate(store)
    print(f"{store.path}: {'rejudged hits and rebuilt summaries' if rebuilt else 'already up to date'}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("migrate", help="bring a store written by an older specdec up to date",
                              description="Add the tables and columns this version has, rejudge hits and "
                                          "rebuild summaries where they predate it. Every ingest does this too.")
    p.add_argument("--db", help="DuckDB file (default: $SPECDEC_DB or data/specdec.duckdb)")
    p.set_defaults(func=cmd_migrate)
