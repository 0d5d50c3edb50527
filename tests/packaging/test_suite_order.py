"""The suite's modules go out longest first by their recorded times, modules with no time yet before them; the
recorded file names only modules that exist, and a run records over it without losing the others."""

from __future__ import annotations

from pathlib import Path

from suite_order import DURATIONS, longest_first, recorded_durations, write_durations

REPO = Path(__file__).resolve().parents[2]


def test_unrecorded_modules_go_first_then_the_longest():
    modules = ["tests/a.py", "tests/new.py", "tests/b.py", "tests/c.py", "tests/newer.py"]
    durations = {"tests/a.py": 3.0, "tests/b.py": 120.5, "tests/c.py": 40.0, "tests/gone.py": 500.0}
    assert longest_first(modules, durations) == ["tests/new.py", "tests/newer.py", "tests/b.py", "tests/c.py",
                                                 "tests/a.py"]


def test_a_recorded_run_updates_its_modules_and_keeps_the_rest(tmp_path):
    path = tmp_path / "durations.json"
    assert recorded_durations(path) == {}
    write_durations({"tests/a.py": 1.04, "tests/b.py": 9.0}, path)
    write_durations({"tests/b.py": 12.26}, path)
    assert recorded_durations(path) == {"tests/a.py": 1.0, "tests/b.py": 12.3}


def test_the_committed_times_name_modules_that_exist():
    durations = recorded_durations(DURATIONS)
    assert durations and all(seconds >= 0 for seconds in durations.values())
    assert [m for m in durations if not (REPO / m).is_file()] == []
