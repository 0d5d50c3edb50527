"""Tables derived from the requests: each hit's source and verdict, the summaries the pages read, their
incremental update after a batch, and `migrate`, which rebuilds them for a store an older version wrote."""

from specdec_core.derived.migrate import migrate

__all__ = ["migrate"]
