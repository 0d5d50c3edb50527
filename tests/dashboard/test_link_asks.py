"""A link whose filters this store cannot honour says so above the page, instead of showing every request as if
the link had chosen them (ui/links.py): a deployment it lacks, a time range outside its logs or no time at all."""

from __future__ import annotations

from apptest import metrics_of, open_app


def _said(at) -> list[str]:
    return [w.value for w in at.warning if w.value.startswith("**This link asks for")]


def test_a_deployment_the_store_lacks_is_said_until_the_visitor_chooses_filters(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, deployment="nope")
    assert metrics_of(at.main)["Requests"] == "6"
    [said] = _said(at)
    assert "- deployment `nope`: not in this store; showing every deployment" in said
    at.run()
    assert _said(at) == [said], "said while the link's view stays"
    at.sidebar.multiselect(key="f_deployments").set_value(["prod"]).run()
    assert metrics_of(at.main)["Requests"] == "4" and not _said(at)


def test_a_time_the_logs_do_not_reach_or_no_time_at_all_is_said(monkeypatch, incident_db):
    cases = {
        ("2030-01-01T00:00:00Z", None): "time range 2030-01-01 00:00:00 UTC to 2026-03-01 10:06:00 UTC: no request",
        ("2026-02-01T00:00:00Z", "2026-02-02T00:00:00Z"): "no request of this store is in it (its logs run "
                                                          "2026-03-01 10:00:00 UTC to 2026-03-01 10:06:00 UTC)",
        ("2026-03-01T10:05:00Z", "2026-03-01T10:01:00Z"): "it ends before it starts; showing the whole log",
        ("yesterday", None): "start `yesterday`: not an ISO 8601 time; showing the whole log",
    }
    for (start, end), expected in cases.items():
        query = {"start": start} | ({"end": end} if end else {})
        at = open_app(monkeypatch, incident_db, **query)
        assert metrics_of(at.main)["Requests"] == "6", query
        assert any(expected in said for said in _said(at)), (query, _said(at))


def test_a_link_the_store_honours_says_nothing(monkeypatch, incident_db):
    at = open_app(monkeypatch, incident_db, deployment="staging", start="2026-03-01T10:00:00Z")
    assert metrics_of(at.main)["Requests"] == "2" and not _said(at)


def test_a_links_end_date_alone_is_that_whole_day_as_for_specdec_stats(monkeypatch, incident_db):
    """`end=2026-03-01` reads as `specdec stats --end 2026-03-01` does: through that day. It read as the day's
    first instant, which lies before every request of this store: the link said so and showed the whole log."""
    for query in ({"end": "2026-03-01"}, {"start": "2026-03-01", "end": "2026-03-01"}, {"end": "20260301"}):
        at = open_app(monkeypatch, incident_db, deployment="staging", **query)
        assert metrics_of(at.main)["Requests"] == "2" and not _said(at), (query, _said(at))
    at = open_app(monkeypatch, incident_db, deployment="staging", end="2026-02-28")
    assert any("no request of this store is in it" in said for said in _said(at)), _said(at)
