"""`specdec cache purge/restore` against a real 3-node Redis Cluster, as an ACL user limited to what a purge
sends and what reads the slot map."""

from __future__ import annotations

import json
import os

import pytest
from helpers import run_cli, write_jsonl
from remediation_servers import (
    PASSWORD,
    PASSWORD_ENV,
    fill_other_applications,
    snapshot,
)

from specdec_core.remediation import RedisTarget, purge_keys, purge_namespace, restore_backup

ENV = {**os.environ, PASSWORD_ENV: PASSWORD}


@pytest.fixture(autouse=True)
def password_in_env(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


@pytest.fixture
def filled(cluster):
    """Poisoned keys spread over every node's slots (and a hash-tagged group in one slot), beside another
    application's keys."""
    admin = cluster.admin
    for port in cluster.ports:  # a clean cluster for each test
        admin.get_node("127.0.0.1", port).redis_connection.flushall()
    others = fill_other_applications(admin)
    poisoned = [f"specdec:prod:v1:{i:03d}" for i in range(60)] + [f"svc:{{tenant-a}}:{i}" for i in range(10)]
    for i, key in enumerate(poisoned):
        admin.set(key, f"wrong {i}", px=900_000 if i % 2 else None)
    return poisoned, others


def owners(cluster, keys: list[str]) -> set[int]:
    return {cluster.admin.get_node_from_key(k).port for k in keys}


def test_plan_purge_on_a_cluster_removes_exactly_the_plan(cluster, filled, tmp_path):
    keys, others = filled
    assert owners(cluster, keys) == set(cluster.ports)  # the plan spans every node
    before = snapshot(cluster.admin, others)
    plan = write_jsonl(tmp_path / "plan.jsonl", [{"redis_key": k} for k in [*keys, "specdec:prod:v1:gone"]])

    done = run_cli("cache", "purge", "--plan", str(plan), "--redis", cluster.url(), "--cluster",
                   "--password-env", PASSWORD_ENV, "--batch", "16", env=ENV, timeout=120)

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["planned"], out["deleted"], out["missing"]) == (71, 70, 1)
    assert sum(cluster.admin.exists(k) for k in keys) == 0
    assert snapshot(cluster.admin, others) == before
    assert PASSWORD not in done.stdout + done.stderr


def test_backup_and_restore_on_a_cluster_round_trip(cluster, filled, tmp_path):
    keys, _ = filled
    before = snapshot(cluster.admin, keys)
    target = RedisTarget(cluster.url(), cluster=True, password_env=PASSWORD_ENV)

    dry = purge_keys(target, keys, dry_run=True)
    assert (dry.would_delete, dry.deleted) == (70, 0) and snapshot(cluster.admin, keys) == before
    result = purge_keys(target, keys, backup=tmp_path / "backup.jsonl", batch=9)
    assert (result.deleted, result.backed_up) == (70, 70)
    assert sum(cluster.admin.exists(k) for k in keys) == 0

    restored = restore_backup(target, tmp_path / "backup.jsonl")

    assert restored.restored == 70
    assert snapshot(cluster.admin, keys) == before


def test_namespace_purge_scans_every_primary(cluster, filled):
    keys, others = filled
    before = snapshot(cluster.admin, others)
    target = RedisTarget(cluster.url(), cluster=True, password_env=PASSWORD_ENV)

    result = purge_namespace(target, "specdec:prod:v1:0", scan_count=10, batch=8)

    assert (result.planned, result.deleted, result.missing) == (60, 60, 0)
    assert sum(cluster.admin.exists(k) for k in keys[:60]) == 0
    assert sum(cluster.admin.exists(k) for k in keys[60:]) == 10  # another prefix: kept
    assert snapshot(cluster.admin, others) == before
