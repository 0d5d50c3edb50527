"""Triage questions over the store, one module per question family; red flags; the mismatch report.

Pages and the CLI call these functions with a `Store` and `Filters`; none of them writes.
"""

from specdec_core.analysis.annotations import (
    Annotation,
    annotations_for,
    contamination_annotations,
    detected_annotations,
    key_scheme_annotations,
    parse_annotations,
    scheme_change_annotations,
)
from specdec_core.analysis.cache import (
    acceptance_by_combination,
    acceptance_rate,
    hit_rate_by_combination,
    hit_rate_over_time,
    key_ratio_by_deployment,
    latency_hit_vs_miss,
)
from specdec_core.analysis.contamination import (
    contaminated_hits,
    contamination_window,
    mismatch_rate_over_time,
)
from specdec_core.analysis.deployment_state import DeploymentState, deployment_states
from specdec_core.analysis.fix_status import (
    FixStatus,
    SchemeChangeHits,
    fix_stats,
    fix_status,
    scheme_change_hits,
)
from specdec_core.analysis.gaps import LoggingGap, logging_gaps
from specdec_core.analysis.key_details import differing_identity_columns, key_prompts
from specdec_core.analysis.keys import key_collision_identities, key_collisions
from specdec_core.analysis.lengths import length_violations, output_length_by_max_tokens
from specdec_core.analysis.overview import FilterOptions, Headline, HeadlineCounts, filter_options, headline
from specdec_core.analysis.quarantine import mostly_quarantined, quarantine_reasons
from specdec_core.analysis.query import NO_FILTERS, Filters, time_bucket
from specdec_core.analysis.red_flags import CEILING_MEANING, RED_FLAG_IDS, RedFlag, red_flags
from specdec_core.analysis.report import KINDS, mismatch_report, report_counts, report_csv, write_report
from specdec_core.analysis.request_detail import LengthCheck, RequestDetail, request_detail
from specdec_core.analysis.requests import (
    RequestRecord,
    quarantined_records,
    request_record,
    suspicious_requests,
)
from specdec_core.analysis.search import SEARCH_FIELDS, SEARCH_MODES, SearchError, search_requests
from specdec_core.analysis.status import (
    ContaminationStatus,
    KeySchemeChange,
    contamination_status,
    key_scheme_changes,
)
from specdec_core.analysis.timeline import (
    SMOOTHING_WINDOWS,
    Freshness,
    freshness,
    hit_rate_by_deployment_over_time,
    latency_histogram,
    requests_in_window,
)
from specdec_core.derived.summaries import NO_DRAFT

__all__ = [
    "SEARCH_FIELDS", "SEARCH_MODES", "SMOOTHING_WINDOWS", "Annotation", "SearchError", "annotations_for",
    "contamination_annotations", "differing_identity_columns", "freshness", "hit_rate_by_deployment_over_time",
    "key_prompts", "latency_histogram", "parse_annotations", "requests_in_window", "search_requests",
    "KINDS", "LoggingGap", "NO_DRAFT", "NO_FILTERS", "RED_FLAG_IDS", "Filters", "RedFlag", "acceptance_by_combination",
    "acceptance_rate", "contaminated_hits", "contamination_window", "filter_options", "headline", "hit_rate_by_combination",
    "hit_rate_over_time", "key_collision_identities", "key_collisions", "key_ratio_by_deployment",
    "latency_hit_vs_miss", "length_violations", "logging_gaps", "mismatch_rate_over_time", "mismatch_report",
    "output_length_by_max_tokens", "quarantined_records", "red_flags", "report_counts", "report_csv",
    "request_record", "request_detail", "mostly_quarantined", "quarantine_reasons", "DeploymentState", "deployment_states", "RequestDetail", "LengthCheck", "suspicious_requests", "time_bucket", "write_report",
    "CEILING_MEANING", "ContaminationStatus", "KeySchemeChange", "contamination_status", "detected_annotations",
    "key_scheme_annotations", "key_scheme_changes", "FixStatus", "SchemeChangeHits", "fix_stats", "fix_status",
    "scheme_change_hits", "scheme_change_annotations", "FilterOptions", "Freshness", "Headline", "HeadlineCounts", "RequestRecord",
]
