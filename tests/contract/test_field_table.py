"""The contract's fields are defined once: a field added to the table is validated, stored and part of the
identity with no other change."""

from __future__ import annotations

from helpers import rec, write_jsonl

import specdec_core
from specdec_core import contract, fingerprint, identity
from specdec_core.contract import fields
from specdec_core.ingestion import ingest
from specdec_core.store import Store

LORA = fields.Field("lora_adapter", "str", identity=True)


def test_a_field_added_to_the_table_is_validated_stored_and_part_of_the_identity(tmp_path):
    base = {"ts": "2026-03-01T10:00:00Z", "prompt": "hi", "target_model": "t", "temperature": 0.0,
            "max_tokens": 8, "tokenizer_version": "v1", "cache_key": "K", "output_text": "x", "output_tokens": 1}
    lines = [
        {**base, "request_id": "m", "cache_hit": False, "lora_adapter": "support-v1"},
        {**base, "request_id": "h", "cache_hit": True, "lora_adapter": "support-v2", "ts": "2026-03-01T10:01:00Z"},
        {**base, "request_id": "bad", "cache_hit": False, "lora_adapter": 7},
    ]
    log = write_jsonl(tmp_path / "log.jsonl", lines)
    with fields.extended(LORA):
        store = Store(tmp_path / "s.duckdb")
        result = ingest(store, [str(log)])
        with store.read() as con:
            stored = dict(con.execute("SELECT request_id, lora_adapter FROM requests").fetchall())
            reasons = [r[0] for r in con.execute("SELECT reason FROM quarantine").fetchall()]
            judged = con.execute("SELECT contaminated, differing_fields FROM hit_sources").fetchall()
        assert "lora_adapter" in identity(lines[0]) and fingerprint(lines[0]) != fingerprint(lines[1])
    assert result.accepted == 2 and result.quarantined == 1
    assert reasons == ["lora_adapter: expected a string, got 7"]
    assert stored == {"m": "support-v1", "h": "support-v2"}
    assert judged == [(True, "lora_adapter")]  # the hit served another adapter's output


def test_after_the_block_the_contract_and_what_is_derived_from_it_are_as_shipped(tmp_path):
    shipped = fields.current()
    with fields.extended(LORA) as extended:
        assert fields.current() is extended and "lora_adapter" in contract.IDENTITY_FIELDS
    assert fields.current() is shipped and "lora_adapter" not in contract.IDENTITY_FIELDS
    store = Store(tmp_path / "s.duckdb")
    assert ingest(store, [str(write_jsonl(tmp_path / "log.jsonl", [rec("a")]))]).accepted == 1
    with store.read() as con:
        columns = {r[0] for r in con.execute("DESCRIBE requests").fetchall()}
    assert "lora_adapter" not in columns and "lora_adapter" not in identity(rec("a"))


def test_every_name_for_the_field_lists_reads_the_one_contract():
    with fields.extended(LORA):
        for name in ("FIELDS", "IDENTITY_FIELDS"):
            assert getattr(specdec_core, name) is getattr(contract, name) is getattr(fields, name)
        assert specdec_core.IDENTITY_FIELDS[-1] == "lora_adapter"
        assert contract.NON_IDENTITY_FIELDS is fields.NON_IDENTITY_FIELDS
    assert "lora_adapter" not in specdec_core.IDENTITY_FIELDS


def test_the_identity_field_list_comes_from_the_table():
    assert contract.IDENTITY_FIELDS == tuple(f.name for f in fields.FIELDS if f.identity)
    assert set(contract.NON_IDENTITY_FIELDS) | set(contract.IDENTITY_FIELDS) | {"prompt_hash"} == set(fields.FIELD_NAMES)


def test_a_field_of_an_unknown_kind_is_refused_and_the_contract_kept():
    shipped = fields.current()
    try:
        fields.define(shipped.fields + (fields.Field("x", "colour"),))
    except ValueError as exc:
        assert str(exc) == "contract field x: unknown kind 'colour'"
    else:
        raise AssertionError("an unknown kind was accepted")
    assert fields.current() is shipped
