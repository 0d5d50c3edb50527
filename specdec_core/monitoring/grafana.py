"""A Grafana dashboard over the contract's metrics (`specdec metrics grafana`): the Overview's questions.

Importable JSON: a Prometheus data source variable and a multi-value `deployment` variable; each panel's
query filters on `deployment=~"$deployment"`. Panels link to the triage dashboard's Mismatches page for the
deployment under the cursor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from specdec_core.monitoring.rules import check_dashboard_url, page_link

SEL = 'deployment=~"$deployment"'
WINDOW = "$__rate_interval"  # Grafana's own: at least four scrape intervals


@dataclass(frozen=True)
class Panel:
    title: str
    kind: str  # "timeseries" or "stat"
    expr: str
    legend: str
    unit: str = "short"
    description: str = ""


PANELS: tuple[Panel, ...] = (
    Panel("Contaminated hits", "stat", f"sum(specdec_contaminated_hits_total{{{SEL}}})", "contaminated hits",
          description="Cache hits that served another identity's output, as first judged (the Overview's headline)."),
    Panel("Requests", "stat", f"sum(specdec_requests_total{{{SEL}}})", "requests"),
    Panel("Key collisions", "stat", f"sum(specdec_key_collisions{{{SEL}}})", "key collisions",
          description="Cache keys shared by more than one identity."),
    Panel("Quarantined records", "stat", "sum(specdec_quarantined_records_total)", "quarantined"),
    Panel("Contaminated hits over time", "timeseries",
          f"sum by (deployment) (increase(specdec_contaminated_hits_total{{{SEL}}}[{WINDOW}]))", "{{deployment}}",
          description="New contaminated hits per deployment: the alert SpecdecContaminatedHits fires on these."),
    Panel("Hit rate per model combination", "timeseries",
          f'sum by (target_model, draft_model) (specdec_requests_total{{cache_hit="true",{SEL}}}) '
          f"/ sum by (target_model, draft_model) (specdec_requests_total{{{SEL}}})",
          "{{target_model}} / {{draft_model}}", "percentunit",
          "Cache hits among all requests, per target and draft model, over the whole store."),
    Panel("Length violations over time", "timeseries",
          f"sum by (deployment, target_model) (increase(specdec_length_violations_total{{{SEL}}}[{WINDOW}]))",
          "{{deployment}} {{target_model}}", description="Outputs longer than their max_tokens."),
    Panel("Keys per identity", "timeseries",
          f"sum by (deployment) (specdec_cache_keys{{{SEL}}}) / sum by (deployment) (specdec_identities{{{SEL}}})",
          "{{deployment}}", description="Below 1: several identities share keys (a narrow key). A correct key "
          "gives exactly 1."),
    Panel("Acceptance rate", "timeseries",
          f"sum by (deployment, target_model, draft_model) (specdec_accepted_tokens_total{{{SEL}}}) "
          f"/ sum by (deployment, target_model, draft_model) (specdec_draft_tokens_total{{{SEL}}})",
          "{{deployment}} {{target_model}} / {{draft_model}}", "percentunit",
          "Accepted draft tokens among drafted ones."),
    Panel("Contaminated hits by differing field", "timeseries",
          f"sum by (field) (specdec_contaminated_hit_fields_total{{{SEL}}})", "{{field}}",
          description="Which identity fields the narrow key leaves out."),
    Panel("Ingest lag", "timeseries", f"time() - max by (deployment) (specdec_newest_request_timestamp_seconds{{{SEL}}})",
          "{{deployment}}", "s", "Age of the newest request logged: SpecdecIngestStale fires above its threshold."),
)


def _panel(n: int, p: Panel, link: str) -> dict[str, Any]:
    stat = p.kind == "stat"
    return {
        "id": n + 1,
        "type": p.kind,
        "title": p.title,
        "description": p.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": ({"h": 4, "w": 6, "x": 6 * (n % 4), "y": 0} if stat else
                    {"h": 8, "w": 12, "x": 12 * ((n - 4) % 2), "y": 4 + 8 * ((n - 4) // 2)}),
        "targets": [{"refId": "A", "expr": p.expr, "legendFormat": p.legend,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}],
        "fieldConfig": {"defaults": {"unit": p.unit, "links": [
            {"title": "Open in specdec-triage", "url": link, "targetBlank": True}]}, "overrides": []},
        "options": {"reduceOptions": {"calcs": ["lastNotNull"]}} if stat else {"legend": {"showLegend": True}},
    }


def dashboard(dashboard_url: str) -> dict[str, Any]:
    """The dashboard JSON (Grafana's import format), linking to the triage dashboard at `dashboard_url`
    (checked as the rules check it: a ValueError otherwise)."""
    check_dashboard_url(dashboard_url)
    link = page_link(dashboard_url, "deployment=${__field.labels.deployment}")
    return {
        "title": "specdec-triage",
        "uid": "specdec-triage",
        "tags": ["specdec", "speculative-decoding", "cache"],
        "timezone": "utc",
        "schemaVersion": 39,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "links": [{"title": "specdec-triage dashboard", "type": "link", "url": page_link(dashboard_url),
                   "targetBlank": True}],
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
            {"name": "deployment", "label": "Deployment", "type": "query",
             "datasource": {"type": "prometheus", "uid": "${datasource}"},
             "query": {"query": "label_values(specdec_requests_total, deployment)", "refId": "deployment"},
             "definition": "label_values(specdec_requests_total, deployment)",
             "multi": True, "includeAll": True, "allValue": ".*", "refresh": 2, "sort": 1,
             "current": {"text": "All", "value": "$__all"}},
        ]},
        "panels": [_panel(n, p, link) for n, p in enumerate(PANELS)],
    }
