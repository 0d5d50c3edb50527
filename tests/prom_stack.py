"""A real alerting stack on free ports (Debian's prometheus and prometheus-alertmanager), a webhook receiver,
and a `specdec ingest --follow --metrics` follower: for the monitoring tests and bench/bench_monitoring.py."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from servers import free_port

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Webhook:
    """Alertmanager's webhook payloads as they arrive, each with its arrival time (time.monotonic())."""

    received: list[tuple[float, dict[str, Any]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def alerts(self, status: str = "firing") -> list[tuple[float, dict[str, Any]]]:
        with self.lock:
            return [(t, a) for t, payload in self.received for a in payload["alerts"] if a["status"] == status]


def _webhook_server(hook: Webhook) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            with hook.lock:
                hook.received.append((time.monotonic(), json.loads(body)))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@dataclass
class Stack:
    workdir: Path
    log: Path
    db: Path
    prometheus_url: str
    alertmanager_url: str
    hook: Webhook
    follower: subprocess.Popen
    intervals: dict[str, str]
    follower_args: tuple[list[str], dict[str, str]] = ([], {})
    exporter_url: str = ""

    def restart_follower(self) -> int:
        """Stop the follower as an operator would (SIGINT), start it again; returns the old one's exit code."""
        self.follower.send_signal(signal.SIGINT)
        code = self.follower.wait(timeout=60)
        cmd, env = self.follower_args
        self.follower = subprocess.Popen(cmd, cwd=self.workdir, env=env, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, text=True)
        return code

    def query(self, expr: str) -> list[dict[str, Any]]:
        return self._api(f"query?{urllib.parse.urlencode({'query': expr})}")["result"]

    def _api(self, path: str) -> Any:
        with urllib.request.urlopen(f"{self.prometheus_url}/api/v1/{path}", timeout=10) as resp:
            body = json.loads(resp.read())
        assert body["status"] == "success", body
        return body["data"]

    def evaluated_after(self, since: float) -> bool:
        """Whether every rule group has been evaluated at a time later than `since` (time.time()), so what the
        rules say now counts every sample scraped before it. An evaluation reads its scheduled instant, which
        may lag the moment it began: one began a whole interval after `since` reads past it for certain."""
        groups = self._api("rules")["groups"]
        return bool(groups) and all(rfc3339(g["lastEvaluation"]) > since + g["interval"] for g in groups)

    def scraped_after(self, since: float) -> bool:
        """Whether every target has been scraped, and answered, since `since` (time.time())."""
        targets = self._api("targets")["activeTargets"]
        return bool(targets) and all(t["health"] == "up" and rfc3339(t["lastScrape"]) > since for t in targets)

    def active_alerts(self) -> list[dict[str, Any]]:
        """Prometheus's pending and firing alerts, as its last evaluation left them."""
        return self._api("alerts")["alerts"]

    def append(self, records: list[dict[str, Any]]) -> None:
        with open(self.log, "a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(r) + "\n" for r in records))
            fh.flush()


def rfc3339(text: str) -> float:
    """Prometheus's timestamps (up to nanoseconds; Z or an offset) as seconds since the epoch."""
    whole, fraction, zone = re.fullmatch(r"(.{19})(?:\.(\d+))?(Z|[+-]\d\d:\d\d)", text).groups()
    stamp = datetime.fromisoformat(whole + ("+00:00" if zone == "Z" else zone))
    return stamp.timestamp() + (int(fraction) / 10 ** len(fraction) if fraction else 0.0)


def wait_for(check: Callable[[], Any], timeout: float, what: str, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except OSError:
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(every)


def ready(url: str) -> bool:
    with urllib.request.urlopen(url, timeout=2) as resp:
        return resp.status == 200


@contextmanager
def alerting_stack(workdir: Path, rules: str, *, scrape: str = "1s", evaluate: str = "1s",
                   group_wait: str = "1s", follow_every: float = 0.2) -> Iterator[Stack]:
    """Prometheus (scraping the follower, evaluating `rules`), Alertmanager (to a webhook), and the follower on
    an empty log: all started here, all stopped when the block ends."""
    workdir.mkdir(parents=True, exist_ok=True)
    ports = {name: free_port() for name in ("exporter", "prometheus", "alertmanager")}
    hook = Webhook()
    webhook = _webhook_server(hook)
    (workdir / "rules.yml").write_text(rules)
    (workdir / "prometheus.yml").write_text(json.dumps({
        "global": {"scrape_interval": scrape, "evaluation_interval": evaluate, "scrape_timeout": scrape},
        "rule_files": [str(workdir / "rules.yml")],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [f"127.0.0.1:{ports['alertmanager']}"]}]}]},
        "scrape_configs": [{"job_name": "specdec", "static_configs": [
            {"targets": [f"127.0.0.1:{ports['exporter']}"]}]}],
    }))
    (workdir / "alertmanager.yml").write_text(json.dumps({
        "route": {"receiver": "hook", "group_by": ["alertname", "deployment"], "group_wait": group_wait,
                  "group_interval": group_wait, "repeat_interval": "1h"},
        "receivers": [{"name": "hook", "webhook_configs": [
            {"url": f"http://127.0.0.1:{webhook.server_port}/", "send_resolved": True}]}],
    }))
    log, db = workdir / "requests.jsonl", workdir / "store.duckdb"
    log.touch()
    procs: list[subprocess.Popen] = []
    stack: Stack | None = None
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.STDOUT}
    try:
        procs.append(subprocess.Popen(
            ["prometheus-alertmanager", f"--config.file={workdir / 'alertmanager.yml'}",
             f"--storage.path={workdir / 'am-data'}", f"--web.listen-address=127.0.0.1:{ports['alertmanager']}",
             "--cluster.listen-address="], **quiet))
        procs.append(subprocess.Popen(
            ["prometheus", f"--config.file={workdir / 'prometheus.yml'}", f"--storage.tsdb.path={workdir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{ports['prometheus']}"], **quiet))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        cmd = [sys.executable, "-m", "specdec_core", "ingest", "--follow", str(log), "--db", str(db),
               "--every", str(follow_every), "--metrics", f"127.0.0.1:{ports['exporter']}"]
        follower = subprocess.Popen(cmd, cwd=workdir, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    text=True)
        stack = Stack(workdir, log, db, f"http://127.0.0.1:{ports['prometheus']}",
                      f"http://127.0.0.1:{ports['alertmanager']}", hook, follower,
                      {"scrape": scrape, "evaluation": evaluate, "group_wait": group_wait}, (cmd, env),
                      f"http://127.0.0.1:{ports['exporter']}/metrics")
        wait_for(lambda: ready(f"{stack.alertmanager_url}/-/ready"), 60, "Alertmanager")
        wait_for(lambda: ready(f"{stack.prometheus_url}/-/ready"), 60, "Prometheus")
        wait_for(lambda: stack.query('up{job="specdec"} == 1'), 60, "Prometheus to scrape the follower")
        yield stack
    finally:
        if stack is not None:
            procs.append(stack.follower)  # the one running now, after any restart
        for proc in reversed(procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT if proc is procs[-1] and stack is not None else signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        webhook.shutdown()
        webhook.server_close()
