"""What the command modules share: the --db option, opening an existing store, and the usage error."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any, BinaryIO

from specdec_core.store import Store
from specdec_core.text import escape_controls, escape_lines


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


# --raw of the commands that write log text into a CSV (report_csv).
RAW_HELP = ("write log text exactly as logged; by default a text cell starting with = + - @ tab or CR gets a "
            "leading ' so a spreadsheet shows it instead of running it as a formula")


class _Terminal:
    """Standard output where it is a terminal, for a CSV of log text: each control character written as its
    escape, as every other line specdec prints. A prompt holding an escape sequence would otherwise clear the
    screen, retitle the window or make a link when the report is read there; piped or redirected, the CSV keeps
    its bytes."""

    def write(self, data: bytes) -> None:
        sys.stdout.write(escape_lines(data.decode("utf-8", "replace")))

    def flush(self) -> None:
        sys.stdout.flush()


def out_target(out: str, store: Store, what: str) -> str | BinaryIO | _Terminal:
    """Where a command writes its `--out`: standard output for `-` (escaped where it is a terminal), else the
    file, which may not be the store."""
    if out == "-":
        return _Terminal() if sys.stdout.isatty() else sys.stdout.buffer
    if same_file(out, store.path):
        raise UsageError(f"--out {out} is the database itself; write {what} to another file")
    return out


def said_written(text: str, out: str) -> None:
    """What a command wrote where: beside a CSV on standard output, on standard error."""
    print(f"{text} to {'standard output' if out == '-' else out}", file=sys.stderr if out == "-" else sys.stdout)


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether two paths name one file (an --out that would overwrite the store itself)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def listed(names: list[str], most: int = 12) -> str:
    """Names a store holds, for a one-line message: the first `most`, each as its characters are (control
    characters escaped), '(none)' for the empty name."""
    shown = ", ".join(escape_controls(n) if n else "(none)" for n in names[:most])
    return shown + (", ..." if len(names) > most else "")


def cannot_write(flag: str, path: object, exc: OSError) -> str:
    """The one line a command says when its output file can't be written: the option, the path and why."""
    return f"{flag} {path}: cannot write: {exc.strerror or exc}"


def warn_unmatched(command: str, store: Store, filters: Any) -> None:
    """On standard error, each filter value the store does not hold and a range that ends before it starts: the
    answer is then empty for that reason, not because nothing happened (a misspelt deployment read as "nothing
    to purge"). The answer itself stays as asked."""
    if filters.start is not None and filters.end is not None and filters.start > filters.end:
        print(f"specdec {command}: the time range starts after it ends: no request can be in it", file=sys.stderr)
    from specdec_core.analysis.overview import NAMED_FILTERS, filter_options, values_not_held

    asked = {key: getattr(filters, key) for key, _ in NAMED_FILTERS}
    if not any(asked.values()):
        return
    options = filter_options(store)
    for key, missing in values_not_held(options, asked).items():
        held = getattr(options, key)
        known = listed(held)
        what = dict(NAMED_FILTERS)[key]
        for value in missing:
            print(f"specdec {command}: no {what} {value!r} in this store (it holds: {known or 'none'})",
                  file=sys.stderr)
