"""Text for the screen: log text made inert for markdown and plotly labels, numbers, times, names.

Nothing here renders HTML: log text reaches the screen through `st.code`/`st.text`/dataframes, or
through `md_escape`/`code_span` when it must sit inside markdown.
"""

from __future__ import annotations

import hashlib
import html
import string
from datetime import datetime
from typing import Any

from specdec_core.analysis import Filters

_MD_SPECIAL = set(string.punctuation)


# Markdown in the browser turns more than markup into links: GitHub's autolink literals (`http://…`, `www.…`,
# `name@host.tld`) and emoji and icon shortcodes (`:smile:`, `:material/home:`) are found in the text after
# escapes are read, so a backslash can't stop them. A word joiner (invisible, zero width) after `@`, inside
# `www.` and after a `:` that a slash or a letter follows breaks every such pattern and shows the text as it
# is (a time's `10:02` keeps its colon bare).
WORD_JOINER = "\u2060"


def md_escape(text: object) -> str:
    """Log text made inert inside st.markdown: every ASCII punctuation backslash-escaped (CommonMark),
    so no HTML, link, image, directive or formula can form; a word joiner where an autolink or a shortcode
    could start (WORD_JOINER), so neither can; newlines become spaces."""
    out = []
    value = str(text)
    for n, ch in enumerate(value):
        if ch in _MD_SPECIAL:
            out.append("\\" + ch)
            after = value[n + 1:n + 2]
            if ch == "@" or (ch == ":" and after and (after in "/+-_" or after.isalpha())):
                out.append(WORD_JOINER)
        elif ch in "\r\n":
            out.append(" ")
        else:
            out.append(ch)
            if ch in "wW" and value[n - 2:n + 2].lower() == "www.":
                out.append(WORD_JOINER)
    return "".join(out)


def plot_label(text: object) -> str:
    """Log text used as a plotly label: plotly reads a few HTML tags in labels, entities show as text."""
    return html.escape(str(text), quote=False)


def fmt_int(value: Any) -> str:
    return "–" if value is None else f"{int(value):,}"


def fmt_pct(value: Any) -> str:
    return "–" if value is None else f"{float(value):.1%}"


def fmt_ts(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S UTC")
    return str(value)


def deployment_label(value: str) -> str:
    return value or "(none)"

def code_span(text: object) -> str:
    """Text as a markdown code span, shown exactly as it is: nothing inside a code span is markup, so no
    escaping (which would show as backslashes); the fence is one backtick longer than the longest run
    of backticks in the text, so a backtick in a log value can't close it."""
    value = str(text).replace("\r", " ").replace("\n", " ")
    longest = max((len(run) for run in _backtick_runs(value)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if value.startswith("`") or value.endswith("`") or not value.strip() else ""
    return f"{fence}{pad}{value}{pad}{fence}"


def _backtick_runs(text: str) -> list[str]:
    runs, current = [], ""
    for ch in text:
        if ch == "`":
            current += ch
        elif current:
            runs.append(current)
            current = ""
    return runs + ([current] if current else [])


def filter_slug(filters: Filters) -> str:
    """The filters in a file name: what a downloaded CSV was cut to, in its own name."""
    parts = []
    if filters.start is not None or filters.end is not None:
        start = filters.start.strftime("%Y%m%dT%H%M") if filters.start else "start"
        end = filters.end.strftime("%Y%m%dT%H%M") if filters.end else "end"
        parts.append(f"{start}-{end}")
    for values in (filters.deployments, filters.target_models, filters.draft_models):
        if values:
            parts.append("+".join(deployment_label(v) for v in values))
    slug = "_".join(parts) or "all"
    safe = "".join(ch if ch.isalnum() or ch in "-+._" else "-" for ch in slug)
    return safe[:120].strip("-") or "all"



def fmt_duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"



def short_digest(values: Any) -> str:
    """A short, stable name for a list of values (never Python's hash(), which changes per process)."""
    return hashlib.sha256("\x1f".join(map(str, values)).encode()).hexdigest()[:12]


def plural(n: int, one: str, many: str | None = None) -> str:
    """'1 contaminated hit', '2 contaminated hits'."""
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def bucket_words(bucket: str) -> str:
    """A time bucket as an axis says it: '5 minutes' -> '5-minute buckets', '1 hour' -> '1-hour buckets'."""
    count, _, unit = bucket.partition(" ")
    return f"{count}-{unit.rstrip('s')} buckets" if unit else f"{bucket} buckets"


# A request's fields that pages show apart from its field table: the texts in full, the id in the heading.
SHOWN_APART = ("request_id", "prompt", "output_text")


def value_text(value: object) -> str:
    """A logged value as the tables show it: one timestamp format, temperature 0 not 0.0, null as empty."""
    if value is None:
        return ""
    if isinstance(value, datetime):
        return fmt_ts(value)
    return f"{value:g}" if isinstance(value, float) else str(value)
