"""The remediation tests' Redis servers (remediation_servers.py): a standalone server and a 3-node Cluster, each
with an ACL user allowed only what a purge sends."""

from remediation_servers import cluster, standalone  # noqa: F401 (fixtures for this folder)
