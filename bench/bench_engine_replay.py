"""Replay through an OpenAI-compatible engine (`transformers serve`) beside the same batch in-process.

1. A batch of the demo log's most suspicious requests (40 by default, each with the max_tokens it logged) is
   replayed in-process, then through a `transformers serve` of the demo target (with --continuous-batching
   where it starts here) at max_concurrency 1, 4 and 8: wall time and replays/s, and how many verdicts agree
   with the in-process ones. Every replay prints a progress line (stderr).
2. The client's overhead over a bare HTTP call for one replay's engine call: `SpecDecoder.generate` on the
   engine (the request built from the identity, the prompt preprocessed and tokenized, the answer parsed,
   escaped, tokenized and its evidence written) beside `http.client` posting the very JSON body the client
   sent. Both open a fresh connection per call (as the client does), with the same headers; rounds alternate
   which side goes first, warm-up rounds are discarded, and each round's client-minus-bare difference is
   taken. Against transformers serve on a shared CPU the generation's own jitter (hundreds of ms) swamps a
   difference of a millisecond, so the same rounds run again against a stand-in server that answers at once
   with the answer transformers serve gave: that difference is the overhead, given as a share of the bare call
   to transformers serve. Cross-check: the client's own time inside each of its calls (its wall time minus
   its HTTP round trip). Target: under 10% of the bare call.

Continuous batching on a CPU: `transformers serve --continuous-batching` sizes its paged KV cache from the
memory it finds (14 GB here) and warms up at 8,192 tokens a batch, which on a CPU does not end in minutes;
the bench sizes the cache for the batch instead (--cb-num-blocks, --cb-max-batch-tokens). The server's log
goes to a file: a pipe nobody reads fills up and stops the server. Both sides run on one torch thread by
default: on a CPU other work shares, two spinning OpenMP threads made a smollm2 decode ten times slower.

    .venv/bin/python bench/bench_engine_replay.py [--n 40] [--family smollm2|tiny] [--models-dir DIR]
        [--concurrency 1,4,8] [--runs 30] [--threads 1] [--no-continuous-batching] [--skip-batch]
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_core.analysis import request_record, suspicious_requests  # noqa: E402
from specdec_core.contract.identity import DecodeRequest  # noqa: E402
from specdec_core.decoding.engine import SpecDecoder  # noqa: E402
from specdec_core.decoding.registry import Registry  # noqa: E402
from specdec_core.decoding.router import DecoderRouter  # noqa: E402
from specdec_core.demo.models import fetch, registry_dict  # noqa: E402
from specdec_core.ingestion.load import ingest  # noqa: E402
from specdec_core.replay.run import ReplayResult, replay_many  # noqa: E402
from specdec_core.store.connection import Store  # noqa: E402

TARGET = {"smollm2": "smollm2-135m", "tiny": "tiny-target"}
DEMO_LOG = ROOT / "data" / "demo" / "requests.jsonl.gz"
CB_PAGE_TOKENS = 256  # transformers' ContinuousBatchingConfig page_size
IDENTITY = ("prompt", "prompt_hash", "target_model", "draft_model", "num_speculative_tokens", "temperature", "top_p",
            "top_k", "max_tokens", "seed", "stop", "tokenizer_version")


def say(*parts: Any) -> None:
    print(*parts, file=sys.stderr, flush=True)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cb_flags(longest_prompt: int, most_tokens: int, concurrency: int) -> list[str]:
    """A paged KV cache for `concurrency` requests of the longest prompt and output, and one prefill a batch."""
    blocks = concurrency * math.ceil((longest_prompt + most_tokens) / CB_PAGE_TOKENS) + 2
    batch_tokens = max(512, longest_prompt + concurrency)
    return ["--continuous-batching", "--cb-num-blocks", str(blocks), "--cb-max-batch-tokens", str(batch_tokens)]


def start_server(model_path: Path, batching: list[str], log: Path, threads: int) -> tuple[subprocess.Popen, str] | None:
    port = free_port()
    cli = Path(sys.executable).with_name("transformers")
    args = [str(cli), "serve", str(model_path), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
            "--log-level", "warning", *batching]
    with log.open("ab") as out:
        server = subprocess.Popen(args, stdout=out, stderr=out,
                                  env={**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
                                       "OMP_NUM_THREADS": str(threads)})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return server, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.5)
    stop(server)
    tail = log.read_text(errors="replace")[-300:].replace("\n", " ")
    say(f"transformers serve {' '.join(batching) or '(no batching flags)'} did not start: {tail}")
    return None


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def engine_registry(models_dir: Path, family: str, url: str, concurrency: int) -> Registry:
    data = registry_dict(models_dir, families=(family,))
    target = TARGET[family]
    served = str(Registry.from_dict(data, base_dir=models_dir).models[target].path)
    data["engines"] = {"serve": {"url": url, "timeout_s": 600, "max_concurrency": concurrency}}
    data["models"][target] = {"engine": "serve", "served_name": served}
    return Registry.from_dict(data, base_dir=models_dir)


def identity(store: Store, request_id: str) -> DecodeRequest:
    record = request_record(store, request_id)
    assert record is not None
    return DecodeRequest.from_record({k: record.get(k) for k in IDENTITY})


def progress(label: str) -> Callable[[int, int, ReplayResult], None]:
    started = time.perf_counter()

    def show(n: int, total: int, result: ReplayResult) -> None:
        say(f"  {label}: {n}/{total} {result.request_id} {result.classification} "
            f"({time.perf_counter() - started:.0f} s)")

    return show


def quartiles(values: list[float]) -> tuple[float, float, float]:
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


# --- the batch --------------------------------------------------------------------------------------------------


def batch_rows(store: Store, ids: list[str], reqs: list[DecodeRequest], local: SpecDecoder, models_dir: Path,
               family: str, url: str, label: str, levels: list[int]) -> list[tuple[str, float, int, str, int]]:
    """(where, wall s, replays, same verdict, failures) in-process, then on the engine at each concurrency."""
    for name in {r.target_model for r in reqs} | {r.draft_model for r in reqs if r.draft_model}:
        if local.registry.knows(name) and local.registry.is_available(name):
            local.loader.model(name)  # loading is not replay: both sides start warm
    started = time.perf_counter()
    here = {r.request_id: r.classification for r in replay_many(store, ids, local, progress=progress("in-process"))}
    rows = [("in-process", time.perf_counter() - started, len(here), "", 0)]
    print_row(rows[-1])
    for concurrency in levels:
        remote = DecoderRouter(SpecDecoder(engine_registry(models_dir, family, url, concurrency), device="cpu"))
        remote.generate(reqs[0])  # the server loads its model on its first request
        failures: list[str] = []
        where = f"{label}, max_concurrency {concurrency}"
        started = time.perf_counter()
        results = replay_many(store, ids, remote, failures=failures, progress=progress(where))
        wall = time.perf_counter() - started
        there = {r.request_id: r.classification for r in results}
        decided = [i for i in there if there[i] != "unavailable" and here.get(i) != "unavailable"]
        same = sum(there[i] == here[i] for i in decided)
        rows.append((where, wall, len(there), f"{same}/{len(decided)}", len(failures)))
        print_row(rows[-1])
        for line in failures:
            print("   ", line, flush=True)
    return rows


def print_row(row: tuple[str, float, int, str, int]) -> None:
    where, wall, n, same, failures = row
    print(f"{where:52}{wall:9.1f}{n:9d}{n / wall:11.3f}{same:>14}{failures:>10}", flush=True)


HEADER = f"{'where':52}{'wall s':>9}{'replays':>9}{'replays/s':>11}{'same verdict':>14}{'failures':>10}"


# --- the client's overhead --------------------------------------------------------------------------------------


def bare_call(url: str, path: str, body: dict[str, Any], headers: dict[str, str]) -> tuple[float, bytes]:
    """http.client posting `body` as JSON on a fresh connection and parsing the JSON answer: (seconds, answer)."""
    parts = urlsplit(url)
    started = time.perf_counter()
    payload = json.dumps(body).encode("utf-8")
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=600)
    try:
        conn.request("POST", parts.path.rstrip("/") + path, body=payload, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        json.loads(raw)
    finally:
        conn.close()
    seconds = time.perf_counter() - started
    assert resp.status == 200, raw[:200]
    return seconds, raw


def stand_in(answer: bytes) -> tuple[ThreadingHTTPServer, str]:
    """A server answering every POST at once with one recorded answer: a call's time without the generation."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}/v1"


def sent_body(remote: DecoderRouter, req: DecodeRequest) -> tuple[str, dict[str, Any]]:
    """(path, body) of the call `remote.generate(req)` makes to its engine."""
    engine = remote.engine_for(req)
    assert engine is not None
    sent: dict[str, Any] = {}
    real_call = engine.client.call

    def recording(method: str, path: str, body: Any = None, **kw: Any) -> Any:
        sent.update(path=path, body=json.loads(json.dumps(body)))
        return real_call(method, path, body, **kw)

    engine.client.call = recording
    try:
        remote.generate(req)
    finally:
        engine.client.call = real_call
    return sent["path"], sent["body"]


def ab_rounds(bare: Callable[[], float], client: Callable[[], tuple[float, float]], runs: int,
              warmup: int) -> tuple[list[float], list[float], list[float]]:
    """(bare s, client s, client's own s) of `runs` rounds after `warmup`, which side goes first alternating."""
    bares, clients, own = [], [], []
    for i in range(warmup + runs):
        for side in ("bare", "client") if i % 2 else ("client", "bare"):
            if side == "bare":
                seconds = bare()
                if i >= warmup:
                    bares.append(seconds)
            else:
                seconds, mine = client()
                if i >= warmup:
                    clients.append(seconds)
                    own.append(mine)
    return bares, clients, own


def timed(remote: DecoderRouter, req: DecodeRequest) -> Callable[[], tuple[float, float]]:
    def call() -> tuple[float, float]:
        started = time.perf_counter()
        out = remote.generate(req)
        seconds = time.perf_counter() - started
        return seconds, seconds - out.latency_ms / 1000.0  # its wall time less its HTTP round trip

    return call


def ms(values: list[float], sign: str = "") -> str:
    q1, q2, q3 = quartiles(values)
    return f"{q2 * 1000:{sign}.2f} ms ({q1 * 1000:{sign}.2f} to {q3 * 1000:{sign}.2f})"


def overhead(remote: DecoderRouter, req: DecodeRequest, url: str, models_dir: Path, family: str, runs: int,
             warmup: int = 3) -> None:
    path, body = sent_body(remote, req)  # after the first call: the fields this server takes, as the client sends
    headers = {"Content-Type": "application/json", "Accept": "application/json"}  # the client's own
    _, answer = bare_call(url, path, body, headers)
    real = ab_rounds(lambda: bare_call(url, path, body, headers)[0], timed(remote, req), runs, warmup)

    server, stub_url = stand_in(answer)
    try:
        stub = DecoderRouter(SpecDecoder(engine_registry(models_dir, family, stub_url, 1), device="cpu"))
        learnt, engine = stub.engine_for(req), remote.engine_for(req)
        assert learnt is not None and engine is not None
        learnt._refused, learnt._ids_refused = set(engine._refused), engine._ids_refused
        assert sent_body(stub, req) == (path, body), "the stand-in must get the very body the server got"
        fake = ab_rounds(lambda: bare_call(stub_url, path, body, headers)[0], timed(stub, req), runs, warmup)
    finally:
        server.shutdown()
        server.server_close()

    print(f"\none replay's engine call: {req.max_tokens} max tokens, {'greedy' if req.is_greedy else 'sampled'}, "
          f"{path}, {runs} rounds after {warmup} warm-up, a fresh connection per call on both sides, the same body "
          "and headers, order alternating; median (quartiles)")
    print(f"{'':34}{'bare http.client':>34}{'client (generate)':>34}{'client - bare, per round':>34}")
    for label, (bares, clients, _) in (("transformers serve", real), ("its answer, from a stand-in", fake)):
        diffs = [c - b for c, b in zip(clients, bares, strict=True)]
        print(f"{label:34}{ms(bares):>34}{ms(clients):>34}{ms(diffs, '+'):>34}")
    base = statistics.median(real[0])
    diffs = [c - b for c, b in zip(fake[1], fake[0], strict=True)]
    q1, q2, q3 = quartiles(diffs)
    own = quartiles(real[2])
    print(f"client overhead: {q2 * 1000:.2f} ms a call (quartiles {q1 * 1000:.2f} to {q3 * 1000:.2f}, measured on "
          f"the stand-in) = {q2 / base * 100:.3f}% of the bare call to transformers serve (quartiles {q1 / base * 100:.3f}%"
          f" to {q3 / base * 100:.3f}%); target < 10%")
    print(f"cross-check: the client's own time inside its calls to transformers serve (wall - its HTTP round trip): "
          f"{own[1] * 1000:.2f} ms (quartiles {own[0] * 1000:.2f} to {own[2] * 1000:.2f})")


# --- main -------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--family", choices=sorted(TARGET), default="smollm2")
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--runs", type=int, default=30, help="rounds of the overhead measurement")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads, in-process and in the server")
    parser.add_argument("--no-continuous-batching", action="store_true")
    parser.add_argument("--skip-batch", action="store_true", help="only the client's overhead")
    args = parser.parse_args()
    models_dir = args.models_dir or ROOT / "data" / "models"
    if args.models_dir is None:
        fetch(args.family, models_dir)
    local_registry = Registry.from_dict(registry_dict(models_dir, families=(args.family,)), base_dir=models_dir)
    local = SpecDecoder(local_registry, device="cpu", threads=args.threads)
    levels = [int(c) for c in args.concurrency.split(",")]

    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    store = Store(tmp / "bench.duckdb")
    ingest(store, [str(DEMO_LOG)])
    ids = list(suspicious_requests(store, args.n)["request_id"])
    if args.family == "tiny":  # the demo log names smollm2: the same requests, renamed onto the tiny family
        with store.write() as con:
            con.execute("UPDATE requests SET target_model = 'tiny-target', tokenizer_version = 'tiny-tok-v1', "
                        "draft_model = CASE WHEN draft_model LIKE 'ngram-%' THEN draft_model ELSE NULL END")
    reqs = [identity(store, i) for i in ids]
    longest = max(len(local.prompt_ids(r)) for r in reqs)
    most = max(r.max_tokens for r in reqs)
    print(f"{len(ids)} suspicious demo requests (max_tokens as logged: {sorted({r.max_tokens for r in reqs})}, "
          f"prompts up to {longest} tokens), family {args.family}, {os.cpu_count()} CPUs, {args.threads} torch "
          f"thread(s) in-process and in the server, "
          f"load average {os.getloadavg()[0]:.1f}", flush=True)

    target_path = local_registry.models[TARGET[args.family]].path
    log = tmp / "serve.log"
    started_server = None
    choices = [] if args.no_continuous_batching else [cb_flags(longest, most, max(levels))]
    for batching in [*choices, []]:
        started_server = start_server(target_path, batching, log, args.threads)
        if started_server is not None:
            break
    if started_server is None:
        sys.exit(f"no transformers serve started (its log: {log})")
    server, url = started_server
    label = "serve --continuous-batching" if batching else "serve"
    say(f"{label} {' '.join(batching[1:])} at {url}; its log: {log}")
    try:
        if not args.skip_batch:
            print(HEADER, flush=True)
            rows = batch_rows(store, ids, reqs, local, models_dir, args.family, url, label, levels)
            print(f"\n{HEADER}")
            for row in rows:
                print_row(row)
        remote = DecoderRouter(SpecDecoder(engine_registry(models_dir, args.family, url, 1), device="cpu"))
        greedy = next((r for r in reqs if r.is_greedy), reqs[0])  # deterministic: both sides get the same answer
        overhead(remote, greedy, url, models_dir, args.family, args.runs)
        print(f"load average at the end {os.getloadavg()[0]:.1f}")
    finally:
        stop(server)


if __name__ == "__main__":
    main()
