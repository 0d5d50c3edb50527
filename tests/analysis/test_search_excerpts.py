"""Issue 44 item 9: each search result says where it matched, the match with the text around it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from helpers import rec, write_jsonl

from specdec_core import analysis
from specdec_core.analysis.query import Filters
from specdec_core.analysis.search import EXCERPT_CHARS, SearchError
from specdec_core.ingestion.load import ingest
from specdec_core.store.connection import Store


def store_of(tmp_path, records) -> Store:
    store = Store(tmp_path / "search.duckdb")
    ingest(store, [str(write_jsonl(tmp_path / "search.jsonl", records))])
    return store


def test_the_first_match_comes_with_the_text_around_it_even_far_into_a_long_output(tmp_path):
    store = store_of(tmp_path, [
        rec("far", output_text="x" * 500 + " the <b>INVOICE</b> total is 42 " + "y" * 500),
        rec("prompt-only", cache_key="k-2", prompt="Find the invoice, please.", output_text="Nothing here."),
        rec("none", cache_key="k-3"),
    ])
    found = analysis.search_requests(store, "invoice").set_index("request_id")
    assert list(found.index) == ["far", "prompt-only"]
    far = found.loc["far"]
    assert (far.match_field, far.match_text) == ("output", "INVOICE"), "as the log has it, case and all"
    assert far.match_before == "…" + ("x" * 500 + " the <b>")[-EXCERPT_CHARS:]
    assert far.match_after == ("</b> total is 42 " + "y" * 500)[:EXCERPT_CHARS] + "…"
    prompt = found.loc["prompt-only"]
    assert (prompt.match_field, prompt.match_before, prompt.match_text, prompt.match_after) == \
        ("prompt", "Find the ", "invoice", ", please.")


def test_punctuation_is_literal_and_a_regex_with_its_own_groups_is_located_whole(tmp_path):
    store = store_of(tmp_path, [rec("a", output_text="Is 100% of_it (really) 42? Yes: 100% of_it.")])
    [row] = analysis.search_requests(store, "100% of_it (really)").itertuples()
    assert (row.match_before, row.match_text, row.match_after) == ("Is ", "100% of_it (really)", " 42? Yes: 100% of_it.")
    [row] = analysis.search_requests(store, r"(re)(a)l+y", mode="regex").itertuples()
    assert (row.match_before, row.match_text) == ("Is 100% of_it (", "really")
    assert analysis.search_requests(store, "REALLY", case_sensitive=True).empty
    [row] = analysis.search_requests(store, "REALLY").itertuples()
    assert row.match_text == "really"


def test_many_matches_list_the_first_in_time_order_ties_by_id_and_count_them_all(tmp_path):
    """The search chooses its rows in a narrow first pass: the list is still the first `limit` matches in time
    order (ties by id), under the filters, and `matches` counts every match, those past the limit too."""
    start = datetime(2026, 5, 1, tzinfo=timezone.utc)
    records = []
    for n in range(60):  # three requests a second (ties in ts), ids falling within a second; 1 in 5 elsewhere
        records.append(rec(f"r-{99 - n}", cache_key=f"k-{n}", ts=(start + timedelta(seconds=n // 3)).isoformat(),
                           deployment="other" if n % 5 == 0 else "edge",
                           output_text="no luck" if n % 7 == 0 else f"an Invoice, number {n}"))
    store = store_of(tmp_path, records)
    expected = sorted((datetime.fromisoformat(r["ts"]), r["request_id"]) for r in records
                      if r["deployment"] == "edge" and "Invoice" in r["output_text"])
    cut = next(i for i in range(10, len(expected)) if expected[i][0] == expected[i - 1][0])  # inside a tie
    found = analysis.search_requests(store, "invoice", filters=Filters(deployments=("edge",)), limit=cut)
    assert list(found.request_id) == [rid for _, rid in expected[:cut]]
    assert set(found.matches) == {len(expected)} and len(expected) > cut
    assert analysis.search_requests(store, "no such text").empty


def test_a_regex_re2_takes_alone_but_not_inside_the_excerpt_is_one_error_not_a_traceback(tmp_path):
    """`a\\Q` matches (an unclosed \\Q quotes to the end) but swallows the excerpt pattern's ")": the page showed
    DuckDB's BinderException; it says the expression can't be used, as for "(", and a sound one still runs."""
    store = store_of(tmp_path, [rec("a1", output_text="a plain answer")])
    for bad in (r"a\Q", "("):
        with pytest.raises(SearchError, match="not a valid regular expression"):
            analysis.search_requests(store, bad, mode="regex")
    assert len(analysis.search_requests(store, r"pl\w+n", mode="regex")) == 1
