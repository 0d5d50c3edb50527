"""Helpers for a project's own tests: pin that its cache key covers the request."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from specdec_core.keys.audit import KeyAudit, KeyFn, audit_key_function


def assert_key_covers(
    key_fn: KeyFn,
    example: Mapping[str, Any],
    ignore: Iterable[str] = (),
    *,
    importable: str | None = None,
) -> KeyAudit:
    """Fail with the audit's findings unless `key_fn` covers every field of `example`
    outside `ignore` and is stable; return the audit (its `skipped` says what could not run).

        def test_cache_key_covers_the_request():
            assert_key_covers(my_key, {"prompt": "hi", "temperature": 0.7, ...}, ignore=["request_id"])
    """
    audit = audit_key_function(key_fn, example, ignore=ignore, importable=importable)
    if not audit.ok:
        raise AssertionError(str(audit))
    return audit
