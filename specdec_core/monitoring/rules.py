"""The Prometheus alert rules over the contract's metrics (`specdec metrics rules`).

Each "new X" alert counts, per deployment, how much its counters grew within the window, exactly:
`x - x offset W` for a series that had a sample one window ago, and `x` itself for a series that had none
(`x unless x offset W`). The second half is the first-sample case: `increase()` needs two samples of a series,
so a deployment whose first batch already holds its first contaminated hit (its counter's first sample is 1)
would never fire with `increase()` alone. The exporter also creates every counter at 0 for each label set it
knows, so most series start at 0. A difference instead of `increase()` also gives whole numbers (no
extrapolation) and never reads a fall (a label value moving into "other") as a counter reset.
A Prometheus or exporter that was away for longer than the window sees every non-zero series as new and
announces each once: the store holds those hits, and saying so again is safer than staying silent.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from specdec_core.extras import require

DEFAULT_DASHBOARD_URL = "http://127.0.0.1:8501"
MISMATCHES_PAGE = "mismatches"  # the dashboard's page of flagged requests; its filters come from the URL
# Prometheus's durations: units from years down to milliseconds, each at most once, in that order.
DURATION = re.compile(r"^(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?$")
_UNIT_MS = (365 * 86_400_000, 7 * 86_400_000, 86_400_000, 3_600_000, 60_000, 1000, 1)
MAX_DURATION_MS = (2**63 - 1) // 1_000_000  # Prometheus keeps a duration in int64 nanoseconds


@dataclass(frozen=True)
class RuleOptions:
    dashboard_url: str = DEFAULT_DASHBOARD_URL
    window: str = "5m"  # how long a "new" alert stays firing after the last growth
    stale_after_s: int = 900  # SpecdecIngestStale: newest request older than this
    # A "new X" alert stays firing this long after its expression stops holding: a scrape gap (an exporter or
    # follower restarting) makes its series stale for a moment, which would resolve the alert and page again.
    keep_firing_for: str = "1m"


def duration_ms(text: str) -> int | None:
    """A Prometheus duration in milliseconds; None where Prometheus would refuse it (zero, out of range, not one)."""
    match = DURATION.match(text)
    if not text or match is None:
        return None
    ms = sum(int(n) * unit for n, unit in zip(match.groups(), _UNIT_MS, strict=True) if n is not None)
    return ms if 0 < ms <= MAX_DURATION_MS else None


def check_dashboard_url(url: str, option: str = "--dashboard-url") -> str:
    """`url` when it can be the base of the alerts' and Grafana's links; a one-line ValueError naming `option`.

    Prometheus runs an annotation as a Go template, so `{{`/`}}` in it would run whatever they hold (a query,
    inside the alert's link); Grafana and the alert are opened by people, so only http(s) goes."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ValueError(f"{option} {url!r}: expected an http(s) URL, e.g. https://triage.example.com")
    if "{{" in url or "}}" in url:
        raise ValueError(f"{option} {url!r}: holds {{{{ or }}}}, which Prometheus would run as a template; "
                         "percent-encode the braces (%7B, %7D)")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise ValueError(f"{option} {url!r}: holds a space or a control character; percent-encode it")
    return url


def page_link(base_url: str, query: str | None = None) -> str:
    """The dashboard's Mismatches page under `base_url`, `query` appended to the base URL's own query string and
    the base URL's fragment kept last, where it belongs."""
    parts = urlsplit(base_url)
    path = f"{parts.path.rstrip('/')}/{MISMATCHES_PAGE}"
    joined = "&".join(q for q in (parts.query, query) if q)
    return urlunsplit((parts.scheme, parts.netloc, path, joined, parts.fragment))


def check_options(options: RuleOptions) -> None:
    """A ValueError naming the bad option, or nothing."""
    check_dashboard_url(options.dashboard_url)
    if duration_ms(options.window) is None:
        raise ValueError(f"--window {options.window!r}: expected a Prometheus duration above 0 and below 292y, "
                         "such as 5m or 1h30m")
    if duration_ms(options.keep_firing_for) is None:
        raise ValueError(f"keep_firing_for {options.keep_firing_for!r}: expected a Prometheus duration such as 1m")
    if options.stale_after_s < 1:
        raise ValueError(f"--stale-after {options.stale_after_s}: expected seconds >= 1")


def dashboard_link(base_url: str) -> str:
    """The Mismatches page filtered to the alert's deployment, as a Prometheus annotation template."""
    return page_link(base_url, "deployment={{ $labels.deployment | urlquery }}")


def new_growth(metric: str, window: str) -> str:
    """Per deployment: how much `metric` grew within `window`, including a series that appeared above zero."""
    return f"sum by (deployment) (({metric} - {metric} offset {window}) or ({metric} unless {metric} offset {window})) > 0"


def alert_rules(options: RuleOptions = RuleOptions()) -> list[dict[str, Any]]:
    check_options(options)
    link = dashboard_link(options.dashboard_url)
    w = options.window
    where = "on deployment {{ $labels.deployment }}"
    return [
        {
            "alert": "SpecdecContaminatedHits",
            "expr": new_growth("specdec_contaminated_hits_total", w),
            "keep_firing_for": options.keep_firing_for,
            "labels": {"severity": "page"},
            "annotations": {
                "summary": f"Contaminated cache hits {where}",
                "description": ("{{ $value | humanize }} cache hit(s) " + where + " served an output cached for "
                                f"another request identity within the last {w}: the cache key is narrower than "
                                "the identity. Open the Mismatches page for the requests and their sources."),
                "dashboard": link,
            },
        },
        {
            "alert": "SpecdecLengthViolations",
            "expr": new_growth("specdec_length_violations_total", w),
            "keep_firing_for": options.keep_firing_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"Outputs longer than max_tokens {where}",
                "description": ("{{ $value | humanize }} request(s) " + where + " returned more tokens than their "
                                f"max_tokens within the last {w}: often an output cached for a request with a "
                                "larger limit."),
                "dashboard": link,
            },
        },
        {
            "alert": "SpecdecKeyCollisions",
            "expr": new_growth("specdec_key_collisions", w),
            "keep_firing_for": options.keep_firing_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"Cache keys shared by several identities grow {where}",
                "description": ("{{ $value | humanize }} more cache key(s) " + where + " are shared by requests "
                                f"of different identities than {w} ago: each is a contaminated hit waiting to "
                                "happen."),
                "dashboard": link,
            },
        },
        {
            "alert": "SpecdecIngestStale",
            "expr": (f"time() - max by (deployment) (specdec_newest_request_timestamp_seconds) "
                     f"> {options.stale_after_s}"),
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"No new requests logged {where}",
                "description": ("The newest request " + where + " is {{ $value | humanizeDuration }} old "
                                f"(threshold {options.stale_after_s} s): the service stopped logging, the "
                                "follower stopped, or the deployment stopped serving."),
                "dashboard": link,
            },
        },
    ]


def rules_yaml(options: RuleOptions = RuleOptions()) -> str:
    """The Prometheus rule file: one group holding every alert."""
    doc = {"groups": [{"name": "specdec-triage", "rules": alert_rules(options)}]}
    yaml = require("metrics", "yaml")
    return yaml.safe_dump(doc, sort_keys=False, width=1000, allow_unicode=True)
