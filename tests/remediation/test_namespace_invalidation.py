"""DecodeService.invalidate moves to a new namespace; docs/library.md's incident sequence runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from helpers import SAMPLE_REQUEST, DeterministicEngine

from specdec_core import DecodeService, MemoryCache
from specdec_core.service import bumped_namespace

ROOT = Path(__file__).resolve().parents[2]


def test_invalidate_bumps_the_namespace_and_old_entries_are_never_read_again():
    cache, engine = MemoryCache(), DeterministicEngine()
    service = DecodeService(cache, engine, namespace="prod")
    service.decode(SAMPLE_REQUEST)
    service.decode(SAMPLE_REQUEST)
    assert service.counters()["hits"] == 1

    assert service.invalidate() == "prod"

    assert service.namespace == "prod-2" and service.cache_key(SAMPLE_REQUEST).startswith("specdec:prod-2:")
    service.decode(SAMPLE_REQUEST)
    assert service.counters()["misses"] == 2 and len(engine.calls) == 2  # the old entry was not read
    assert cache.delete_namespace("prod") == 1 and len(cache) == 1
    assert service.invalidate("blue") == "prod-2" and service.namespace == "blue"
    with pytest.raises(ValueError, match="current namespace"):
        service.invalidate("blue")
    with pytest.raises(ValueError, match="namespace"):
        service.invalidate("bad:name")
    assert service.namespace == "blue"
    assert [bumped_namespace(n) for n in ("prod", "prod-2", "prod-9", "a-b", "-3", "prod-\u00b2", "prod-\u0663")] == [
        "prod-2", "prod-3", "prod-10", "a-b-2", "-3-2", "prod-\u00b2-2", "prod-\u0663-2"]


def test_the_library_docs_incident_sequence_runs_and_the_fix_holds(tmp_path, monkeypatch, capsys):
    text = (ROOT / "docs" / "library.md").read_text()
    section = text.split("## After an incident", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("tempfile.mkdtemp", lambda: str(tmp_path))
    exec(compile(code, "docs/library.md", "exec"), {})
    said = capsys.readouterr().out
    assert "removed 6 entries under specdec:prod:" in said
    assert re.search(r"prod: fix deployed at .*; 0 hits from old-scheme keys since\.", said)
