"""`consumer` and `experiment` in every format (../shared/remediation.md, "Two optional log fields"): where OTel
and LiteLLM carry them, by name in a mapping file and in the contract's own files; never in the identity."""

from __future__ import annotations

import json

import pytest
from helpers import rec, write_csv, write_jsonl

from specdec_core.contract import IDENTITY_FIELDS, fingerprint
from specdec_core.formats import line_reader, load_mapping
from specdec_core.ingestion import ingest
from specdec_core.service import DecodeService
from specdec_core.store import Store


def _attr(key: str, value: str) -> dict:
    return {"key": key, "value": {"stringValue": value}}


def _otel(*attrs: dict) -> dict:
    line = json.dumps({"resourceSpans": [{"resource": {"attributes": []}, "scopeSpans": [{"spans": [{
        "spanId": "00f067aa0ba902b7", "startTimeUnixNano": "1772359200000000000",
        "attributes": [_attr("gen_ai.operation.name", "chat"), *attrs]}]}]}]})
    return line_reader("otel")(line).records[0]


@pytest.mark.parametrize(("attrs", "consumer"), [
    ((_attr("specdec.consumer", "team-a"), _attr("user.id", "u1"), _attr("enduser.id", "e1")), "team-a"),
    ((_attr("user.id", "u1"), _attr("enduser.id", "e1")), "u1"),
    ((_attr("enduser.id", "e1"),), "e1"),
    ((), None),
])
def test_otel_consumer_is_specdec_consumer_else_user_id_else_enduser_id(attrs, consumer):
    record = _otel(*attrs, _attr("specdec.experiment", "arm-b"))
    assert record.get("consumer") == consumer
    assert record["experiment"] == "arm-b"


def _litellm(metadata: dict, **over) -> dict:
    payload = {"id": "c1", "startTime": 1772359200.0, "hidden_params": {"litellm_model_name": "t"},
               "messages": "Hi", "model_parameters": {"temperature": 0, "max_tokens": 8}, "metadata": metadata,
               "cache_hit": None, "cache_key": "k", "completion_tokens": 1,
               "response": {"choices": [{"message": {"content": "x"}}]}, **over}
    return line_reader("litellm")(json.dumps(payload)).records[0]


@pytest.mark.parametrize(("metadata", "over", "consumer"), [
    ({"requester_metadata": {"consumer": "c", "experiment": "e"}, "user_api_key_alias": "alias"}, {"end_user": "u"},
     "c"),
    ({"user_api_key_alias": "alias", "user_api_key_end_user_id": "eu"}, {"end_user": "u"}, "alias"),
    ({"user_api_key_alias": None, "user_api_key_end_user_id": "eu"}, {"end_user": "u"}, "eu"),
    ({}, {"end_user": "u"}, "u"),
    ({"user_api_key_alias": ""}, {"end_user": ""}, None),
])
def test_litellm_consumer_falls_back_through_the_key_alias_and_end_user(metadata, over, consumer):
    record = _litellm(metadata, **over)
    assert record.get("consumer") == consumer
    assert record.get("experiment") == metadata.get("requester_metadata", {}).get("experiment")


def test_a_mapping_file_names_both(tmp_path):
    mapping = tmp_path / "map.toml"
    mapping.write_text('request_id = "id"\nconsumer = "who.tenant"\nexperiment = { value = "eval-7" }\n',
                       encoding="utf-8")
    record = load_mapping(mapping).read_line(json.dumps({"id": "r", "who": {"tenant": "acme"}})).records[0]
    assert record == {"request_id": "r", "consumer": "acme", "experiment": "eval-7"}


def test_neither_field_is_identity_and_csv_and_jsonl_store_them_by_name(tmp_path):
    assert "consumer" not in IDENTITY_FIELDS and "experiment" not in IDENTITY_FIELDS
    assert fingerprint(rec("a", consumer="x", experiment="y")) == fingerprint(rec("a"))
    csv_file = write_csv(tmp_path / "a.csv", [rec("c1", consumer="acme", experiment="arm-a")])
    jsonl = write_jsonl(tmp_path / "b.jsonl", [rec("j1", consumer=None, experiment="arm-b"), rec("j2")])
    store = Store(tmp_path / "s.duckdb")
    assert ingest(store, [str(csv_file), str(jsonl)]).accepted == 3
    with store.read() as con:
        rows = con.execute("SELECT request_id, consumer, experiment, extra FROM requests ORDER BY 1").fetchall()
    assert rows == [("c1", "acme", "arm-a", None), ("j1", None, "arm-b", None), ("j2", None, None, None)]


def test_a_number_is_no_consumer_and_quarantines_with_the_field_named(tmp_path):
    store = Store(tmp_path / "s.duckdb")
    result = ingest(store, [str(write_jsonl(tmp_path / "x.jsonl", [rec("q", consumer=7)]))])
    assert result.quarantined == 1
    with store.read() as con:
        assert "consumer" in con.execute("SELECT reason FROM quarantine").fetchall()[0][0]


def test_the_service_logs_them_and_its_span_carries_them(tmp_path):
    from helpers import DeterministicEngine

    from specdec_core.cache import MemoryCache

    records: list[dict] = []
    service = DecodeService(MemoryCache(), DeterministicEngine(), log_sink=records.append, deployment="d")
    service.decode(rec("s1"), request_id="s1", consumer="acme", experiment="arm-a")
    service.decode(rec("s2"), request_id="s2")
    assert (records[0]["consumer"], records[0]["experiment"]) == ("acme", "arm-a")
    assert (records[1]["consumer"], records[1]["experiment"]) == (None, None)
    assert records[0]["cache_key"] == records[1]["cache_key"] and records[1]["cache_hit"] is True
    from specdec_core.spans import span_attributes

    attributes = span_attributes(records[0])
    assert (attributes["specdec.consumer"], attributes["specdec.experiment"]) == ("acme", "arm-a")
