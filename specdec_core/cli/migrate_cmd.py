"""`specdec migrate`: bring a store written by an older specdec up to date (reads never do it themselves)."""

from __future__ import annotations

import argparse

from specdec_core.cli.common import add_db, existing_store
from specdec_core.derived import migrate
from specdec_core.derived.migrate import copy_store
from specdec_core.store import Store


def cmd_migrate(args: argparse.Namespace) -> int:
    store = existing_store(args, "migrate")
    if store is None:
        return 1
    # A StoreError is said by cli.main, in one line naming the store, with exit 1.
    if args.to:
        dest = Store(args.to)
        copied = copy_store(store, dest)
        print(f"{store} -> {dest}: copied {copied:,} requests, rejudged hits and rebuilt summaries")
        return 0
    changes = migrate(store)
    print(f"{store}: {'; '.join(changes) if changes else 'already up to date'}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("migrate", help="bring a store written by an older specdec up to date",
                              description="Add the tables and columns this version has, rejudge hits and "
                                          "rebuild summaries where they predate it. Every ingest does this too.")
    add_db(p)
    p.add_argument("--to", metavar="STORE", help="copy the --db store into STORE, a new store (a file, or "
                                                 "ducklake:CATALOG: a local store into a shared one)")
    p.set_defaults(func=cmd_migrate)
