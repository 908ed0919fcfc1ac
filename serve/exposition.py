"""`/metrics` over HTTP, and the sums of the worker processes' metrics that a supervisor serves there.

Free of grpc, ONNX Runtime and the request path, which the supervisor does not import: it only starts, watches and
stops its workers.
"""

import contextlib
import logging
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from wsgiref.simple_server import WSGIServer

from edgedistill.common.atomic import atomic_write
from edgedistill.serve.ports import reserve_port, unbindable
from prometheus_client import CollectorRegistry, ProcessCollector, start_http_server
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.mmap_dict import MmapedDict, mmap_key
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.registry import Collector

log = logging.getLogger("serve")

# A scrape sends its request at once. prometheus-client's HTTP server gives each connection a thread that waits for
# the request with no time limit: 500 silent connections held 500 threads (13 MB) for as long as they stayed open.
HTTP_TIMEOUT_S = 10.0
MODEL_INFO = "edgedistill_model_info"  # the served models' info gauge, which the sums keep for live models


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
                with contextlib.suppress(OSError):  # cut, timed out or gone: nobody to answer, nothing for the log
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


@dataclass
class HttpServers:
    """The `/metrics` servers of one host, one on each of its addresses (`ports.bind_addresses`), on one port."""

    servers: list[WSGIServer] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)  # each server's, which `stop_http` waits for

    @property
    def server_port(self) -> int:
        return self.servers[0].server_port


def serve_http(registry: CollectorRegistry, host: str, port: int) -> HttpServers:
    """An HTTP server for `/metrics` of `registry` on each address of `host` that this machine has, all on `port` (0:
    any port free on all of them), each in a daemon thread, closing a connection that has not sent its request within
    HTTP_TIMEOUT_S; `SettingsError` naming the metrics settings where an address cannot be bound."""
    with reserve_port(host, port, "metrics_port") as reservation:  # the addresses gRPC binds, and a port free on each
        addresses = [holder.getsockname()[0] for holder in reservation.holders]
        picked = reservation.port
    http = HttpServers()
    try:
        for address in addresses:
            server, thread = start_http_server(picked, addr=address, registry=registry)
            http.servers.append(server)
            http.threads.append(thread)
            # Set on the running server (prometheus-client takes no handler): only a connection accepted meanwhile,
            # within moments of the port opening, goes untimed.
            server.RequestHandlerClass = _timed(server.RequestHandlerClass)
    except OSError as err:  # taken since the reservation closed
        stop_http(http)
        raise unbindable("metrics_port", host, port, err.strerror or str(err)) from err
    return http


def check_http(host: str, port: int) -> None:
    """`SettingsError`, as `serve_http` raises it, where `host:port` cannot be bound now (a port in use, a host that
    does not resolve): checked before a model loads, which takes long and is lost when the port then fails."""
    reserve_port(host, port, "metrics_port").close()


def stop_http(http: HttpServers) -> None:
    """Close every server of `http`, and wait for their threads."""
    for server in http.servers:
        server.shutdown()
        server.server_close()
    for thread in http.threads:
        thread.join()


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
                was = _identity(retired)
                try:
                    self._fold(own, retired)
                except OSError as err:
                    if _identity(retired) == was:  # e.g. a full volume: the worker's own file stays, summed as before
                        log.warning(
                            "cannot add an exited worker's %s metrics to the retired workers' file; its own file "
                            "stays: %s",
                            kind,
                            err.__cause__ or err,  # the system's words: a DiskFull's advice is the pipeline's
                            extra={"event": "metrics_retire_failed", "worker_pid": pid},
                        )
                        continue
                    # the sums were published, and flushing their folder failed: they hold the worker's values
                own.unlink()

    def _fold(self, own: Path, retired: Path) -> None:
        """Write the sums of the files `own` and `retired` (where it exists) to `retired`, atomically: the temporary
        name is hidden, and scrapes, which glob `*.db`, skip it."""
        # accumulate=False: the buckets as the workers write them (each its own count), not cumulated
        merged = self.merge([str(path) for path in (retired, own) if path.exists()], accumulate=False)

        def write(tmp: Path) -> None:
            values = MmapedDict(str(tmp))
            try:
                for family in merged:
                    for sample in family.samples:
                        labels = sample.labels
                        key = mmap_key(
                            family.name, sample.name, list(labels), list(labels.values()), family.documentation
                        )
                        values.write_value(key, sample.value, 0.0)
            finally:
                values.close()

        atomic_write(retired, write)


def _identity(path: Path) -> tuple[int, int] | None:
    """The device and inode of the file at `path`, which a replace changes; None where there is none."""
    try:
        stat = path.stat()
    except FileNotFoundError:
        return None
    return stat.st_dev, stat.st_ino


def workers_registry(files: WorkerFiles, pids: Callable[[], dict[int, int]]) -> CollectorRegistry:
    """A registry of the metrics that worker processes write to `files`' folder (counters and histograms summed over
    every worker that ran, the queue depth over the live ones); the supervisor's own process figures, and each live
    worker's (`pids`: index -> pid)."""
    registry = CollectorRegistry()
    registry.register(files)
    ProcessCollector(registry=registry)
    registry.register(WorkerProcesses(pids))
    return registry
