"""What a purge costs production: a concurrent client's GET latency while `specdec cache purge` removes
100,000 planned keys from a Redis holding 1M, beside the same client with no purge, and the purge's rate
beside `redis-cli --scan --pattern ... | xargs redis-cli unlink` on the same data.

    .venv/bin/python bench/bench_purge.py [--keys 1000000] [--purge 100000] [--baseline-seconds 5]

A redis-server of its own on a free port (no persistence), stopped at the end. The GET client is a separate
process (a thread would share the purge's interpreter lock and measure that instead), reading random keys
of the other 900,000 back to back; its percentiles are over the requests it made while each side ran.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from helpers import free_port, start_redis  # noqa: E402  (the tests' own launcher)

from specdec_core.remediation import RedisTarget, purge_keys  # noqa: E402

POISONED = "specdec:old:v1:"
OTHER = "app:session:"
VALUE = b"x" * 200


def resp(*words: bytes) -> bytes:
    return b"*%d\r\n" % len(words) + b"".join(b"$%d\r\n%s\r\n" % (len(w), w) for w in words)


def load(port: int, keys: list[bytes]) -> None:
    """SET every key with `redis-cli --pipe` (the fastest way in; not what is measured)."""
    payload = b"".join(resp(b"SET", k, VALUE) for k in keys)
    subprocess.run([shutil.which("redis-cli") or "redis-cli", "-p", str(port), "--pipe"], input=payload,
                   check=True, capture_output=True)


def poisoned_keys(n: int) -> list[bytes]:
    return [f"{POISONED}{i:08d}".encode() for i in range(n)]


def get_client(port: int, others: int, stop, out) -> None:
    """GET random other keys until `stop` is set; send (start, latency seconds) of each."""
    client = redis.Redis(port=port)
    rnd = random.Random(1)
    samples = []
    while not stop.is_set():
        key = f"{OTHER}{rnd.randrange(others):08d}"
        t = time.perf_counter()
        client.get(key)
        samples.append((t, time.perf_counter() - t))
    out.send(samples)


def with_client(port: int, others: int, work) -> tuple[float, list[float]]:
    """Run work() while the GET client reads; (work's seconds, the client's latencies during it)."""
    stop = mp.Event()
    receive, send = mp.Pipe(duplex=False)
    reader = mp.Process(target=get_client, args=(port, others, stop, send))
    reader.start()
    time.sleep(0.5)  # the client connected and reading before the work starts
    started = time.perf_counter()
    work()
    ended = time.perf_counter()
    stop.set()
    samples = receive.recv()
    reader.join()
    return ended - started, [lat for t, lat in samples if started <= t <= ended]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


def row(name: str, seconds: float, lat: list[float], keys: int | None) -> str:
    rate = f"{keys / seconds:>10,.0f}" if keys else f"{'':>10}"
    return (f"{name:<44}{seconds:>8.2f}{rate}{len(lat):>9,}{statistics.median(lat) * 1000:>9.3f}"
            f"{pct(lat, 0.99):>9.3f}{pct(lat, 0.999):>9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--purge", type=int, default=100_000)
    parser.add_argument("--baseline-seconds", type=float, default=5.0)
    parser.add_argument("--batch", type=int, default=500)
    args = parser.parse_args()
    others = args.keys - args.purge
    folder = Path(tempfile.mkdtemp(prefix="bench-purge-"))
    port = free_port()
    server = start_redis(port, folder)
    admin = redis.Redis(port=port)
    try:
        load(port, [f"{OTHER}{i:08d}".encode() for i in range(others)])
        plan = poisoned_keys(args.purge)
        load(port, plan)
        assert admin.dbsize() == args.keys
        target = RedisTarget(f"redis://127.0.0.1:{port}/0")
        text_plan = [k.decode() for k in plan]
        print(f"redis-server {admin.info('server')['redis_version']}, {admin.dbsize():,} keys, "
              f"{args.purge:,} planned; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
        print(f"{'':<44}{'seconds':>8}{'keys/s':>10}{'GETs':>9}{'p50 ms':>9}{'p99 ms':>9}{'p99.9 ms':>9}")

        seconds, lat = with_client(port, others, lambda: time.sleep(args.baseline_seconds))
        print(row("GET client alone", seconds, lat, None), flush=True)

        seconds, lat = with_client(port, others, lambda: purge_keys(target, text_plan, batch=args.batch))
        assert admin.dbsize() == others
        print(row(f"specdec cache purge (batch {args.batch})", seconds, lat, args.purge), flush=True)

        load(port, plan)
        backup = folder / "backup.jsonl"
        seconds, lat = with_client(port, others, lambda: purge_keys(target, text_plan, batch=args.batch,
                                                                    backup=backup))
        assert admin.dbsize() == others
        print(row("specdec cache purge --backup", seconds, lat, args.purge), flush=True)
        backup.unlink()

        load(port, plan)
        rate = 20_000
        seconds, lat = with_client(port, others, lambda: purge_keys(target, text_plan, batch=args.batch,
                                                                    rate=rate))
        assert admin.dbsize() == others
        print(row(f"specdec cache purge --rate {rate}", seconds, lat, args.purge), flush=True)

        load(port, plan)
        cli = shutil.which("redis-cli") or "redis-cli"
        pipeline = (f"{cli} -p {port} --scan --pattern '{POISONED}*' | xargs {cli} -p {port} unlink "
                    ">/dev/null")
        seconds, lat = with_client(port, others, lambda: subprocess.run(pipeline, shell=True, check=True))
        assert admin.dbsize() == others
        print(row("redis-cli --scan --pattern | xargs unlink", seconds, lat, args.purge), flush=True)
    finally:
        admin.close()
        server.kill()
        server.wait()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
