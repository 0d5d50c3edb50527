"""`specdec dashboard`: serve the dashboard over a store, from any folder (as `datasette serve`, `mlflow ui`)."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import threading

from specdec_core.cli.common import UsageError
from specdec_core.dashboard_launch import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    DashboardNotFound,
    parse_port,
    streamlit_command,
)
from specdec_core.extras import require

STOP_GRACE_S = 10.0


def cmd_dashboard(args: argparse.Namespace) -> int:
    require("dashboard", "streamlit")
    try:
        port = parse_port(args.port)
        command = streamlit_command(args.db, args.host, port)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except DashboardNotFound as exc:
        print(f"specdec dashboard: {exc}", file=sys.stderr)
        return 1
    print(f"specdec dashboard: serving http://{args.host}:{port}/ (Ctrl-C stops it)", file=sys.stderr, flush=True)
    server = subprocess.Popen(command)

    def stop(_signum: int, _frame: object) -> None:
        """A service manager's stop (SIGTERM to this process alone) stops the server too: it would otherwise run
        on without us, holding the port. Streamlit's server waits for the requests in flight without a limit (a
        browser's open tab kept one stopping for good): killed after STOP_GRACE_S."""
        server.terminate()
        timer = threading.Timer(STOP_GRACE_S, server.kill)
        timer.daemon = True
        timer.start()

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        code = server.wait()
        return code if code >= 0 else 128 - code  # a killed server: 137, as a shell says it
    except KeyboardInterrupt:  # Streamlit got the same Ctrl-C and stops itself
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("dashboard", help="serve the dashboard over a store (http://127.0.0.1:8501/)",
                              description="Serve the triage dashboard over a store, from any folder. It binds to "
                                          "this machine only unless --host says otherwise: it has no login.")
    p.add_argument("--db", metavar="STORE", help="the store to open (default: $SPECDEC_DB, the [store] of "
                                                 "specdec.toml, else data/specdec.duckdb)")
    p.add_argument("--host", default=DEFAULT_HOST, help=f"address to listen on ({DEFAULT_HOST})")
    p.add_argument("--port", default=str(DEFAULT_PORT), help=f"port to listen on ({DEFAULT_PORT})")
    p.set_defaults(func=cmd_dashboard)
