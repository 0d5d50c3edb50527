"""Triage questions over the store: filters, one module per question family, red flags and the mismatch report."""

from specdec_core.analysis.metrics import Filters, headline, red_flags
from specdec_core.analysis.report import mismatch_report, write_report

__all__ = ["Filters", "headline", "mismatch_report", "red_flags", "write_report"]
