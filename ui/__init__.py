"""What app.py and every page share, by job: this session's state and database (`state`), what a visitor
may open (`access`), text for the screen (`format`) and time charts (`charts`). Pages use the names
re-exported here (`ui.cached`, `ui.fmt_ts`, ...), and tables with the same headers and formats (`tables`)."""

from ui.access import (
    confine_db_choice,
    confined_log_files,
    dashboard_settings,
    operator_stores,
)
from ui.charts import (
    ALARM,
    GOOD,
    PALETTE,
    TIME_KEY,
    TIME_ZOOM_KEY,
    annotate,
    annotations,
    bucket_delta,
    click_bridge,
    fit_value_axes,
    panel_spacing,
    point_deployment,
    point_time,
    readable_layout,
    show_point_rows,
    time_chart,
)
from ui.format import (
    bucket_words,
    code_span,
    deployment_label,
    filter_slug,
    fmt_duration,
    fmt_int,
    fmt_pct,
    fmt_ts,
    md_escape,
    plot_label,
    plural,
    short_digest,
)
from ui.state import (
    ANNOTATIONS_KEY,
    DB_ACCEPTED_KEY,
    DB_KEY,
    DB_REFUSED_KEY,
    FILTERS_KEY,
    PAGE_FILES,
    PRELOAD_KEY,
    REPLAY_IDS_KEY,
    REPLAY_JOB_KEY,
    REPLAY_RESULTS_KEY,
    REPLAY_START_KEY,
    SLIDER_LIMITS,
    VIEW_PARAMS_KEY,
    cached,
    default_db_path,
    empty_state,
    entrypoint,
    filters,
    has_data,
    page_header,
    page_link,
    replay_url,
    request_url,
    require_data,
    store,
    view_params,
)
from ui.tables import TIME_FORMAT, columns_for, header, request_table, table

__all__ = [
    "ALARM", "ANNOTATIONS_KEY", "DB_ACCEPTED_KEY", "DB_KEY", "DB_REFUSED_KEY", "FILTERS_KEY", "GOOD", "PAGE_FILES",
    "PALETTE", "PRELOAD_KEY", "REPLAY_IDS_KEY", "REPLAY_JOB_KEY", "REPLAY_RESULTS_KEY", "REPLAY_START_KEY",
    "SLIDER_LIMITS", "TIME_KEY", "VIEW_PARAMS_KEY", "TIME_ZOOM_KEY", "annotate", "annotations", "bucket_delta", "bucket_words", "plural", "cached", "click_bridge", "fit_value_axes",
    "code_span", "confine_db_choice", "confined_log_files", "dashboard_settings", "default_db_path",
    "deployment_label", "empty_state", "entrypoint", "filter_slug", "filters", "fmt_duration", "fmt_int", "fmt_pct",
    "fmt_ts", "has_data", "md_escape", "operator_stores", "page_header", "page_link", "panel_spacing",
    "plot_label", "point_deployment", "point_time", "readable_layout", "replay_url", "request_table", "request_url",
    "require_data", "short_digest", "show_point_rows", "store", "time_chart", "TIME_FORMAT", "columns_for", "header",
    "table", "view_params",
]
