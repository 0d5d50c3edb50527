"""What a visitor may open: the dashboard's users are whoever reaches the port, with no login.

Stores and log files are opened only inside the config's [dashboard] roots, and the stores the
operator named (the --db it was started with, the configured shared store).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from specdec_core import config
from specdec_core.config import DashboardSettings
from specdec_core.store import resolve_db
from specdec_core.store.location import LocationError, lake_location
from ui.state import DB_ACCEPTED_KEY, DB_KEY, DB_REFUSED_KEY, default_db_path


def dashboard_settings() -> DashboardSettings:
    """The config's [dashboard] settings; the folder of the database the dashboard was started with
    (`--db` or $SPECDEC_DB, chosen by whoever started it) may always be opened too."""
    return config.dashboard_settings().with_roots(_started_store_folders())


def _started_store_folders() -> list[Path]:
    """The folder of the store the dashboard was started with: a DuckDB file's, or a local lake catalog's."""
    started = default_db_path()
    try:
        lake = lake_location(started)
    except LocationError:
        return []
    if lake is None:
        return [Path(started).resolve().parent]
    return [] if lake.postgres else [Path(lake.catalog).parent]


def operator_stores() -> tuple[str, ...]:
    """The stores the operator named (the configured shared store, the --db it was started with)."""
    try:
        return tuple(dict.fromkeys((default_db_path(), resolve_db(None))))
    except LocationError:
        return (default_db_path(),)


def confine_db_choice() -> None:
    """on_change of the Database box: a store outside the roots is refused, and the box goes back.

    What is kept is the store as it will be opened (an absolute path; a lake's resolved catalog),
    never the typed text: `md:`, `ducklake:` or a relative name can't mean something else later.
    """
    chosen = str(st.session_state.get(DB_KEY) or "").strip()
    try:
        # An emptied box is the store the dashboard was started with.
        chosen = dashboard_settings().confine_store(chosen, allowed=operator_stores()) if chosen else default_db_path()
    except (config.PathRefused, config.ConfigError) as exc:
        st.session_state[DB_KEY] = st.session_state.get(DB_ACCEPTED_KEY) or default_db_path()
        st.session_state[DB_REFUSED_KEY] = f"Database not changed: {exc}"
    else:
        st.session_state[DB_KEY] = st.session_state[DB_ACCEPTED_KEY] = chosen
        st.session_state.pop(DB_REFUSED_KEY, None)


def confined_log_files(text: str) -> list[str]:
    """The log files a path, folder or glob typed into the sidebar names, all inside the roots."""
    return dashboard_settings().confine_logs(text)

