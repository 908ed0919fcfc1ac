"""The HTTP server of `/metrics`, and the supervisor's sums of its workers' metrics and process figures."""

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from edgedistill.common import atomic
from edgedistill.serve import exposition
from edgedistill.serve.exposition import (
    RETIRED,
    WorkerFiles,
    WorkerProcesses,
    check_http,
    serve_http,
    stop_http,
    workers_registry,
)
from edgedistill.serve.metrics import Metrics
from edgedistill.serve.settings import SettingsError
from prometheus_client import CollectorRegistry, generate_latest, values
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.multiprocess import MultiProcessCollector

from tests.serve.test_operations import metric
from tests.serve.test_ports import ipv6_loopback


@pytest.fixture
def worker_scrape():
    """A scrape of `WorkerProcesses` over this process (worker 0), a running child (worker 1) and an exited one (2)."""
    running = subprocess.Popen(
        [sys.executable, "-c", "import time; print('up', flush=True); time.sleep(60)"], stdout=subprocess.PIPE
    )
    running.stdout.readline()  # it has run: its memory is mapped
    exited = subprocess.Popen(["true"])
    exited.wait()
    registry = CollectorRegistry()
    registry.register(WorkerProcesses(lambda: {0: os.getpid(), 1: running.pid, 2: exited.pid}))
    yield generate_latest(registry).decode()
    running.kill()
    running.communicate()


def test_each_live_workers_memory_is_labelled_with_its_index(worker_scrape):
    assert metric(worker_scrape, "edgedistill_worker_resident_memory_bytes", worker="1") > 0


def test_each_workers_cpu_time_is_a_counter(worker_scrape):
    assert "# TYPE edgedistill_worker_cpu_seconds_total counter" in worker_scrape


def test_a_worker_that_exited_has_no_process_figures(worker_scrape):
    assert 'worker="2"' not in worker_scrape


def test_the_metrics_port_closes_a_connection_that_sends_no_request(monkeypatch):
    monkeypatch.setattr(exposition, "HTTP_TIMEOUT_S", 0.2)
    server = serve_http(Metrics().registry, "127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as silent:
            silent.sendall(b"GET /metrics HTTP/1.1\r\n")  # the request's first line, and nothing more
            assert silent.recv(1) == b""  # closed by the server, before this socket's own 5 s
    finally:
        stop_http(server)


def open_for(
    connection: socket.socket,
    seconds: float,
    start: bytes = b"GET /metrics HTTP/1.1\r\nHost: x\r\n",
    more: bytes = b"X-A: b\r\n",
) -> float:
    """Send `start` (a request's first line), then `more` (a header line) every 0.2 s (each read of the server's well
    within its own timeout) for up to `seconds`; how long the server kept the connection open."""
    started = time.monotonic()
    connection.settimeout(0.2)
    try:
        connection.sendall(start)
        while time.monotonic() - started < seconds:
            with contextlib.suppress(TimeoutError):
                if connection.recv(1) == b"":
                    break
            connection.sendall(more)
    except ConnectionError:
        pass
    return time.monotonic() - started


def test_the_metrics_port_closes_a_connection_that_trickles_its_request_past_the_limit(monkeypatch):
    monkeypatch.setattr(exposition, "HTTP_TIMEOUT_S", 0.5)
    server = serve_http(Metrics().registry, "127.0.0.1", 0)
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as slow:
            assert open_for(slow, 3) < 2
    finally:
        stop_http(server)


def test_a_connection_cut_mid_request_line_writes_nothing_but_json_lines_to_stderr(monkeypatch, capfd):
    monkeypatch.setattr(exposition, "HTTP_TIMEOUT_S", 0.5)
    server = serve_http(Metrics().registry, "127.0.0.1", 0)
    server.servers[0].daemon_threads = False  # `stop_http` then waits for the connection's thread, and all it writes
    try:
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5) as slow:
            open_for(slow, 3, start=b"GE", more=b"T")  # a request line that never ends
    finally:
        stop_http(server)
    assert [line for line in capfd.readouterr().err.splitlines() if not is_json_object(line)] == []


def is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def test_the_metrics_port_answers_a_request_sent_whole(monkeypatch):
    monkeypatch.setattr(exposition, "HTTP_TIMEOUT_S", 0.5)
    server = serve_http(Metrics().registry, "127.0.0.1", 0)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # past an http_proxy of the environment
    try:
        with direct.open(f"http://127.0.0.1:{server.server_port}/metrics", timeout=5) as reply:
            assert reply.status == 200
    finally:
        stop_http(server)


@pytest.mark.parametrize("loopback", ["127.0.0.1", pytest.param("[::1]", marks=ipv6_loopback)])
def test_a_localhost_metrics_port_answers_on_each_loopback_address(loopback):
    server = serve_http(Metrics().registry, "localhost", 0)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(f"http://{loopback}:{server.server_port}/metrics", timeout=5) as reply:
            assert reply.status == 200
    finally:
        stop_http(server)


@pytest.fixture
def stopped_localhost():
    """The metrics servers of `localhost`, on a free port, stopped."""
    server = serve_http(Metrics().registry, "localhost", 0)
    stop_http(server)
    return server


@ipv6_loopback
def test_a_stopped_localhost_metrics_port_is_free_again_on_both_loopback_addresses(stopped_localhost):
    check_http("localhost", stopped_localhost.server_port)  # SettingsError where either address still holds it


@ipv6_loopback
def test_a_stopped_localhost_metrics_port_leaves_no_server_thread_running(stopped_localhost):
    assert [thread.is_alive() for thread in stopped_localhost.threads] == [False, False]


@pytest.mark.parametrize("bind", [check_http, lambda host, port: serve_http(Metrics().registry, host, port)])
def test_a_taken_metrics_port_is_refused_naming_its_variables_and_flags(bind):
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        with pytest.raises(SettingsError) as caught:
            bind("127.0.0.1", other.getsockname()[1])
    assert "(EDGEDISTILL_METRICS_HOST and EDGEDISTILL_METRICS_PORT, flags --metrics-host and --metrics-port)" in str(
        caught.value
    )


WORKER_PIDS = (101, 102, 103)


@pytest.fixture
def worker_files(tmp_path, monkeypatch) -> WorkerFiles:
    """The metrics folder of workers WORKER_PIDS that exited, each after its own calls and batches, as
    prometheus-client's multiprocess mode writes them."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    for n, pid in enumerate(WORKER_PIDS, 1):
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda pid=pid: pid))
        worker = Metrics(shared=True)
        worker.set_model("tiny", "1", "onnxruntime", ["CPUExecutionProvider"])
        for _ in range(n):
            worker.observe_call("/edgedistill.v1.Classifier/Classify", grpc.StatusCode.OK, 0.002 * n)
        worker.observe_call("/edgedistill.v1.Classifier/Classify", grpc.StatusCode.INVALID_ARGUMENT, 0.0003)
        worker.batch_done(rows=4 * n, seconds=0.0001 * n)
        worker.queue_depth(n)
    return WorkerFiles(tmp_path)


def summed(files: MultiProcessCollector) -> dict:
    """Every counter and histogram sample a scrape gives: (name, labels) -> value."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in files.collect()
        if family.type in ("counter", "histogram")
        for sample in family.samples
    }


def test_retired_workers_counters_and_histograms_keep_their_sums(worker_files):
    before = summed(worker_files)
    for pid in WORKER_PIDS:
        worker_files.retire(pid)
    assert summed(worker_files) == pytest.approx(before)  # float sums, added in another order


def test_retired_workers_leave_one_file_of_each_kind(worker_files, tmp_path):
    for pid in WORKER_PIDS:
        worker_files.retire(pid)
    assert sorted(os.listdir(tmp_path)) == ["counter_retired.db", "histogram_retired.db"]


def test_a_retired_workers_queue_depth_leaves_the_sum(worker_files):
    worker_files.retire(WORKER_PIDS[0])
    depth = next(family for family in worker_files.collect() if family.name == "edgedistill_queue_depth")
    assert [sample.value for sample in depth.samples] == [2 + 3]


def test_a_retired_worker_whose_values_cannot_be_written_keeps_its_own_files_in_the_sums(worker_files, monkeypatch):
    def full_volume(filename):
        raise OSError(28, "No space left on device", filename)

    before = summed(worker_files)
    monkeypatch.setattr(exposition, "MmapedDict", full_volume)
    worker_files.retire(WORKER_PIDS[0])
    assert summed(worker_files) == pytest.approx(before)


def test_a_retired_worker_whose_sums_were_written_but_whose_folder_could_not_be_flushed_is_counted_once(
    worker_files, tmp_path, monkeypatch
):
    flush = atomic._fsync

    def failing_folder(path):
        if Path(path) == tmp_path:
            raise OSError(5, "Input/output error")
        flush(path)

    before = summed(worker_files)
    monkeypatch.setattr(atomic, "_fsync", failing_folder)
    worker_files.retire(WORKER_PIDS[0])
    assert summed(worker_files) == pytest.approx(before)


def test_a_full_volume_is_told_in_the_systems_words_not_the_pipelines_advice(worker_files, monkeypatch, caplog):
    def full_volume(self, *args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MmapedDict, "write_value", full_volume)
    worker_files.retire(WORKER_PIDS[0])
    assert "its own file stays: [Errno 28] No space left on device\n" in caplog.text


def visible(folder) -> set[str]:
    return {name for name in os.listdir(folder) if not name.startswith(".")}


@pytest.fixture
def retiring(worker_files, tmp_path, monkeypatch) -> tuple[dict, list[tuple[set[str], dict]]]:
    """The sums of a scrape of the metrics folder before worker WORKER_PIDS[0] retires, and as each kind of its values
    has been written for the retired workers' file, before that file is replaced: the visible files that appeared
    since that write began, and the sums of a scrape then. (before, [during])."""
    scrape = MultiProcessCollector(None, path=str(tmp_path))  # as another process's: the supervisor's own waits
    during = []

    class Watched(MmapedDict):
        def __init__(self, filename):
            self.shown = visible(tmp_path)
            super().__init__(filename)

        def close(self):
            super().close()
            during.append((visible(tmp_path) - self.shown, summed(scrape)))

    before = summed(scrape)
    monkeypatch.setattr(exposition, "MmapedDict", Watched)
    worker_files.retire(WORKER_PIDS[0])
    return before, during


def test_a_scrape_while_a_worker_retires_sums_its_values_once(retiring):
    before, during = retiring
    assert [sums == pytest.approx(before) for _, sums in during] == [True, True]


def test_the_retired_values_are_written_under_a_hidden_name(retiring):
    _, during = retiring
    assert [appeared for appeared, _ in during] == [set(), set()]


def test_a_retired_worker_whose_values_cannot_be_written_leaves_no_partial_file(worker_files, tmp_path, monkeypatch):
    def full_volume(self, *args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(MmapedDict, "write_value", full_volume)
    worker_files.retire(WORKER_PIDS[0])
    assert [name for name in os.listdir(tmp_path) if RETIRED in name] == []


@pytest.fixture
def reloaded_workers_scrape(tmp_path, monkeypatch) -> str:
    """The supervisor's scrape of two workers that served version 1 of a model, then reloaded onto version 2."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    for pid in WORKER_PIDS[:2]:
        monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda pid=pid: pid))
        worker = Metrics(shared=True)
        for version in ("1", "2"):
            worker.set_model("tiny", version, "onnxruntime", ["CPUExecutionProvider"])
    return generate_latest(workers_registry(WorkerFiles(tmp_path), dict)).decode()


def test_after_a_reload_the_workers_model_info_gives_only_the_served_model(reloaded_workers_scrape):
    samples = [line for line in reloaded_workers_scrape.splitlines() if line.startswith("edgedistill_model_info{")]
    assert samples == [
        'edgedistill_model_info{name="tiny",providers="CPUExecutionProvider",runtime="onnxruntime",version="2"} 1.0'
    ]


@pytest.fixture
def replaced_member_workers_scrape(tmp_path, monkeypatch) -> str:
    """The supervisor's scrape of a worker whose cascade member `teacher`, 2 rows queued, was replaced by a cascade of
    the same name whose members have other ids, then closed."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue(lambda: WORKER_PIDS[0]))
    worker = Metrics(shared=True)
    replaced = worker.member("tiny-cascade", "teacher")
    replaced.queue_depth(2)
    worker.member("tiny-cascade", "big-teacher").queue_depth(0)  # the new member's batcher starts
    replaced.closed()
    return generate_latest(workers_registry(WorkerFiles(tmp_path), dict)).decode()


def test_a_workers_replaced_member_reads_a_queue_depth_of_zero_in_the_supervisors_scrape(
    replaced_member_workers_scrape,
):
    depth = metric(replaced_member_workers_scrape, "edgedistill_cascade_member_queue_depth", member="teacher")
    assert depth == 0
