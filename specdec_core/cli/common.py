"""What the command modules share: the --db option, opening an existing store, and the usage error."""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

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


def show_batch(batch: Any, as_json: bool, metrics: Any) -> None:
    """A follower's line for one committed batch (one JSON object with --json); a follower serving metrics
    reads its figures right after, so the next scrape finds this batch's ready."""
    line = json.dumps({**batch.result.to_json(), "lag_seconds": batch.lag_seconds}) if as_json \
        else f"{time.strftime('%H:%M:%S')} {batch.status_line()}"
    print(line, flush=True)
    if metrics is not None:
        metrics.collector.figures()
