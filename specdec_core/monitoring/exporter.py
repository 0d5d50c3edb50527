"""The store's figures as Prometheus metrics (shared/metrics.md), and the HTTP server that serves them.

Needs `prometheus_client` (the `[metrics]` extra). The figures are read from the store at a scrape when
the store changed since the last one (a writer's swap or a lake's commit changes `Store.version`), so a
follower's batch shows at the next scrape and an idle store costs nothing to scrape again.

The server bounds what a client can hold: at most MAX_CONNECTIONS at once, each socket operation
IO_TIMEOUT_S, and a whole exchange (request read, answer written) CONNECTION_DEADLINE_S; a client that
sends or reads slowly, or never, is cut off after that, and what it held is freed.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from specdec_core.connections import BoundedThreads, cut
from specdec_core.contract import fields as contract
from specdec_core.extras import require
from specdec_core.monitoring.figures import (
    CUT_CHARS,
    DEFAULT_COMBINATIONS,
    DEFAULT_TOP,
    DIGEST_CHARS,
    MAX_LABEL_CHARS,
    OTHER,
    Figures,
    read_figures,
)
from specdec_core.store.connection import Store, StoreError, release_snapshots
from specdec_core.store.location import mask_secrets
from specdec_core.text import host_and_port

# Through require: without the [metrics] extra, importing this module says so in one line.
_core = require("metrics", "prometheus_client.core")
_exposition = require("metrics", "prometheus_client.exposition")
CollectorRegistry, Metric = _core.CollectorRegistry, _core.Metric
CounterMetricFamily, GaugeMetricFamily = _core.CounterMetricFamily, _core.GaugeMetricFamily

EMPTY = Figures((), (), (), (), (), (), (), (), (), 0, ())
FOLD_NOTE = (f"labels keep the top {{top}} values by requests, the rest folded into \"{OTHER}\", and at most "
             f"{{combinations}} deployment/model sets, a deployment's others folding its models into \"{OTHER}\" "
             "(once folded, folded while the exporter runs); a value over "
             f"{MAX_LABEL_CHARS} characters is cut to its first {CUT_CHARS}, \"~\" and the first {DIGEST_CHARS} "
             "hex digits of the SHA-256 of the whole value")

MAX_CONNECTIONS = 16
IO_TIMEOUT_S = 10.0  # Prometheus's default scrape_timeout: a scrape that waits longer is already failed
CONNECTION_DEADLINE_S = 30.0


class StoreCollector:
    """A prometheus_client collector over one store: each metric of the contract, current at every scrape."""

    def __init__(self, store: Store, top: int = DEFAULT_TOP, combinations: int = DEFAULT_COMBINATIONS) -> None:
        if top < 1:
            raise ValueError(f"top: expected a number >= 1, got {top}")
        self.store, self.top, self.combinations = store, top, combinations
        self._lock = threading.Lock()
        self._cached: tuple[Any, Figures] | None = None
        self.last_read_seconds = 0.0
        # Every read on one thread of its own: it keeps its read-only view of the store from scrape to scrape
        # (the HTTP server starts a thread per request), and closes it before the process ends.
        self._reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specdec-metrics")

    def figures(self) -> Figures:
        """The store's figures, read again only when the store changed since the last read."""
        with self._lock:  # two scrapes at once read the store once
            if not self.store.exists:  # a follower's store before its first batch
                return EMPTY
            version = self.store.version()
            if self._cached is None or self._cached[0] != version:
                started = time.perf_counter()
                # What the last read kept and folded stays so: no series it exported falls.
                folds = self._cached[1].folds if self._cached is not None else None
                self._cached = (version, self._reader.submit(read_figures, self.store, self.top, folds,
                                                             self.combinations).result())
                self.last_read_seconds = time.perf_counter() - started
            return self._cached[1]

    def close(self) -> None:
        """Close the reader's view of the store; the collector reads nothing after this."""
        with self._lock:
            self._reader.submit(release_snapshots).result()
            self._reader.shutdown()

    def describe(self) -> list[Metric]:
        return []  # registering must not read the store: the names are the contract's, checked by the tests

    def collect(self) -> Iterator[Metric]:
        yield from families(self.figures(), self.top, self.last_read_seconds, self.combinations)


def _counter(name: str, doc: str, labels: list[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=labels)


def families(f: Figures, top: int, read_seconds: float = 0.0,
             combinations: int = DEFAULT_COMBINATIONS) -> Iterator[Metric]:
    """The contract's metric families from one read of the figures."""
    fold = FOLD_NOTE.format(top=top, combinations=combinations)
    combos = sorted({r[:3] for r in f.requests})
    deployments = sorted({r[0] for r in f.requests})

    m = _counter("specdec_requests", f"Accepted request records; {fold}.",
                 ["deployment", "target_model", "draft_model", "cache_hit"])
    seen = {r[:4]: r[4] for r in f.requests}
    for combo in combos:  # both cache_hit series from the start: a first hit is then an increase
        for hit in ("false", "true"):
            m.add_metric([*combo, hit], seen.get((*combo, hit), 0))
    yield m

    m = _counter("specdec_contaminated_hits",
                 "Cache hits that served another identity's output, each counted when first judged contaminated "
                 f"(a later re-judging never lowers it: see specdec_contaminated_hits_current); {fold}.",
                 ["deployment", "target_model", "draft_model"])
    first = {r[:3]: r[3] for r in f.contaminated_first}
    for combo in sorted(set(combos) | set(first)):  # 0 for every label set with requests: no first-sample gap
        m.add_metric(list(combo), first.get(combo, 0))
    yield m

    m = GaugeMetricFamily("specdec_contaminated_hits_current",
                          "Cache hits contaminated by the store's current verdicts (what `specdec stats` and the "
                          f"dashboard show; a late file can lower it); {fold}.",
                          labels=["deployment", "target_model", "draft_model"])
    now = {r[:3]: r[3] for r in f.contaminated_now}
    for combo in sorted(set(combos) | set(now)):
        m.add_metric(list(combo), now.get(combo, 0))
    yield m

    m = _counter("specdec_contaminated_hit_fields",
                 "Contaminated hits (as first judged) whose differing_fields hold `field`, a hit once per field; "
                 f"{fold}.", ["deployment", "field"])
    fields = {r[:2]: r[2] for r in f.contaminated_fields}
    for key in sorted({(d, name) for d in deployments for name in contract.IDENTITY_FIELDS} | set(fields)):
        m.add_metric(list(key), fields.get(key, 0))
    yield m

    m = _counter("specdec_length_violations", f"Requests with output_tokens > max_tokens; {fold}.",
                 ["deployment", "target_model"])
    for dep, target, n in f.length_violations:
        m.add_metric([dep, target], n)
    yield m

    m = _counter("specdec_quarantined_records", "Records quarantined by the ingest (bad input, with a reason).", [])
    m.add_metric([], f.quarantined)
    yield m

    gauges = [GaugeMetricFamily(name, f"{doc}; {fold}.", labels=["deployment"]) for name, doc in (
        ("specdec_cache_keys", "Distinct cache keys"),
        ("specdec_identities", "Distinct request identities (fingerprints)"),
        ("specdec_key_collisions", "Cache keys shared by more than one identity"))]
    for dep, keys, identities, collisions in f.keys:
        for gauge, value in zip(gauges, (keys, identities, collisions), strict=True):
            gauge.add_metric([dep], value)
    yield from gauges

    draft = _counter("specdec_draft_tokens", f"Sum of draft_tokens over accepted records; {fold}.",
                     ["deployment", "target_model", "draft_model"])
    accepted = _counter("specdec_accepted_tokens", f"Sum of accepted_tokens over accepted records; {fold}.",
                        ["deployment", "target_model", "draft_model"])
    for dep, target, draft_model, d, a in f.tokens:
        draft.add_metric([dep, target, draft_model], d)
        accepted.add_metric([dep, target, draft_model], a)
    yield draft
    yield accepted

    m = GaugeMetricFamily("specdec_newest_request_timestamp_seconds",
                          f"ts of the newest request, Unix seconds; {fold}.", labels=["deployment"])
    for dep, ts in f.newest:
        m.add_metric([dep], ts)
    yield m

    m = _counter("specdec_replays", "Stored replays by classification.", ["classification"])
    for classification, n in f.replays:
        m.add_metric([classification], n)
    yield m

    m = GaugeMetricFamily("specdec_label_values_folded",
                          f"Distinct values of a label folded into \"{OTHER}\" (beyond the top {top} by requests); "
                          f"label=\"combination\": deployment/model sets beyond the {combinations} kept.",
                          labels=["label"])
    for label, n in f.folded:
        m.add_metric([label], n)
    yield m

    m = GaugeMetricFamily("specdec_figures_read_seconds", "How long the last read of the store's figures took.")
    m.add_metric([], read_seconds)
    yield m


@dataclass(frozen=True)
class Listen:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> Listen:
    """HOST:PORT ("[::1]:9464" for IPv6); a ValueError that says what is wrong otherwise."""
    address = host_and_port(text)
    if address is None:
        raise ValueError(f"{text!r}: expected HOST:PORT, e.g. 127.0.0.1:9464")
    return Listen(*address)


class _Sink:
    """Where the handler's error output goes: a client that timed out or hung up is no one's error."""

    def write(self, _text: str) -> None:
        pass

    def flush(self) -> None:
        pass


class _Handler(WSGIRequestHandler):
    """One connection: each socket operation within IO_TIMEOUT_S, the whole within CONNECTION_DEADLINE_S."""

    timeout = IO_TIMEOUT_S  # StreamRequestHandler sets it on the socket: reads and writes alike

    def setup(self) -> None:
        super().setup()
        # A client trickling a byte per IO_TIMEOUT_S would pass every per-operation timeout; the deadline
        # closes its socket whatever it does.
        self._deadline = threading.Timer(CONNECTION_DEADLINE_S, cut, args=(self.connection,))
        self._deadline.daemon = True
        self._deadline.start()

    def finish(self) -> None:
        self._deadline.cancel()
        try:
            super().finish()
        except OSError:
            pass

    def get_stderr(self) -> _Sink:
        return _Sink()

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


class _Server(BoundedThreads, _exposition.ThreadingWSGIServer):
    """A thread per connection, at most MAX_CONNECTIONS at once: the next waits to be accepted, then is refused."""

    request_queue_size = 64
    max_connections = MAX_CONNECTIONS
    slot_wait_s = IO_TIMEOUT_S

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out or hung up: its connection is closed, nothing to say


def _app(registry: CollectorRegistry) -> Any:
    """prometheus_client's WSGI app; a store that can't be read answers 500 with one line, said on stderr too."""
    metrics_app = _exposition.make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Any) -> Any:
        try:
            return metrics_app(environ, start_response)
        except StoreError as exc:
            said = mask_secrets(str(exc))
            print(f"specdec metrics: a scrape failed: {said}", file=sys.stderr, flush=True)
            start_response("500 Internal Server Error", [("Content-Type", "text/plain; charset=utf-8")])
            return [f"{said}\n".encode()]

    return app


def _start_server(listen: Listen, registry: CollectorRegistry) -> Any:
    """prometheus_client's start_http_server, on a server that bounds its clients (see the module's text)."""
    family, host = _exposition._get_best_family(listen.host, listen.port)
    server_class = type("SpecdecMetricsServer", (_Server,), {"address_family": family})
    server = make_server(host, listen.port, _app(registry), server_class, handler_class=_Handler)
    thread = threading.Thread(target=server.serve_forever, name="specdec-metrics-http", daemon=True)
    thread.start()
    return server


@dataclass(frozen=True)
class Running:
    """An exporter `serve` started: its HTTP server and its collector."""

    server: Any
    collector: StoreCollector

    @property
    def port(self) -> int:
        return self.server.server_port

    def stop(self) -> None:
        """Stop serving, and close the collector's view of the store."""
        self.server.shutdown()
        self.server.server_close()
        self.collector.close()


def serve(store: Store, listen: Listen, top: int = DEFAULT_TOP,
          registry: CollectorRegistry | None = None, combinations: int = DEFAULT_COMBINATIONS) -> Running:
    """Serve `store`'s metrics at http://HOST:PORT/metrics from a background thread.

    Returns the running exporter (`.port`, `.stop()`). OSError when the address can't be bound.
    """
    registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
    collector = StoreCollector(store, top, combinations)
    try:
        server = _start_server(listen, registry)
    except OSError:
        collector.close()
        raise
    registry.register(collector)
    return Running(server, collector)
