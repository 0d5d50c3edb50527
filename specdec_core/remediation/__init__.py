"""Remediation: the purge plan from the store, purge and restore against a production Redis (or Cluster),
and the record of what was done (the `purges` table).

The dashboard uses only the plan; purging connects to a production cache and is for the CLI and scripts."""

from specdec_core.remediation.backup import RestoreResult, read_backup, restore_backup
from specdec_core.remediation.log import PurgeRecord, purge_log, record_purge
from specdec_core.remediation.plan import (
    DEFAULT_KEY_TEMPLATE,
    PlanCounts,
    PlanEntry,
    PlanError,
    plan_counts,
    plan_jsonl,
    purge_command,
    purge_plan,
    read_plan_keys,
    write_plan,
)
from specdec_core.remediation.purge import Interrupted, PurgeResult, purge_keys, purge_namespace
from specdec_core.remediation.target import PurgeError, RedisTarget, mask_url

__all__ = [
    "DEFAULT_KEY_TEMPLATE", "Interrupted", "PlanCounts", "PlanEntry", "PlanError", "PurgeError", "PurgeRecord",
    "PurgeResult", "RedisTarget", "RestoreResult", "mask_url", "plan_counts", "plan_jsonl", "purge_command",
    "purge_keys", "purge_log", "purge_namespace", "purge_plan", "read_backup", "read_plan_keys", "record_purge",
    "restore_backup", "write_plan",
]
