"""A served dashboard sets the modules it has loaded aside from Python's cycle collector, which Streamlit runs
over every generation after each run of a page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# In a process of its own: freezing is for the whole process, and a test worker's objects are not a server's.
# Automatic collections are off, so every collection counted is one the function asked for.
PROBE = """
import gc, sys
sys.path.insert(0, sys.argv[1])
gc.disable()
import ui.state as state
asked = []
gc.callbacks.append(lambda phase, info: phase == "start" and asked.append(info["generation"]))
state.freeze_what_is_loaded()
print("no server", gc.get_freeze_count(), len(asked))
state.runtime.exists = lambda: True  # as under `streamlit run`
state.freeze_what_is_loaded()
print("served", gc.get_freeze_count(), len(asked))
state.freeze_what_is_loaded()
print("again", gc.get_freeze_count(), len(asked))
import colorsys
state.freeze_what_is_loaded()
print("more modules", gc.get_freeze_count(), len(asked))
"""


def test_a_served_dashboard_freezes_its_modules_once_per_import_and_a_script_run_alone_never():
    out = subprocess.run([sys.executable, "-c", PROBE, str(ROOT)], capture_output=True, text=True, check=True,
                         timeout=120).stdout.split("\n")
    said = {" ".join(line.split()[:-2]): tuple(map(int, line.split()[-2:])) for line in out if line}
    assert said["no server"] == (0, 0)
    frozen, collected = said["served"]
    assert frozen > 50_000 and collected == 1, said  # streamlit, pandas, duckdb: collected once, then set aside
    assert said["again"] == said["served"], "the same modules: nothing collected or frozen again"
    assert said["more modules"][0] > frozen and said["more modules"][1] == 2, said
