"""Replay through an OpenAI-compatible engine (`transformers serve`) beside the same batch in-process.

A batch of the demo log's most suspicious requests (40 by default) is replayed in-process, then through a
`transformers serve` of the demo target (with --continuous-batching where it starts here) at max_concurrency
1, 4 and 8: wall time and replays/s, and how many verdicts agree with the in-process ones. Then the client's
overhead over a bare HTTP call for one replay: `EngineDecoder.generate` (prompt preprocessing, the call,
parsing, tokenizing the answer) and the whole `replay` (diff, classification, the database write) beside
`http.client` posting the same prebuilt body. Target: the client under 10% over the bare call.

    .venv/bin/python bench/bench_engine_replay.py [--n 40] [--family smollm2|tiny] [--models-dir DIR]
        [--concurrency 1,4,8] [--no-continuous-batching]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec_core.analysis import suspicious_requests  # noqa: E402
from specdec_core.contract.identity import DecodeRequest  # noqa: E402
from specdec_core.decoding.engine import SpecDecoder  # noqa: E402
from specdec_core.decoding.registry import Registry  # noqa: E402
from specdec_core.demo.models import fetch, registry_dict  # noqa: E402
from specdec_core.replay.run import replay, replay_many  # noqa: E402
from specdec_core.store.connection import Store  # noqa: E402
from specdec_core.store.ingest import ingest  # noqa: E402

TARGET = {"smollm2": "smollm2-135m", "tiny": "tiny-target"}
DEMO_LOG = ROOT / "data" / "demo" / "requests.jsonl.gz"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model_path: Path, batching: bool) -> tuple[subprocess.Popen, str] | None:
    port = free_port()
    cli = Path(sys.executable).with_name("transformers")
    args = [str(cli), "serve", str(model_path), "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
            "--log-level", "warning"] + (["--continuous-batching"] if batching else [])
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and server.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1):
                return server, f"http://127.0.0.1:{port}/v1"
        except OSError:
            time.sleep(0.5)
    server.kill()
    print(f"transformers serve {'with' if batching else 'without'} --continuous-batching did not start: "
          + server.stderr.read().decode(errors="replace")[-300:].replace("\n", " "), file=sys.stderr)
    return None


def stop(server: subprocess.Popen) -> None:
    server.terminate()
    try:
        server.wait(10)
    except subprocess.TimeoutExpired:
        server.kill()


def engine_registry(models_dir: Path, family: str, url: str, concurrency: int) -> Registry:
    data = registry_dict(models_dir, families=(family,))
    target = TARGET[family]
    served = str(Registry.from_dict(data, base_dir=models_dir).models[target].path)
    data["engines"] = {"serve": {"url": url, "timeout_s": 600, "max_concurrency": concurrency}}
    data["models"][target] = {"engine": "serve", "served_name": served}
    return Registry.from_dict(data, base_dir=models_dir)


def bare_call(url: str, body: dict) -> float:
    """Seconds for http.client to post a prebuilt body and parse the JSON answer: the floor under any client."""
    rest = url.removeprefix("http://")
    hostport, base = rest.split("/", 1)
    host, port = hostport.split(":")
    payload = json.dumps(body).encode()
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, int(port), timeout=600)
    conn.request("POST", f"/{base}/completions", body=payload, headers={"Content-Type": "application/json"})
    json.loads(conn.getresponse().read())
    conn.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--family", choices=sorted(TARGET), default="smollm2")
    parser.add_argument("--models-dir", type=Path, default=None)
    parser.add_argument("--concurrency", default="1,4,8")
    parser.add_argument("--no-continuous-batching", action="store_true")
    args = parser.parse_args()
    models_dir = args.models_dir or ROOT / "data" / "models"
    if args.models_dir is None:
        fetch(args.family, models_dir)
    local_registry = Registry.from_dict(registry_dict(models_dir, families=(args.family,)), base_dir=models_dir)
    local = SpecDecoder(local_registry, device="cpu")

    tmp = Path(tempfile.mkdtemp(prefix="bench-engine-"))
    store = Store(tmp / "bench.duckdb")
    ingest(store, [str(DEMO_LOG)])
    ids = list(suspicious_requests(store, args.n)["request_id"])
    if args.family == "tiny":  # the demo log names smollm2: the same requests, renamed onto the tiny family
        with store.write() as con:
            con.execute("UPDATE requests SET target_model = 'tiny-target', tokenizer_version = 'tiny-tok-v1', "
                        "draft_model = CASE WHEN draft_model LIKE 'ngram-%' THEN draft_model ELSE NULL END")
    print(f"{len(ids)} suspicious demo requests, family {args.family}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")

    started = time.perf_counter()
    here = {r.request_id: r.classification for r in replay_many(store, ids, local)}
    base_s = time.perf_counter() - started
    print(f"{'where':50}{'wall s':>9}{'replays/s':>11}{'same verdict':>14}  failures")
    print(f"{'in-process':50}{base_s:9.1f}{len(ids) / base_s:11.2f}{'':>14}")

    target_path = local_registry.models[TARGET[args.family]].path
    started_server = None
    for batching in ([False] if args.no_continuous_batching else [True, False]):
        started_server = start_server(target_path, batching)
        if started_server is not None:
            break
    if started_server is None:
        sys.exit("no transformers serve started")
    server, url = started_server
    label = "serve --continuous-batching" if batching else "serve"
    try:
        for concurrency in [int(c) for c in args.concurrency.split(",")]:
            remote = SpecDecoder(engine_registry(models_dir, args.family, url, concurrency), device="cpu")
            remote.generate(DecodeRequest.from_record({k: v for k, v in _first(store, ids[0]).items()}))  # warm
            failures: list[str] = []
            started = time.perf_counter()
            there = {r.request_id: r.classification for r in replay_many(store, ids, remote, failures=failures)}
            wall = time.perf_counter() - started
            decided = [i for i in there if there[i] != "unavailable" and here.get(i) != "unavailable"]
            same = sum(there[i] == here[i] for i in decided)
            print(f"{label + f', max_concurrency {concurrency}':50}{wall:9.1f}{len(there) / wall:11.2f}"
                  f"{f'{same}/{len(decided)}':>14}  {len(failures)}")
            for line in failures:
                print("   ", line)

        # One replay: the client beside the bare HTTP call, alternating, median of 9.
        remote = SpecDecoder(engine_registry(models_dir, args.family, url, 1), device="cpu")
        record = _first(store, ids[0])
        req = DecodeRequest.from_record(record)
        engine = remote.engine_for(req)
        remote.generate(req)  # learns what this server takes (token ids or text) before the body is built
        path, body, _ = engine._body(req)
        assert path == "/completions"
        bare, client, whole = [], [], []
        for i in range(9):  # alternating which goes first: a server idle for a moment answers its next call later
            for side in (("bare", "client") if i % 2 else ("client", "bare")):
                if side == "bare":
                    bare.append(bare_call(url, dict(body)))
                else:
                    t = time.perf_counter()
                    remote.generate(req)
                    client.append(time.perf_counter() - t)
        for _ in range(3):
            t = time.perf_counter()
            replay(store, ids[0], remote)
            whole.append(time.perf_counter() - t)
        b, c, w = (statistics.median(x) for x in (bare, client, whole))
        print(f"\none replay of {ids[0]} ({req.max_tokens} max tokens), median of 9 (whole replay: of 3):")
        print(f"  bare HTTP call {b * 1000:8.1f} ms")
        print(f"  client         {c * 1000:8.1f} ms  ({(c - b) / b * 100:+.1f}% over the bare call; target < 10%)")
        print(f"  whole replay   {w * 1000:8.1f} ms  ({(w - b) / b * 100:+.1f}%: source replay, diff, verdict, "
              "database write)")
    finally:
        stop(server)


def _first(store: Store, request_id: str) -> dict:
    from specdec_core.analysis import request_record

    record = request_record(store, request_id)
    fields = ("prompt", "prompt_hash", "target_model", "draft_model", "num_speculative_tokens", "temperature", "top_p",
              "top_k", "max_tokens", "seed", "stop", "tokenizer_version")
    return {k: record.get(k) for k in fields}


if __name__ == "__main__":
    main()
