"""`specdec audit-key MODULE:FUNCTION --example FILE.json`: audit any cache-key function."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from specdec_core.cli.common import UsageError
from specdec_core.contract import fields as contract
from specdec_core.keys.audit import (
    KeyAuditError,
    audit_key_function,
    resolve_importable,
    unknown_ignore_names,
)


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "audit-key",
        help="check a cache-key function for ignored request fields and instability",
        description="Call MODULE:FUNCTION (one dict of request parameters -> key) on the example and on "
        "semantic variants of it. Exit 0: covered and stable (the log contract's identity fields the example "
        "lacks are named: their changes were not tried); 1: something was found; 2: usage. "
        "It imports MODULE and runs FUNCTION with your permissions, as `python -m` would import it (the current "
        "directory comes first on the import path): audit only code you trust. The dashboard audits only "
        "functions listed in specdec.toml's [dashboard] audit_functions.",
    )
    parser.add_argument("target", metavar="MODULE:FUNCTION", help="the key function, importable from here")
    parser.add_argument("--example", required=True, metavar="FILE.json", help="one request as a JSON object")
    parser.add_argument("--ignore", default="", metavar="a,b",
                        help="fields that cannot change the output (or that your requests never carry)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    # As with `python -m`: a module in the current directory is importable.
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        key_fn = resolve_importable(args.target)
    except ModuleNotFoundError as exc:
        raise UsageError(
            f"module {exc.name!r} not found (importing {args.target.partition(':')[0]!r} from {os.getcwd()})"
        ) from None
    except (AttributeError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    except Exception as exc:  # the module itself failed to import: say why, in one line
        raise UsageError(f"importing {args.target.partition(':')[0]!r} failed: {type(exc).__name__}: {exc}") from None
    try:
        with open(args.example, encoding="utf-8") as fh:
            example = json.load(fh)
    except OSError as exc:
        raise UsageError(f"cannot read example {args.example}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UsageError(f"example {args.example} is not valid JSON: {exc}") from None
    if not isinstance(example, dict):
        raise UsageError(f"example {args.example} must be one JSON object, got {type(example).__name__}")
    ignore = [name.strip() for name in args.ignore.split(",") if name.strip()]
    # An identity field the requests never carry may be ignored though the example lacks it (audit.untried).
    if unknown := {k: v for k, v in unknown_ignore_names(example, ignore).items() if k not in contract.IDENTITY_FIELDS}:
        named = ", ".join(
            f"{name!r}" + (f" (did you mean {close!r}?)" if close else "") for name, close in unknown.items()
        )
        fields = ", ".join(sorted(example))
        raise UsageError(f"--ignore names no field of the example: {named}; its fields: {fields}")
    try:
        audit = audit_key_function(key_fn, example, ignore=ignore, importable=args.target,
                                   expected=contract.IDENTITY_FIELDS)
    except KeyAuditError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(audit.to_dict(), ensure_ascii=False) if args.json else audit)
    return 0 if audit.ok else 1
