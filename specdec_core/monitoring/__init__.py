"""The triage figures as Prometheus metrics (shared/metrics.md), the alert rules and a Grafana dashboard.

figures.py reads the numbers (no prometheus_client needed), exporter.py serves them, rules.py and grafana.py
write the rule file and the dashboard, service_metrics.py instruments DecodeService.
"""
