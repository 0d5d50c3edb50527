"""What the store raises: one line that says which store and why."""

from __future__ import annotations


class StoreError(RuntimeError):
    """The database can't be opened or written; the message says which file and why."""


class ForeignDatabaseError(StoreError):
    """A database that holds tables but is no specdec store: no write may change it."""


class LakeError(RuntimeError):
    """The store's catalog or data path can't be used; the message is one line."""
