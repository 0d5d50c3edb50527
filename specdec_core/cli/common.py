"""What the command modules share: the --db option, opening an existing store, and the usage error."""

from __future__ import annotations

import argparse
import sys

from specdec_core.store import Store


class UsageError(Exception):
    """The command was called wrongly (a bad option value, a bad file given as an option): nothing was done.

    `cli.main` says it in one line, `specdec COMMAND: MESSAGE`, and exits 2.
    """


def add_db(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="DuckDB file (default: $SPECDEC_DB or data/specdec.duckdb)")


def existing_store(args: argparse.Namespace, command: str) -> Store | None:
    """The --db store, or None after saying on stderr that it does not exist (reading never creates one)."""
    store = Store(args.db)
    if store.exists:
        return store
    print(f"specdec {command}: {store.path}: no such database; load logs with `specdec ingest PATH --db FILE`",
          file=sys.stderr)
    return None
