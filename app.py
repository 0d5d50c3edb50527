"""specdec-triage dashboard: `streamlit run app.py -- --db FILE`.

The entry holds the navigation and the shared sidebar (database, loading logs, filters);
each page in pages/ answers one question from what `specdec_core` computes.
"""

from __future__ import annotations

import shutil
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

import streamlit as st

import ui
from specdec_core import analysis
from specdec_core.analysis import NO_FILTERS, Filters
from specdec_core.analysis.impact import rfc3339
from specdec_core.analysis.query import selection_time
from specdec_core.config import ConfigError, PathRefused
from specdec_core.formats import FORMATS
from specdec_core.formats.files import JSON_DOCUMENT_SUFFIXES, SUPPORTED_SUFFIXES
from specdec_core.ingestion import ingest
from specdec_core.replay import jobs as replay_jobs
from specdec_core.store import LogReadError, Store, StoreError
from ui import links as url_links

LAST_INGEST_KEY = "last_ingest"
# What `specdec ingest` reads, by the last part of each name (.jsonl.gz and .csv.gz as "gz").
UPLOAD_TYPES = sorted({suffix.rsplit(".", 1)[-1] for suffix in SUPPORTED_SUFFIXES + JSON_DOCUMENT_SUFFIXES})
# As `specdec ingest --format`: every format it reads, in its order.
FORMAT_NAMES = {"contract": "the log contract", "otel": "OpenTelemetry GenAI spans",
                "openinference": "OpenInference spans (Arize Phoenix)", "litellm": "LiteLLM payloads",
                "langfuse": "Langfuse observations"}
LOG_FORMATS = {"auto": "auto (decided per file)", **{name: FORMAT_NAMES.get(name, name) for name in FORMATS}}
# The filters' query parameters: a view pasted into a ticket opens with the same selection.
URL_KEYS = ("start", "end", "deployment", "target_model", "draft_model", "db", "notes")
NOTES_KEY = "annotations_text"
URL_WRITTEN_KEY = "_url_written"
LIVE_EVERY_S = 5
NEW_DB_TOGGLE = "load_new_db"
NEW_DB_PATH = "load_new_db_path"
NEXT_DB_KEY = "_db_next"  # a store a load just made, for the Database box to open on the next run

st.set_page_config(page_title="specdec-triage", page_icon="🔎", layout="wide")

ICONS = {"Overview": ":material/dashboard:", "Cache": ":material/cached:", "Output length": ":material/straighten:",
         "Mismatches": ":material/difference:", "Keys": ":material/key:", "Replay": ":material/replay:",
         "Impact": ":material/group:",
         "Search": ":material/search:", "Export": ":material/download:", "Request": ":material/receipt_long:"}
PAGES = {title: st.Page(path, title=title, icon=ICONS[title], default=title == "Overview")
         for title, path in ui.PAGE_FILES.items()}
# The sidebar's own links (below) carry the view's filters: a page switch is then one history entry with them,
# where Streamlit's menu would add the page bare and the filters as entries of their own.
navigation = st.navigation(list(PAGES.values()), position="hidden")


def load_logs(paths: list[str], names: dict[str, str] | None = None) -> None:
    """Ingest with a progress bar; the counts stay in the sidebar until the next load. `names`: the name
    each file is recorded under, where that is not its path (an upload's own name). With "into a new
    database" ticked, into that store, which the dashboard then opens."""
    try:
        target = new_database() if st.session_state.get(NEW_DB_TOGGLE) else ui.store()
    except (PathRefused, ConfigError, ValueError) as exc:
        st.session_state.pop(LAST_INGEST_KEY, None)
        st.error(f"Nothing loaded: {ui.md_escape(exc)}")
        return
    try:
        log_format, mapping = chosen_format()
    except (ValueError, OSError) as exc:
        st.session_state.pop(LAST_INGEST_KEY, None)
        st.error(f"Nothing loaded: the mapping file can't be read: {ui.md_escape(exc)}")
        return
    bar = st.progress(0.0, text="Reading logs")

    def progress(done: int, total: int, what: str) -> None:
        bar.progress(done / total if total else 1.0, text=ui.md_escape(what[:1].upper() + what[1:]))

    try:
        parts = {Path(path).resolve(): (name, 0) for path, name in (names or {}).items()}
        result = ingest(target, paths, progress=progress, log_format=log_format, mapping=mapping, parts=parts)
    except (LogReadError, StoreError, OSError, ValueError) as exc:
        bar.empty()
        st.session_state.pop(LAST_INGEST_KEY, None)
        said = str(exc)
        for path, name in (names or {}).items():  # an upload is named as it was called, not by its temporary copy
            said = said.replace(path, name)
        st.error(f"Nothing loaded: {ui.md_escape(said)}")
        return
    if result.all_quarantined:
        bar.empty()  # show_last_ingest says why, in red
    else:
        bar.progress(1.0, text="Loaded")
    st.session_state[LAST_INGEST_KEY] = {**result.to_json(), "all_quarantined": result.all_quarantined,
                                         "db": target.name}
    if target.name != ui.store().name:
        st.session_state[NEXT_DB_KEY] = target.name  # the Database box is drawn already: it takes it next run
        st.rerun()


def new_database() -> Store:
    """The store typed under "into a new database": inside the roots, and not there yet."""
    chosen = ui.dashboard_settings().confine_store(str(st.session_state.get(NEW_DB_PATH) or ""))
    store = Store(chosen)
    if store.exists:
        raise ValueError(f"{chosen} exists already: name a new file for a load of its own")
    return store


def partial_load_warning() -> None:
    """On every page while the store shown is the one the last load went into and that load was mostly
    quarantined: its figures are a fraction of the files, and why, grouped."""
    counts = st.session_state.get(LAST_INGEST_KEY)
    if (not counts or counts.get("db") != ui.store().name
            or not analysis.mostly_quarantined(counts["read"], counts["quarantined"])):
        return
    reasons = ui.cached(analysis.quarantine_reasons, counts["ingest_id"])
    grouped = "\n".join(f"- {ui.plural(int(r.records), 'record')}: {ui.code_span(r.reason)}, for example "
                        f"{ui.md_escape(r.example[:200])}" for r in reasons.itertuples())
    st.warning(f"**The last load was mostly refused**: {ui.fmt_int(counts['quarantined'])} of "
               f"{ui.plural(counts['read'], 'record')} were quarantined and are not in these figures; "
               f"{ui.fmt_int(counts['accepted'])} {'was' if counts['accepted'] == 1 else 'were'} added to what the "
               f"database held. By reason:\n\n{grouped}"
               "\n\nTo see those files alone, load them again with *Into a new database* (sidebar, Load logs).")


def load_path(text: str) -> None:
    """A typed path is opened only inside the configured roots, each file checked after its links."""
    try:
        files = ui.confined_log_files(text)
    except (PathRefused, ConfigError, LogReadError, OSError) as exc:
        st.session_state.pop(LAST_INGEST_KEY, None)
        st.error(f"Nothing loaded: {ui.md_escape(exc)}")
        return
    load_logs(files)


def chosen_format() -> tuple[str, object]:
    """The log format chosen in the sidebar, and the mapping file's mapping where one is uploaded."""
    upload = st.session_state.get("load_mapping")
    if upload is None:
        return st.session_state.get("load_format", "auto"), None
    from specdec_core import formats

    folder = Path(tempfile.mkdtemp(prefix="specdec-map-"))
    try:
        path = folder / "mapping.toml"
        path.write_bytes(upload.getvalue())
        return "auto", formats.load_mapping(path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def load_uploads(files: list) -> None:
    """Uploads go to a temporary folder under their own names, so the suffix picks the reader."""
    empty = [upload.name for upload in files if not upload.getvalue()]
    if empty:
        st.session_state.pop(LAST_INGEST_KEY, None)
        st.warning(f"{', '.join(ui.code_span(name) for name in empty)} "
                   f"{'is' if len(empty) == 1 else 'are'} empty (0 bytes): nothing in "
                   f"{'it' if len(empty) == 1 else 'them'} to load.")
        files = [upload for upload in files if upload.getvalue()]
        if not files:
            return
    folder = Path(tempfile.mkdtemp(prefix="specdec-upload-"))
    try:
        names = {}
        for n, upload in enumerate(files):
            target = folder / str(n) / Path(upload.name).name
            target.parent.mkdir()
            target.write_bytes(upload.getvalue())
            names[str(target)] = Path(upload.name).name
        load_logs(list(names), names)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def show_last_ingest() -> None:
    counts = st.session_state.get(LAST_INGEST_KEY)
    if not counts:
        return
    if not counts["read"]:
        st.warning("The files held no records: nothing was loaded.")
    if counts.get("all_quarantined"):
        st.error(f"Nothing loaded: all {ui.plural(counts['quarantined'], 'record')} broke the log contract and were "
                 "quarantined. Their reasons are below.")
        reasons = ui.cached(analysis.quarantined_records).reason.drop_duplicates().head(3)
        for reason in reasons:
            st.caption(ui.md_escape(reason))
    left, right = st.columns(2)
    left.metric("Read", ui.fmt_int(counts["read"]))
    right.metric("Accepted", ui.fmt_int(counts["accepted"]))
    left.metric("Duplicates", ui.fmt_int(counts["duplicates"]))
    right.metric("Quarantined", ui.fmt_int(counts["quarantined"]))
    if counts["quarantined"]:
        with st.expander("Quarantined records", expanded=bool(counts.get("all_quarantined"))):
            ui.table(ui.cached(analysis.quarantined_records), column_config={
                "reason": st.column_config.TextColumn("reason", width="large")})


def keep_valid(key: str, options: list) -> None:
    """Drop selections the current database no longer has (another file, or a filter left from before)."""
    if key in st.session_state:
        st.session_state[key] = [v for v in st.session_state[key] if v in options]


def time_range(options: analysis.FilterOptions) -> tuple:
    # The slider spans the bulk of the requests (see analysis.filter_options): a few lines with an unset
    # clock (epoch 0, year 1) neither break it nor stretch it past the incident's hours.
    start, end = options.span_start, options.span_end
    if end <= start:
        return None, None
    zoom = st.session_state.pop(ui.TIME_ZOOM_KEY, None)
    if zoom is not None:  # a box dragged across a time chart
        st.session_state["f_time"] = (max(zoom[0], start), min(zoom[1], end))
    chosen = st.session_state.get("f_time")
    last = st.session_state.get(TIME_SPAN_KEY)
    if chosen and last and last != (start, end):  # the store changed: a handle at an end stays at that end
        chosen = (start if chosen[0] <= last[0] else chosen[0], end if chosen[1] >= last[1] else chosen[1])
    if not chosen or chosen[0] < start or chosen[1] > end or chosen[0] > chosen[1]:
        chosen = (start, end)
    # Set on every run, as keep_valid sets the lists, not only when it changes: a run that a click cut short
    # before the slider reached the browser (a slow first load of a link) left the browser to draw it at its
    # default, the whole span, and send that back with the next rerun as if chosen: the link's range was lost.
    st.session_state["f_time"], st.session_state[TIME_SPAN_KEY] = chosen, (start, end)
    step = max(timedelta(seconds=1), timedelta(seconds=round((end - start).total_seconds() / 1000)))
    # The one timestamp format (ui.TIME_FORMAT); over a single day the date goes in the label, once: two
    # whole timestamps over the handles ran past the sidebar's edge when the handles came close.
    one_day = start.date() == end.date()
    label = f"Time range (UTC, {start:%Y-%m-%d})" if one_day else "Time range (UTC)"
    low, high = st.slider(label, min_value=start, max_value=end, step=step,
                          format=ui.TIME_FORMAT.split(" ")[1] if one_day else ui.TIME_FORMAT, key="f_time")
    st.caption(f"{ui.fmt_ts(low)} to {ui.fmt_ts(high)}")
    st.segmented_control("Quick range", list(QUICK_RANGES), key=QUICK_KEY, on_change=quick_range,
                         args=(start, end), help="The last 15 minutes, hour, 6 or 24 hours of the log, up to its "
                                                 "newest request; or all of it")
    if options.outside_span:
        beyond = "has a timestamp" if options.outside_span == 1 else "have timestamps"
        st.caption(f"{ui.plural(options.outside_span, 'request')} {beyond} beyond this slider (earliest "
                   f"{ui.fmt_ts(options.start)}, latest {ui.fmt_ts(options.end)}); a handle at its end "
                   "keeps them in.")
    # A handle at its end is no bound on that side: requests loaded later, or beyond the slider, stay in view.
    return (None if low <= start else low), (None if high >= end else high)


# Grafana's quick ranges, counted back from the newest request: "now" for a live store, the incident's end for
# a log loaded after it.
QUICK_RANGES = {"15m": timedelta(minutes=15), "1h": timedelta(hours=1), "6h": timedelta(hours=6),
                "24h": timedelta(hours=24), "all": None}
QUICK_KEY = "quick_range"
TIME_SPAN_KEY = "_time_span"  # the slider's span in the last run: a store that grows moves the handles at its ends


def quick_range(start: datetime, end: datetime) -> None:
    """on_change of the quick ranges: the time filter becomes the last stretch of the log chosen (or all of
    it). The control then lets go of its choice: a range dragged later is no quick range."""
    name = st.session_state.get(QUICK_KEY)
    if name in QUICK_RANGES:
        length = QUICK_RANGES[name]
        st.session_state["f_time"] = (start if length is None else max(start, end - length), end)
    st.session_state[QUICK_KEY] = None


def filters_from_url(options: analysis.FilterOptions) -> None:
    """A URL the session did not write itself (pasted, reloaded, browser Back) sets the view it names, and a
    filter it leaves out goes back to all: Back from a filter change shows the view before it, and the URL
    written next is that same view (a second write would be a history entry of its own)."""
    current = {k: tuple(st.query_params.get_all(k)) for k in URL_KEYS if k in st.query_params}
    written = st.session_state.get(URL_WRITTEN_KEY)
    if current == written or (not current and written is None):
        return
    st.session_state[URL_WRITTEN_KEY] = current
    span, said, times = (options.span_start, options.span_end), url_links.unmet_names(current, options), {}
    if span[0] is not None:
        for name, default in (("start", span[0]), ("end", span[1])):
            try:
                times[name] = _url_time(current.get(name), default, end=name == "end")
            except ValueError:
                said += url_links.unparsable(name, current.get(name))
        if len(times) == 2:  # what the link asked that the store lacks is said above the page (ui/links.py)
            said += url_links.unmet_time((times["start"], times["end"]), span)
            st.session_state["f_time"] = (max(times["start"], span[0]), min(times["end"], span[1]))
    for url_key, key, _ in url_links.NAMED:
        st.session_state[f"f_{key}"] = [v for v in current.get(url_key, ()) if v in getattr(options, key)]
    url_links.note_unmet(said)
    st.session_state[NOTES_KEY] = current["notes"][0] if "notes" in current else ""


def _url_time(values: tuple | None, default, end: bool):
    """A link's start= or end=, read as `specdec stats --start/--end` reads it (an end date alone: that whole day)."""
    return selection_time(values[0], end=end) if values else default


def _link_time(ts: datetime) -> str:
    """A bound as a link writes it: RFC 3339 UTC with its fraction, milliseconds at least. The slider's handles
    step from the log's first request, fractions and all; a link cut to the second moved a bound by up to a
    second, and the view opened from it counted another second of requests (at 1,000 a second, a thousand).
    A whole second keeps its `.000`: an end written without a fraction reads as through that second."""
    return rfc3339(ts)


def filters_to_url(chosen: Filters) -> None:
    """The filters and the database into the address bar, beside the page's own parameters."""
    wanted: dict[str, list[str]] = {}
    for name, bound in (("start", chosen.start), ("end", chosen.end)):
        if bound is not None:
            wanted[name] = [_link_time(bound)]
    for url_key, values in (("deployment", chosen.deployments), ("target_model", chosen.target_models),
                            ("draft_model", chosen.draft_models)):
        if values:
            wanted[url_key] = list(values)
    if (st.session_state.get(NOTES_KEY) or "").strip():  # the typed annotations are part of the view
        wanted["notes"] = [st.session_state[NOTES_KEY]]
    if st.session_state.get(ui.DB_KEY) and st.session_state[ui.DB_KEY] != ui.default_db_path():
        wanted["db"] = [st.session_state[ui.DB_KEY]]
    # One write: each change of the query string is a browser history entry of its own.
    have = {k: st.query_params.get_all(k) for k in st.query_params}
    merged = {k: v for k, v in have.items() if k not in URL_KEYS} | wanted
    if merged != have:
        st.query_params.from_dict(merged)
    st.session_state[URL_WRITTEN_KEY] = {k: tuple(v) for k, v in wanted.items()}
    st.session_state[ui.VIEW_PARAMS_KEY] = wanted


def page_links() -> None:
    """The pages, each link carrying this view's filters (see `navigation`)."""
    view = st.session_state.get(ui.VIEW_PARAMS_KEY) or {}
    for title, page in PAGES.items():
        if title in ui.LINKED_ONLY:
            continue
        st.page_link(page, label=title, icon=ICONS[title], query_params=view, width="stretch")


def db_from_url() -> None:
    """?db= opens that database, inside the roots only (as the Database box)."""
    wanted = st.query_params.get("db")
    if not wanted or wanted == st.session_state.get(ui.DB_KEY):
        return
    if (URL_WRITTEN_KEY in st.session_state
            and (wanted,) == st.session_state[URL_WRITTEN_KEY].get("db")):
        return
    st.session_state[ui.DB_KEY] = wanted
    ui.confine_db_choice()


def filter_widgets() -> Filters:
    options = ui.cached(analysis.filter_options, span_limits=ui.SLIDER_LIMITS)
    filters_from_url(options)
    start, end = time_range(options)
    chosen = {}
    for key, label, format_func in (
        ("deployments", "Deployments", ui.deployment_label),
        ("target_models", "Target models", str),
        ("draft_models", "Draft models", str),
    ):
        keep_valid(f"f_{key}", getattr(options, key))
        chosen[key] = tuple(st.multiselect(label, getattr(options, key), format_func=format_func, key=f"f_{key}",
                                           placeholder="All"))
    return Filters(start=start, end=end, **chosen)


@st.cache_resource(show_spinner=False)
def model_preload(db: str):
    """The models the store's requests name start loading once the dashboard's first page is drawn: the first
    replay doesn't wait for them, and a registry model no request names is never loaded."""
    return replay_jobs.preload_models(wanted=lambda: models_named(Store(db)), after=ui.PAGE_RAN)


def models_named(store: Store) -> tuple[str, ...]:
    try:
        options = analysis.filter_options(store)
    except StoreError:
        return ()
    return options.target_models + options.draft_models


def annotation_widgets() -> None:
    """Deploys and fixes to mark on every time chart, typed or from a file, beside the detected ones."""
    with st.expander("Annotations"):
        typed = st.text_area("One per line: time, deployment, label", key=NOTES_KEY, height=90,
                             placeholder="2026-03-01T10:30:00Z, prod, deploy v2.3\n2026-03-01T11:00:00Z, , key fix")
        upload = st.file_uploader("Or a file (CSV lines or a JSON list of {ts, deployment, label})",
                                  type=["csv", "txt", "json"], key="annotations_file")
        text = typed + "\n" + (upload.getvalue().decode("utf-8", "replace") if upload else "")
        found, errors = analysis.parse_annotations(text) if text.strip() else ([], [])
        for error in errors[:5]:
            st.caption(f":orange[Skipped] {ui.md_escape(error)}")
        detected = st.toggle("Mark what the data shows: the first and last contaminated hit, key-scheme changes",
                             value=True, key="annotations_detected")
    notes = list(found)
    if detected and ui.has_data():
        # The same cached calls the Overview makes: the key scheme's scan is paid once.
        changes = ui.cached(analysis.key_scheme_changes, filters=ui.filters())
        notes += sorted(ui.cached(analysis.contamination_annotations, filters=ui.filters())
                        + analysis.scheme_change_annotations(changes), key=lambda note: note.ts)
    st.session_state[ui.ANNOTATIONS_KEY] = notes


def live_status() -> None:
    """While Live is on: the newest request and its lag, and a fresh view as soon as the store changes.

    Only then is the fragment drawn, and only a drawn fragment reruns every LIVE_EVERY_S: drawn always (and
    returning at once), it had every open tab's server and browser redraw it every 5 s, Live or not, forever.
    """
    if st.session_state.get("live"):
        live_check()


@st.fragment(run_every=LIVE_EVERY_S)
def live_check() -> None:
    if not st.session_state.get("live"):  # switched off while a rerun of its own was on its way
        return
    db = ui.store()
    if not db.exists:
        st.caption("Live: no database yet.")
        return
    fresh = ui.cached(analysis.freshness)
    lag = fresh.lag_seconds
    st.caption(f"Live · newest request {ui.fmt_ts(fresh.newest)} · lag "
               f"{'–' if lag is None else ui.fmt_duration(lag)} · checked every {LIVE_EVERY_S} s")
    version = db.version()
    if st.session_state.get("_live_version") not in (None, version):
        st.session_state["_live_version"] = version
        st.rerun(scope="app")
    st.session_state["_live_version"] = version


with st.sidebar:
    links = st.container()
    if ui.DB_KEY not in st.session_state:
        st.session_state[ui.DB_KEY] = ui.default_db_path()
    if NEXT_DB_KEY in st.session_state:
        st.session_state[ui.DB_KEY] = st.session_state[ui.DB_ACCEPTED_KEY] = st.session_state.pop(NEXT_DB_KEY)
    db_from_url()
    st.text_input("Database", key=ui.DB_KEY, on_change=ui.confine_db_choice,
                  help="A DuckDB file made by `specdec ingest`; created on first load. Only inside the folders "
                       "the config's [dashboard] roots name (default: the repo's data/ and the folder the "
                       "dashboard was started in).")
    if ui.DB_REFUSED_KEY in st.session_state:
        st.error(ui.md_escape(st.session_state.pop(ui.DB_REFUSED_KEY)))
    try:
        ready = ui.has_data()
    except StoreError:
        ready = None  # the page says what is wrong with the file
    st.toggle("Live", key="live", help="Re-read the database every few seconds while logs are being loaded "
                                       "into it (`specdec ingest --follow`), and show how far behind it is.")
    live_status()
    with st.expander("Load logs", expanded=not ready):
        # The path and the new file are read by the button only: typed and the button clicked at once, their
        # commit's rerun raced the click (and the button, disabled until that rerun, took no click at all).
        log_path = st.text_input("Log file, folder or glob", key="load_path", placeholder="data/demo/",
                                 on_change="ignore")
        st.selectbox("Log format", list(LOG_FORMATS), format_func=LOG_FORMATS.get, key="load_format",
                     help="As `specdec ingest --format`; auto decides per file from its first record.")
        st.file_uploader("Mapping file (TOML, as `--map`), for other JSON Lines", type=["toml"], key="load_mapping")
        if st.toggle("Into a new database", key=NEW_DB_TOGGLE,
                     help="Load into a store of its own, not beside what this database holds: a load whose "
                          "request ids are already here with other content is quarantined otherwise."):
            # Beside the database open now (a folder the dashboard may write to), named by the time.
            st.session_state.setdefault(NEW_DB_PATH, str(Path(ui.store().path).parent / (
                f"load-{datetime.now(timezone.utc):%Y%m%d-%H%M%S}.duckdb")))
            st.text_input("New database file", key=NEW_DB_PATH, on_change="ignore")
        if st.button("Load path"):
            if log_path.strip():
                load_path(log_path.strip())
            else:
                st.error("Nothing loaded: type a log file, folder or glob first")
        uploads = st.file_uploader("Or upload log files", type=UPLOAD_TYPES, accept_multiple_files=True,
                                   key="uploads")
        if st.button("Load uploads", disabled=not uploads):
            load_uploads(uploads)
        show_last_ingest()
    st.subheader("Filters")
    # Asked again: a load just above may have filled an empty database.
    st.session_state[ui.FILTERS_KEY] = filter_widgets() if ready is not None and ui.has_data() else NO_FILTERS
    filters_to_url(st.session_state[ui.FILTERS_KEY])
    with links:
        page_links()
    if ready is not None:
        annotation_widgets()
    ui.click_bridge()

try:
    preload = replay_jobs.preload_enabled()
except ValueError as exc:
    st.warning(str(exc))
    preload = True
st.session_state[ui.PRELOAD_KEY] = model_preload(ui.store().name) if preload else None

partial_load_warning()
url_links.warn_unmet(st.session_state.get(ui.FILTERS_KEY))
ui.freeze_what_is_loaded()

with ui.entrypoint():
    navigation.run()
