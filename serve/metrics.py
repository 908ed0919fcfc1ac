"""Prometheus metrics of one server, in its own registry, served over HTTP at `/metrics`."""

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from serve.batching import BatchObserver, DropReason

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)


class Metrics(BatchObserver):
    """Per-call metrics (fed by the call observer) and batch metrics (fed by the batcher as its observer)."""

    def __init__(self):
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgedistill_requests", "gRPC calls by method and status code", ["method", "code"], registry=r
        )
        self.errors = Counter(
            "edgedistill_errors", "gRPC calls that ended with a status other than OK", ["code"], registry=r
        )
        self.latency = Histogram(
            "edgedistill_request_seconds",
            "Total time of a call in the server",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "edgedistill_queue_wait_seconds",
            "Time a request waited before a batch took it",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.inference = Histogram(
            "edgedistill_inference_seconds",
            "Time of one backend call (a batch, or one length group of it)",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "edgedistill_batch_size", "Rows per backend call", buckets=BATCH_BUCKETS, registry=r
        )
        self.depth = Gauge("edgedistill_queue_depth", "Rows waiting for a batch", registry=r)
        self.dropped = Counter(
            "edgedistill_dropped_rows", "Queued rows dropped before running, by reason", ["reason"], registry=r
        )
        self.model = Gauge(
            "edgedistill_model_info",
            "The model being served (value 1)",
            ["name", "version", "runtime", "providers"],
            registry=r,
        )
        self._http = None

    def observe_call(self, method: str, code: grpc.StatusCode, seconds: float) -> None:
        self.requests.labels(method, code.name).inc()
        self.latency.labels(method).observe(seconds)
        if code is not grpc.StatusCode.OK:
            self.errors.labels(code.name).inc()

    def set_model(self, name: str, version: str, runtime: str, providers: list[str]) -> None:
        self.model.clear()
        self.model.labels(name, version, runtime, ",".join(providers)).set(1)

    def queue_depth(self, rows: int) -> None:
        self.depth.set(rows)

    def batch_done(self, rows: int, seconds: float) -> None:
        self.batch_size.observe(rows)
        self.inference.observe(seconds)

    def request_done(self, queue_wait: float) -> None:
        self.queue_wait.observe(queue_wait)

    def rows_dropped(self, rows: int, reason: DropReason) -> None:
        self.dropped.labels(reason.value).inc(rows)

    def start_http(self, host: str, port: int) -> int:
        """Serve `/metrics` on `host:port` (0: any free port) in a daemon thread; return the port."""
        address = host.strip("[]")
        try:
            self._http, _ = start_http_server(port, addr=address, registry=self.registry)
        except OSError:
            if address != "::":
                raise
            self._http, _ = start_http_server(port, addr="0.0.0.0", registry=self.registry)  # no IPv6 here
        return self._http.server_port

    def stop_http(self) -> None:
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None
