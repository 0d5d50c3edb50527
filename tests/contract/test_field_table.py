"""The contract's fields are defined once: a field added to the table is validated, stored and part of the
identity with no other change."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from specdec_core import contract
from specdec_core.contract import fields

# Runs in a fresh interpreter: modules that derive SQL from the table read it when imported.
EXTENDED = textwrap.dedent("""
    import json, sys
    from specdec_core.contract import fields as cf
    cf.define(cf.FIELDS + (cf.Field("lora_adapter", "str", identity=True),))

    from specdec_core import identity, fingerprint
    from specdec_core.store import Store
    from specdec_core.ingest import ingest

    base = {"ts": "2026-03-01T10:00:00Z", "prompt": "hi", "target_model": "t", "temperature": 0.0,
            "max_tokens": 8, "tokenizer_version": "v1", "cache_key": "K", "output_text": "x",
            "output_tokens": 1}
    lines = [
        {**base, "request_id": "m", "cache_hit": False, "lora_adapter": "support-v1"},
        {**base, "request_id": "h", "cache_hit": True, "lora_adapter": "support-v2", "ts": "2026-03-01T10:01:00Z"},
        {**base, "request_id": "bad", "cache_hit": False, "lora_adapter": 7},
    ]
    log = sys.argv[1] + "/log.jsonl"
    with open(log, "w") as fh:
        fh.write("\\n".join(json.dumps(r) for r in lines) + "\\n")
    store = Store(sys.argv[1] + "/s.duckdb")
    result = ingest(store, [log])
    with store.read() as con:
        stored = dict(con.execute("SELECT request_id, lora_adapter FROM requests").fetchall())
        reasons = [r[0] for r in con.execute("SELECT reason FROM quarantine").fetchall()]
        judged = con.execute("SELECT contaminated, differing_fields FROM hit_sources").fetchall()
    print(json.dumps({
        "accepted": result.accepted, "quarantined": result.quarantined, "stored": stored, "reasons": reasons,
        "judged": judged, "identity_has_field": "lora_adapter" in identity(lines[0]),
        "fingerprints_differ": fingerprint(lines[0]) != fingerprint(lines[1]),
    }))
""")


def test_a_field_added_to_the_table_is_validated_stored_and_part_of_the_identity(tmp_path):
    run = subprocess.run([sys.executable, "-c", EXTENDED, str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["accepted"] == 2 and out["quarantined"] == 1
    assert out["reasons"] == ["lora_adapter: expected a string, got 7"]
    assert out["stored"] == {"m": "support-v1", "h": "support-v2"}
    assert out["identity_has_field"] and out["fingerprints_differ"]
    assert out["judged"] == [[True, "lora_adapter"]]  # the hit served another adapter's output


def test_the_identity_field_list_comes_from_the_table():
    assert contract.IDENTITY_FIELDS == tuple(f.name for f in fields.FIELDS if f.identity)
    assert "lora_adapter" not in contract.IDENTITY_FIELDS  # the subprocess's extension stayed there
    assert set(contract.NON_IDENTITY_FIELDS) | set(contract.IDENTITY_FIELDS) | {"prompt_hash"} == set(fields.FIELD_NAMES)
