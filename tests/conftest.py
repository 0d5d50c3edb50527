"""Fixtures every folder shares, the order the modules run in; shared helpers are in helpers.py, and each
folder's own fixtures in its conftest.py."""

from __future__ import annotations

import fcntl
import gc
import os

import pytest
from suite_order import longest_first, recorded_durations, write_durations

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


def pytest_addoption(parser):
    parser.addoption("--record-durations", action="store_true",
                     help="write each module's time in this run into tests/durations.json (the suite's order)")


# The longest modules first. The suite's workers each take a whole module at a time (--dist loadfile), and
# xdist would otherwise hand them out by test count, so a module of three long tests came last and one
# worker ran it alone for minutes. The order comes from each module's time in tests/durations.json, which
# `pytest --record-durations` (make durations) writes from a run; a module it doesn't know yet goes first,
# where a long one costs least (suite_order.py).
def pytest_collection_modifyitems(items):
    modules = list(dict.fromkeys(item.nodeid.partition("::")[0] for item in items))
    rank = {module: i for i, module in enumerate(longest_first(modules, recorded_durations()))}
    items.sort(key=lambda item: rank[item.nodeid.partition("::")[0]])


# What collection imported (torch, transformers, Streamlit, pandas: most of a worker's objects) lives as
# long as the worker: left out of the collector's full passes, which otherwise walked it each time. 424 store,
# analysis and dashboard tests on three workers: 9.0 s in the garbage collector before, 5.0 s after.
def pytest_collection_finish(session):
    gc.collect()
    gc.freeze()


_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    # Setup, call and teardown: a module's servers and models start in the setup of its first test. Under xdist
    # the controller receives every worker's reports.
    module = report.nodeid.partition("::")[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_sessionfinish(session):
    if not session.config.getoption("record_durations") or hasattr(session.config, "workerinput"):
        return
    write_durations(_module_seconds)
