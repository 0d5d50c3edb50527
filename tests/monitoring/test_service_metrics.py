"""DecodeService's guard counters and latency as Prometheus metrics on the application's registry."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from helpers import DeterministicEngine, free_port
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.parser import text_string_to_metric_families

from specdec_core.cache import MemoryCache
from specdec_core.contract.identity import DecodeRequest
from specdec_core.service import DecodeService


def request(max_tokens: int) -> DecodeRequest:
    return DecodeRequest.from_record({"prompt": "Summarise the incident.", "target_model": "llama-8b",
                                      "draft_model": "llama-1b", "temperature": 0.0, "max_tokens": max_tokens,
                                      "tokenizer_version": "tok-v1"})


def scrape(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    server, _ = start_http_server(free_port(), addr="127.0.0.1", registry=registry)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.server_port}/metrics", timeout=10) as resp:
            text = resp.read().decode()
    finally:
        server.shutdown()
        server.server_close()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_a_narrow_keys_refused_entries_show_on_the_applications_registry():
    registry = CollectorRegistry()
    narrow = DecodeService(MemoryCache(), DeterministicEngine(), key_scheme="prompt_only", deployment="edge",
                           metrics_registry=registry)
    correct = DecodeService(MemoryCache(), DeterministicEngine(), deployment="core", metrics_registry=registry)
    for service in (narrow, correct):
        service.decode(request(64))
        service.decode(request(64))  # a hit
        service.decode(request(16))  # the narrow key finds the 64-token entry: the guard refuses it
    m = scrape(registry)
    edge, core = (("deployment", "edge"),), (("deployment", "core"),)
    assert m[("specdec_cache_fingerprint_mismatches_total", edge)] == 1
    assert m[("specdec_cache_fingerprint_mismatches_total", core)] == 0
    assert m[("specdec_cache_hits_total", edge)] == m[("specdec_cache_hits_total", core)] == 1
    assert m[("specdec_cache_misses_total", edge)] == m[("specdec_cache_misses_total", core)] == 2
    assert m[("specdec_decode_latency_seconds_count", (("cache_hit", "false"), ("deployment", "edge")))] == 2
    assert m[("specdec_decode_latency_seconds_count", (("cache_hit", "true"), ("deployment", "edge")))] == 1
    assert narrow.counters()["fingerprint_mismatches"] == 1


def test_without_prometheus_client_the_service_runs_without_metrics():
    code = """
import sys
sys.modules['prometheus_client'] = None
from helpers import DeterministicEngine
from specdec_core.cache import MemoryCache
from specdec_core.service import DecodeService
from specdec_core.contract.identity import DecodeRequest
def request(n):
    return DecodeRequest.from_record({"prompt": "p", "target_model": "t", "temperature": 0.0, "max_tokens": n,
                                      "tokenizer_version": "v"})
s = DecodeService(MemoryCache(), DeterministicEngine(), key_scheme="prompt_only")
s.decode(request(64)); s.decode(request(16))
print(s.counters()["fingerprint_mismatches"], s._metrics)
"""
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent.parent), str(here.parent)])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "None"]
