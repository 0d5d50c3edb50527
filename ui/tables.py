"""Tables: every page's dataframes with the same human headers, one timestamp format, rates as percentages
and temperatures as `0` (not `0.0`), as the charts and the sentences show them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import streamlit as st

from ui.format import fmt_pct
from ui.state import request_url


def request_link_column() -> Any:
    """The first column of every table of requests: a link to the request's own page."""
    return st.column_config.LinkColumn("request", display_text="open", width="small",
                                       help="The request's page: its source, both outputs, replays")

# One timestamp format everywhere: fmt_ts's "%Y-%m-%d %H:%M:%S" as moment.js (tables, the slider) and d3
# (charts' hover) write it. The zone is named once where the time is shown: a header, a label, an axis.
TIME_FORMAT = "YYYY-MM-DD HH:mm:ss"
TIME_FORMAT_D3 = "%Y-%m-%d %H:%M:%S"
HIGHLIGHT = "background-color: #fde2c4"

HEADERS = {
    "request_id": "request", "ts": "time", "source_request_id": "source request", "source_ts": "source time",
    "target_model": "target model", "draft_model": "draft model", "tokenizer_version": "tokenizer",
    "max_tokens": "max tokens", "output_tokens": "output tokens", "cache_key": "cache key", "cache_hit": "cache hit",
    "differing_fields": "differing fields", "output_preview": "output (start)", "prompt_preview": "prompt (start)",
    "prompt_hash": "prompt hash", "classification": "verdict", "replay_id": "replay id", "replayed_at": "replayed at",
    "request_ts": "request time", "first_divergent_token": "first divergent token",
    "unique_keys": "unique keys", "unique_identities": "unique identities", "keys_per_identity": "keys per identity",
    "hit_rate": "hit rate", "max_correct_hit_rate": "ceiling for a correct key",
    "first_sight_hits": "hits on never-served identities", "partial_hits": "hits with unknown fields",
    "contaminated_hits": "contaminated hits",
    "first_contaminated": "first contaminated hit", "last_contaminated": "last contaminated hit",
    "mean_ms": "mean (ms)", "p50_ms": "median (ms)", "p95_ms": "95th percentile (ms)",
    "decoded_requests": "decoded requests", "draft_tokens": "draft tokens", "accepted_tokens": "accepted tokens",
    "acceptance_rate": "acceptance rate", "mean_accepted_length": "accepted tokens per step",
    "mismatch_rate": "contaminated share of hits", "source_file": "file", "source_line": "line",
    "raw": "record as logged", "latency_ms": "latency (ms)", "match_field": "found in",
    "match_before": "…before", "match_text": "match", "match_after": "after…",
    "first_request_id": "first request",
}
PERCENT_COLUMNS = ("similarity",)  # besides every *_rate


def header(name: str) -> str:
    return HEADERS.get(name, name.replace("_", " "))


def is_percent(name: str) -> bool:
    return name.endswith("_rate") or name in PERCENT_COLUMNS


def is_time(column: pd.Series) -> bool:
    return pd.api.types.is_datetime64_any_dtype(column)


def columns_for(frame: pd.DataFrame) -> dict[str, Any]:
    """Each column's header and format, by its name and type."""
    config: dict[str, Any] = {}
    for name in frame.columns:
        if is_time(frame[name]):
            config[name] = st.column_config.DatetimeColumn(f"{header(name)} (UTC)", format=TIME_FORMAT)
        elif is_percent(name):
            config[name] = st.column_config.NumberColumn(header(name), format="percent")
        elif name == "temperature" and pd.api.types.is_numeric_dtype(frame[name]):
            # As text (unknown_cells: "unknown" beside numbers), a number column would draw "unknown" empty.
            config[name] = st.column_config.NumberColumn(header(name), format="%g")
        else:
            config[name] = header(name)
    return config


def _display(value: Any, name: str, time: bool) -> str:
    """A cell as text, for a styled table (Streamlit shows a Styler's text, not the column's format)."""
    if value is None or (not isinstance(value, str | list | tuple) and pd.isna(value)):
        return ""
    if time:
        return pd.Timestamp(value).strftime(TIME_FORMAT_D3)
    if is_percent(name):
        return fmt_pct(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def unknown_cells(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with each cell its row's `unknown_fields` names reading "unknown" (a LiteLLM hit's temperature):
    left empty it read as a value never sent (Streamlit draws a missing cell as "None"). The list itself goes."""
    if "unknown_fields" not in frame.columns:
        return frame
    shown = frame.drop(columns="unknown_fields")
    # A row whose log left nothing unknown holds NULL (read as pandas' NA), not an empty list.
    listed = [list(u) if isinstance(u, list | tuple | np.ndarray) else [] for u in frame["unknown_fields"]]
    for name in shown.columns:
        marked = [name in u for u in listed]
        if any(marked):  # as text, the values as a styled table writes them: one type, as Arrow wants a column
            shown[name] = ["unknown" if m else _display(v, name, False)
                           for m, v in zip(marked, shown[name], strict=True)]
    return shown


def table(frame: pd.DataFrame, *, highlight: Sequence[str] = (), column_config: dict[str, Any] | None = None,
          **kwargs: Any) -> Any:
    """st.dataframe with the shared headers and formats (`column_config` overrides a column's), without the
    index; the `highlight` columns' cells on a highlighted background; a frame's `unknown_fields` as its cells
    reading "unknown" (unknown_cells)."""
    frame = unknown_cells(frame)
    config = {**columns_for(frame), **(column_config or {})}
    data: Any = frame
    if highlight:
        times = {name for name in frame.columns if is_time(frame[name])}
        data = frame.style.format({name: (lambda v, n=name: _display(v, n, n in times)) for name in frame.columns})
        data = data.map(lambda _: HIGHLIGHT, subset=[c for c in highlight if c in frame.columns])
    return st.dataframe(data, hide_index=True, column_config=config, **kwargs)


def side_by_side(rows: pd.DataFrame, *, marked: Sequence[int], **kwargs: Any) -> Any:
    """A comparison of text columns (a field, then one column per side), the `marked` rows on a highlighted
    background: where two requests' identities differ."""
    marked_rows = set(marked)
    styled = rows.style.apply(lambda row: [HIGHLIGHT if row.name in marked_rows else ""] * len(row), axis=1)
    return st.dataframe(styled, hide_index=True, **kwargs)


def request_table(rows: pd.DataFrame, *, key: str, **kwargs: Any) -> Any:
    """Requests with a link to each one's page in the first column."""
    shown = rows.copy()
    shown.insert(0, "open", [request_url(r) for r in shown["request_id"]])
    links = {"open": request_link_column()}
    return table(shown, key=key, column_config={**links, **kwargs.pop("column_config", {})}, **kwargs)
