"""Prometheus metrics of one server, in its own registry, served over HTTP at `/metrics` (`serve.exposition`); with
several workers, the supervisor serves their sum."""

from typing import NamedTuple

import grpc
from edgedistill.serve.batching import BatchObserver, DropReason
from edgedistill.serve.exposition import MODEL_INFO, serve_http, stop_http
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)

# Seconds. A small student's backend call takes about 50-200 us and its call a few hundred, the default recipe's
# paced SLO is a p99 of 3 ms: dense below 10 ms, with edges at 0.1 ms and at 3 ms; up to 60 s, past the default
# BATCH_TIMEOUT_S (30 s) a slow or hung backend's call can take, so its quantiles read true rather than the last edge.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    30.0, 60.0,
)  # fmt: skip
# Rows per backend call: powers of two from 1 to 65536, well past the default MAX_QUEUED (1024), which bounds a batch
# (MAX_BATCH_SIZE), so that a server set for large batches reads their sizes apart rather than all in +Inf.
BATCH_BUCKETS = tuple(1 << power for power in range(17))
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
            "Queued rows dropped before running, by reason: cancelled (by the client), ended (a stream the server ended: "
            "a bad request, its idle limit or a shutdown), deadline (the call's passed), failed (another row of the "
            "call failed in the backend), fault (the batcher faulted) or closed (the model closed, at a shutdown or a "
            "reload, before its queue finished)",
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
            "Texts below a cascade member's threshold that the next member's full queue could not take, answered by "
            "the member (CASCADE_OVERLOAD=answer; with refuse the request fails, and none of its texts is counted)",
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
        observer.series.depth.set(rows)
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
        observer.series.depth.set(0)  # at 0, not removed: multiprocess mode keeps its file's value
        if self._member_depths.pop(observer.labels, None) is not None:
            self._sum_member_depths()

    def _sum_member_depths(self) -> None:
        self.depth.set(sum(rows for _, rows in self._member_depths.values()))

    def member(self, cascade: str, member: str) -> "MemberObserver":
        """The batch observer of the member `member` (its bundle id) of the cascade served as `cascade`; its series
        appear when its batcher starts (`member_started`)."""
        return MemberObserver(self, cascade, member)

    def member_started(self, observer: "MemberObserver") -> "MemberSeries":
        """`observer`'s member started taking batches, its cascade warm: its series, made now at zero, so a member that
        has not answered yet (or whose calls never queue) is scraped as 0, not missing, and a cascade that failed to
        load or warm up adds none. A member of the same cascade name and id, before or after a reload, gets the same
        series."""
        return MemberSeries(
            *(
                family.labels(*observer.labels)
                for family in (
                    self.cascade_answered,
                    self.cascade_escalated,
                    self.cascade_refused,
                    self.member_inference,
                    self.member_queue_wait,
                    self.member_depth,
                )
            )
        )

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


class MemberSeries(NamedTuple):
    """A cascade member's children of the cascade families, looked up once (`Metrics.member_started`): a `labels()`
    lookup per request or batch cost more than the counting."""

    answered: Counter
    escalated: Counter
    refused: Counter
    inference: Histogram
    queue_wait: Histogram
    depth: Gauge


class MemberObserver(BatchObserver):
    """A cascade member's batcher: the server's batch metrics, plus the member's own backend time, queue depth and
    queue wait (the cascade records each request's total wait in the server's, `CascadeRuntime.classify`), and its
    routed texts."""

    def __init__(self, metrics: Metrics, cascade: str, member: str):
        self.metrics = metrics
        self.labels = (cascade, member)
        self._series: MemberSeries | None = None

    @property
    def series(self) -> MemberSeries:
        if self._series is None:  # at the batcher's first report, its start
            self._series = self.metrics.member_started(self)
        return self._series

    def queue_depth(self, rows: int) -> None:
        self.metrics.member_queue_depth(self, rows)

    def retired(self) -> None:
        self.metrics.member_retired(self)

    def closed(self) -> None:
        if self._series is not None:  # else it wrote no series: a cascade closed after a failed warm-up leaves none
            self.metrics.member_closed(self)

    def routed(self, answered: int, escalated: int, refused: int) -> None:
        """A cascade request's texts at this member: answered here, passed on, and refused by the next member."""
        self.series.answered.inc(answered)
        self.series.escalated.inc(escalated)
        self.series.refused.inc(refused)

    def batch_done(self, rows: int, seconds: float) -> None:
        self.metrics.batch_done(rows, seconds)
        self.series.inference.observe(seconds)

    def request_done(self, queue_wait: float) -> None:
        self.series.queue_wait.observe(queue_wait)

    def rows_dropped(self, rows: int, reason: DropReason) -> None:
        self.metrics.rows_dropped(rows, reason)

    def rows_admitted(self, rows: int) -> None:
        self.metrics.rows_admitted(rows)
