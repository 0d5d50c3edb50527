"""A purge's backup: each key's DUMP payload and TTL, written before the key is unlinked, and the restore
that puts them back.

The backup file is JSON Lines, appended to (a resumed purge adds to its first run's backup), one object a
key, written before that key is unlinked (and synced to disk at least once a second):

    {"v": 1, "key": "specdec:prod:v1:9f2c...", "payload": "<DUMP payload, base64>",
     "pttl_ms": 86399000, "expires_at_ms": 1767225600000, "backed_up_at": "2026-03-01T10:00:00.000Z"}

`key_b64` replaces `key` for a key that is not UTF-8 text; `pttl_ms` is -1 and `expires_at_ms` null for a
key without expiry. A restore gives each key what is left of its TTL then (an entry whose time is up is
not restored) with `RESTORE key ttl payload REPLACE`.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from specdec_core.extras import require
from specdec_core.remediation.target import (
    PurgeError,
    RedisTarget,
    connect,
    pipeline,
    redis_failure,
    secret_of,
)

BACKUP_VERSION = 1
BATCH = 500  # keys a pipeline


@dataclass(frozen=True)
class RestoreResult:
    entries: int  # distinct keys in the backup
    restored: int
    expired: int  # entries whose TTL ran out before the restore: left out

    def to_json(self) -> dict[str, int]:
        return {"restored": self.restored, "expired": self.expired, "entries": self.entries}


def _rfc3339_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


SYNC_EVERY_S = 1.0


class BackupWriter:
    """Appends one line a key. A batch's lines reach the file (the OS) before its keys are unlinked, so a
    purge that dies loses none; they reach the disk at least once a second and at the end (an fsync a batch
    cost a loaded disk 100 ms, and the purge ten times its rate)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._synced = time.monotonic()
        try:  # owner-only: the payloads are production outputs
            self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        except OSError as exc:
            raise PurgeError(f"--backup {path}: cannot write: {exc.strerror or exc}") from None
        self.path = path

    def write(self, key: bytes, payload: bytes, pttl_ms: int) -> None:
        now_ms = int(time.time() * 1000)
        try:
            named: dict[str, str] = {"key": key.decode("utf-8")}
        except UnicodeDecodeError:
            named = {"key_b64": base64.b64encode(key).decode("ascii")}
        line = {"v": BACKUP_VERSION, **named, "payload": base64.b64encode(payload).decode("ascii"),
                "pttl_ms": pttl_ms, "expires_at_ms": now_ms + pttl_ms if pttl_ms >= 0 else None,
                "backed_up_at": _rfc3339_now()}
        data = (json.dumps(line) + "\n").encode("utf-8")
        while data:
            data = data[os.write(self._fd, data):]

    def sync(self, *, now: bool = False) -> None:
        if now or time.monotonic() - self._synced >= SYNC_EVERY_S:
            os.fsync(self._fd)
            self._synced = time.monotonic()

    def close(self) -> None:
        try:
            self.sync(now=True)
        finally:
            os.close(self._fd)


@dataclass(frozen=True)
class BackupEntry:
    key: bytes
    payload: bytes
    expires_at_ms: int | None
    where: str = ""  # FILE:LINE, to name a line Redis refuses


def read_backup(path: str | os.PathLike[str]) -> list[BackupEntry]:
    """A backup's entries, the last of each key (a resumed purge may have written a key twice)."""
    entries: dict[bytes, BackupEntry] = {}
    try:
        with open(path, encoding="utf-8") as fh:
            for number, line in enumerate(fh, start=1):
                if line.strip():
                    entry = _backup_entry(line, f"{path}:{number}")
                    entries.pop(entry.key, None)
                    entries[entry.key] = entry
    except UnicodeDecodeError as exc:
        raise PurgeError(f"{path}: not UTF-8 text (byte {exc.start}): not a specdec backup") from None
    except OSError as exc:
        raise PurgeError(f"--backup {path}: cannot read: {exc.strerror or exc}") from None
    return list(entries.values())


def _backup_entry(line: str, where: str) -> BackupEntry:
    try:
        obj = json.loads(line)
        if not isinstance(obj, dict) or obj.get("v") != BACKUP_VERSION:
            raise ValueError(f"not a version-{BACKUP_VERSION} backup line")
        key = obj["key"].encode("utf-8") if "key" in obj else base64.b64decode(obj["key_b64"], validate=True)
        payload = base64.b64decode(obj["payload"], validate=True)
        expires = obj.get("expires_at_ms")
        if expires is not None and (not isinstance(expires, int) or isinstance(expires, bool)):
            raise ValueError("expires_at_ms must be a whole number of milliseconds or null")
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        reason = f"no {exc.args[0]}" if isinstance(exc, KeyError) else str(exc).split("\n")[0]
        raise PurgeError(f"{where}: {reason}") from None
    return BackupEntry(key, payload, expires, where)


def back_up(client: Any, keys: list[bytes], writer: BackupWriter) -> int:
    pipe = pipeline(client)
    for key in keys:
        pipe.dump(key)
        pipe.pttl(key)
    answers = pipe.execute()
    written = 0
    for key, payload, pttl in zip(keys, answers[0::2], answers[1::2], strict=True):
        if payload is not None:  # gone already: nothing to keep, and it will count as missing
            writer.write(key, payload, int(pttl))
            written += 1
    writer.sync()
    return written


def restore_backup(target: RedisTarget, path: str | os.PathLike[str], *, batch: int = BATCH,
                   progress: Callable[[int, int | None], None] | None = None,
                   client: Any = None) -> RestoreResult:
    """Put a backup's keys back: RESTORE ... REPLACE with what is left of each one's TTL."""
    entries = read_backup(path)
    client = client if client is not None else connect(target)
    rx = require("redis", "redis.exceptions")
    restored = expired = 0
    refused: list[tuple[BackupEntry, Exception]] = []  # entries whose payload Redis would not take
    try:
        for start in range(0, len(entries), batch):
            pipe = pipeline(client)
            queued: list[BackupEntry] = []
            now_ms = int(time.time() * 1000)
            for entry in entries[start:start + batch]:
                ttl = 0 if entry.expires_at_ms is None else entry.expires_at_ms - now_ms
                if entry.expires_at_ms is not None and ttl <= 0:
                    expired += 1
                    continue
                pipe.restore(entry.key, ttl, entry.payload, replace=True)
                queued.append(entry)
            # Each command's answer: a bad payload fails its own key, not the batch's others, which Redis took.
            for entry, answer in zip(queued, pipe.execute(raise_on_error=False) if queued else [], strict=True):
                if not isinstance(answer, Exception):
                    restored += 1
                elif _refused_payload(answer):
                    refused.append((entry, answer))
                else:
                    raise answer
            if progress is not None:
                progress(min(start + batch, len(entries)), len(entries))
    except (rx.RedisError, rx.RedisClusterException, OSError) as exc:
        raise redis_failure(exc, target, secret_of(target),
                            f"{restored} keys were restored before the failure; a rerun restores them all again"
                            ) from None
    if refused:
        entry, answer = refused[0]
        more = f" (and {len(refused) - 1:,} more lines)" if len(refused) > 1 else ""
        raise PurgeError(f"{entry.where}: Redis refused the payload of key {entry.key.decode('utf-8', 'replace')!r} "
                         f"({' '.join(str(answer).split())}){more}; the other {restored:,} keys were restored")
    return RestoreResult(entries=len(entries), restored=restored, expired=expired)


def _refused_payload(answer: Exception) -> bool:
    """A RESTORE's error about its own payload (an edited or cut backup line), not about the server or the user."""
    text = str(answer)
    return "payload" in text or "Bad data format" in text
