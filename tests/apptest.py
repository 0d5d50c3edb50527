"""Running the app under Streamlit's AppTest and reading what it shows: what the dashboard's tests share."""

from __future__ import annotations

import functools
import json
import os
import re
import sys
from pathlib import Path

import pandas as pd
from helpers import STAND_IN_DECODER
from streamlit.components.v2 import manifest_scanner
from streamlit.runtime.scriptrunner.script_cache import ScriptCache
from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the ui package sits beside app.py, which is not a package
import ui  # noqa: E402, F401 (the dashboard's tests read its names through this module)

APP = ROOT / "app.py"

# Each AppTest scans every installed distribution's metadata for Streamlit components before its first run:
# 0.3-0.6 s each, 35 s of a whole run's CPU. What is installed does not change while the suite runs, so a
# worker scans once and every AppTest registers the same components.
manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)

# Likewise each run of an AppTest compiles app.py and its page anew (a cache of its own per run): 24 s of a
# whole run's CPU. A script is compiled once per worker while its file is unchanged.
_compiled: dict[tuple[str, int, int], object] = {}
_compile = ScriptCache.get_bytecode


def _compile_once(self: ScriptCache, script_path: str) -> object:
    seen = os.stat(script_path)
    key = (os.path.abspath(script_path), seen.st_mtime_ns, seen.st_size)
    if key not in _compiled:
        _compiled[key] = _compile(self, script_path)
    return _compiled[key]


ScriptCache.get_bytecode = _compile_once


def open_app(monkeypatch, db: Path, page: str | None = None, **query: str) -> AppTest:
    monkeypatch.setenv("SPECDEC_DB", str(db))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params.update(query)
    if page:  # opened at its address, as a link to it opens it: no Overview drawn first
        at.switch_page(f"pages/{page}.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def metrics_of(block) -> dict[str, str]:
    return {m.label: m.value for m in block.metric}


def texts(at: AppTest, kind: str) -> list[str]:
    return [e.value for e in at.get(kind)]


def walk(node) -> list:
    children = getattr(node, "children", None)
    if not children:
        return [node]
    return [node] + [e for child in children.values() for e in walk(child)]


def markdown_unescape(text: str) -> str:
    """Markdown as it reads on screen: without md_escape's backslashes and invisible word joiners."""
    return re.sub(r"\\([!-/:-@\[-`{-~])", r"\1", text).replace("\u2060", "")


def stand_in_replay_module(monkeypatch) -> list:
    """specdec_core.replay.run's functions replaced, its result types kept; records the calls the pages make."""
    from specdec_core.replay.diff import OutputDiff, WordOp
    from specdec_core.replay.run import ReplayResult

    calls: list = []
    ops = (WordOp("equal", "An ", "An "), WordOp("insert", "", "<b>other</b> "), WordOp("equal", "output.", "output."))

    def replay(store, request_id, decoder, *, prompt=None):
        calls.append(("replay", request_id, decoder, prompt))
        with store.write():  # the real one stores its result: a new version of the database
            pass
        return ReplayResult(
            request_id, "foreign", "served r1's output",
            {"source": "r1", "why": "replay of the source matches production"},
            production_text="An output.", replay_text="An <b>other</b> output.",
            diff=OutputDiff(identical=False, production_tokens=3, replay_tokens=4, common_prefix_tokens=1,
                            common_prefix_chars=3, first_divergent_token=1, first_divergent_char=3,
                            similarity=0.5, word_ops=ops, max_tokens=16),
            draft_tokens=8, accepted_tokens=6, source_request_id="r1", source_replay_text="An output.",
        )

    def replay_many(store, request_ids, decoder, progress=None):
        out = []
        for n, request_id in enumerate(request_ids, 1):
            out.append(replay(store, request_id, decoder))
            if progress:
                progress(n, len(request_ids), out[-1])
        return out

    def replays_table(store, limit=1000):
        return pd.DataFrame({"request_id": [c[1] for c in calls], "classification": "foreign"})

    import specdec_core.replay.run as module

    for name, stand_in in (("replay", replay), ("replay_many", replay_many), ("replays_table", replays_table),
                           ("default_decoder", lambda: STAND_IN_DECODER)):
        monkeypatch.setattr(module, name, stand_in)
    return calls


def _plain(value):
    """Plotly writes numeric arrays as {dtype, bdata} (base64): back to lists, to compare."""
    if isinstance(value, dict) and "bdata" in value and "dtype" in value:
        import base64

        import numpy as np

        return np.frombuffer(base64.b64decode(value["bdata"]), dtype=value["dtype"]).tolist()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def figure(at, key: str) -> dict:
    [chart] = [c for c in at.get("plotly_chart") if c.key == key]
    return _plain(json.loads(chart.proto.spec))
