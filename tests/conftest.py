"""Shared pytest fixtures; shared helpers are in helpers.py."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_registry(tmp_path_factory):
    """A registry of the tiny demo family (target, two drafts, two tokenizer versions), built once per session."""
    from specdec_core.demo.models import tiny_registry

    return tiny_registry(tmp_path_factory.mktemp("models"))


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
