"""Prometheus metrics of one server, in its own registry, served over HTTP at `/metrics`; with several workers, the
supervisor serves their sum."""

import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable
from pathlib import Path

import grpc
from edgedistill.serve.batching import BatchObserver, DropReason
from edgedistill.serve.settings import SettingsError, env_name
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
    start_http_server,
)
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

log = logging.getLogger("serve")

# Seconds. A small student's backend call takes about 50-200 us and its call a few hundred, the default recipe's
# paced SLO is a p99 of 3 ms: dense below 10 ms, with edges at 0.1 ms and at 3 ms; up to 60 s, past the default
# BATCH_TIMEOUT_S (30 s) a slow or hung backend's call can take, so its quantiles read true rather than the last edge.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
# A scrape sends its request at once. prometheus-client's HTTP server gives each connection a thread that waits for
# the request with no time limit: 500 silent connections held 500 threads (13 MB) for as long as they stayed open.
HTTP_TIMEOUT_S = 10.0
# Calls the client ended: it cancelled, or its deadline passed (or it sent nothing for STREAM_IDLE_S). Counted apart
# from the errors: a client that gives up is no server error (a rise with the queue wait still means a slow server).
ABANDONED = (grpc.StatusCode.CANCELLED, grpc.StatusCode.DEADLINE_EXCEEDED)
# Failed calls whose status blames the request, not the server: malformed, unauthorised, for a model or method that is
# not served, a reload the operator asked of a bad bundle. Counted as errors of kind "client", apart from the server's
# own (INTERNAL, UNKNOWN, UNAVAILABLE, a full queue's RESOURCE_EXHAUSTED, ...), so that one client's bad requests do
# not page. RESOURCE_EXHAUSTED is the server's unless the call says otherwise (a request over a limit, `observe_call`).
CLIENT_CODES = frozenset(
    {
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.ALREADY_EXISTS,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAUTHENTICATED,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.OUT_OF_RANGE,
        grpc.StatusCode.UNIMPLEMENTED,
    }
)
# Multiprocess mode has no `_created` series, so with one worker none are made either: a scrape holds the same
# series whatever WORKERS is, and a labelled counter or histogram is not one series longer per label set.
disable_created_metrics()
MODEL_INFO = "edgedistill_model_info"


class Metrics(BatchObserver):
    """Per-call metrics (fed by the call observer) and batch metrics (fed by the batcher as its observer). `shared`:
    a worker's, whose values go to the files of prometheus-client's multiprocess mode (PROMETHEUS_MULTIPROC_DIR),
    summed by the supervisor's /metrics."""

    def __init__(self, shared: bool = False):
        self.shared = shared
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "edgedistill_requests", "gRPC calls by method and status code", ["method", "code"], registry=r
        )
        self.errors = Counter(
            "edgedistill_errors",
            "gRPC calls that ended with a status other than OK, CANCELLED or DEADLINE_EXCEEDED, by whose fault: client "
            "(the request) or server",
            ["code", "kind"],
            registry=r,
        )
        self.abandoned = Counter(
            "edgedistill_abandoned_calls",
            "gRPC calls the client ended: CANCELLED (it gave up or went away) or DEADLINE_EXCEEDED (its deadline "
            "passed)",
            ["code"],
            registry=r,
        )
        for code in ABANDONED:
            self.abandoned.labels(code.name)  # scraped from the start, at 0
        self.latency = Histogram(
            "edgedistill_request_seconds",
            "Total time of a call in the server",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.queue_wait = Histogram(
            "edgedistill_queue_wait_seconds",
            "Time a request waited before a batch took it (a cascade's request: its waits at the members it reached, "
            "summed)",
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
        # multiprocess_mode: how several workers' values combine (only with PROMETHEUS_MULTIPROC_DIR)
        self.depth = Gauge(
            "edgedistill_queue_depth", "Rows waiting for a batch", registry=r, multiprocess_mode="livesum"
        )
        self.admitted = Gauge(
            "edgedistill_admitted_rows",
            "Rows holding queue places while their texts are tokenized in threads, not yet waiting for a batch: with "
            "the queue depth, what MAX_QUEUED bounds (a cascade: the sum over its members, each bounded by MAX_QUEUED)",
            registry=r,
            multiprocess_mode="livesum",
        )
        self.dropped = Counter(
            "edgedistill_dropped_rows",
            "Queued rows dropped before running, by reason: cancelled (by the client), deadline (the call's passed), "
            "failed (another row of the call failed in the backend), fault (the batcher faulted) or closed (the model "
            "closed, at a shutdown or a reload, before its queue finished)",
            ["reason"],
            registry=r,
        )
        for reason in DropReason:
            self.dropped.labels(reason.value)  # every reason scraped from the start, at 0
        self.model = Gauge(
            MODEL_INFO,
            "The model being served (value 1)",
            ["name", "version", "runtime", "providers"],
            registry=r,
            multiprocess_mode="livemax",
        )
        self.cascade_answered = Counter(
            "edgedistill_cascade_answered_texts",
            "Texts a confidence cascade's member answered, by cascade (its served name) and member (its bundle id)",
            ["cascade", "member"],
            registry=r,
        )
        self.cascade_escalated = Counter(
            "edgedistill_cascade_escalated_texts",
            "Texts a cascade's member passed on to the next member, below its confidence threshold",
            ["cascade", "member"],
            registry=r,
        )
        self.cascade_refused = Counter(
            "edgedistill_cascade_escalation_refused_texts",
            "Texts below a cascade member's threshold that the next member's full queue could not take",
            ["cascade", "member"],
            registry=r,
        )
        self.member_inference = Histogram(
            "edgedistill_cascade_member_inference_seconds",
            "Time of one backend call of a cascade's member",
            ["cascade", "member"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.member_queue_wait = Histogram(
            "edgedistill_cascade_member_queue_wait_seconds",
            "Time a cascade request's texts waited before a batch of a cascade's member took them",
            ["cascade", "member"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.member_depth = Gauge(
            "edgedistill_cascade_member_queue_depth",
            "Rows waiting for a batch of a cascade's member",
            ["cascade", "member"],
            registry=r,
            multiprocess_mode="livesum",
        )
        if not shared:  # a worker's process figures are the supervisor's to read (`WorkerProcesses`)
            ProcessCollector(registry=r)
        # (cascade, member) -> the observer that last wrote its queue depth, and the rows: the serving cascade's members
        # (a replaced one's until it closes), whose sum is the server's queue depth
        self._member_depths: dict[tuple[str, str], tuple[MemberObserver, int]] = {}
        # (method, code, the request's fault) -> its children of `requests`, `latency` and `errors` or `abandoned`: a
        # `labels()` lookup per call (argument checks, a lock) cost more than the counting itself; the server's methods
        # and codes are few
        self._call_children: dict[tuple[str, grpc.StatusCode, bool], tuple] = {}
        self._model_labels: tuple[str, ...] | None = None
        self._http = None

    def observe_call(self, method: str, code: grpc.StatusCode, seconds: float, clients_fault: bool = False) -> None:
        """One call of `method` that ended with `code` after `seconds`; `clients_fault`: a failed call the request
        itself caused, whatever its code (e.g. RESOURCE_EXHAUSTED for one over a limit), else its code says whose."""
        key = method, code, clients_fault
        if (children := self._call_children.get(key)) is None:
            failed = None
            if code in ABANDONED:
                failed = self.abandoned.labels(code.name)
            elif code is not grpc.StatusCode.OK:
                kind = "client" if clients_fault or code in CLIENT_CODES else "server"
                failed = self.errors.labels(code.name, kind)
            children = self.requests.labels(method, code.name), self.latency.labels(method), failed
            self._call_children[key] = children
        requests, latency, failed = children
        requests.inc()
        latency.observe(seconds)
        if failed is not None:
            failed.inc()

    def set_model(self, name: str, version: str, runtime: str, providers: list[str]) -> None:
        if not self.shared:
            self.model.clear()
        elif self._model_labels is not None:
            # clear() cannot reach the shared file, where it would stay 1: at 0, the supervisor's scrape drops it
            self.model.labels(*self._model_labels).set(0)
        self._model_labels = (name, version, runtime, ",".join(providers))
        self.model.labels(*self._model_labels).set(1)

    def queue_depth(self, rows: int) -> None:
        self._member_depths.clear()  # a bundle serves: no member's queue is in the server's any more
        self.depth.set(rows)

    def member_queue_depth(self, observer: "MemberObserver", rows: int) -> None:
        """Rows waiting for the batch of `observer`'s cascade member; the server's queue depth is the members' sum."""
        self._member_depths[observer.labels] = observer, rows
        self.member_depth.labels(*observer.labels).set(rows)
        self._sum_member_depths()

    def member_retired(self, observer: "MemberObserver") -> None:
        """`observer`'s member was replaced: its rows leave the server's sum, which is the new runtime's from now on,
        unless that runtime already writes the series (a member of the same cascade name and id); its own series
        keeps its rows until it closes (`member_closed`)."""
        writer, _ = self._member_depths.get(observer.labels, (None, 0))
        if writer is observer:
            del self._member_depths[observer.labels]
            self._sum_member_depths()

    def member_closed(self, observer: "MemberObserver") -> None:
        """`observer`'s member closed: its queue depth reads 0 and leaves the server's sum, unless the runtime that
        replaced it writes that series now (a member of the same cascade name and id)."""
        writer, _ = self._member_depths.get(observer.labels, (observer, 0))
        if writer is not observer:
            return
        self.member_depth.labels(*observer.labels).set(0)  # at 0, not removed: multiprocess mode keeps its file's value
        if self._member_depths.pop(observer.labels, None) is not None:
            self._sum_member_depths()

    def _sum_member_depths(self) -> None:
        self.depth.set(sum(rows for _, rows in self._member_depths.values()))

    def member(self, cascade: str, member: str) -> "MemberObserver":
        """The batch observer of the member `member` (its bundle id) of the cascade served as `cascade`. Its series
        start at zero here, so a member that has not answered yet (or whose calls never queue) is scraped as 0, not
        missing."""
        for family in (
            self.cascade_answered,
            self.cascade_escalated,
            self.cascade_refused,
            self.member_inference,
            self.member_queue_wait,
            self.member_depth,
        ):
            family.labels(cascade, member)
        return MemberObserver(self, cascade, member)

    def routed(self, cascade: str, member: str, answered: int, escalated: int, refused: int) -> None:
        """A cascade request's texts at `member`: answered there, passed on, and refused by the next member."""
        self.cascade_answered.labels(cascade, member).inc(answered)
        self.cascade_escalated.labels(cascade, member).inc(escalated)
        self.cascade_refused.labels(cascade, member).inc(refused)

    def batch_done(self, rows: int, seconds: float) -> None:
        self.batch_size.observe(rows)
        self.inference.observe(seconds)

    def request_done(self, queue_wait: float) -> None:
        self.queue_wait.observe(queue_wait)

    def rows_dropped(self, rows: int, reason: DropReason) -> None:
        self.dropped.labels(reason.value).inc(rows)

    def rows_admitted(self, rows: int) -> None:
        self.admitted.inc(rows)

    def start_http(self, host: str, port: int) -> int:
        """Serve `/metrics` on `host:port` (0: any free port) in a daemon thread; return the port."""
        self._http = serve_http(self.registry, host, port)
        return self._http.server_port

    def stop_http(self) -> None:
        if self._http is not None:
            stop_http(self._http)
            self._http = None


class MemberObserver(BatchObserver):
    """A cascade member's batcher: the server's batch metrics, plus the member's own backend time, queue depth and
    queue wait (the cascade records each request's total wait in the server's, `CascadeRuntime.classify`)."""

    def __init__(self, metrics: Metrics, cascade: str, member: str):
        self.metrics = metrics
        self.labels = (cascade, member)

    def queue_depth(self, rows: int) -> None:
        self.metrics.member_queue_depth(self, rows)

    def retired(self) -> None:
        self.metrics.member_retired(self)

    def closed(self) -> None:
        self.metrics.member_closed(self)

    def batch_done(self, rows: int, seconds: float) -> None:
        self.metrics.batch_done(rows, seconds)
        self.metrics.member_inference.labels(*self.labels).observe(seconds)

    def request_done(self, queue_wait: float) -> None:
        self.metrics.member_queue_wait.labels(*self.labels).observe(queue_wait)

    def rows_dropped(self, rows: int, reason: DropReason) -> None:
        self.metrics.rows_dropped(rows, reason)

    def rows_admitted(self, rows: int) -> None:
        self.metrics.rows_admitted(rows)


def _timed(handler: type) -> type:
    """`handler` with a deadline: a connection whose request has not come whole within HTTP_TIMEOUT_S of its start
    is shut, however it trickles (a read's own timeout, also HTTP_TIMEOUT_S, restarts with each byte)."""

    class TimedHandler(handler):
        timeout = HTTP_TIMEOUT_S

        def handle(self):
            self.deadline = threading.Timer(HTTP_TIMEOUT_S, self.cut)
            self.deadline.daemon = True
            self.deadline.start()
            try:
                super().handle()
            finally:
                self.deadline.cancel()

        def cut(self) -> None:
            with contextlib.suppress(OSError):  # closed meanwhile
                self.connection.shutdown(socket.SHUT_RDWR)

        def parse_request(self) -> bool:  # reads the headers; the reply is written after it, with no deadline
            parsed = super().parse_request()
            self.deadline.cancel()
            return parsed

    return TimedHandler


def serve_http(registry: CollectorRegistry, host: str, port: int):
    """An HTTP server for `/metrics` of `registry` on `host:port` (0: any free port), in a daemon thread, closing a
    connection that has not sent its request within HTTP_TIMEOUT_S; `SettingsError` naming the metrics settings where
    the address cannot be bound."""
    address = host.strip("[]")
    try:
        try:
            server, _ = start_http_server(port, addr=address, registry=registry)
        except OSError:
            if address != "::":
                raise
            server, _ = start_http_server(port, addr="0.0.0.0", registry=registry)  # no IPv6 here
    except OSError as err:
        raise SettingsError(
            f"cannot bind the metrics port {host}:{port} ({env_name('metrics_host')}, {env_name('metrics_port')}): "
            f"{err.strerror or err}"
        ) from err
    # Set on the running server (prometheus-client takes no handler): only a connection accepted meanwhile, within
    # moments of the port opening, goes untimed.
    server.RequestHandlerClass = _timed(server.RequestHandlerClass)
    return server


def stop_http(server) -> None:
    server.shutdown()
    server.server_close()


# prometheus-client's process families -> the supervisor's per-worker ones: (name, help, family class)
WORKER_PROCESS = {
    "process_resident_memory_bytes": (
        "edgedistill_worker_resident_memory_bytes",
        "Resident memory of a worker process in bytes",
        GaugeMetricFamily,
    ),
    "process_cpu_seconds": (
        "edgedistill_worker_cpu_seconds",
        "User and system CPU time of a worker process",
        CounterMetricFamily,
    ),
    "process_open_fds": ("edgedistill_worker_open_fds", "Open file descriptors of a worker process", GaugeMetricFamily),
    "process_start_time_seconds": (
        "edgedistill_worker_start_time_seconds",
        "Start time of a worker process since the epoch (a restart moves it)",
        GaugeMetricFamily,
    ),
}


class WorkerProcesses(Collector):
    """Each live worker's memory, CPU time, open files and start time, read from /proc at each scrape and labelled
    with the worker's index (kept across its restarts): multiprocess mode cannot combine process figures."""

    def __init__(self, pids: Callable[[], dict[int, int]]):
        self.pids = pids  # worker index -> pid of the live workers

    def collect(self) -> list[Metric]:
        families = {source: kind(name, doc, labels=["worker"]) for source, (name, doc, kind) in WORKER_PROCESS.items()}
        for index, pid in self.pids().items():
            for family in ProcessCollector(pid=lambda pid=pid: pid, registry=None).collect():  # none once it exited
                if family.name in families:
                    families[family.name].add_metric([str(index)], family.samples[0].value)
        return list(families.values())


# Multiprocess mode keeps each worker process's counters and histograms in files of its own (64 KiB each at least),
# which the sums need after it exited: every restart left two more files in the temporary folder (a 64 MiB
# memory-backed volume in the Kubernetes deployment), and every scrape read them all. An exited worker's values are
# added to one file per kind instead, named as a worker's file is (`<kind>_<name>.db`) so that scrapes sum it too.
RETIRED_KINDS = ("counter", "histogram")
RETIRED = "retired"


class WorkerFiles(MultiProcessCollector):
    """The metrics that worker processes write to `folder` (prometheus-client's multiprocess mode), summed at each
    scrape: counters and histograms over every worker that ran, the live gauges over the live ones, the model info
    of the models served. `retire` folds an exited worker's files into the retired workers' ones, so that restarts
    add no files."""

    def __init__(self, folder: Path):
        super().__init__(None, path=str(folder))
        self.folder = Path(folder)
        self._lock = threading.Lock()  # a scrape sees a retiring worker's values once: not twice, not missing

    def collect(self):
        with self._lock:
            families = list(super().collect())
        for family in families:
            if family.name == MODEL_INFO:  # a worker's earlier models stay in its file at 0: one server drops them
                family.samples = [sample for sample in family.samples if sample.value]
        return families

    def retire(self, pid: int) -> None:
        """Worker `pid` exited: its live gauges are dropped, its counters and histograms added to the retired ones."""
        with self._lock:
            mark_process_dead(pid, str(self.folder))
            for kind in RETIRED_KINDS:
                own = self.folder / f"{kind}_{pid}.db"
                if not own.exists():
                    continue
                retired = self.folder / f"{kind}_{RETIRED}.db"
                staged = retired.with_suffix(".tmp")  # not *.db until complete: scrapes read only those
                try:
                    self._fold(own, retired, staged)
                except OSError as err:  # e.g. a full volume: the worker's own file stays, and is summed as before
                    staged.unlink(missing_ok=True)
                    log.warning(
                        "cannot add an exited worker's %s metrics to the retired workers' file; its own file stays: %s",
                        kind,
                        err,
                        extra={"event": "metrics_retire_failed", "worker_pid": pid},
                    )
                    continue
                own.unlink()

    def _fold(self, own: Path, retired: Path, staged: Path) -> None:
        """Write the sums of the files `own` and `retired` (where it exists) to `staged`, then rename it `retired`."""
        # accumulate=False: the buckets as the workers write them (each its own count), not cumulated
        merged = self.merge([str(path) for path in (retired, own) if path.exists()], accumulate=False)
        staged.unlink(missing_ok=True)
        values = MmapedDict(str(staged))
        try:
            for family in merged:
                for sample in family.samples:
                    labels = sample.labels
                    key = mmap_key(family.name, sample.name, list(labels), list(labels.values()), family.documentation)
                    values.write_value(key, sample.value, 0.0)
        finally:
            values.close()
        os.replace(staged, retired)


def workers_registry(files: WorkerFiles, pids: Callable[[], dict[int, int]]) -> CollectorRegistry:
    """A registry of the metrics that worker processes write to `files`' folder (counters and histograms summed over
    every worker that ran, the queue depth over the live ones); the supervisor's own process figures, and each live
    worker's (`pids`: index -> pid)."""
    registry = CollectorRegistry()
    registry.register(files)
    ProcessCollector(registry=registry)
    registry.register(WorkerProcesses(pids))
    return registry
