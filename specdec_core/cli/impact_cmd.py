"""`specdec impact`: who received wrong outputs; `specdec incident-report`: the postmortem drafted from the store."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from specdec_core.cli.common import (
    RAW_HELP,
    UsageError,
    cannot_write,
    listed,
    out_target,
    said_written,
    warn_unmatched,
)
from specdec_core.cli.store_cmds import add_db, add_filters, existing_store, stats_filters
from specdec_core.contract.names import IMPACT_DIMENSIONS
from specdec_core.store import Store

if TYPE_CHECKING:  # the analysis (pandas) is imported when a command asks a question
    from specdec_core.analysis import Filters


def _cell(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _name(value: str) -> str:
    """A logged name as one table cell: '(none)' for none, a line break, another control character or a character
    that is no glyph (a bidirectional override, U+202E, reversed the rest of the row) as a space (a consumer
    named 'a\nb' split its row in two)."""
    return "".join(ch if ch.isprintable() else " " for ch in value) if value else "(none)"


def cmd_impact(args: argparse.Namespace) -> int:
    from specdec_core.analysis.impact import experiment_impact, impact, rfc3339

    if args.experiments and args.by is not None:  # it went unread: the arms were printed as if it was obeyed
        raise UsageError("--by groups the table per value; --experiments is per experiment arm (its own "
                         "figures): give one of them")
    if args.out is None and (args.consumer is not None or args.raw):
        raise UsageError(f"{'--consumer' if args.consumer is not None else '--raw'} is for the affected requests' "
                         "CSV: give --out FILE.csv too")
    if args.out is not None and (args.experiments or args.json or args.by not in (None, "consumer")):
        other = "--experiments" if args.experiments else "--json" if args.json else f"--by {args.by}"
        raise UsageError("--out writes the affected requests, consumer by consumer (--consumer NAME: one); "
                         f"{other} prints the figures instead: give one of them")
    store = existing_store(args, "impact")
    if store is None:
        return 1
    filters = stats_filters(args)
    warn_unmatched("impact", store, filters)
    if args.out is not None:
        return _write_affected(store, args, filters)
    if args.experiments:
        result = experiment_impact(store, filters)
        if args.json:
            print(json.dumps(result.as_json()))
            return 0
        print(f"{'arm':<20}{'served from':<20}{'hits':>8}")
        for c in result.cross_feeding:
            print(f"{_name(c.arm):<20}{_name(c.served_from):<20}{c.hits:>8,}")
        print()
        print(f"{'arm':<20}{'requests all/clean':>20}{'output tokens':>20}{'latency ms':>22}{'acceptance':>18}")
        for a in result.arms:
            print(f"{_name(a.arm):<20}{f'{a.requests.all:,} / {a.requests.clean:,}':>20}"
                  f"{_cell(a.mean_output_tokens.all) + ' / ' + _cell(a.mean_output_tokens.clean):>20}"
                  f"{_cell(a.mean_latency_ms.all) + ' / ' + _cell(a.mean_latency_ms.clean):>22}"
                  f"{_cell(a.acceptance_rate.all, 3) + ' / ' + _cell(a.acceptance_rate.clean, 3):>18}")
        return 0
    by = args.by or "consumer"
    rows = impact(store, by, filters)
    if args.json:
        print(json.dumps([r.as_json() for r in rows]))
        return 0
    print(f"{by:<24}{'requests':>10}{'contaminated':>14}{'violations':>12}  first .. last")
    for r in rows:
        span = f"{rfc3339(r.first)} .. {rfc3339(r.last)}" if r.first else "-"
        print(f"{_name(r.value):<24}{r.requests:>10,}{r.contaminated_hits:>14,}{r.length_violations:>12,}  {span}")
    return 0


def _write_affected(store: Store, args: argparse.Namespace, filters: Filters) -> int:
    """`--out`: the affected requests as the Impact page's CSV, every consumer's or `--consumer`'s."""
    from specdec_core.analysis.impact import affected_rows, impact
    from specdec_core.analysis.report import report_csv, write_bytes

    target = out_target(args.out, store, "the CSV")
    rows = affected_rows(store, args.consumer, filters)
    try:
        write_bytes(target, report_csv(rows, raw=args.raw))
    except OSError as exc:
        print(f"specdec impact: {cannot_write('--out', args.out, exc)}", file=sys.stderr)
        return 1
    whose = "every consumer" if args.consumer is None else _name(args.consumer)
    said_written(f"wrote {len(rows):,} affected requests ({whose})", args.out)
    if args.consumer is None or len(rows):
        return 0
    held = {r.value for r in impact(store, "consumer", filters)}
    if args.consumer not in held:  # the CSV is empty for that reason, not because nothing reached them
        print(f"specdec impact: no consumer {args.consumer!r} in this store (it holds: {listed(sorted(held)) or 'none'})",
              file=sys.stderr)
    return 0


def cmd_incident_report(args: argparse.Namespace) -> int:
    from specdec_core.remediation.report import ReportError, write_incident_report

    store = existing_store(args, "incident-report")
    if store is None:
        return 1
    try:
        written = write_incident_report(store, args.out)
    except ReportError as exc:
        print(f"specdec incident-report: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"specdec incident-report: {cannot_write('--out', args.out, exc)}", file=sys.stderr)
        return 1
    print(f"wrote the incident report to {written}")
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("impact", help="who received wrong outputs: per consumer, experiment arm or deployment",
                              description="Per consumer (or experiment arm, or deployment): the requests, the "
                                          "contaminated hits and length violations received, the first and last. "
                                          "--experiments: which arm's outputs each arm received, and each arm's "
                                          "figures with and without its contaminated hits.")
    add_db(p)
    p.add_argument("--by", choices=IMPACT_DIMENSIONS, help="group by this field (default consumer)")
    p.add_argument("--experiments", action="store_true",
                   help="the cross-feeding between experiment arms and each arm's all/clean figures")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    add_filters(p)
    p.add_argument("--out", metavar="FILE.csv",
                   help="write the affected requests instead (what a customer notice lists: each request a consumer "
                        "received another's output or an over-long one for), as the Impact page downloads them, "
                        "consumer by consumer; - for standard output")
    p.add_argument("--consumer", metavar="NAME", help="with --out: only this consumer's ('' for none logged)")
    p.add_argument("--raw", action="store_true", help=RAW_HELP)
    p.set_defaults(func=cmd_impact)

    r = subparsers.add_parser("incident-report", help="draft the incident's postmortem (Markdown or HTML)",
                              description="Draft the postmortem from the store: summary, timeline, root cause, "
                                          "blast radius, remediation done and left, the mismatch report. "
                                          "FILE.html is one self-contained file with its charts.")
    add_db(r)
    r.add_argument("--out", required=True, metavar="FILE.md|FILE.html", help="where to write it (by its suffix)")
    r.set_defaults(func=cmd_incident_report)
