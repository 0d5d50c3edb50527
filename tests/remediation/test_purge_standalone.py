"""`specdec cache purge/restore` against a real redis-server, as an ACL user allowed only what a purge sends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import free_port, rec, run_cli, sigint_default, write_jsonl
from remediation_servers import (
    PASSWORD,
    PASSWORD_ENV,
    fill_other_applications,
    snapshot,
)

from specdec_core.cli import main
from specdec_core.ingestion import ingest
from specdec_core.remediation import Interrupted, RedisTarget, purge_keys, purge_log, purge_namespace
from specdec_core.store import Store

ENV = {**os.environ, PASSWORD_ENV: PASSWORD}
T = "2026-03-01T10:"


def plan_file(path: Path, keys: list[str]) -> Path:
    return write_jsonl(path, [{"deployment": "prod", "cache_key": k, "redis_key": k, "reason": "contaminated",
                               "identities": 2, "contaminated_hits": 1, "first_contaminated": T + "00:00Z",
                               "last_seen": T + "00:00Z"} for k in keys])


def purge_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess[str]:
    return run_cli("cache", "purge", *args, "--password-env", PASSWORD_ENV, env=env or ENV, timeout=120)


def purge_here(capsys, *args: str, password_env: str = PASSWORD_ENV,
               command: str = "purge") -> subprocess.CompletedProcess[str]:
    """`specdec cache purge ARGS` in this process (a second's start-up less than purge_cli), same result."""
    code = main(["cache", command, *args, "--password-env", password_env])
    out = capsys.readouterr()
    return subprocess.CompletedProcess(args, code, out.out, out.err)


def target(server) -> RedisTarget:
    return RedisTarget(server.url(), password_env=PASSWORD_ENV)


@pytest.fixture(autouse=True)
def password_in_env(monkeypatch):
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD)


@pytest.fixture
def poisoned(standalone):
    """A clean server holding 30 poisoned keys (some with TTLs) beside another application's keys."""
    admin = standalone.admin
    admin.flushall()
    others = fill_other_applications(admin)
    poisoned = [f"specdec:prod:v1:{i:03d}" for i in range(30)]
    for i, key in enumerate(poisoned):
        admin.set(key, json.dumps({"text": f"wrong output {i}"}), px=600_000 if i % 3 else None)
    return poisoned, others


def test_purge_removes_exactly_the_plan_and_other_keys_survive_byte_for_byte(standalone, poisoned, tmp_path):
    keys, others = poisoned
    before = snapshot(standalone.admin, others)
    plan = plan_file(tmp_path / "plan.jsonl", [*keys, "specdec:prod:v1:never-there"])

    done = purge_cli("--plan", str(plan), "--redis", standalone.url())

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) | {"seconds": 0} == {"planned": 31, "deleted": 30, "missing": 1,
                                                        "dry_run": False, "seconds": 0}
    assert standalone.admin.exists(*keys) == 0
    assert snapshot(standalone.admin, others) == before
    assert done.stderr == ""  # no progress bar when stderr is not a terminal


def test_dry_run_changes_nothing_and_says_what_would_go(standalone, poisoned, tmp_path, capsys):
    keys, others = poisoned
    before = snapshot(standalone.admin, keys + others)
    plan = plan_file(tmp_path / "plan.jsonl", [*keys[:10], "specdec:prod:v1:gone"])

    done = purge_here(capsys, "--plan", str(plan), "--redis", standalone.url(), "--dry-run",
                     "--backup", str(tmp_path / "backup.jsonl"))

    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["planned"], out["deleted"], out["would_delete"], out["missing"]) == (11, 0, 10, 1)
    assert snapshot(standalone.admin, keys + others) == before
    assert not (tmp_path / "backup.jsonl").exists()
    # --rate caps deletions; a dry run deletes none, so it is not held to it (at 0.5 a second, 11 keys were 22 s).
    done = purge_here(capsys, "--plan", str(plan), "--redis", standalone.url(), "--dry-run", "--rate", "0.5")
    assert json.loads(done.stdout)["seconds"] < 5 and snapshot(standalone.admin, keys + others) == before


def test_backup_then_restore_puts_back_payloads_and_remaining_ttls(standalone, poisoned, tmp_path, capsys):
    keys, _ = poisoned
    before = snapshot(standalone.admin, keys)
    ttls = {k: standalone.admin.pttl(k) for k in keys}
    backup = tmp_path / "backup.jsonl"

    done = purge_cli("--plan", str(plan_file(tmp_path / "plan.jsonl", keys)), "--redis", standalone.url(),
                     "--backup", str(backup))
    assert json.loads(done.stdout)["backed_up"] == 30
    assert standalone.admin.exists(*keys) == 0
    lines = [json.loads(line) for line in backup.read_text().splitlines()]
    assert {line["key"] for line in lines} == set(keys)
    assert oct(backup.stat().st_mode & 0o777) == "0o600"

    restored = purge_here(capsys, "--backup", str(backup), "--redis", standalone.url(), command="restore")

    assert restored.returncode == 0, restored.stderr
    assert json.loads(restored.stdout)["restored"] == 30
    assert snapshot(standalone.admin, keys) == before
    for key in keys:
        if ttls[key] < 0:
            assert standalone.admin.pttl(key) == -1
        else:  # what was left of the TTL, less the seconds the round trip took
            assert ttls[key] - 30_000 < standalone.admin.pttl(key) <= ttls[key]


def test_rate_caps_deletions_per_second(standalone, poisoned):
    keys, _ = poisoned
    started = time.monotonic()
    result = purge_keys(target(standalone), keys, rate=60)
    assert result.deleted == 30
    assert time.monotonic() - started >= 0.45  # 30 keys at 60 a second: at least half a second


def test_interrupted_purge_run_again_deletes_the_rest_and_counts_them_missing(standalone, tmp_path):
    admin = standalone.admin
    admin.flushall()
    keys = [f"specdec:prod:v1:{i:04d}" for i in range(400)]
    admin.mset({k: b"poison" for k in keys})
    plan = plan_file(tmp_path / "plan.jsonl", keys)
    args = [sys.executable, "-m", "specdec_core", "cache", "purge", "--plan", str(plan), "--redis",
            standalone.url(), "--password-env", PASSWORD_ENV, "--rate", "100", "--backup", str(tmp_path / "b.jsonl")]
    first = subprocess.Popen(args, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=sigint_default)
    deadline = time.monotonic() + 30
    # Interrupted as soon as it has deleted some: at 100 a second the rest takes seconds, so a test worker
    # that a loaded machine pauses still interrupts it midway.
    while admin.dbsize() >= 400 and time.monotonic() < deadline:
        time.sleep(0.02)
    first.send_signal(signal.SIGINT)
    out, err = first.communicate(timeout=30)
    assert first.returncode == 130, err
    stopped = json.loads(out)
    assert stopped["interrupted"] is True and 0 < stopped["deleted"] < 400
    left = admin.dbsize()

    again = purge_cli("--plan", str(plan), "--redis", standalone.url(), "--backup", str(tmp_path / "b.jsonl"))

    result = json.loads(again.stdout)
    assert (result["deleted"], result["missing"]) == (left, 400 - left)
    assert admin.dbsize() == 0
    backed_up = {json.loads(line)["key"] for line in (tmp_path / "b.jsonl").read_text().splitlines()}
    assert backed_up == set(keys)  # the first run's backup was added to, not overwritten


class _SignalledClient:
    """A real client whose pipelines signal this process: `before` times before sending, and (`after`) once the
    moment the server's replies are back, before the purge reads them: where the CLI run above sometimes got
    its Ctrl-C (a purge that said it deleted none of the keys the server had just unlinked)."""

    def __init__(self, client, sig: signal.Signals = signal.SIGINT, before: int = 0, after: bool = True) -> None:
        self._client, self._sig, self._before, self._after = client, sig, before, after

    def __getattr__(self, name: str):
        return getattr(self._client, name)

    def pipeline(self, **kwargs):
        pipe = self._client.pipeline(**kwargs)
        execute = pipe.execute

        def signalled(*args, **kw):
            for _ in range(self._before):
                os.kill(os.getpid(), self._sig)
            replies = execute(*args, **kw)
            if self._after:
                os.kill(os.getpid(), self._sig)
            return replies

        pipe.execute = signalled
        return pipe


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


# As in `specdec cache purge`'s main thread: Python's Ctrl-C, and a SIGTERM raised as one.
@pytest.mark.parametrize("sig, handler", [(signal.SIGINT, signal.default_int_handler),
                                          (signal.SIGTERM, _raise_interrupt)])
def test_a_ctrl_c_while_the_server_unlinks_a_batch_stops_after_it_and_counts_it(standalone, sig, handler):
    admin = standalone.admin
    admin.flushall()
    keys = [f"specdec:prod:v1:{i:04d}" for i in range(30)]
    admin.mset({k: b"poison" for k in keys})
    previous = signal.signal(sig, handler)
    try:
        with pytest.raises(Interrupted) as stopped:
            purge_keys(target(standalone), keys, batch=10, client=_SignalledClient(admin, sig))
    finally:
        signal.signal(sig, previous)
    assert admin.dbsize() == 20, "the run stopped after its first batch"
    assert (stopped.value.result.deleted, stopped.value.result.missing) == (10, 0)


def test_a_second_ctrl_c_stops_a_batch_at_once(standalone):
    """The batch a first Ctrl-C waits for may hang (a server that stopped answering): a second one does not wait."""
    admin = standalone.admin
    admin.flushall()
    keys = [f"specdec:prod:v1:{i:04d}" for i in range(30)]
    admin.mset({k: b"poison" for k in keys})
    client = _SignalledClient(admin, before=2, after=False)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(Interrupted) as stopped:
            purge_keys(target(standalone), keys, batch=10, client=client)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert admin.dbsize() == 30 and stopped.value.result.deleted == 0


def test_namespace_with_glob_characters_removes_only_its_own_keys(standalone, tmp_path, capsys):
    admin = standalone.admin
    admin.flushall()
    prefix = "specdec:a*b?[c]\\d:"
    ours = [f"{prefix}v1:{i}" for i in range(25)]
    # Keys a glob reading of the prefix would match, and keys that only start alike.
    lookalikes = ["specdec:aXXb?[c]\\d:v1:0", "specdec:a*bZ[c]\\d:v1:0", "specdec:a*b?c\\d:v1:0",
                  "specdec:a*b?[c]d:v1:0", "specdec:a*b?[c]\\d", "other:specdec:a*b?[c]\\d:v1:0"]
    admin.mset({k: b"x" for k in ours + lookalikes})
    before = snapshot(admin, lookalikes)

    dry = purge_here(capsys, "--namespace", prefix, "--redis", standalone.url(), "--dry-run")
    assert json.loads(dry.stdout)["would_delete"] == 25 and admin.dbsize() == 31
    done = purge_here(capsys, "--namespace", prefix, "--redis", standalone.url(), "--batch", "7")

    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) | {"seconds": 0} == {"planned": 25, "deleted": 25, "missing": 0,
                                                        "dry_run": False, "seconds": 0}
    assert snapshot(admin, lookalikes) == before and admin.dbsize() == len(lookalikes)


def test_namespace_purge_finds_keys_beyond_one_scan_batch(standalone):
    admin = standalone.admin
    admin.flushall()
    admin.mset({f"old:{i}": b"x" for i in range(1200)} | {f"new:{i}": b"y" for i in range(300)})
    result = purge_namespace(target(standalone), "old:", scan_count=100, batch=64)
    assert (result.planned, result.deleted) == (1200, 1200) and admin.dbsize() == 300


def test_empty_namespace_is_refused_before_connecting():
    done = run_cli("cache", "purge", "--namespace", "", "--redis", f"redis://127.0.0.1:{free_port()}")
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "empty prefix" in done.stderr


def test_password_never_appears_in_output_files_or_the_store(standalone, poisoned, tmp_path, capsys, monkeypatch):
    keys, _ = poisoned
    db = tmp_path / "triage.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "log.jsonl", [rec("r1", ts=T + "00:00Z")]))])
    plan = plan_file(tmp_path / "plan.jsonl", keys)
    runs = [purge_cli("--plan", str(plan), "--redis", standalone.url(), "--backup", str(tmp_path / "b.jsonl"),
                      "--db", str(db)),
            purge_here(capsys, "--backup", str(tmp_path / "b.jsonl"), "--redis", standalone.url(), "--db", str(db),
                       command="restore")]
    # a wrong password for the user: refused, and the attempt's text is not echoed
    monkeypatch.setenv(PASSWORD_ENV, PASSWORD + "-wrong")
    runs.append(purge_here(capsys, "--plan", str(plan), "--redis", standalone.url()))
    with_password = purge_here(capsys, "--plan", str(plan), "--redis",
                               f"redis://purger:{PASSWORD}@127.0.0.1:{standalone.port}/0")

    assert [r.returncode for r in runs] == [0, 0, 1]
    assert with_password.returncode == 2 and "--password-env" in with_password.stderr
    assert standalone.admin.exists(*keys) == len(keys)  # the refused runs touched nothing
    texts = [r.stdout + r.stderr for r in [*runs, with_password]]
    texts += [(tmp_path / "b.jsonl").read_text(), db.read_bytes().decode("latin-1")]
    assert not [t for t in texts if PASSWORD in t]
    records = purge_log(Store(db))
    assert [(r.kind, r.planned, r.deleted, r.missing) for r in records] == [("plan", 30, 30, 0),
                                                                            ("restore", 30, 0, 0)]
    assert records[0].target == f"redis://purger@127.0.0.1:{standalone.port}/0"
    assert records[0].plan == str(plan) and records[0].namespace is None and not records[0].dry_run
    assert records[1].plan == str(tmp_path / "b.jsonl"), "a restore records the backup it read"


def test_failures_are_one_line_with_exit_status(standalone, tmp_path, capsys):
    plan = plan_file(tmp_path / "plan.jsonl", ["k"])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"redis_key": "a"}\n\n{"redis_key": 7}\n')
    standalone.admin.execute_command("ACL", "SETUSER", "reader", "reset", "on", f">{PASSWORD}", "~*",
                                     "-@all", "+@connection", "+exists")
    runs = {
        "unreachable": purge_cli("--plan", str(plan), "--redis", f"redis://127.0.0.1:{free_port()}/0"),
        "noperm": purge_here(capsys, "--plan", str(plan), "--redis", standalone.url("reader")),
        "bad line": purge_here(capsys, "--plan", str(bad), "--redis", standalone.url()),
        "no env": purge_here(capsys, "--plan", str(plan), "--redis", standalone.url(),
                             password_env="SPECDEC_NO_SUCH_VARIABLE"),
        "no plan": purge_here(capsys, "--plan", str(tmp_path / "nope.jsonl"), "--redis", standalone.url()),
    }
    for name, done in runs.items():
        assert done.returncode in (1, 2), name
        assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, (name, done.stderr)
        assert done.stdout == "", name
    assert "cannot reach Redis" in runs["unreachable"].stderr
    assert "NOPERM" in runs["noperm"].stderr
    assert f"{bad}:3:" in runs["bad line"].stderr
    assert "SPECDEC_NO_SUCH_VARIABLE" in runs["no env"].stderr


def test_purge_log_of_a_store_without_the_table_is_empty(tmp_path):
    import duckdb

    db = tmp_path / "old.duckdb"
    ingest(Store(db), [str(write_jsonl(tmp_path / "log.jsonl", [rec("r1", ts=T + "00:00Z")]))])
    with duckdb.connect(str(db)) as con:  # a store made before the table existed
        con.execute("DROP TABLE purges")
    assert purge_log(Store(db)) == []
    assert purge_log(Store(tmp_path / "missing.duckdb")) == []


def test_progress_bar_goes_to_a_terminal_on_stderr_and_stdout_stays_one_object(standalone, poisoned, tmp_path):
    import pty

    keys, _ = poisoned
    plan = plan_file(tmp_path / "plan.jsonl", keys)
    terminal, attached = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "specdec_core", "cache", "purge", "--plan", str(plan), "--redis",
                             standalone.url(), "--password-env", PASSWORD_ENV, "--batch", "10"], env=ENV,
                            stdout=subprocess.PIPE, stderr=attached)
    os.close(attached)
    shown = b""
    while True:
        try:
            chunk = os.read(terminal, 4096)
        except OSError:  # the pty's other end closed: the process is done
            break
        if not chunk:
            break
        shown += chunk
    out, _ = proc.communicate(timeout=60)
    os.close(terminal)
    assert proc.returncode == 0
    assert json.loads(out)["deleted"] == 30 and out.count(b"\n") == 1
    assert b"30/30 keys" in shown and b"[" + b"#" * 30 + b"]" in shown


def litellm_redis_key(logged: str, namespace: str = "narrow") -> str:
    """Where LiteLLM's RedisCache stores a key (redis_cache.py check_and_fix_namespace): its namespace is
    prefixed only to a key that does not start with it, and the key it logs already does."""
    return logged if logged.startswith(namespace) else f"{namespace}:{logged}"


def test_a_litellm_plan_names_the_keys_litellm_wrote(standalone, tmp_path):
    from specdec_core.remediation import purge_plan

    store = Store(tmp_path / "litellm.duckdb")
    ingest(store, [str(Path(__file__).resolve().parents[1] / "fixtures" / "formats" / "litellm_payloads.jsonl")],
           log_format="litellm")
    plan = purge_plan(store)
    assert plan and all(e.redis_key == e.cache_key and e.cache_key.startswith("narrow:") for e in plan)
    admin = standalone.admin
    admin.flushall()
    admin.mset({litellm_redis_key(e.cache_key): b"cached response" for e in plan})
    admin.set("narrow:someone-elses-entry", b"keep")

    result = purge_keys(target(standalone), [e.redis_key for e in plan])

    distinct = len({e.redis_key for e in plan})
    assert (result.planned, result.deleted, result.missing) == (distinct, distinct, 0)
    assert admin.keys("*") == [b"narrow:someone-elses-entry"]


def test_urls_with_a_password_are_refused_and_every_url_is_shown_masked():
    from specdec_core.remediation import PurgeError, mask_url
    from specdec_core.remediation.target import check_url

    for url in ("redis://:hunter2@cache:6379/0", "redis://purger:hunter2@cache:6379", "rediss://u:hunter2@c",
                "unix:///run/redis.sock?db=0&password=hunter2"):
        with pytest.raises(PurgeError) as refused:
            check_url(url)
        assert refused.value.exit_code == 2 and "hunter2" not in str(refused.value)
        assert "hunter2" not in mask_url(url) and "***" in mask_url(url)
    for url in ("redis://purger@cache:6379/0", "unix:///run/redis.sock?db=0", "rediss://cache"):
        check_url(url)
        assert mask_url(url) == url
    with pytest.raises(PurgeError, match="expected redis://"):
        check_url("http://cache:6379")


def test_restore_leaves_out_an_entry_whose_ttl_ran_out_and_names_a_bad_line(standalone, tmp_path, capsys):
    admin = standalone.admin
    admin.flushall()
    admin.set("fresh", b"a", px=600_000)
    admin.set("stale", b"b", px=600_000)
    backup = tmp_path / "backup.jsonl"
    assert purge_keys(target(standalone), ["fresh", "stale"], backup=backup).backed_up == 2
    lines = [json.loads(line) for line in backup.read_text().splitlines()]
    for line in lines:
        if line["key"] == "stale":  # as if the restore came after its TTL ran out
            line["expires_at_ms"] = int(time.time() * 1000) - 1
    backup.write_text("".join(json.dumps(line) + "\n" for line in lines))

    done = purge_here(capsys, "--backup", str(backup), "--redis", standalone.url(), command="restore")

    assert (done.returncode, json.loads(done.stdout)) == (0, {"restored": 1})
    assert "1 of 2 entries had outlived their TTL" in done.stderr
    assert admin.get("fresh") == b"a" and admin.exists("stale") == 0
    backup.write_text(backup.read_text() + '{"v": 1, "key": "x", "payload": "not base64!"}\n')
    bad = purge_here(capsys, "--backup", str(backup), "--redis", standalone.url(), command="restore")
    assert bad.returncode == 1 and f"{backup}:3:" in bad.stderr and bad.stderr.count("\n") == 1


def test_a_backup_line_redis_refuses_is_named_and_the_others_are_restored(standalone, poisoned, tmp_path, capsys):
    """A backup whose second line's payload was edited: the restore said "DUMP payload version or checksum are
    wrong; 0 keys were restored before the failure", naming no line, though the batch's other keys were back."""
    keys, _ = poisoned
    backup = tmp_path / "b.jsonl"
    assert purge_here(capsys, "--plan", str(plan_file(tmp_path / "plan.jsonl", keys)), "--redis", standalone.url(),
                      "--backup", str(backup)).returncode == 0
    lines = backup.read_text().splitlines()
    broken = json.loads(lines[1]) | {"payload": "AAAA"}
    backup.write_text("\n".join([lines[0], json.dumps(broken), *lines[2:]]) + "\n")
    done = purge_here(capsys, "--backup", str(backup), "--redis", standalone.url(), command="restore")
    assert done.returncode == 1 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"specdec cache restore: {backup}:2: Redis refused the payload of key "
                                  f"'{broken['key']}' ("), done.stderr
    assert done.stderr.rstrip().endswith(f"the other {len(keys) - 1} keys were restored"), done.stderr
    assert standalone.admin.exists(*keys) == len(keys) - 1 and not standalone.admin.exists(broken["key"])
