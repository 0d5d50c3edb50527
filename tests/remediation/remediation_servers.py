"""Real redis-server processes for the remediation tests (fixtures shared by importing them), one set per
module: a standalone server and a 3-node Cluster, each with an ACL user allowed exactly what a purge sends."""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from helpers import free_port, start_redis

PASSWORD = "s3cr3t-purger-pw"
PASSWORD_ENV = "SPECDEC_TEST_REDIS_PASSWORD"
# Exactly the commands the contract lets a purge send, and the connection commands.
PURGER_RULES = ["on", f">{PASSWORD}", "resetkeys", "~*", "resetchannels", "-@all", "+@connection", "+dump",
                "+pttl", "+exists", "+unlink", "+scan", "+restore"]
# On a Cluster also what reads the slot map.
CLUSTER_RULES = ["+cluster|slots", "+cluster|shards", "+cluster|nodes", "+info", "+cluster|myid"]


@dataclass(frozen=True)
class Server:
    port: int
    admin: redis.Redis

    def url(self, user: str | None = "purger") -> str:
        return f"redis://{user + '@' if user else ''}127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory) -> Iterator[Server]:
    port = free_port()
    proc = start_redis(port, tmp_path_factory.mktemp("redis"))
    admin = redis.Redis(port=port)
    admin.acl_setuser("purger", reset=True)
    admin.execute_command("ACL", "SETUSER", "purger", *PURGER_RULES)
    try:
        yield Server(port, admin)
    finally:
        admin.close()
        proc.kill()
        proc.wait()


@dataclass(frozen=True)
class Cluster:
    ports: tuple[int, ...]
    admin: redis.cluster.RedisCluster

    def url(self, user: str | None = "purger") -> str:
        return f"redis://{user + '@' if user else ''}127.0.0.1:{self.ports[1]}"


def _start_cluster_node(port: int, folder: Path) -> subprocess.Popen:
    executable = shutil.which("redis-server") or "/usr/bin/redis-server"
    return subprocess.Popen([executable, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", str(folder), "--cluster-enabled", "yes", "--cluster-config-file",
                             f"nodes-{port}.conf", "--cluster-node-timeout", "2000"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cluster_port(taken: set[int]) -> int:
    """A free port whose cluster bus port (+10000) is free and exists: free_port() may hand out 56945."""
    while True:
        with socket.socket() as a, socket.socket() as b:
            port = random.randint(20000, 50000)  # noqa: S311 - a port, not a secret
            if port in taken:
                continue
            try:
                a.bind(("127.0.0.1", port))
                b.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
            return port


def _poll(check, what: str, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


def _answers(port: int) -> bool:
    try:
        return redis.Redis(port=port, socket_connect_timeout=0.2).ping()
    except redis.ConnectionError:
        return False


def _cluster_ok(ports: list[int]) -> bool:
    for port in ports:
        with redis.Redis(port=port) as node:
            if b"cluster_state:ok" not in node.execute_command("CLUSTER", "INFO"):
                return False
    return True


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Iterator[Cluster]:
    folder = tmp_path_factory.mktemp("cluster")
    ports: list[int] = []
    for _ in range(3):
        ports.append(_cluster_port(set(ports)))
    procs = [_start_cluster_node(port, folder) for port in ports]
    try:
        for port in ports:
            _poll(lambda port=port: _answers(port), f"redis-server --cluster-enabled on {port}")
        subprocess.run([shutil.which("redis-cli") or "/usr/bin/redis-cli", "--cluster", "create",
                        *[f"127.0.0.1:{p}" for p in ports], "--cluster-replicas", "0", "--cluster-yes"],
                       check=True, capture_output=True, timeout=60)
        _poll(lambda: _cluster_ok(ports), "the cluster's state to be ok")
        for port in ports:  # ACL users are per node
            with redis.Redis(port=port) as node:
                node.execute_command("ACL", "SETUSER", "purger", "reset")
                node.execute_command("ACL", "SETUSER", "purger", *PURGER_RULES, *CLUSTER_RULES)
        admin = redis.cluster.RedisCluster(host="127.0.0.1", port=ports[0])
        yield Cluster(tuple(ports), admin)
        admin.close()
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def snapshot(client: redis.Redis | redis.cluster.RedisCluster, keys: list[str]) -> dict[str, tuple[bytes, bool]]:
    """Each key's DUMP payload and whether it has a TTL: what must not change for a key outside a purge."""
    return {k: (client.dump(k), client.pttl(k) > 0) for k in keys}


def fill_other_applications(client: redis.Redis | redis.cluster.RedisCluster, prefix: str = "") -> list[str]:
    """Another application's keys of every type, some with TTLs, some named like ours on purpose."""
    keys = []
    for i in range(40):
        name = f"{prefix}other-app:session:{i}"
        client.set(name, f"value-{i}".encode() * 3, ex=3600 if i % 2 else None)
        keys.append(name)
    client.hset(f"{prefix}other-app:user:{{7}}", mapping={"name": "ada", "plan": "pro"})
    client.rpush(f"{prefix}other-app:queue", *[f"job-{i}" for i in range(20)])
    client.sadd(f"{prefix}other-app:tags", "a", "b", "c")
    client.zadd(f"{prefix}other-app:scores", {"x": 1.5, "y": 2.5})
    client.xadd(f"{prefix}other-app:events", {"kind": "login"})
    # Near misses of the keys a purge removes: same text with one more character, or a glob's look-alike.
    client.set(f"{prefix}specdec:prod:v1:abc-extra", b"keep")
    client.set(f"{prefix}specdec:prodX:v1:abc", b"keep")
    keys += [f"{prefix}other-app:user:{{7}}", f"{prefix}other-app:queue", f"{prefix}other-app:tags",
             f"{prefix}other-app:scores", f"{prefix}other-app:events", f"{prefix}specdec:prod:v1:abc-extra",
             f"{prefix}specdec:prodX:v1:abc"]
    return keys
