"""The record of purges and restores run against a production cache: the store's `purges` table.

`specdec cache purge/restore --db STORE` write one row a run (dry runs too, marked), so the incident
report can say what was removed, from where and when. For a restore, `planned` is the backup's keys,
`deleted` is 0 and `missing` the keys not restored because their TTL had run out meanwhile."""

from __future__ import annotations

from dataclasses import astuple, dataclass, fields
from datetime import datetime, timezone

from specdec_core.store.connection import Store
from specdec_core.store.schema import PURGE_COLUMNS
from specdec_core.store.sql import has_table

KINDS = ("plan", "namespace", "restore")


@dataclass(frozen=True)
class PurgeRecord:
    ts: datetime
    kind: str  # "plan" | "namespace" | "restore"
    target: str  # masked URL
    plan: str | None  # the plan file read; a restore: its backup file
    namespace: str | None
    planned: int
    deleted: int
    missing: int
    dry_run: bool

    @property
    def words(self) -> str:
        """The run in words, as the incident report's timeline and remediation list say it."""
        if self.kind == "restore":  # planned: the backup's entries; missing: those past their TTL, not put back
            expired = f" ({self.missing:,} had outlived their TTL)" if self.missing else ""
            return (f"restored {self.planned - self.missing:,} keys from the backup {self.plan or '(not recorded)'} on "
                    f"{self.target}{expired}: the purged entries it held are in the cache again")
        what = {"plan": f"the plan {self.plan}", "namespace": f"the namespace {self.namespace}"}.get(self.kind, self.kind)
        if self.dry_run:
            return f"dry run of {what} on {self.target}: {self.planned:,} planned; nothing deleted"
        said = f"purged {what} on {self.target}: {self.planned:,} planned, {self.deleted:,} deleted, {self.missing:,} missing"
        left = self.planned - self.deleted - self.missing  # every planned key is deleted or missing once a purge ends
        return said + (f"; interrupted with {left:,} keys left: run it again" if left > 0 else "")


_NAMES = [f.name for f in fields(PurgeRecord)]
if _NAMES != [name for name, _ in PURGE_COLUMNS]:  # the table and the record are one shape, in one order
    raise RuntimeError("store.schema.PURGE_COLUMNS and PurgeRecord disagree; change them together")


def record_purge(store: Store, record: PurgeRecord) -> None:
    """Add one run to the store's `purges` table (made on the first write of a store that lacks it)."""
    if record.kind not in KINDS:
        raise ValueError(f"kind: expected one of {', '.join(KINDS)}, got {record.kind!r}")
    if record.ts.tzinfo is None:
        raise ValueError("ts: expected an aware datetime (UTC)")

    def insert(con) -> None:
        con.execute(f"INSERT INTO purges ({', '.join(_NAMES)}) VALUES ({', '.join('?' * len(_NAMES))})",
                    list(astuple(record)))

    store.transact(insert)


def purge_log(store: Store) -> list[PurgeRecord]:
    """Every recorded purge and restore, oldest first; [] for a store without any (or without the table)."""
    if not store.exists:
        return []
    with store.read() as con:
        if not has_table(con, "purges"):
            return []
        rows = con.execute(f"SELECT {', '.join(_NAMES)} FROM purges ORDER BY ts, kind").fetchall()
    return [PurgeRecord(ts.astimezone(timezone.utc), kind, target, plan, namespace, int(planned), int(deleted),
                        int(missing), bool(dry_run))
            for ts, kind, target, plan, namespace, planned, deleted, missing, dry_run in rows]
