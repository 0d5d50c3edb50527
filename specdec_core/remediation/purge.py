"""Removing a purge plan's keys (or an old namespace's) from a running Redis or Redis Cluster.

What it sends, and only this: DUMP and PTTL (the backup, backup.py), EXISTS, UNLINK, SCAN, PING and what
redis-py sends to connect (on a Cluster also the slot map's CLUSTER SLOTS/SHARDS/NODES). A batch's UNLINK
(or EXISTS) names only keys of one Cluster slot, so no command crosses slots; batches are small and
pipelined, so the server answers other clients between them; never KEYS or FLUSH*. A rerun of an
interrupted purge unlinks what is left and counts the rest as missing.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from specdec_core import interrupts
from specdec_core.extras import require
from specdec_core.remediation.backup import BackupWriter, back_up
from specdec_core.remediation.target import (
    RedisTarget,
    connect,
    is_cluster,
    pipeline,
    redis_failure,
    secret_of,
    usage_error,
)

BATCH = 500  # keys a pipeline: small enough that the server answers other clients between batches
SCAN_COUNT = 500  # SCAN's COUNT hint: the work one SCAN call does on the server

Progress = Callable[[int, int | None], None]  # (keys done, keys planned or None when still scanning)


# --- results -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class PurgeResult:
    planned: int  # keys in the plan (or found under the namespace)
    deleted: int
    missing: int  # planned keys that were not there (expired, or removed by an earlier run)
    dry_run: bool = False
    would_delete: int = 0
    backed_up: int | None = None  # keys written to the backup; None without --backup
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"planned": self.planned, "deleted": self.deleted, "missing": self.missing}
        if self.dry_run:
            out["would_delete"] = self.would_delete
        out["dry_run"] = self.dry_run
        if self.backed_up is not None:
            out["backed_up"] = self.backed_up
        out["seconds"] = round(self.seconds, 3)
        return out


class _Tally:
    """Counts as a run goes, so an interrupted run can still say what it did."""

    def __init__(self, planned: int | None) -> None:
        self.planned = planned or 0
        self.deleted = 0
        self.missing = 0
        self.existing = 0
        self.backed_up = 0


class Interrupted(Exception):
    """A run stopped part-way (Ctrl-C): `result` is what it had done by then."""

    def __init__(self, result: PurgeResult) -> None:
        super().__init__("interrupted")
        self.result = result


# --- the batches ---------------------------------------------------------------------------------------------

class _Pacer:
    """Holds deletions to `rate` a second over the whole run (None: no cap)."""

    def __init__(self, rate: float | None) -> None:
        self.rate = rate
        self.started = time.monotonic()

    def batch_size(self, batch: int) -> int:
        # About ten batches a second under a cap, so the rate holds smoothly rather than in bursts.
        return batch if self.rate is None else max(1, min(batch, int(self.rate / 10)))

    def wait(self, done: int) -> None:
        if self.rate is not None:
            ahead = self.started + done / self.rate - time.monotonic()
            if ahead > 0:
                time.sleep(ahead)


def _as_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8")


def _same_slot_groups(client: Any, keys: list[bytes]) -> list[list[bytes]]:
    """The batch as multi-key commands that each stay in one Cluster slot (standalone: one group): a
    command per key cost the client more than the server."""
    if not is_cluster(client):
        return [keys]
    groups: dict[int, list[bytes]] = {}
    for key in keys:
        groups.setdefault(client.keyslot(key), []).append(key)
    return list(groups.values())


def _run_batch(client: Any, keys: list[bytes], tally: _Tally, *, dry_run: bool,
               writer: BackupWriter | None) -> None:
    if writer is not None and not dry_run:
        tally.backed_up += back_up(client, keys, writer)
    pipe = pipeline(client)
    for group in _same_slot_groups(client, keys):
        pipe.execute_command("EXISTS" if dry_run else "UNLINK", *group)
    found = sum(int(n) for n in pipe.execute())
    if dry_run:
        tally.existing += found
    else:
        tally.deleted += found
    tally.missing += len(keys) - found


def _result(tally: _Tally, dry_run: bool, backup: bool, started: float) -> PurgeResult:
    return PurgeResult(planned=tally.planned, deleted=tally.deleted, missing=tally.missing, dry_run=dry_run,
                       would_delete=tally.existing, backed_up=tally.backed_up if backup and not dry_run else None,
                       seconds=time.monotonic() - started)


def _drive(client: Any, target: RedisTarget, batches: Iterable[list[bytes]], tally: _Tally, *, dry_run: bool,
           backup: str | os.PathLike[str] | None, pacer: _Pacer, progress: Progress | None,
           total: Callable[[], int | None]) -> PurgeResult:
    rx = require("redis", "redis.exceptions")
    started = time.monotonic()
    writer = BackupWriter(backup) if backup is not None and not dry_run else None
    try:
        for keys in batches:
            with interrupts.deferred():  # Ctrl-C or SIGTERM: the run stops after the batch under way, counted
                _run_batch(client, keys, tally, dry_run=dry_run, writer=writer)
            done = tally.deleted + tally.missing + tally.existing
            if progress is not None:
                progress(done, total())
            pacer.wait(tally.deleted + tally.existing)
    except KeyboardInterrupt:
        raise Interrupted(_result(tally, dry_run, backup is not None, started)) from None
    except (rx.RedisError, rx.RedisClusterException, OSError) as exc:
        done = (f"{tally.deleted} keys were deleted before the failure; run it again to delete the rest"
                if not dry_run else "")
        raise redis_failure(exc, target, secret_of(target), done) from None
    finally:
        if writer is not None:
            writer.close()
    return _result(tally, dry_run, backup is not None, started)


# --- the two purges ------------------------------------------------------------------------------------------

def purge_keys(target: RedisTarget, keys: list[str], *, dry_run: bool = False,
               backup: str | os.PathLike[str] | None = None, rate: float | None = None, batch: int = BATCH,
               progress: Progress | None = None, client: Any = None) -> PurgeResult:
    """Unlink exactly `keys` (a plan's redis_keys, each counted once); with `dry_run`, only count those that
    exist."""
    keys = list(dict.fromkeys(keys))  # two deployments may log one key: it is one key in the cache
    _check_rate(rate)
    client = client if client is not None else connect(target)
    pacer = _Pacer(None if dry_run else rate)  # a dry run deletes nothing: no reason to hold it back
    size = pacer.batch_size(batch)
    chunks = ([_as_bytes(k) for k in keys[i:i + size]] for i in range(0, len(keys), size))
    return _drive(client, target, chunks, _Tally(len(keys)), dry_run=dry_run, backup=backup, pacer=pacer,
                  progress=progress, total=lambda: len(keys))


def escape_glob(text: str) -> str:
    """`text` as a SCAN MATCH pattern that matches only itself: \\ * ? [ ] each escaped."""
    return "".join("\\" + c if c in "\\*?[]" else c for c in text)


def purge_namespace(target: RedisTarget, prefix: str, *, dry_run: bool = False,
                    backup: str | os.PathLike[str] | None = None, rate: float | None = None, batch: int = BATCH,
                    scan_count: int = SCAN_COUNT, progress: Progress | None = None,
                    client: Any = None) -> PurgeResult:
    """Unlink every key that starts with `prefix`, found by SCAN MATCH on every primary, in batches."""
    if not prefix:
        raise usage_error("--namespace: an empty prefix would match every key; give the old scheme's prefix, "
                          "e.g. specdec:prod:")
    _check_rate(rate)
    client = client if client is not None else connect(target)
    pacer = _Pacer(None if dry_run else rate)  # a dry run deletes nothing: no reason to hold it back
    tally = _Tally(0)
    size = pacer.batch_size(batch)

    def batches() -> Iterator[list[bytes]]:
        seen: set[bytes] = set()  # SCAN may return a key twice while the server resizes its table
        chunk: list[bytes] = []
        for key in _scan(client, prefix, scan_count):
            if key in seen:
                continue
            seen.add(key)
            tally.planned += 1
            chunk.append(key)
            if len(chunk) >= size:
                yield chunk
                chunk = []
        if chunk:
            yield chunk

    return _drive(client, target, batches(), tally, dry_run=dry_run, backup=backup, pacer=pacer,
                  progress=progress, total=lambda: None)


def _scan(client: Any, prefix: str, count: int) -> Iterator[bytes]:
    pattern = escape_glob(prefix) + "*"
    wanted = prefix.encode("utf-8")
    nodes = [client.get_redis_connection(node) for node in client.get_primaries()] if is_cluster(client) \
        else [client]
    for node in nodes:
        cursor = 0
        while True:
            cursor, keys = node.scan(cursor=cursor, match=pattern, count=count)
            for key in keys:
                key = _as_bytes(key)
                if key.startswith(wanted):  # the pattern should see to it; a purge checks anyway
                    yield key
            if int(cursor) == 0:
                break


def _check_rate(rate: float | None) -> None:
    if rate is not None and not (rate > 0 and rate != float("inf")):
        raise usage_error(f"--rate {rate}: expected a number of deletions a second > 0")
