"""Shared pytest fixtures; shared helpers are in helpers.py."""

from __future__ import annotations

import fcntl
import os

import pytest

# One torch thread per worker when the suite runs on every core (make test): torch's OpenMP threads spin
# while they wait, so two workers' two threads each on two cores burned 2.5x the CPU for the same demo
# replays (16 s against 40 s of user time), CPU the other worker's tests then lacked. Set before torch is
# imported, and inherited by the CLIs and servers the tests start.
# DuckDB alike ($SPECDEC_THREADS): on the tests' small batches a second thread mostly waits and wakes.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("SPECDEC_THREADS", "1")


@pytest.fixture(scope="session")
def tiny_registry(tmp_path_factory, worker_id):
    """A registry of the tiny demo family (target, two drafts, two tokenizer versions), built once per run.

    Under xdist the workers share one build (12 s of CPU each otherwise) in the run's common temporary
    folder: the first to take the lock builds, the others find it complete (the build's stamp).
    """
    from specdec_core.demo.models import tiny_registry

    if worker_id == "master":
        return tiny_registry(tmp_path_factory.mktemp("models"))
    shared = tmp_path_factory.getbasetemp().parent / "models"
    with open(f"{shared}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return tiny_registry(shared)


@pytest.fixture(scope="session")
def engine(tiny_registry):
    """A speculative decoder over the tiny family, its models loaded once per session."""
    from specdec_core.decoding import SpecDecoder

    return SpecDecoder(tiny_registry, device="cpu")


@pytest.fixture
def store(tmp_path):
    """An empty store in the test's own folder."""
    from specdec_core.store import Store

    return Store(tmp_path / "triage.duckdb")


# The longest modules first. The suite's workers each take a whole module at a time (--dist loadfile), and
# xdist would otherwise hand them out by test count, so a module of three long tests came last and one
# worker ran it alone for minutes. Rough order from `pytest --durations=0`; modules not named follow in
# their usual order. The second needs no models: its worker works while the first's builds the tiny ones.
LONGEST_FIRST = (
    "tests/browser/test_incident_flow.py",
    "tests/store/test_incremental.py",
    "tests/store/test_lake_maintenance.py",
    "tests/browser/test_replay_flow.py",
    "tests/demo/test_demo_incident.py",
    "tests/store/test_lake.py",
    "tests/replay/test_replay_verdicts.py",
    "tests/browser/test_glance_and_back.py",
    "tests/browser/test_served_dashboard.py",
    "tests/store/test_follow.py",
    "tests/store/test_shared_store.py",
    "tests/replay/test_engine_replay.py",
    "tests/formats/test_format_fixtures.py",
    "tests/dashboard/test_pages.py",
    "tests/dashboard/test_charts_annotations_search.py",
    "tests/monitoring/test_metric_figures.py",
    "tests/keys/test_audit.py",
    "tests/cli/test_migrate_and_stats_json.py",
    "tests/packaging/test_optional_extras.py",
    "tests/monitoring/test_alerting_end_to_end.py",
    "tests/store/test_concurrency.py",
    "tests/store/test_ingest_hostile_inputs.py",
)


def pytest_collection_modifyitems(items):
    rank = {module: i for i, module in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))
