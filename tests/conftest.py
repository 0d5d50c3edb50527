"""Shared pytest fixtures."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_registry(tmp_path_factory):
    """A registry of the tiny demo family (target, two drafts, two tokenizer versions), built once per session."""
    from specdec_core.demo.models import tiny_registry

    return tiny_registry(tmp_path_factory.mktemp("models"))
