"""`specdec migrate`: bring a store written by an older specdec up to date (reads never do it themselves)."""

from __future__ import annotations

import argparse

from specdec_core.cli.store_cmds import add_db, existing_store
from specdec_core.store import migrate


def cmd_migrate(args: argparse.Namespace) -> int:
    store = existing_store(args, "migrate")
    if store is None:
        return 1
    rebuilt = migrate(store)
    print(f"{store}: {'rejudged hits and rebuilt summaries' if rebuilt else 'already up to date'}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("migrate", help="bring a store written by an older specdec up to date",
                              description="Add the tables and columns this version has, rejudge hits and "
                                          "rebuild summaries where they predate it. Every ingest does this too.")
    add_db(p)
    p.set_defaults(func=cmd_migrate)
