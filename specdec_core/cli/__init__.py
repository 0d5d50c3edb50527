"""The `specdec` command: a thin layer over specdec_core, one module per command group.

Exit codes: 0 done, 1 the work could not be done (an unreadable path, a finding),
2 usage (a command whose pip extra is not installed included). Errors are one line on stderr.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

import duckdb

from specdec_core import interrupts
from specdec_core.cli.common import UsageError
from specdec_core.extras import MissingExtra
from specdec_core.store.connection import StoreError
from specdec_core.store.location import mask_secrets

# Each command and the module that registers it (`register(subparsers)`; its parsers set `func(args) -> int`).
# A run imports its command's module only: every module at each start was 0.12 s of the 0.41 s of CPU of a
# `specdec metrics rules` (pyarrow and the other commands' code; a command that reads frames imports pandas,
# and with it pyarrow, anyway). tests/cli/test_cli_edges.py holds this table equal to what the modules register.
COMMANDS: dict[str, str] = {
    "ingest": "specdec_core.cli.store_cmds", "report": "specdec_core.cli.store_cmds",
    "stats": "specdec_core.cli.store_cmds",
    "collect": "specdec_core.cli.collect_cmd",
    "migrate": "specdec_core.cli.migrate_cmd",
    "replay": "specdec_core.cli.replay_cmd",
    "demo": "specdec_core.cli.demo_cmd",
    "audit-key": "specdec_core.cli.audit_cmd",
    "models": "specdec_core.cli.models_cmds",
    "metrics": "specdec_core.cli.metrics_cmd",
    "cache": "specdec_core.cli.cache_cmd",
    "impact": "specdec_core.cli.impact_cmd", "incident-report": "specdec_core.cli.impact_cmd",
    "dashboard": "specdec_core.cli.dashboard_cmd",
}
COMMAND_MODULES: tuple[str, ...] = tuple(dict.fromkeys(COMMANDS.values()))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's default prints usage; keep it to one line
        self.exit(2, f"{self.prog}: error: {message}\n")  # the command named, as its other errors do


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole parser; with a known `command`, the parser of that command's module only (what a run of it
    parses: the same options, help and errors)."""
    parser = _Parser(prog="specdec", description="Triage a speculative-decoding cache incident.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    subparsers.required = True
    for name in (COMMANDS[command],) if command in COMMANDS else COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def _is_interrupt(exc: BaseException) -> bool:
    """Ctrl-C, however it arrives: DuckDB turns it into its own exception, or a RuntimeError, mid-query."""
    if isinstance(exc, (KeyboardInterrupt, duckdb.InterruptException)):
        return True
    return type(exc) is RuntimeError and str(exc) == "Query interrupted"


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: the interpreter's last flush of a closed pipe would print an error at exit."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def _command_name(args: argparse.Namespace) -> str:
    """The command as typed: `cache plan`, `metrics serve`, or a command of no group, `ingest`."""
    sub = getattr(args, f"{args.command}_command", None)
    return f"{args.command} {sub}" if isinstance(sub, str) else args.command


def main(argv: Sequence[str] | None = None) -> int:
    interrupts.install()
    try:
        argv = sys.argv[1:] if argv is None else list(argv)
        args = build_parser(argv[0] if argv else None).parse_args(argv)
        try:
            return int(args.func(args) or 0)
        except BrokenPipeError:  # `specdec stats | head -1`: the reader has what it wanted (an OSError: first)
            _quiet_stdout()
            return 0
        except (UsageError, MissingExtra) as exc:
            print(f"specdec {_command_name(args)}: {exc}", file=sys.stderr)
            return 2
        except (StoreError, OSError) as exc:  # what a command didn't say itself: still one line, naming the file
            print(f"specdec {args.command}: {mask_secrets(str(exc))}", file=sys.stderr)
            return 1
        except duckdb.OutOfMemoryException as exc:  # the store is as it was: a write commits whole or not at all
            print(f"specdec {args.command}: {str(exc).splitlines()[0]}; nothing was written", file=sys.stderr)
            return 1
    except BaseException as exc:
        if not _is_interrupt(exc):
            raise
        print("specdec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
