"""The incident report: the postmortem drafted from the evidence in a store (../shared/remediation.md,
"The incident report"), as Markdown or as one self-contained HTML file whose charts are inline SVG.

Every figure comes from the functions `specdec stats`, `specdec impact` and `specdec report` call, so the
report and those commands agree on the same store. Nothing in the HTML is fetched: no script, font or
stylesheet from the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from specdec_core.analysis.fix_status import SchemeChangeHits, scheme_change_hits
from specdec_core.analysis.gaps import LoggingGap, logging_gaps
from specdec_core.analysis.impact import (
    ExperimentImpact,
    Impact,
    experiment_impact,
    impact,
    named_affected,
    wrong_outputs_over_time,
)
from specdec_core.analysis.overview import Headline, headline
from specdec_core.analysis.report import KINDS, mismatch_report, report_counts
from specdec_core.analysis.status import (
    ContaminationStatus,
    KeySchemeChange,
    contamination_status,
    fmt_time,
    key_scheme_changes,
)
from specdec_core.derived import summaries
from specdec_core.remediation.log import PurgeRecord, purge_log
from specdec_core.remediation.plan import PlanCounts, plan_counts, purge_plan
from specdec_core.remediation.report_charts import bars_svg, heatmap_svg, paired_bars_svg
from specdec_core.remediation.report_markup import (
    HTML,
    MARKDOWN,
    PLAIN,
    Inline,
    Markup,
    esc,
    escaped,
    h_link,
    h_table,
    md_code,
    md_link,
    md_table,
    md_text,
)
from specdec_core.replay.stored import replay_history
from specdec_core.store.connection import Store

SUFFIXES = (".md", ".html")
# Replays whose verdict names the cache as the cause: production's output belongs to another identity.
PROVING = ("foreign",)
APPENDIX_ROWS = 500  # the mismatch report's first rows in the appendix; the CSV (`specdec report`) has them all


class ReportError(ValueError):
    """The report can't be written; the message is one line."""


@dataclass(frozen=True)
class Event:
    ts: datetime
    what: str
    link: str | None = None


@dataclass(frozen=True)
class Replay:
    replay_id: str
    request_id: str
    replayed_at: datetime
    classification: str
    deployment: str


@dataclass(frozen=True)
class IncidentReport:
    store: str
    drafted_at: datetime
    headline: Headline
    changes: tuple[KeySchemeChange, ...]
    status: tuple[ContaminationStatus, ...]  # per deployment with contaminated hits: its first and last
    left_out: dict[str, dict[str, int]]  # deployment -> identity field -> contaminated hits it differed in
    consumers: tuple[Impact, ...]
    deployments: tuple[Impact, ...]
    experiments: ExperimentImpact
    over_time: pd.DataFrame
    replays: tuple[Replay, ...]
    purges: tuple[PurgeRecord, ...]
    fixes: tuple[SchemeChangeHits, ...]
    plan: PlanCounts
    gaps: tuple[LoggingGap, ...]  # identity fields the logs leave unknown or never set, as `specdec stats` says
    guard: dict[str, int]
    mismatch_counts: dict[str, int]
    mismatches: pd.DataFrame  # the report's first APPENDIX_ROWS rows
    external_url: str | None

    @property
    def first_contaminated(self) -> datetime | None:
        times = self.contaminated_times()
        return None if times is None else times[0]

    @property
    def last_contaminated(self) -> datetime | None:
        times = self.contaminated_times()
        return None if times is None else times[1]

    def link(self, page: str) -> str | None:
        return None if not self.external_url else f"{self.external_url.rstrip('/')}/{page}"

    def timeline(self) -> list[Event]:
        events = []
        hits = self.contaminated_times()
        if hits is not None:
            events.append(Event(hits[0], "first contaminated hit", self.link("mismatches")))
        events += [Event(c.ts, f"key scheme change: {c.sentence}", self.link("keys")) for c in self.changes]
        if hits is not None:
            events.append(Event(hits[1], "last contaminated hit", self.link("mismatches")))
        events += [Event(r.replayed_at, f"replay of {r.request_id}: {r.classification}",
                         self.link(f"replay?replay_id={r.replay_id}")) for r in self.replays]
        events += [Event(p.ts, p.words) for p in self.purges or ()]
        return sorted(events, key=lambda e: e.ts)

    def contaminated_times(self) -> tuple[datetime, datetime] | None:
        if not self.status:
            return None
        return (min(s.first_contaminated for s in self.status), max(s.last_contaminated for s in self.status))


# Over the summaries every read may use (a read of a store whose summaries are older asks for a migrate), or
# the rows where there are none (a store that holds no request yet).
_LEFT_OUT_SQL = """
SELECT deployment, field, count(*) AS hits FROM (
    SELECT deployment, unnest(string_split(differing_fields, ';')) AS field FROM {contaminated}
    WHERE coalesce(differing_fields, '') <> '')
GROUP BY ALL ORDER BY deployment, hits DESC, field
"""

_GUARD_SQL = """
SELECT (SELECT count(*) FROM requests WHERE cache_hit AND cached_fingerprint IS NOT NULL),
       (SELECT count(*) FROM hit_sources WHERE fingerprint_mismatch)
"""


def _left_out(store: Store) -> dict[str, dict[str, int]]:
    with store.read() as con:
        contaminated = "summary_contaminated" if summaries.ready(con) else f"({summaries.contaminated_sql()})"
        rows = con.execute(_LEFT_OUT_SQL.format(contaminated=contaminated)).fetchall()
    out: dict[str, dict[str, int]] = {}
    for deployment, field, hits in rows:
        out.setdefault(deployment, {})[field] = int(hits)
    return out


def _guard(store: Store) -> dict[str, int]:
    with store.read() as con:
        logged, mismatched = con.execute(_GUARD_SQL).fetchall()[0]
    return {"hits_with_fingerprint": int(logged), "guard_mismatches": int(mismatched)}


def incident_report(store: Store, external_url: str | None = None) -> IncidentReport:
    """Everything the report says, read from the store once."""
    changes = tuple(key_scheme_changes(store))
    history = replay_history(store)
    replays = tuple(Replay(r.replay_id, r.request_id, pd.Timestamp(r.replayed_at).to_pydatetime(), r.classification,
                           r.deployment) for r in history.sort_values("replayed_at").itertuples())
    return IncidentReport(
        store=str(store), drafted_at=datetime.now(timezone.utc), headline=headline(store), changes=changes,
        status=tuple(contamination_status(store)),
        left_out=_left_out(store), consumers=impact(store, "consumer"), deployments=impact(store, "deployment"),
        experiments=experiment_impact(store), over_time=wrong_outputs_over_time(store), replays=replays,
        purges=tuple(purge_log(store)), fixes=tuple(scheme_change_hits(store, changes=list(changes))),
        plan=plan_counts(purge_plan(store)), gaps=tuple(logging_gaps(store)),
        guard=_guard(store), mismatch_counts=report_counts(store),
        mismatches=mismatch_report(store, limit=APPENDIX_ROWS),
        external_url=external_url,
    )


# --- the text, section by section, shared by both renderings ---------------------------------------------------

def _n(value: int) -> str:
    return f"{value:,}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1%}"


def _num(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _when(ts: datetime | None) -> str:
    return "-" if ts is None else fmt_time(ts.astimezone(timezone.utc) if ts.tzinfo else ts)


def title(r: IncidentReport) -> str:
    """What happened, as far as the store shows: no claim of contamination it did not find."""
    if r.headline.contaminated_hits:
        return "Incident report: speculative-decoding cache served other requests' outputs"
    return "Incident report: no cache hit served another request's output in these logs"


def _hits(n: int) -> str:
    return f"{_n(n)} hit" if n == 1 else f"{_n(n)} hits"


def summary_lines(r: IncidentReport, fmt: Inline = PLAIN) -> list[str]:
    """The summary's sentences, each value quoted by `fmt` (the markup the report is written in)."""
    h = r.headline
    arms = [a for a in r.experiments.arms if a.arm and a.contaminated_hits]
    lines = [f"{_n(h.contaminated_hits)} contaminated hits ({_pct(h.contaminated_rate)} of {_n(h.hits)} hits) and "
             f"{_n(h.length_violations)} length violations among {_n(h.requests)} requests "
             f"({_when(h.first_ts)} to {_when(h.last_ts)})."]
    if r.first_contaminated:
        lines.append(f"Contaminated hits from {_when(r.first_contaminated)} to {_when(r.last_contaminated)}, "
                     f"in {', '.join(fmt.text(d.value or '(none)') for d in r.deployments if d.contaminated_hits)}.")
    unseen = [g for g in r.gaps if g.unknown_hits]
    if unseen:  # LiteLLM's hits: contamination through those fields is not in these counts
        lines.append("A floor, not a count: the logs leave identity fields unknown on cache hits, and contamination "
                     "through them cannot be seen: " + "; ".join(f"{fmt.code(g.field)} on {_n(g.unknown_hits)} of "
                                                                   f"{_n(g.hits)} hits" for g in unseen) + ".")
    hit, named, unnamed = named_affected(r.consumers)
    who = f"{hit} of {named} named consumers received wrong outputs" if named else "The log names no consumer"
    if unnamed is not None:
        who += (f"{', and' if named else ':'} requests naming none received {_n(unnamed.contaminated_hits)} "
                f"contaminated hits and {_n(unnamed.length_violations)} over-long outputs")
    lines.append(f"{who}; {len(arms)} named experiment arms received contaminated hits.")
    if r.fixes:
        lines.append("Key fixed: " + "; ".join(f"{fmt.text(f.change.deployment)} from {_when(f.change.ts)} "
                                               f"({_n(f.hits_after_fix)} old-scheme hits after)" for f in r.fixes) + ".")
    return lines


def root_cause_lines(r: IncidentReport, fmt: Inline = PLAIN) -> list[str]:
    lines = []
    for c in r.changes:
        fields = r.left_out.get(c.deployment, {})
        named = ", ".join(f"{fmt.code(f)} ({_hits(n)})" for f, n in fields.items()) or "none seen"
        lines.append(f"{fmt.text(c.deployment)}: the key scheme {fmt.code(c.old_prefix)} left out identity fields: "
                     f"{named}.")
    for deployment, fields in r.left_out.items():
        if deployment not in {c.deployment for c in r.changes}:
            named = ", ".join(f"{fmt.code(f)} ({_hits(n)})" for f, n in fields.items())
            lines.append(f"{fmt.text(deployment or '(none)')}: its key left out identity fields: {named}; "
                         "no change of key scheme seen yet.")
    return lines


def checklist(r: IncidentReport, fmt: Inline = PLAIN) -> list[tuple[str, str, str]]:
    """The seed's checklist: (item, done / left / unknown, what the store says, its values quoted by `fmt`)."""
    items = []
    if r.fixes:
        after = sum(f.hits_after_fix for f in r.fixes)
        since = "; ".join(f"{fmt.text(f.change.deployment)} since {_when(f.change.ts)}" for f in r.fixes)
        items.append(("Key fixed", "done" if after == 0 else "left",
                      f"{since}; {_n(after)} hits after the fix on old-scheme keys"))
    else:
        items.append(("Key fixed", "left" if r.headline.contaminated_hits else "unknown",
                      "no change of key scheme in the logs"))
    # A restore puts a purge's entries back: a namespace purge before the latest restore is undone.
    restored = max((p.ts for p in r.purges if p.kind == "restore"), default=None)
    namespaces = [p for p in r.purges if p.kind == "namespace" and not p.dry_run
                  and (restored is None or p.ts > restored)]
    if not namespaces:
        said = ("no purge recorded" if not r.purges else f"a restore at {_when(restored)} put the purged entries back"
                if restored is not None and any(p.kind == "namespace" and not p.dry_run for p in r.purges)
                else "no namespace purge recorded")
        items.append(("Old namespace purged", "left" if r.changes or r.headline.contaminated_hits else "unknown", said))
    else:
        done = "; ".join(f"{fmt.text(p.namespace)} on {fmt.text(p.target)} at {_when(p.ts)}: {_n(p.deleted)} deleted"
                         for p in namespaces)
        # Each old key scheme the logs show is purged once a namespace purge held all of its keys.
        left = [c for c in r.changes if not any(_holds(p.namespace or "", c.old_prefix) for p in namespaces)]
        items.append(("Old namespace purged", "left" if left else "done", done + "".join(
            f"; not yet {fmt.text(c.old_prefix + ':...')} ({fmt.text(c.deployment or '(none)')})" for c in left)))
    items.append(("Guard on read", "done" if r.guard["hits_with_fingerprint"] and not r.guard["guard_mismatches"]
                  else "left", f"{_n(r.guard['hits_with_fingerprint'])} hits logged the cached entry's fingerprint; "
                  f"{_n(r.guard['guard_mismatches'])} guard mismatches seen"))
    items.append(("Regression test", "unknown", "the logs can't show it: check the key function with "
                  f"{fmt.code('specdec audit-key MODULE:FUNCTION --example REQUEST.json')} in CI"))
    return items


def _holds(namespace: str, old_prefix: str) -> bool:
    """Whether a purge of `namespace` removed every key of the scheme `old_prefix` (its keys `old_prefix:...`):
    the namespace starts them, or names the scheme whole after a key template's own prefix."""
    return bool(namespace) and (f"{old_prefix}:".startswith(namespace) or namespace.endswith((old_prefix, f"{old_prefix}:")))


def _purge_rows(r: IncidentReport) -> list[str]:
    """The purges and restores done (dry runs changed nothing: the timeline has them)."""
    done = [p for p in r.purges if not p.dry_run]
    if not done:
        return ["no purge recorded" if not r.purges else "no purge recorded; only dry runs"]
    return [f"{_when(p.ts)}: {p.words}" for p in done]


# --- Markdown ------------------------------------------------------------------------------------------------

def _consumer_rows(rows: tuple[Impact, ...]) -> list[list[Any]]:
    return [[i.value or "(none)", _n(i.requests), _n(i.contaminated_hits), _n(i.length_violations),
             _when(i.first), _when(i.last)] for i in rows]


def _arm_rows(r: IncidentReport) -> list[list[Any]]:
    rows = []
    for a in r.experiments.arms:
        rows.append([a.arm or "(none)", f"{_n(int(a.requests.all or 0))} / {_n(int(a.requests.clean or 0))}",
                     f"{_num(a.mean_output_tokens.all)} / {_num(a.mean_output_tokens.clean)}",
                     f"{_num(a.mean_latency_ms.all)} / {_num(a.mean_latency_ms.clean)}",
                     f"{_num(a.acceptance_rate.all, 3)} / {_num(a.acceptance_rate.clean, 3)}"])
    return rows


_IMPACT_HEADER = ["consumer", "requests", "contaminated hits", "length violations", "first", "last"]
_ARM_HEADER = ["arm", "requests all / clean", "mean output tokens", "mean latency ms", "acceptance rate"]
_APPENDIX_COLUMNS = ["request_id", "ts", "kind", "cache_key", "source_request_id", "differing_fields"]


def render_markdown(r: IncidentReport) -> str:
    out = [f"# {title(r)}",
           "", f"Drafted {_when(r.drafted_at)} from {md_code(r.store)} by `specdec incident-report`.", "", "## Summary", ""]
    out += [f"- {line}" for line in summary_lines(r, MARKDOWN)]
    out += ["", "## Timeline", ""]
    out += md_table(["time (UTC)", "event"], [[_when(e.ts), md_link(e.what, e.link)] for e in r.timeline()])
    out += ["", "## Root cause", ""]
    out += [f"- {line}" for line in root_cause_lines(r, MARKDOWN)] or ["- No contaminated hit: no key left a field out."]
    proving = [p for p in r.replays if p.classification in PROVING]
    out += ["", f"Replays that prove it ({len(proving)} of {len(r.replays)} stored replays):", ""]
    out += [f"- {md_link(p.request_id, r.link(f'replay?replay_id={p.replay_id}'))} ({md_text(p.deployment)}, replayed "
            f"{_when(p.replayed_at)}): {p.classification}" for p in proving] or ["- no replay stored yet"]
    out += ["", "## Blast radius", "", "### Consumers", ""]
    out += md_table(_IMPACT_HEADER, _consumer_rows(r.consumers))
    out += ["", "### Deployments", ""]
    out += md_table(["deployment", *_IMPACT_HEADER[1:]], _consumer_rows(r.deployments))
    out += ["", "### Experiment arms: who was served whose outputs", ""]
    out += md_table(["arm", "served from", "contaminated hits"],
                     [[c.arm or "(none)", c.served_from or "(none)", _n(c.hits)] for c in r.experiments.cross_feeding])
    out += ["", "### Experiment arms: all rows / clean rows", ""]
    out += md_table(_ARM_HEADER, _arm_rows(r))
    out += ["", "## Remediation", "", "### Done", ""]
    out += [f"- {md_text(line)}" for line in _purge_rows(r)]
    out += ["", "### Purge plan", "",
            f"`specdec cache plan` lists {_n(r.plan.keys)} keys: {_n(r.plan.contaminated)} served a contaminated "
            f"hit, {_n(r.plan.collision)} are shared by several identities.", "", "### Checklist", ""]
    out += md_table(["item", "status", "what the store says"],
                    [[a, b, Markup(c)] for a, b, c in checklist(r, MARKDOWN)])
    out += ["", "## Appendix: mismatch report", ""]
    out += [f"- {k}: {_n(r.mismatch_counts.get(k, 0))}" for k in KINDS]
    shown, total = r.mismatches, sum(r.mismatch_counts.values())
    out += ["", f"The first {len(shown):,} of {total:,} rows (`specdec report` writes them all):", ""]
    out += md_table(_APPENDIX_COLUMNS, [[row[c] if pd.notna(row[c]) else "" for c in _APPENDIX_COLUMNS]
                                         for _, row in shown.iterrows()])
    return "\n".join(out) + "\n"


# --- HTML ----------------------------------------------------------------------------------------------------

_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2rem auto;max-width:1100px;
color:#1f2328;padding:0 1rem;line-height:1.45}
h1{font-size:1.6rem}h2{border-bottom:1px solid #d0d7de;padding-bottom:.2rem;margin-top:2rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.9rem}td,th{border:1px solid #d0d7de;padding:.25rem .5rem;
text-align:left;overflow-wrap:anywhere}td:first-child{white-space:nowrap}th{background:#f6f8fa}.figures{display:flex;gap:1rem;flex-wrap:wrap}
.figure{border:1px solid #d0d7de;border-radius:6px;padding:.6rem 1rem;min-width:150px}
.figure b{display:block;font-size:1.5rem}.bad{color:#c0392b}.ok{color:#1a7f37}svg{max-width:100%}
.charts{display:flex;gap:1.5rem;flex-wrap:wrap;align-items:flex-start}code{background:#f6f8fa;padding:0 .2rem}
"""


def render_html(r: IncidentReport) -> str:
    h = r.headline
    hit, named, unnamed = named_affected(r.consumers)
    figures = [("requests", _n(h.requests), ""), ("contaminated hits", _n(h.contaminated_hits), "bad"),
               ("length violations", _n(h.length_violations), "bad"),
               ("consumers affected", f"{hit} of {named}" if named else "none named",
                "bad" if hit or unnamed else "ok"),
               ("arms cross-fed", _n(len({c.arm for c in r.experiments.cross_feeding if c.arm})), "")]
    parts = [f"<h1>{esc(title(r))}</h1>",
             f"<p>Drafted {esc(_when(r.drafted_at))} from <code>{esc(r.store)}</code> by "
             "<code>specdec incident-report</code>.</p>", "<h2>Summary</h2>",
             '<div class="figures">' + "".join(f'<div class="figure"><b class="{cls}">{esc(v)}</b>{esc(k)}</div>'
                                              for k, v, cls in figures) + "</div>",
             "<ul>" + "".join(f"<li>{line}</li>" for line in summary_lines(r, HTML)) + "</ul>"]
    per_consumer = r.over_time.groupby(["bucket", "consumer"], as_index=False)["wrong"].sum()
    arms = [a for a in r.experiments.arms]
    span = (h.first_ts, h.last_ts)
    parts.append('<div class="charts">' + bars_svg(per_consumer, "Wrong outputs per consumer over time", span)
                 + heatmap_svg(r.experiments.cross_feeding, "Cross-feeding: requested by arm x served from arm")
                 + "</div>")
    parts += ["<h2>Timeline</h2>",
              h_table(["time (UTC)", "event"], [[esc(_when(e.ts)), h_link(e.what, e.link)] for e in r.timeline()])]
    parts += ["<h2>Root cause</h2>", "<ul>" + "".join(f"<li>{line}</li>" for line in root_cause_lines(r, HTML))
              + "</ul>"]
    proving = [p for p in r.replays if p.classification in PROVING]
    parts.append(f"<p>Replays that prove it ({len(proving)} of {len(r.replays)} stored replays):</p><ul>"
                 + ("".join(f"<li>{h_link(p.request_id, r.link(f'replay?replay_id={p.replay_id}'))} "
                            f"({esc(p.deployment)}, replayed {esc(_when(p.replayed_at))}): {esc(p.classification)}</li>"
                            for p in proving) or "<li>no replay stored yet</li>") + "</ul>")
    parts += ["<h2>Blast radius</h2>", "<h3>Consumers</h3>", h_table(_IMPACT_HEADER, escaped(_consumer_rows(
        r.consumers))), "<h3>Deployments</h3>",
              h_table(["deployment", *_IMPACT_HEADER[1:]], escaped(_consumer_rows(r.deployments))),
              "<h3>Experiment arms: who was served whose outputs</h3>",
              h_table(["arm", "served from", "contaminated hits"],
                       escaped([[c.arm or "(none)", c.served_from or "(none)", _n(c.hits)]
                                 for c in r.experiments.cross_feeding])),
              "<h3>Experiment arms: all rows / clean rows</h3>", h_table(_ARM_HEADER, escaped(_arm_rows(r))),
              paired_bars_svg(arms, "Mean latency (ms): all rows vs clean rows")]
    parts += ["<h2>Remediation</h2>", "<h3>Done</h3>", "<ul>" + "".join(f"<li>{esc(x)}</li>" for x in _purge_rows(r))
              + "</ul>", "<h3>Purge plan</h3>",
              f"<p><code>specdec cache plan</code> lists {_n(r.plan.keys)} keys: {_n(r.plan.contaminated)} served a "
              f"contaminated hit, {_n(r.plan.collision)} are shared by several identities.</p>", "<h3>Checklist</h3>",
              h_table(["item", "status", "what the store says"],
                       [[esc(a), f'<span class="{"ok" if b == "done" else "bad"}">{esc(b)}</span>', c]
                        for a, b, c in checklist(r, HTML)])]
    shown, total = r.mismatches, sum(r.mismatch_counts.values())
    parts += ["<h2>Appendix: mismatch report</h2>",
              "<ul>" + "".join(f"<li>{esc(k)}: {_n(r.mismatch_counts.get(k, 0))}</li>" for k in KINDS) + "</ul>",
              f"<p>The first {len(shown):,} of {total:,} rows (<code>specdec report</code> writes them "
              "all):</p>",
              h_table(_APPENDIX_COLUMNS, [[esc(row[c]) if pd.notna(row[c]) else "" for c in _APPENDIX_COLUMNS]
                                           for _, row in shown.iterrows()])]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>Incident report</title><style>{_STYLE}</style></head><body>\n" + "\n".join(parts)
            + "\n</body></html>\n")


def _check_suffix(suffix: str) -> None:
    if suffix not in SUFFIXES:
        raise ReportError(f"the report is Markdown or HTML: name a file ending in {' or '.join(SUFFIXES)}, "
                          f"not {suffix or 'no suffix'}")


def render(r: IncidentReport, suffix: str) -> str:
    _check_suffix(suffix)
    return render_markdown(r) if suffix == ".md" else render_html(r)


def incident_report_text(store: Store, suffix: str, external_url: str | None = None) -> str:
    """The report as the text of a `suffix` file (.md or .html): what the dashboard offers for download."""
    _check_suffix(suffix)
    return render(incident_report(store, external_url), suffix)


def write_incident_report(store: Store, out: str | Path, external_url: str | None = None) -> Path:
    """Write the report to `out` (.md or .html); `external_url` defaults to [dashboard] external_url."""
    path = Path(out)
    suffix = path.suffix.lower()
    _check_suffix(suffix)
    if external_url is None:
        from specdec_core.config import ConfigError, dashboard_settings

        try:
            external_url = dashboard_settings().external_url
        except ConfigError as exc:
            raise ReportError(str(exc)) from None
    text = render(incident_report(store, external_url), suffix)
    path.write_text(text, encoding="utf-8")
    return path
