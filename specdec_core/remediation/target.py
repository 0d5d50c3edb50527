"""Where a purge or restore goes: a Redis or Redis Cluster URL without a password, the password from the
environment, the client, and redis-py's failures said in one line that names the server (masked) and never
the password."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, urlsplit

from specdec_core.extras import require


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


def scrub(text: str, secret: str | None) -> str:
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
    return PurgeError(scrub(what, secret))


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
            raise usage_error(scrub(f"--redis {target.masked}: {exc}", secret)) from None
        raise redis_failure(exc, target, secret) from None
    return client


def pipeline(client: Any) -> Any:
    # A Cluster pipeline sends each key's command to the node that owns its slot: no command spans slots.
    return client.pipeline(transaction=False) if not is_cluster(client) else client.pipeline()


def is_cluster(client: Any) -> bool:
    return hasattr(client, "get_primaries")


def secret_of(target: RedisTarget) -> str | None:
    try:
        return target.password()
    except PurgeError:
        return None
