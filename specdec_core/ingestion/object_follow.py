"""`specdec ingest --follow s3://bucket/prefix/`: load each new object under a prefix once it stops growing.

An object is loaded whole once its size and last-modified time held still between two polls (an upload
under way, or a writer that replaces an object as it grows, is waited for). Which version of each object
was loaded is written beside its rows (`follow_offsets`, file_id `s3:<url>`), in the same transaction, so a
follower killed at any point loads no object twice and misses none; a new version is loaded again (its
rows already stored are exact duplicates). Local paths named beside the URLs are followed as usual.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone

import duckdb
import pyarrow as pa

from specdec_core import formats
from specdec_core.formats import object_store
from specdec_core.formats.files import LogReadError
from specdec_core.ingestion.follow import OFFSETS_DDL, Batch, Follower, has_offsets
from specdec_core.ingestion.load import IngestResult, ingest
from specdec_core.ingestion.staging import IngestLimits
from specdec_core.store.connection import Store
from specdec_core.store.ddl import create_tables

_PREFIX = "s3:"


class ObjectFollower:
    """The follower of `ingest --follow` for paths that include s3:// URLs (the same poll/close surface)."""

    def __init__(self, store: Store, paths: list[str], *, log_format: str = "auto",
                 mapping: formats.Mapping | None = None, limits: IngestLimits | None = None,
                 batch_rows: int = 10_000, on_problem: Callable[[str], None] | None = None) -> None:
        self.store, self.log_format, self.mapping, self.limits = store, log_format, mapping, limits
        self.batch_rows = batch_rows
        store.write_repeatedly()
        self.urls = [p for p in paths if object_store.is_s3(p)]
        local = [p for p in paths if not object_store.is_s3(p)]
        self.local = Follower(store, local, log_format=log_format, mapping=mapping, limits=limits,
                              batch_rows=batch_rows, on_problem=on_problem) if local else None
        self.problems: list[str] = []
        self._on_problem = on_problem or self.problems.append
        self._said: set[str] = set()
        self._last: dict[str, str] = {}  # url -> version at the last poll
        self._loaded = self._loaded_versions()
        self._con: duckdb.DuckDBPyConnection | None = None

    def _loaded_versions(self) -> dict[str, str]:
        if not self.store.exists:
            return {}
        with self.store.read() as con:
            if not has_offsets(con):
                return {}
            rows = con.execute("SELECT path, head FROM follow_offsets WHERE file_id LIKE 's3:%'").fetchall()
        return {path: head for path, head in rows}

    def close(self) -> None:
        self.store.drop_spare()
        if self.local is not None:
            self.local.close()
        if self._con is not None:
            self._con.close()
            self._con = None

    def _say(self, message: str) -> None:
        if message not in self._said:
            self._said.add(message)
            self._on_problem(message)

    def _ready(self) -> list[object_store.S3Object]:
        """Objects new or changed since they were loaded whose version held still since the last poll."""
        if self._con is None:
            self._con = object_store.connect()
        listed: list[object_store.S3Object] = []
        for spec in self.urls:
            try:
                listed.extend(object_store.list_objects(self._con, spec, missing_ok=True))
            except LogReadError as exc:
                self._say(f"{exc}; tried again at the next poll")
        seen = {o.url: o.version for o in listed}
        ready = [o for o in listed if self._last.get(o.url) == o.version and self._loaded.get(o.url) != o.version]
        self._last = seen
        return ready

    def poll(self) -> Batch | None:
        if self.local is not None:
            batch = self.local.poll()
            if batch is not None:
                return batch
        if not self.urls:
            return None
        ready = self._ready()
        if not ready:
            return None
        newest: list[datetime | None] = []

        def save(con: duckdb.DuckDBPyConnection, ingest_id: int) -> None:
            create_tables(con, OFFSETS_DDL)
            con.execute("ALTER TABLE follow_offsets ADD COLUMN IF NOT EXISTS head VARCHAR")
            con.register("objects_arrow", pa.table({
                "file_id": [_PREFIX + o.url for o in ready], "path": [o.url for o in ready],
                "byte_offset": pa.array([o.size for o in ready], pa.int64()),
                "line_count": pa.array([0] * len(ready), pa.int64()), "done": [True] * len(ready),
                "head": [o.version for o in ready]}))
            con.execute("DELETE FROM follow_offsets WHERE file_id IN (SELECT file_id FROM objects_arrow)")
            con.execute("INSERT INTO follow_offsets (file_id, path, byte_offset, line_count, done, head) "
                        "SELECT file_id, path, byte_offset, line_count, done, head FROM objects_arrow")
            con.unregister("objects_arrow")
            newest.append(con.execute("SELECT max(ts) FROM requests WHERE ingest_id = ?", [ingest_id]
                                      ).fetchall()[0][0])

        try:
            with object_store.fetched([], ready) as (local, names):
                result: IngestResult = ingest(self.store, local, limits=self.limits, log_format=self.log_format,
                                              mapping=self.mapping, parts=names, before_commit=save)
        except LogReadError as exc:
            self._say(f"{exc}; tried again when it changes")
            for o in ready:
                self._loaded[o.url] = o.version
            return None
        for o in ready:
            self._loaded[o.url] = o.version
        latest = newest[-1] if newest else None
        lag = (datetime.now(timezone.utc) - latest).total_seconds() if latest is not None else None
        return Batch(result, len(ready), latest, lag)
