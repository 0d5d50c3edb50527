"""Where the dashboard's files are and the `streamlit run` line that serves them (`specdec dashboard`).

The dashboard (app.py, pages/, ui/ and its .streamlit/config.toml) sits at the top of a checkout and is
shipped in the wheel as specdec_core/dashboard/ (pyproject.toml maps it there): from a checkout, an editable
install or a wheel, the same command finds it. Nothing here imports Streamlit.
"""

from __future__ import annotations

import sys
from pathlib import Path

from specdec_core.settings_file import tomllib
from specdec_core.text import ascii_digits

DEFAULT_HOST = "127.0.0.1"  # triage data is sensitive: this machine only unless the operator says otherwise
DEFAULT_PORT = 8501


class DashboardNotFound(RuntimeError):
    """The dashboard's files are not beside this specdec_core (an install that left them out)."""


def dashboard_app() -> Path:
    """app.py of the dashboard: in the installed package (a wheel), else at the top of the checkout."""
    package = Path(__file__).resolve().parent
    for folder in (package / "dashboard", package.parent):
        app = folder / "app.py"
        if app.is_file() and (folder / "pages").is_dir() and (folder / "ui").is_dir():
            return app
    raise DashboardNotFound(f"the dashboard's app.py, pages/ and ui/ are not in {package / 'dashboard'} nor in "
                            f"{package.parent}: reinstall specdec-triage[dashboard]")


def streamlit_settings(app: Path) -> dict[str, str]:
    """The dashboard's own Streamlit settings (.streamlit/config.toml beside app.py) by their flag names:
    Streamlit reads that file only from the folder it is started in, and the dashboard may start anywhere."""
    config = app.parent / ".streamlit" / "config.toml"
    if not config.is_file():
        return {}
    settings = {}
    for section, values in tomllib.loads(config.read_text(encoding="utf-8")).items():
        for key, value in values.items():
            settings[f"{section}.{key}"] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return settings


def parse_port(text: str) -> int:
    """A TCP port: ASCII digits only (int() would take other scripts' digits too), 1 to 65535."""
    if not ascii_digits(text) or not 1 <= int(text) <= 65535:
        raise ValueError(f"port {text!r} is not a number from 1 to 65535")
    return int(text)


def streamlit_command(db: str | None, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT) -> list[str]:
    """The command line that serves the dashboard on HOST:PORT over the store DB (else the default store)."""
    if not host.strip() or any(ch.isspace() for ch in host):
        raise ValueError(f"host {host!r} is not a host name or address")
    app = dashboard_app()
    settings = {**streamlit_settings(app), "server.address": host, "server.port": str(port)}
    command = [sys.executable, "-m", "streamlit", "run", str(app)]
    command += [part for name, value in settings.items() for part in (f"--{name}", value)]
    return command + (["--", "--db", db] if db else [])
