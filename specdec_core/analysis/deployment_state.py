"""Each deployment's state in a word, for a status strip: contaminated now, clean since when, or no data."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import pandas as pd

from specdec_core.analysis.overview import filter_options
from specdec_core.analysis.query import NO_FILTERS, Filters, df
from specdec_core.analysis.status import (
    contamination_status,
    fmt_time,
    logged_span_minute_sql,
    logged_span_sql,
)
from specdec_core.store.connection import Store

CONTAMINATED, CLEAN, NO_DATA = "contaminated", "clean", "no_data"


@dataclass(frozen=True)
class DeploymentState:
    deployment: str
    state: str  # CONTAMINATED (its last contaminated hit is not behind a long clean stretch), CLEAN or NO_DATA
    since: datetime | None  # the first contaminated hit, or the start of the clean stretch
    contaminated_hits: int

    @property
    def headline(self) -> str:
        return {CONTAMINATED: "contaminated now", CLEAN: "clean", NO_DATA: "no data"}[self.state]

    @property
    def sentence(self) -> str:
        if self.state == NO_DATA:
            return "no requests in this selection"
        return f"since {fmt_time(self.since)}"  # after the headline: "clean since ...", "contaminated now since ..."


def deployment_states(store: Store, filters: Filters = NO_FILTERS) -> list[DeploymentState]:
    """Every deployment the filters choose (all the store knows where they choose none), by name."""
    known = filter_options(store).deployments
    chosen = [d for d in known if not filters.deployments or d in filters.deployments]
    spans = df(store, logged_span_sql, filters, minute=logged_span_minute_sql).set_index("deployment")
    statuses = {s.deployment: s for s in contamination_status(store, filters)}
    out = []
    for deployment in sorted(chosen):
        status = statuses.get(deployment)
        if status is not None and not status.over:
            since = status.logs_begin if status.under_way_at_start else status.first_contaminated
            out.append(DeploymentState(deployment, CONTAMINATED, since, status.contaminated_hits))
        elif status is not None:
            out.append(DeploymentState(deployment, CLEAN, status.last_contaminated, status.contaminated_hits))
        elif deployment in spans.index:
            since = pd.Timestamp(spans.loc[deployment].logs_begin).to_pydatetime()
            out.append(DeploymentState(deployment, CLEAN, since, 0))
        else:
            out.append(DeploymentState(deployment, NO_DATA, None, 0))
    return out
