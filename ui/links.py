"""What a link asked for that this store cannot show, said above the page instead of dropped in silence.

A link comes from an alert (`specdec metrics rules`: a deployment the exporter folded into "other"), a ticket or
a colleague on another store. Its filters go into the sidebar's widgets, which hold only values the store has: a
deployment it lacks, a time outside its logs or one that is no time at all would leave the page showing every
request as if the link had chosen them.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import streamlit as st

from specdec_core.analysis.overview import NAMED_FILTERS, values_not_held
from ui.format import code_span, fmt_ts

# The link's unmet parts, and the filters the page chose in their stead (shown while those stay chosen).
UNMET_KEY = "_link_unmet"
UNMET_FILTERS_KEY = "_link_unmet_filters"
# Each named filter: its query parameter (singular, as the URL repeats it), its options' key, what a value is.
NAMED = tuple((key[:-1], key, what) for key, what in NAMED_FILTERS)


def unmet_names(current: dict[str, tuple[str, ...]], options: Any) -> list[str]:
    """Each named filter of the link (`current`: its query parameters) with values the store does not hold."""
    asked = {key: current.get(url_key, ()) for url_key, key, _ in NAMED}
    said = []
    for key, missing in values_not_held(options, asked).items():
        what = dict(NAMED_FILTERS)[key]
        instead = "the link's others" if len(missing) < len(asked[key]) else f"every {what}"
        said.append(f"{what} {', '.join(code_span(v) for v in missing)}: not in this store; showing {instead}")
    return said


def unmet_time(asked: tuple[datetime, datetime], span: tuple[datetime, datetime]) -> list[str]:
    """The link's time range, where it holds none of the store's requests (the page shows the whole span)."""
    low, high = asked
    if low > span[1] or high < span[0]:
        return [f"time range {fmt_ts(low)} to {fmt_ts(high)}: no request of this store is in it (its logs run "
                f"{fmt_ts(span[0])} to {fmt_ts(span[1])}); showing the whole log"]
    if low > high:
        return [f"time range {fmt_ts(low)} to {fmt_ts(high)}: it ends before it starts; showing the whole log"]
    return []


def note_unmet(said: list[str]) -> None:
    """Remember what the link just opened could not show (nothing: forget an earlier link's)."""
    st.session_state.pop(UNMET_FILTERS_KEY, None)
    if said:
        st.session_state[UNMET_KEY] = said
    else:
        st.session_state.pop(UNMET_KEY, None)


def warn_unmet(chosen: Any) -> None:
    """Above the page, while the filters the link ended in stay chosen: what it asked for and did not get."""
    said = st.session_state.get(UNMET_KEY)
    if not said:
        return
    if st.session_state.setdefault(UNMET_FILTERS_KEY, chosen) != chosen:  # the visitor chose others since
        st.session_state.pop(UNMET_KEY)
        return
    st.warning("**This link asks for what this store does not hold**:\n\n"
               + "\n".join(f"- {line}" for line in said))


def unparsable(name: str, values: tuple[str, ...] | None) -> list[str]:
    """The link's `name` (start or end), which is no ISO 8601 time."""
    return [f"{name} {code_span(values[0] if values else '')}: not an ISO 8601 time; showing the whole log"]
