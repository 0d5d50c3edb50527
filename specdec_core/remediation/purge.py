"""Removing a purge plan's keys (or an old namespace's) from a running Redis or Redis Cluster, and putting
them back from a backup.

What it sends, and only this: DUMP, PTTL, EXISTS, UNLINK, SCAN, RESTORE, PING and what redis-py sends
to connect (on a Cluster also the slot map's CLUSTER SLOTS/SHARDS/NODES). A batch's UNLINK (or EXISTS)
names only keys of one Cluster slot, so no command crosses slots; batches are small and pipelined, so the
server answers other clients between them; never KEYS or FLUSH*. A rerun of an interrupted purge unlinks what is left and counts
the rest as missing.

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
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from specdec_core.extras import require

BATCH = 500  # keys a pipeline: small enough that the server answers other clients between batches
SCAN_COUNT = 500  # SCAN's COUNT hint: the work one SCAN call does on the server
BACKUP_VERSION = 1

Progress = Callable[[int, int | None], None]  # (keys done, keys planned or None when still scanning)


class PurgeError(Exception):
    """A purge or restore that could not be done: one line, and the exit status that says why."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def usage_error(message: str) -> PurgeError:
    return PurgeError(message, exit_code=2)


# --- the server's address and credentials ------------------------------------------------------------------

def mask_url(url: str) -> str:
    """The URL with any password in it (user info or a `password=` query) shown as ***, the rest as written."""
    try:
        parts = urlsplit(url)
        masked = url
        if parts.password is not None:
            user, _, host = parts.netloc.rpartition("@")
            masked = masked.replace(parts.netloc, f"{user.split(':', 1)[0]}:***@{host}", 1)
        if parts.query:
            query = re.sub(r"(?i)(^|&)(password=)[^&]*", r"\1\2***", parts.query)
            masked = masked.replace(f"?{parts.query}", f"?{query}", 1)
        return masked
    except ValueError:
        return "<a URL that could not be read>"


def check_url(url: str) -> None:
    """A usage error for a URL that holds a password: it would be in the shell's history and in `ps`."""
    try:
        parts = urlsplit(url)
        has_password = parts.password is not None or any(
            k.lower() == "password" for k, _ in parse_qsl(parts.query, keep_blank_values=True))
    except ValueError:
        raise usage_error(f"--redis {mask_url(url)}: not a URL") from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise usage_error(f"--redis {mask_url(url)}: expected redis://, rediss:// or unix://")
    if has_password:
        raise usage_error(f"--redis {mask_url(url)}: the URL holds a password; leave it out and name the "
                          "environment variable that holds it with --password-env NAME")


@dataclass(frozen=True)
class RedisTarget:
    """Where to purge: a URL without a password, whether it is a Cluster, and the password's variable."""

    url: str
    cluster: bool = False
    password_env: str | None = None

    @property
    def masked(self) -> str:
        return mask_url(self.url) + (" (cluster)" if self.cluster else "")

    def password(self) -> str | None:
        if not self.password_env:
            return None
        value = os.environ.get(self.password_env)
        if value is None:
            raise usage_error(f"--password-env {self.password_env}: that environment variable is not set")
        return value


def _say(text: str, secret: str | None) -> str:
    return text.replace(secret, "***") if secret else text


def redis_failure(exc: BaseException, target: RedisTarget, secret: str | None = None, done: str = "") -> PurgeError:
    """A redis-py exception as one line naming the server (masked), never the password."""
    rx = require("redis", "redis.exceptions")
    detail = " ".join(str(exc).split()) or type(exc).__name__
    detail = detail.split(" caused error: ", 1)[-1]  # a pipeline's error names its command number first
    after = f"; {done}" if done else ""
    if isinstance(exc, rx.NoPermissionError) or detail.startswith("NOPERM"):
        what = (f"Redis at {target.masked} refused a command to this user (NOPERM: {detail.removeprefix('NOPERM ')}"
                f"); a purge needs DUMP, PTTL, EXISTS, UNLINK, SCAN and RESTORE{after}")
    elif isinstance(exc, rx.AuthenticationError) or detail.startswith(("NOAUTH", "WRONGPASS")):
        what = (f"Redis at {target.masked} refused the credentials ({detail}); give the user in the URL and "
                f"the password through --password-env{after}")
    elif isinstance(exc, (rx.ConnectionError, rx.TimeoutError, rx.ClusterDownError, rx.RedisClusterException,
                          OSError)):
        what = f"cannot reach Redis at {target.masked}: {detail}{after}"
    else:
        what = f"Redis at {target.masked}: {detail}{after}"
    return PurgeError(_say(what, secret))


def connect(target: RedisTarget, timeout_s: float = 10.0) -> Any:
    """A redis-py client for the target, after one PING (standalone) or reading the slot map (Cluster)."""
    check_url(target.url)
    secret = target.password()
    redis = require("redis", "redis")
    options: dict[str, Any] = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
    if secret is not None:
        options["password"] = secret
    try:
        if target.cluster:
            cluster = require("redis", "redis.cluster")
            client = cluster.RedisCluster.from_url(target.url, **options)
        else:
            client = redis.Redis.from_url(target.url, **options)
            client.ping()
    except (redis.RedisError, redis.exceptions.RedisClusterException, OSError, ValueError) as exc:
        if isinstance(exc, ValueError) and not isinstance(exc, redis.RedisError):
            raise usage_error(_say(f"--redis {target.masked}: {exc}", secret)) from None
        raise redis_failure(exc, target, secret) from None
    return client


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


@dataclass(frozen=True)
class RestoreResult:
    entries: int  # distinct keys in the backup
    restored: int
    expired: int  # entries whose TTL ran out before the restore: left out

    def to_json(self) -> dict[str, int]:
        return {"restored": self.restored, "expired": self.expired, "entries": self.entries}


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


# --- backup --------------------------------------------------------------------------------------------------

def _rfc3339_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


SYNC_EVERY_S = 1.0


class _BackupWriter:
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
    return BackupEntry(key, payload, expires)


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


def _pipeline(client: Any) -> Any:
    # A Cluster pipeline sends each key's command to the node that owns its slot: no command spans slots.
    return client.pipeline(transaction=False) if not _is_cluster(client) else client.pipeline()


def _is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


def _as_bytes(key: str | bytes) -> bytes:
    return key if isinstance(key, bytes) else key.encode("utf-8")


def _same_slot_groups(client: Any, keys: list[bytes]) -> list[list[bytes]]:
    """The batch as multi-key commands that each stay in one Cluster slot (standalone: one group): a
    command per key cost the client more than the server."""
    if not _is_cluster(client):
        return [keys]
    groups: dict[int, list[bytes]] = {}
    for key in keys:
        groups.setdefault(client.keyslot(key), []).append(key)
    return list(groups.values())


def _back_up(client: Any, keys: list[bytes], writer: _BackupWriter) -> int:
    pipe = _pipeline(client)
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


def _run_batch(client: Any, keys: list[bytes], tally: _Tally, *, dry_run: bool,
               writer: _BackupWriter | None) -> None:
    if writer is not None and not dry_run:
        tally.backed_up += _back_up(client, keys, writer)
    pipe = _pipeline(client)
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
    writer = _BackupWriter(backup) if backup is not None and not dry_run else None
    try:
        for keys in batches:
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
        raise redis_failure(exc, target, _secret(target), done) from None
    finally:
        if writer is not None:
            writer.close()
    return _result(tally, dry_run, backup is not None, started)


def _secret(target: RedisTarget) -> str | None:
    try:
        return target.password()
    except PurgeError:
        return None


# --- the three operations ------------------------------------------------------------------------------------

def purge_keys(target: RedisTarget, keys: list[str], *, dry_run: bool = False,
               backup: str | os.PathLike[str] | None = None, rate: float | None = None, batch: int = BATCH,
               progress: Progress | None = None, client: Any = None) -> PurgeResult:
    """Unlink exactly `keys` (a plan's redis_keys, each counted once); with `dry_run`, only count those that
    exist."""
    keys = list(dict.fromkeys(keys))  # two deployments may log one key: it is one key in the cache
    _check_rate(rate)
    client = client if client is not None else connect(target)
    pacer = _Pacer(rate)
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
    pacer = _Pacer(rate)
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
    nodes = [client.get_redis_connection(node) for node in client.get_primaries()] if _is_cluster(client) \
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


def restore_backup(target: RedisTarget, path: str | os.PathLike[str], *, batch: int = BATCH,
                   progress: Progress | None = None, client: Any = None) -> RestoreResult:
    """Put a backup's keys back: RESTORE ... REPLACE with what is left of each one's TTL."""
    entries = read_backup(path)
    client = client if client is not None else connect(target)
    rx = require("redis", "redis.exceptions")
    restored = expired = 0
    try:
        for start in range(0, len(entries), batch):
            pipe = _pipeline(client)
            queued = 0
            now_ms = int(time.time() * 1000)
            for entry in entries[start:start + batch]:
                ttl = 0 if entry.expires_at_ms is None else entry.expires_at_ms - now_ms
                if entry.expires_at_ms is not None and ttl <= 0:
                    expired += 1
                    continue
                pipe.restore(entry.key, ttl, entry.payload, replace=True)
                queued += 1
            if queued:
                pipe.execute()
            restored += queued
            if progress is not None:
                progress(min(start + batch, len(entries)), len(entries))
    except (rx.RedisError, rx.RedisClusterException, OSError) as exc:
        raise redis_failure(exc, target, _secret(target),
                            f"{restored} keys were restored before the failure; a rerun restores them all again"
                            ) from None
    return RestoreResult(entries=len(entries), restored=restored, expired=expired)


def _check_rate(rate: float | None) -> None:
    if rate is not None and not (rate > 0 and rate != float("inf")):
        raise usage_error(f"--rate {rate}: expected a number of deletions a second > 0")
