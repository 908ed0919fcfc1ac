"""WORKERS=N: worker processes on one port under a supervisor that sums their metrics, drains and reloads them all,
and restarts one that dies; WORKERS=1 stays one process."""

import contextlib
import errno
import fcntl
import importlib.util
import json
import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import grpc
import pytest
from edgedistill.common import cascade, machine
from edgedistill.common.cascade import served_bundles
from edgedistill.serve import workers
from edgedistill.serve.proto import classifier_pb2 as pb
from edgedistill.serve.proto import classifier_pb2_grpc
from edgedistill.serve.settings import Settings
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from tests.conftest import run_here, wait_until
from tests.serve import conftest
from tests.serve.conftest import ROOT, serve_command, subprocess_env, write_bundle, write_engine
from tests.serve.test_malloc import glibc_only
from tests.serve.test_operations import corrupt, metric
from tests.serve.test_ports import has_ipv6_loopback

needs_taskset = pytest.mark.skipif(
    shutil.which("taskset") is None, reason="needs taskset (util-linux) to run on one core"
)
LOCAL = [("grpc.use_local_subchannel_pool", 1)]  # a connection of its own: the kernel picks a worker per connection
CHANNELS = 16  # connections opened to find every worker: both are reached with probability 1 - 2**-15


def scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def answering_pids(port: int, channels: int = CHANNELS) -> list[tuple[int, str]]:
    """(pid, model version) from GetModelInfo over `channels` new connections, one Classify call on each."""
    found = []
    for _ in range(channels):
        with grpc.insecure_channel(f"127.0.0.1:{port}", options=LOCAL) as channel:
            stub = classifier_pb2_grpc.ClassifierStub(channel)
            # wait_for_ready: a connection refused or reset while a worker goes down is tried again, as clients do
            info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10, wait_for_ready=True)
            stub.Classify(pb.ClassifyRequest(texts=["a great movie"]), timeout=10)
            found.append((info.pid, info.version))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as status:
            return "State:\tZ" not in status.read()
    except FileNotFoundError:
        return False


def wait_for_restart(server) -> int:
    """The pid of the worker the supervisor started in place of one that died, once it serves."""
    wait_until(
        lambda: sum(line.get("event") == "serving" for line in server.lines) == 3,
        "the worker never came back",
        timeout=60,
    )
    return next(
        line["worker_pid"] for line in server.lines if line.get("event") == "worker_started" and line["restart"]
    )


@pytest.fixture(scope="module")
def spawn_once(tmp_path_factory):
    """`spawn` for a module's fixtures: its servers killed at the end of the module if still running, their temporary
    files in a folder of the module's."""
    folder = tmp_path_factory.mktemp("spawned")
    started = []

    def start(bundle, *flags, process_group: int | None = None, **env) -> conftest.ServerProcess:
        process = conftest.ServerProcess(bundle, *flags, process_group=process_group, **{"TMPDIR": str(folder)} | env)
        started.append(process)
        return process

    yield start
    for process in started:
        process.close()


def start_two_workers(spawn, folder: Path):
    """A supervisor with two workers on a bundle of its own written in `folder` (version 1): (process, its
    workers_serving line)."""
    write_bundle(folder)
    # METRICS_HOST as the deployments set it: the workers inherit it and run with their metrics port off
    server = spawn(folder, EDGEDISTILL_WORKERS="2", EDGEDISTILL_METRICS_HOST="127.0.0.1")
    server.folder = folder
    return server, server.wait_for("workers_serving", timeout=60)


@pytest.fixture
def two_workers(spawn, tmp_path):
    """`start_two_workers`, for a test that calls, stops, reloads or kills it."""
    return start_two_workers(spawn, tmp_path / "bundle")


@pytest.fixture(scope="module")
def two_workers_read(spawn_once, tmp_path_factory):
    """`start_two_workers`, shared by the module's tests that only call it and read what it maps and reports."""
    return start_two_workers(spawn_once, tmp_path_factory.mktemp("two-workers") / "bundle")


def test_two_workers_answer_on_one_port(two_workers_read):
    _, serving = two_workers_read
    pids = {pid for pid, _ in answering_pids(serving["port"])}
    assert pids == set(serving["workers"])


@pytest.mark.skipif(not has_ipv6_loopback(), reason="this machine has no IPv6 loopback (::1)")
def test_workers_on_localhost_answer_on_both_loopback_addresses(spawn, tmp_path):
    server = spawn(write_bundle(tmp_path / "bundle"), "--host", "localhost", EDGEDISTILL_WORKERS="2")
    serving = server.wait_for("workers_serving", timeout=60)
    answered = []
    for address in (f"127.0.0.1:{serving['port']}", f"[::1]:{serving['port']}"):
        with grpc.insecure_channel(address) as channel:
            info = classifier_pb2_grpc.ClassifierStub(channel).GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
            answered.append(info.pid in serving["workers"])
    assert answered == [True, True]


def test_the_metrics_endpoint_sums_over_the_workers(two_workers):
    _, serving = two_workers
    pids = [pid for pid, _ in answering_pids(serving["port"])]
    classified = metric(
        scrape(serving["metrics_port"]),
        "edgedistill_requests_total",
        method="/edgedistill.v1.Classifier/Classify",
        code="OK",
    )
    assert len(set(pids)) == 2
    assert classified == CHANNELS


def test_the_metrics_endpoint_gives_each_workers_memory(two_workers_read):
    _, serving = two_workers_read
    scraped = scrape(serving["metrics_port"])
    memory = [metric(scraped, "edgedistill_worker_resident_memory_bytes", worker=w) for w in ("0", "1")]
    assert all(rss > 10_000_000 for rss in memory)  # each holds Python, gRPC and ONNX Runtime


# the shared objects of ONNX Runtime and gRPC, as a process that imported them maps them
LIBRARIES = ["onnxruntime_pybind11_state", "cygrpc"]


def mapped(pid: int) -> str:
    return Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("library", LIBRARIES)
def test_the_supervisor_loads_no_library_of_the_request_path(two_workers_read, library):
    server, _ = two_workers_read
    assert library not in mapped(server.proc.pid)


@pytest.mark.parametrize("library", LIBRARIES)
def test_a_worker_loads_the_libraries_of_the_request_path(two_workers_read, library):
    _, serving = two_workers_read
    assert library in mapped(serving["workers"][0])


def test_sigterm_drains_every_worker_and_exits_zero(two_workers):
    server, serving = two_workers
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait(30) == 0
    assert server.wait_for("workers_stopped")["exit_status"] == 0
    stopped = {line["pid"] for line in server.lines if line.get("event") == "stopped"}
    assert stopped == set(serving["workers"])
    assert not [pid for pid in serving["workers"] if alive(pid)]


@pytest.fixture(scope="module")
def reflection_at_sigterm(spawn_once, tmp_path_factory):
    """Two workers with a grace of 30 s, sent SIGTERM while a reflection stream (one request answered) is held open
    on one of them: how the stream ended, and how long the supervisor took to exit."""
    bundle = write_bundle(tmp_path_factory.mktemp("reflection") / "bundle")
    server = spawn_once(bundle, EDGEDISTILL_WORKERS="2", EDGEDISTILL_SHUTDOWN_GRACE_S="30")
    port = server.wait_for("workers_serving", timeout=60)["port"]
    requests = queue.Queue()
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stream = reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
            iter(requests.get, None), timeout=90
        )
        requests.put(reflection_pb2.ServerReflectionRequest(list_services=""))
        next(stream)
        began = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(grpc.RpcError):  # the stream's end, read below
            list(stream)
        server.wait(60)
        exit_s = time.monotonic() - began
        requests.put(None)
    return {"details": stream.details(), "exit_s": exit_s}


def test_an_open_reflection_stream_does_not_hold_the_workers_drain_for_its_grace(reflection_at_sigterm):
    assert reflection_at_sigterm["exit_s"] < 10


def test_an_open_reflection_stream_is_told_to_open_a_new_one_when_the_workers_drain(reflection_at_sigterm):
    assert "open a new stream" in reflection_at_sigterm["details"]


def test_sighup_reloads_every_worker(two_workers):
    server, serving = two_workers
    write_bundle(server.folder, version="2")
    server.proc.send_signal(signal.SIGHUP)
    wait_until(
        lambda: sum(line.get("event") == "model_active" for line in server.lines) == 4,  # 2 at start, 2 reloads
        "not every worker reloaded",
        timeout=30,
    )
    answers = set(answering_pids(serving["port"]))
    assert answers == {(pid, "2") for pid in serving["workers"]}


@pytest.fixture(scope="module")
def reloaded_by_a_call(spawn_once, tmp_path_factory):
    """Two workers behind an admin token, whose bundle was written again and reloaded by a Reload call that reached one
    worker, after one naming a path: the server, its `workers_serving` line and the refused call's code."""
    folder = write_bundle(tmp_path_factory.mktemp("reloaded") / "bundle")
    server = spawn_once(folder, EDGEDISTILL_WORKERS="2", EDGEDISTILL_ADMIN_TOKEN="admin")
    serving = server.wait_for("workers_serving", timeout=60)
    write_bundle(folder, version="2")
    admin = [("authorization", "Bearer admin")]
    with grpc.insecure_channel(f"127.0.0.1:{serving['port']}") as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)
        with pytest.raises(grpc.RpcError) as refused:  # it would reach one worker only
            stub.Reload(pb.ReloadRequest(bundle_path=str(folder)), metadata=admin, timeout=30)
        stub.Reload(pb.ReloadRequest(), metadata=admin, timeout=30)
    wait_until(
        lambda: sum(line.get("event") == "model_active" for line in server.lines) == 4,  # 2 at start, 2 reloads
        "not every worker reloaded",
        timeout=30,
    )
    return server, serving, refused.value.code()


def test_a_reload_call_naming_a_path_is_refused_by_a_server_of_several_workers(reloaded_by_a_call):
    assert reloaded_by_a_call[2] == grpc.StatusCode.PERMISSION_DENIED


def test_a_reload_call_reloads_every_worker(reloaded_by_a_call):
    server, serving, _ = reloaded_by_a_call
    assert set(answering_pids(serving["port"])) == {(pid, "2") for pid in serving["workers"]}


def test_the_supervisor_logs_the_reload_call_it_relays_to_the_other_workers(reloaded_by_a_call):
    relayed = reloaded_by_a_call[0].wait_for("workers_reload")
    assert re.fullmatch(r"a Reload call to worker [01]", relayed["trigger"])


def test_a_worker_reloaded_by_the_supervisor_names_it_as_what_asked(reloaded_by_a_call):
    triggers = [line["trigger"] for line in reloaded_by_a_call[0].lines if line.get("event") == "reload_started"]
    assert workers.RELAYED in triggers


@pytest.fixture(scope="module")
def reload_root_with_several_workers(spawn_once, bundle, tmp_path_factory):
    """A supervisor of two workers given a reload root, once it exited: (process, its exit status)."""
    root = tmp_path_factory.mktemp("reload-root")
    server = spawn_once(
        bundle, EDGEDISTILL_WORKERS="2", EDGEDISTILL_ADMIN_TOKEN="admin", EDGEDISTILL_RELOAD_ROOT=str(root)
    )
    return server, server.wait(60)


def test_a_reload_root_with_several_workers_stops_the_server_with_status_2(reload_root_with_several_workers):
    _, status = reload_root_with_several_workers
    assert status == 2


def test_a_reload_root_with_several_workers_is_refused_naming_both(reload_root_with_several_workers):
    server, _ = reload_root_with_several_workers
    assert (
        "EDGEDISTILL_RELOAD_ROOT lets a Reload call name a bundle, which a server of 2 workers (EDGEDISTILL_WORKERS=2)"
        in server.wait_for("start_failed", timeout=60)["msg"]
    )


def test_sighup_while_the_workers_start_reloads_them_once_they_serve(spawn, bundle):
    server = spawn(bundle, EDGEDISTILL_WORKERS="2")
    server.wait_for("supervising", timeout=30)
    server.proc.send_signal(signal.SIGHUP)  # before any worker can handle it
    server.wait_for("workers_serving", timeout=60)
    wait_until(
        lambda: sum(line.get("event") == "model_active" for line in server.lines) == 4,
        "a worker never reloaded",
        timeout=30,
    )
    assert server.proc.poll() is None


def test_a_worker_that_dies_is_restarted_while_the_other_serves(two_workers):
    server, serving = two_workers
    killed, survivor = serving["workers"]
    os.kill(killed, signal.SIGKILL)
    wait_until(lambda: not alive(killed), "the killed worker lives on", timeout=10)
    # new connections go to the listener still open (and to the replacement, once it listens)
    answers = {pid for pid, _ in answering_pids(serving["port"])}
    assert killed not in answers
    assert survivor in answers
    restarted = wait_for_restart(server)
    assert {pid for pid, _ in answering_pids(serving["port"])} == {survivor, restarted}
    assert server.proc.poll() is None


def test_a_dead_workers_metrics_files_go_and_its_calls_stay_counted(two_workers, tmp_path):
    server, serving = two_workers
    answering_pids(serving["port"])
    killed = serving["workers"][0]
    os.kill(killed, signal.SIGKILL)
    wait_for_restart(server)
    calls = metric(
        scrape(serving["metrics_port"]),
        "edgedistill_requests_total",
        method="/edgedistill.v1.Classifier/Classify",
        code="OK",
    )
    files = [path.name for path in tmp_path.glob("edgedistill-metrics-*/*")]
    assert [name for name in files if name.endswith(f"_{killed}.db")] == []
    assert calls == CHANNELS


def test_a_restarted_worker_takes_connections_only_once_warm(two_workers):
    server, serving = two_workers
    os.kill(serving["workers"][0], signal.SIGKILL)
    restarted = wait_for_restart(server)
    events = [line["event"] for line in server.lines if line.get("pid") == restarted]
    assert events.index("listening") > events.index("model_active")


def test_the_workers_die_with_the_supervisor(two_workers):
    server, serving = two_workers
    server.proc.send_signal(signal.SIGKILL)
    wait_until(
        lambda: not any(alive(pid) for pid in serving["workers"]), "a worker outlived its supervisor", timeout=30
    )


@pytest.fixture(scope="module")
def no_worker_can_serve(spawn_once, tmp_path_factory):
    """A supervisor of two workers on a bundle none can serve, once it exited: (process, its exit status)."""
    server = spawn_once(corrupt(write_bundle(tmp_path_factory.mktemp("corrupt") / "bundle")), EDGEDISTILL_WORKERS="2")
    return server, server.wait(60)


def test_a_bundle_no_worker_can_serve_stops_the_supervisor_with_status_2(no_worker_can_serve):
    server, status = no_worker_can_serve
    assert status == 2
    assert server.wait_for("workers_stopping")["exit_status"] == 2
    assert server.wait_for("workers_stopped")["exit_status"] == 2


def test_the_supervisors_stopping_line_gives_why_in_a_field_of_its_own(no_worker_can_serve):
    server, _ = no_worker_can_serve
    assert "before it served" in server.wait_for("workers_stopping")["reason"]


# `python -m edgedistill.serve` whose supervisor starts its first worker stopped (SIGSTOP, before it runs Python):
# killed while so, it has surely not served, however long the test takes to kill it (a worker serves 0.9 s after its
# start: a stall of the test as long let it serve, and the supervisor restarted it instead of stopping)
FIRST_WORKER_STOPPED = """
import runpy
from edgedistill.serve import workers

command, started = workers.Supervisor._command, []

def first_stopped(self):
    started.append(command(self))
    return started[-1] if len(started) > 1 else ["sh", "-c", 'kill -STOP $$; exec "$@"', "sh", *started[-1]]

workers.Supervisor._command = first_stopped
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def killed_while_starting(spawn_once, bundle):
    """A supervisor of two workers, the first killed by SIGKILL (as the out-of-memory killer kills) before it served."""
    with pytest.MonkeyPatch.context() as monkeypatch:  # the command the server is started with
        monkeypatch.setattr(
            conftest,
            "serve_command",
            lambda *args: [sys.executable, "-c", FIRST_WORKER_STOPPED, *serve_command(*args)[3:]],
        )
        server = spawn_once(bundle, EDGEDISTILL_WORKERS="2")
    os.kill(server.wait_for("worker_started", timeout=60)["worker_pid"], signal.SIGKILL)
    server.wait(60)
    return server


def test_a_worker_killed_before_it_served_stops_the_supervisor_with_128_plus_the_signal(killed_while_starting):
    assert killed_while_starting.proc.returncode == 128 + signal.SIGKILL


def test_a_worker_killed_by_a_signal_is_logged_with_the_signal(killed_while_starting):
    assert killed_while_starting.wait_for("worker_exited")["signal"] == "SIGKILL"


@pytest.fixture(scope="module")
def interrupted_while_starting(spawn_once, bundle):
    """A supervisor of two workers given SIGINT, as Ctrl-C gives it to the terminal's whole process group (at once: a
    worker the supervisor stops first has exited before a later signal of its own), once both workers started and
    before they serve."""
    server = spawn_once(bundle, process_group=0, EDGEDISTILL_WORKERS="2")
    wait_until(
        lambda: sum(line.get("event") == "worker_started" for line in server.lines) == 2,
        "the workers never started",
        timeout=60,
    )
    os.killpg(server.proc.pid, signal.SIGINT)
    server.wait(60)
    return server


def test_ctrl_c_while_the_workers_start_exits_zero(interrupted_while_starting):
    assert interrupted_while_starting.proc.returncode == 0, interrupted_while_starting.lines[-8:]


def test_ctrl_c_while_the_workers_start_logs_their_exits_at_info(interrupted_while_starting):
    exits = [line for line in interrupted_while_starting.lines if line.get("event") == "worker_exited"]
    assert [line["level"] for line in exits] == ["INFO", "INFO"], exits


def test_a_worker_starts_with_sigint_blocked(bundle, tmp_path, monkeypatch):
    said = tmp_path / "blocked"
    code = "import signal, sys; open(sys.argv[1], 'w').write(str(signal.SIGINT in signal.pthread_sigmask(0, [])))"
    monkeypatch.setattr(workers.Supervisor, "_command", lambda self: [sys.executable, "-c", code, str(said)])
    supervisor = workers.Supervisor(conftest.settings_for(bundle, workers=2), [], 2, cascade.ServedModels.read(bundle))
    try:
        supervisor._start(0).proc.wait(30)
    finally:
        supervisor._close()
    assert said.read_text() == "True"


def test_a_sigint_held_while_a_worker_is_started_is_taken_after_not_lost():
    caught = []
    previous = signal.signal(signal.SIGINT, lambda number, frame: caught.append(number))
    try:
        with workers.sigint_held():
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # to this thread: others do not block it
            held = list(caught)
        assert (held, caught) == ([], [signal.SIGINT]), "(during the start, after it)"
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_held_while_a_worker_starts_ends_it_with_status_0_once_its_handler_is_set():
    code = (
        "import os, signal; signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT}); "
        "os.kill(os.getpid(), signal.SIGINT); "
        "from edgedistill.serve.__main__ import hold_signals; hold_signals(); raise SystemExit(3)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=60).returncode == 0


@pytest.fixture
def reaped_after_ctrl_c(bundle):
    """A supervisor that finds a worker gone before it served (exit 0, as a worker stopped by Ctrl-C while it starts
    exits) while the SIGINT the same Ctrl-C gave the supervisor is caught but not yet handled: it reaps the worker."""
    supervisor = workers.Supervisor(conftest.settings_for(bundle, workers=2), [], 2, cascade.ServedModels.read(bundle))
    try:
        read, write = os.pipe()
        os.close(write)
        proc = subprocess.Popen([sys.executable, "-c", "pass"])
        proc.wait()
        supervisor.workers.append(workers.Worker(0, proc, os.fdopen(read, "rb", buffering=0), time.monotonic() + 60))
        supervisor.received.append(signal.SIGINT)
        supervisor._reap()
        yield supervisor
    finally:
        supervisor._close()


def test_a_worker_gone_while_the_supervisors_ctrl_c_waits_to_be_handled_counts_as_drained(reaped_after_ctrl_c):
    assert reaped_after_ctrl_c.exit_status == 0


@pytest.fixture(scope="module")
def killed_while_draining(spawn_once, tmp_path_factory):
    """A supervisor of two workers sent SIGTERM, its first worker (stopped, so that it cannot drain first) then killed
    by SIGKILL: (process, the killed worker's pid, the other worker's)."""
    server, serving = start_two_workers(spawn_once, tmp_path_factory.mktemp("draining") / "bundle")
    killed, drained = serving["workers"]
    os.kill(killed, signal.SIGSTOP)
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for("workers_stopping")
    os.kill(killed, signal.SIGKILL)
    server.wait(60)
    return server, killed, drained


def exit_line(server, pid: int) -> dict:
    return next(line for line in server.lines if line.get("event") == "worker_exited" and line["worker_pid"] == pid)


def test_a_worker_killed_while_the_workers_drain_gives_the_supervisor_its_status(killed_while_draining):
    server, _, _ = killed_while_draining
    assert server.proc.returncode == 128 + signal.SIGKILL


def test_a_worker_killed_while_the_workers_drain_is_logged_as_an_error_with_its_signal(killed_while_draining):
    server, killed, _ = killed_while_draining
    line = exit_line(server, killed)
    assert (line["level"], line["signal"]) == ("ERROR", "SIGKILL")


def test_a_worker_that_drains_logs_its_exit_at_info(killed_while_draining):
    server, _, drained = killed_while_draining
    assert exit_line(server, drained)["level"] == "INFO"


# `python -m edgedistill.serve` whose supervisor can start two worker processes and no more, as under a pids limit
TWO_PROCESSES = """
import errno, runpy, subprocess, types
from edgedistill.serve import workers

started = []

def popen(*args, **kwargs):
    if len(started) == 2:
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
    started.append(subprocess.Popen(*args, **kwargs))
    return started[-1]

workers.subprocess = types.SimpleNamespace(Popen=popen)
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


@pytest.fixture(scope="module")
def restart_without_a_process(spawn_once, bundle):
    """Two workers under a supervisor that cannot start a third process, one of them killed: (the supervisor, the
    pid of the worker left)."""
    with pytest.MonkeyPatch.context() as monkeypatch:  # the command the server is started with
        monkeypatch.setattr(
            conftest, "serve_command", lambda *args: [sys.executable, "-c", TWO_PROCESSES, *serve_command(*args)[3:]]
        )
        server = spawn_once(bundle, EDGEDISTILL_WORKERS="2")
    killed, survivor = server.wait_for("workers_serving", timeout=60)["workers"]
    os.kill(killed, signal.SIGKILL)
    server.wait(60)
    return server, survivor


def test_a_worker_that_cannot_be_restarted_stops_the_supervisor_with_status_71(restart_without_a_process):
    server, _ = restart_without_a_process
    assert server.proc.returncode == 71


def test_a_worker_that_cannot_be_restarted_is_logged_with_the_errno(restart_without_a_process):
    server, _ = restart_without_a_process
    assert server.wait_for("worker_restart_failed")["errno"] == "EAGAIN"


def test_a_worker_that_cannot_be_restarted_lets_the_others_drain(restart_without_a_process):
    server, survivor = restart_without_a_process
    drained = [(line["pid"], line["cut_calls"]) for line in server.lines if line.get("event") == "stopped"]
    assert drained == [(survivor, 0)]


def test_a_worker_that_cannot_be_restarted_kills_no_worker(restart_without_a_process):
    server, _ = restart_without_a_process
    assert not [line for line in server.lines if line.get("event") in ("worker_killed", "start_failed")]


def started_on_a_held_port(spawn, bundle: Path, workers: str) -> tuple[conftest.ServerProcess, int]:
    """A server of `workers` started on a port another process listens on, once it exited, and that port."""
    with socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that would share it
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        server = spawn(bundle, "--host", "127.0.0.1", "--port", str(port), EDGEDISTILL_WORKERS=workers)
        server.wait(60)
    return server, port


@pytest.fixture(scope="module", params=["1", "2"], ids=["one process", "supervisor"])
def on_a_held_port(request, spawn_once, bundle):
    """A server (one process, or a supervisor of two workers) started on a port another process listens on, and
    that port."""
    return started_on_a_held_port(spawn_once, bundle, request.param)


def test_a_port_held_by_another_process_is_refused_not_shared(on_a_held_port):
    server, _ = on_a_held_port
    assert server.proc.returncode == 2


def test_a_port_held_by_another_process_is_refused_naming_why(on_a_held_port):
    server, port = on_a_held_port
    named = "(EDGEDISTILL_HOST and EDGEDISTILL_PORT, flags --host and --port)"
    assert server.wait_for("start_failed")["msg"].endswith(
        f"cannot bind the gRPC port 127.0.0.1:{port} {named}: Address already in use"
    )


def test_one_server_process_refuses_a_port_in_use_before_it_loads_its_bundle(spawn, tmp_path):
    server, _ = started_on_a_held_port(spawn, corrupt(write_bundle(tmp_path / "bundle")), "1")
    assert "Address already in use" in server.wait_for("start_failed")["msg"]  # not the bundle's damage


def test_a_port_held_by_another_process_is_refused_in_json_lines_alone(on_a_held_port):
    server, _ = on_a_held_port
    assert [line["msg"] for line in server.lines if line.get("event") == "unstructured"] == []


@pytest.fixture(scope="module")
def on_a_held_metrics_port(spawn_once, bundle):
    """`on_a_held_metrics_port(workers)`: a server of `workers` ("1": one process, "2": a supervisor of two) started
    with its metrics port on a port another process listens on, exited: (process, its exit status); started once for
    the module's tests of that count."""
    started = {}

    def start(count: str) -> tuple[conftest.ServerProcess, int]:
        if count not in started:
            with socket.socket() as other:
                other.bind(("127.0.0.1", 0))
                other.listen()
                server = spawn_once(bundle, "--metrics-port", str(other.getsockname()[1]), EDGEDISTILL_WORKERS=count)
                started[count] = server, server.wait(60)
        return started[count]

    return start


@pytest.mark.parametrize("count", ["1", "2"], ids=["one process", "supervisor"])
def test_a_metrics_port_in_use_is_refused_naming_its_variable(on_a_held_metrics_port, count):
    server, status = on_a_held_metrics_port(count)
    assert status == 2
    assert "EDGEDISTILL_METRICS_PORT" in server.wait_for("start_failed")["msg"]


def test_one_server_process_refuses_a_metrics_port_in_use_before_it_loads_its_bundle(on_a_held_metrics_port):
    server, _ = on_a_held_metrics_port("1")
    assert "backend_ready" not in [line.get("event") for line in server.lines]


def test_a_metrics_port_in_use_leaves_no_line_after_the_refusal(on_a_held_metrics_port):
    server, _ = on_a_held_metrics_port("1")
    assert server.lines[-1]["event"] == "start_failed"


def test_the_health_port_is_shared_by_the_workers(spawn, bundle):
    server = spawn(bundle, "--health-port", "0", EDGEDISTILL_WORKERS="2")
    server.wait_for("workers_serving", timeout=60)
    port = server.wait_for("supervising")["health_port"]
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=LOCAL) as channel:
        status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5).status
    assert status == health_pb2.HealthCheckResponse.SERVING


def test_one_worker_is_one_process_without_a_supervisor(spawn, bundle):
    server = spawn(bundle, EDGEDISTILL_WORKERS="1")
    assert server.wait_for("serving")["pid"] == server.proc.pid
    assert not [line for line in server.lines if line.get("event") == "supervising"]


@pytest.fixture(scope="module")
def start_timeout_on_one_core(bundle) -> subprocess.CompletedProcess:
    """A server given START_TIMEOUT_S and WORKERS=0, run on one core (taskset): one process, with no supervisor."""
    core = str(min(os.sched_getaffinity(0)))
    environ = subprocess_env(EDGEDISTILL_WORKERS="0", EDGEDISTILL_START_TIMEOUT_S="600")
    command = ["taskset", "-c", core, *serve_command(bundle, "--metrics-port", "0")]
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


@needs_taskset
def test_a_start_timeout_where_workers_0_comes_to_one_process_exits_2(start_timeout_on_one_core):
    assert start_timeout_on_one_core.returncode == 2


@needs_taskset
def test_a_start_timeout_where_workers_0_comes_to_one_process_is_refused_saying_why(start_timeout_on_one_core):
    refusal = "EDGEDISTILL_WORKERS=0 resolved to one process on this machine (one usable core)"
    assert refusal in json.loads(start_timeout_on_one_core.stderr.splitlines()[-1])["msg"]


@pytest.fixture(scope="module", params=["x", "1:2:3", f"{os.getpid()}:999999"], ids=["word", "three parts", "no pipe"])
def posing_as_a_worker(request, bundle) -> subprocess.CompletedProcess:
    """A server started with SERVE_SUPERVISOR set by hand, to a value no supervisor sets."""
    environ = subprocess_env(SERVE_SUPERVISOR=request.param)
    return subprocess.run(serve_command(bundle), cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


@pytest.fixture(scope="module")
def glibc_limit_not_in_decimal(bundle, tmp_path_factory) -> subprocess.CompletedProcess:
    """A supervisor of two workers started with MALLOC_ARENA_MAX=08 (octal to glibc, which ignores it), run to its
    exit."""
    environ = subprocess_env(
        EDGEDISTILL_WORKERS="2", MALLOC_ARENA_MAX="08", TMPDIR=str(tmp_path_factory.mktemp("glibc-limit"))
    )
    command = serve_command(bundle, "--metrics-port", "0")
    return subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)


@glibc_only
def test_a_glibc_arena_limit_not_in_decimal_stops_a_supervisor_with_status_2(glibc_limit_not_in_decimal):
    assert glibc_limit_not_in_decimal.returncode == 2


@glibc_only
def test_a_glibc_arena_limit_not_in_decimal_is_refused_once_for_all_the_workers(glibc_limit_not_in_decimal):
    assert glibc_limit_not_in_decimal.stderr.count("MALLOC_ARENA_MAX is '08': write a positive whole number") == 1


@glibc_only
def test_a_glibc_arena_limit_not_in_decimal_is_refused_before_any_worker_starts(glibc_limit_not_in_decimal):
    events = [json.loads(line).get("event") for line in glibc_limit_not_in_decimal.stderr.splitlines()]
    assert "worker_started" not in events


def test_a_supervisor_variable_set_by_hand_exits_2(posing_as_a_worker):
    assert posing_as_a_worker.returncode == 2


def test_a_supervisor_variable_set_by_hand_is_refused_in_one_line(posing_as_a_worker):
    assert len(posing_as_a_worker.stderr.splitlines()) == 1


def test_a_supervisor_variable_set_by_hand_is_refused_saying_to_unset_it(posing_as_a_worker):
    refusal = "SERVE_SUPERVISOR=.* is not a supervisor's '<pid>:<pipe>'.*: the variable is internal to the server's supervisor"
    assert re.search(refusal + ", which sets it for its workers; unset it", posing_as_a_worker.stderr)


@pytest.mark.parametrize(
    ("cores", "memory_mb", "model_mb", "expected"),
    [(16, 64_000, 10, 16), (16, 3000, 10, 4), (2, 64_000, 10, 2), (16, 300, 100, 1)],
    ids=["one per core", "capped by memory", "two cores", "at least one"],
)
def test_workers_0_is_one_per_core_capped_by_memory(monkeypatch, tmp_path, cores, memory_mb, model_mb, expected):
    folder = write_bundle(tmp_path / "bundle", model=b"\0" * (model_mb << 20))
    monkeypatch.setattr(workers, "usable_cores", lambda: cores)
    monkeypatch.setattr(workers, "usable_memory", lambda: memory_mb << 20)
    assert workers.worker_count(Settings(bundle=folder)) == expected  # 732 MiB each: 200, 2 x 10, 256 x 2 x 1 MiB


@pytest.mark.parametrize(("rpcs", "expected"), [(64, 4), (256, 2)], ids=["64 calls", "256 calls"])
def test_workers_0_counts_each_workers_stalled_calls_against_memory(monkeypatch, tmp_path, rpcs, expected):
    folder = write_bundle(tmp_path / "bundle")
    monkeypatch.setattr(workers, "usable_cores", lambda: 16)
    monkeypatch.setattr(workers, "usable_memory", lambda: 1500 << 20)  # 200 MiB a worker, 2 MiB a stalled call
    assert workers.worker_count(Settings(bundle=folder, max_concurrent_rpcs=rpcs)) == expected


@pytest.mark.parametrize(("memory_mb", "warned"), [(300, True), (64_000, False)], ids=["short", "enough"])
def test_workers_set_by_hand_beyond_the_usable_memory_are_started_with_a_warning(
    monkeypatch, tmp_path, caplog, memory_mb, warned
):
    folder = write_bundle(tmp_path / "bundle")
    monkeypatch.setattr(workers, "usable_memory", lambda: memory_mb << 20)
    with caplog.at_level(logging.WARNING, logger="serve"):
        assert workers.worker_count(Settings(bundle=folder, workers=2)) == 2
    assert any(getattr(r, "event", None) == "workers_exceed_memory" for r in caplog.records) == warned


@pytest.mark.parametrize(
    ("threads", "count", "warned"),
    [(2, 2, True), (1, 2, False), (0, 4, True), (0, 2, False), (0, 1, False)],
    ids=["threads by hand", "one each", "workers above the cores", "one per core", "one process"],
)
def test_threads_beyond_the_usable_cores_over_all_the_workers_are_warned_of(
    monkeypatch, tmp_path, caplog, threads, count, warned
):
    monkeypatch.setattr(workers, "usable_cores", lambda: 2)  # a machine of two cores, no CPU quota
    monkeypatch.setattr(workers, "affinity_cores", lambda: 2)
    settings = Settings(bundle=write_bundle(tmp_path / "bundle"), threads=threads)
    with caplog.at_level(logging.WARNING, logger="serve"):
        workers.warn_oversubscribed(settings, count, cascade.ServedModels.read(settings.bundle))
    assert any(getattr(r, "event", None) == "threads_exceed_cores" for r in caplog.records) == warned


def test_a_supervisors_start_reads_the_bundles_manifests_once(monkeypatch, tmp_path):
    reads = []

    def counted(folder):
        reads.append(folder)
        return served_bundles(folder)

    monkeypatch.setattr(cascade, "served_bundles", counted)
    monkeypatch.setattr(workers, "supervise", lambda *args: 0)  # stands in for the Supervisor, which reads none
    monkeypatch.setattr(workers, "usable_memory", lambda: 64_000 << 20)
    run_here("serve", "--bundle", write_bundle(tmp_path / "bundle"), "--workers", "2")
    assert len(reads) == 1


def test_a_supervisor_of_tensorrt_engines_refuses_to_start_workers_without_onnx_runtime(monkeypatch, tmp_path):
    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else find(name, *a))
    settings = Settings(bundle=write_engine(tmp_path / "engine"), host="127.0.0.1", port=0)
    with pytest.raises(ModuleNotFoundError) as refused:  # every worker imports it (common.runtime), an engine's too
        workers.Supervisor(settings, [], 2, cascade.ServedModels.read(settings.bundle))._close()
    assert refused.value.name == "onnxruntime"


def test_a_supervisor_given_its_bundles_models_reads_no_manifest(monkeypatch, tmp_path):
    monkeypatch.setattr(cascade, "served_bundles", lambda folder: pytest.fail(f"{folder} read again"))
    settings = Settings(bundle=tmp_path / "gone", host="127.0.0.1", port=0)
    supervisor = workers.Supervisor(settings, [], 2, cascade.ServedModels(model_bytes=1, onnx_runtime=False))
    supervisor._close()
    assert supervisor.threads is None  # no model on ONNX Runtime, as given


# A server on 4 cores of its affinity whose cgroup allows `quota` CPUs (None: no quota).
UNDER_QUOTA = """
import os, runpy, sys
import edgedistill.common.machine as machine

os.sched_getaffinity = lambda pid: set(range(4))
machine.cpu_quota = lambda *cgroup: {quota}
sys.argv = ["serve", *sys.argv[1:]]
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


def backend_threads(bundle, quota: int | None) -> int:
    """The intra-op threads a single server process (WORKERS=1, THREADS=0) gives its runtime, from its log."""
    command = [sys.executable, "-c", UNDER_QUOTA.format(quota=quota), *serve_command(bundle)[3:], "--threads", "0"]
    command += ["--metrics-port", "off"]
    proc = subprocess.Popen(command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        for line in proc.stdout:
            entry = json.loads(line)
            if entry.get("event") == "backend_ready":
                return entry["threads"]
        raise AssertionError("no backend_ready log line")
    finally:
        proc.kill()
        proc.wait(10)


def test_one_process_under_a_cpu_quota_runs_as_many_intra_op_threads_as_the_quota_has_cpus(bundle):
    assert backend_threads(bundle, quota=2) == 2


def test_one_process_without_a_cpu_quota_leaves_the_intra_op_threads_to_the_runtime(bundle):
    assert backend_threads(bundle, quota=None) == 0


def test_one_process_under_a_cpu_quota_on_a_tensorrt_engine_is_not_refused_for_threads_it_was_not_given(tmp_path):
    engine = write_engine(tmp_path / "engine")
    command = [sys.executable, "-c", UNDER_QUOTA.format(quota=2), *serve_command(engine)[3:], "--metrics-port", "off"]
    result = subprocess.run(command, cwd=ROOT, env=subprocess_env(), capture_output=True, text=True, timeout=60)
    refusal = json.loads(result.stderr.strip().splitlines()[-1])
    assert "EDGEDISTILL_THREADS" not in refusal["msg"]


def test_workers_share_the_usable_cores_as_intra_op_threads(spawn, bundle):
    server = spawn(bundle, EDGEDISTILL_WORKERS="2")
    server.wait_for("workers_serving", timeout=60)
    threads = [line["threads"] for line in server.lines if line.get("event") == "backend_ready"]
    assert threads == [max(1, machine.usable_cores() // 2)] * 2


def test_a_supervisor_of_tensorrt_engine_workers_gives_no_intra_op_thread_count(spawn, tmp_path):
    server = spawn(write_engine(tmp_path / "engine"), EDGEDISTILL_WORKERS="2")
    assert server.wait_for("supervising", timeout=30)["threads"] is None


def test_a_supervisor_of_onnx_workers_gives_their_intra_op_threads(spawn, bundle):
    server = spawn(bundle, EDGEDISTILL_WORKERS="2", EDGEDISTILL_THREADS="3")
    assert server.wait_for("supervising", timeout=30)["threads"] == 3


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
    monkeypatch.setattr(workers.tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_a_killed_supervisors_metrics_folder_is_removed_by_the_next_start(temp_root):
    left = temp_root / "edgedistill-metrics-abc"  # no process holds its lock
    left.mkdir()
    workers.MetricsFolder().remove()
    assert not left.exists()


def test_a_metrics_folder_removed_by_its_supervisor_as_a_start_looks_at_it_is_passed_over(temp_root, monkeypatch):
    stopping = temp_root / "edgedistill-metrics-abc"
    stopping.mkdir()

    class VanishingPath(type(temp_root)):
        """A path whose folder `stopping` its supervisor removes right after a start first looks at it."""

        def stat(self, *, follow_symlinks=True):
            found = super().stat(follow_symlinks=follow_symlinks)
            if self == stopping and os.path.isdir(self):
                os.rmdir(self)
            return found

    monkeypatch.setattr(workers, "Path", VanishingPath)
    folder = workers.MetricsFolder()
    made = folder.path.is_dir()
    folder.remove()
    assert made


def test_a_metrics_folder_a_live_supervisor_locks_is_kept_whatever_its_pid(temp_root):
    running = temp_root / "edgedistill-metrics-abc"
    running.mkdir()
    held = os.open(running, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a supervisor in another container holds it, pid 1 in its own namespace
    workers.MetricsFolder().remove()
    os.close(held)
    assert running.exists()


def test_a_new_metrics_folder_another_start_removed_before_it_was_locked_is_made_again(temp_root, monkeypatch):
    made, mkdtemp = [], tempfile.mkdtemp

    def mkdtemp_then_another_start(*args, **kwargs):
        path = mkdtemp(*args, **kwargs)
        made.append(path)
        if len(made) == 1:  # another start globs now, finds it unlocked and takes it for a dead supervisor's
            workers._remove_unheld(Path(path))
        return path

    monkeypatch.setattr(workers.tempfile, "mkdtemp", mkdtemp_then_another_start)
    folder = workers.MetricsFolder()
    kept = folder.path.is_dir()
    folder.remove()
    assert kept


def test_a_new_metrics_folder_is_locked_while_its_supervisor_lives(temp_root):
    folder = workers.MetricsFolder()
    other = os.open(folder.path, os.O_RDONLY | os.O_DIRECTORY)
    with pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.close(other)
    folder.remove()


def test_a_removed_metrics_folder_is_gone(temp_root):
    folder = workers.MetricsFolder()
    folder.remove()
    assert not folder.path.exists()


def test_a_worker_process_that_cannot_be_made_leaves_no_descriptor_open(bundle, temp_root, monkeypatch):
    def no_process(*args, **kwargs):
        raise OSError(errno.EAGAIN, "Resource temporarily unavailable")

    supervisor = workers.Supervisor(
        Settings(bundle=bundle, host="127.0.0.1", port=0), [], 2, cascade.ServedModels.read(bundle)
    )
    monkeypatch.setattr(workers.subprocess, "Popen", no_process)
    made = []  # the pipe's inode, by which its ends are told from descriptors other threads open and close meanwhile
    real_pipe = os.pipe

    def pipe():
        ends = real_pipe()
        made.append(os.fstat(ends[0]).st_ino)
        return ends

    with monkeypatch.context() as patched, contextlib.suppress(OSError):
        patched.setattr(workers.os, "pipe", pipe)
        supervisor._start(0)
    supervisor._close()
    assert made and not set(made) & open_inodes()


def open_inodes() -> set[int]:
    """The inodes this process's open descriptors refer to (a pipe's ends share one)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # closed since it was listed
            inodes.add(os.stat(f"/proc/self/fd/{fd}").st_ino)
    return inodes


@pytest.fixture
def worker_that_never_serves(bundle, temp_root, monkeypatch, caplog):
    """A supervisor (START_TIMEOUT_S 1 s) of one worker that sleeps instead of loading its model, as one hung in a
    mount's read: (its exit status, the seconds it ran, its log records)."""
    settings = Settings(bundle=bundle, host="127.0.0.1", port=0, metrics_port=None, start_timeout_s=1)
    supervisor = workers.Supervisor(settings, [], 1, cascade.ServedModels.read(bundle))
    monkeypatch.setattr(supervisor, "_command", lambda: [sys.executable, "-c", "import time; time.sleep(60)"])
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="serve"):
        status = supervisor.run()
    return status, time.monotonic() - began, caplog.records


def test_a_worker_that_never_serves_stops_the_supervisor_with_a_failure_status(worker_that_never_serves):
    status, _, _ = worker_that_never_serves
    assert status == 128 + signal.SIGKILL


def test_a_worker_that_never_serves_is_killed_soon_after_the_start_timeout(worker_that_never_serves):
    _, seconds, _ = worker_that_never_serves
    assert seconds < 10


def test_a_worker_that_never_serves_is_logged_naming_the_start_timeout_setting(worker_that_never_serves):
    _, _, records = worker_that_never_serves
    (timeout,) = [record for record in records if getattr(record, "event", None) == "worker_start_timeout"]
    assert "EDGEDISTILL_START_TIMEOUT_S" in timeout.getMessage()


STUCK_S = 30.0  # how long the worker below stays asleep in the kernel after SIGKILL


class UnkillableProcess:
    """Stands in for a worker's `subprocess.Popen` whose process sleeps in the kernel (a hung mount, a GPU driver):
    it ignores every signal, SIGKILL too, until it exits STUCK_S after its start."""

    def __init__(self, *args, **kwargs):
        self.pid = os.getpid()  # a pid that exists, for the supervisor's log lines and metrics files
        self.returncode = None
        self.exits_at = time.monotonic() + STUCK_S

    def poll(self) -> int | None:
        if time.monotonic() >= self.exits_at:
            self.returncode = -signal.SIGKILL
        return self.returncode

    def send_signal(self, number: int) -> None:
        pass

    def kill(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> int:
        left = self.exits_at - time.monotonic()
        if timeout is not None and timeout < left:
            time.sleep(timeout)
            raise subprocess.TimeoutExpired("worker", timeout)
        time.sleep(max(0.0, left))
        return self.poll()


@pytest.mark.serial  # a bound on time
def test_a_worker_that_sigkill_cannot_end_does_not_hold_the_supervisors_exit(bundle, temp_root, monkeypatch):
    settings = Settings(
        bundle=bundle, host="127.0.0.1", port=0, metrics_port=None, start_timeout_s=1, shutdown_grace_s=0
    )
    monkeypatch.setattr(workers, "STOP_MARGIN_S", 0.0)
    monkeypatch.setattr(workers.subprocess, "Popen", UnkillableProcess)
    began = time.monotonic()
    workers.Supervisor(settings, [], 1, cascade.ServedModels.read(bundle)).run()
    assert time.monotonic() - began < STUCK_S / 3


def test_one_process_where_the_system_gives_no_affinity_leaves_the_intra_op_threads_to_the_runtime(monkeypatch):
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)  # as on macOS
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    monkeypatch.setattr(machine, "cpu_quota", lambda *cgroup: None)
    assert workers.intra_op_threads(0, 1) == 0


@pytest.mark.parametrize(("count", "expected"), [(1, 4), (2, 2), (8, 1)])
def test_workers_under_a_cpu_quota_share_its_cpus_as_intra_op_threads(monkeypatch, count, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(machine, "cpu_quota", lambda *cgroup: 4)
    assert workers.intra_op_threads(0, count) == expected


@pytest.fixture
def first_start_without_a_process(bundle, temp_root, monkeypatch, caplog):
    """A supervisor of two workers that can start one process and no more, as under a pids limit: (its exit status,
    its log records)."""
    settings = Settings(bundle=bundle, host="127.0.0.1", port=0, metrics_port=None)
    supervisor = workers.Supervisor(settings, [], 2, cascade.ServedModels.read(bundle))
    monkeypatch.setattr(supervisor, "_command", lambda: [sys.executable, "-c", "import time; time.sleep(60)"])
    started = []
    real_popen = subprocess.Popen

    def popen(*args, **kwargs):
        if started:
            raise OSError(errno.EAGAIN, "Resource temporarily unavailable")
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    with caplog.at_level(logging.INFO, logger="serve"):
        status = supervisor.run()
    return status, caplog.records


def events(records: list[logging.LogRecord], name: str) -> list[logging.LogRecord]:
    return [record for record in records if getattr(record, "event", None) == name]


def test_a_worker_that_cannot_be_started_stops_the_supervisor_with_status_71(first_start_without_a_process):
    status, _ = first_start_without_a_process
    assert status == 71


def test_a_worker_that_cannot_be_started_is_logged_with_the_errno(first_start_without_a_process):
    _, records = first_start_without_a_process
    (failed,) = events(records, "worker_start_failed")
    assert failed.errno == "EAGAIN"


def test_a_worker_that_cannot_be_started_is_logged_saying_to_raise_the_limit(first_start_without_a_process):
    _, records = first_start_without_a_process
    (failed,) = events(records, "worker_start_failed")
    assert "pids or open-files limit" in failed.getMessage()


def test_a_worker_that_cannot_be_started_lets_the_started_one_drain_unkilled(first_start_without_a_process):
    _, records = first_start_without_a_process
    assert not events(records, "worker_killed")


class StuckProcess:
    """Stands in for a worker's `subprocess.Popen` whose process sleeps in the kernel: it never exits, and records
    its kills and waits (with their timeouts) in `calls`."""

    def __init__(self, calls: list[tuple]):
        self.pid = os.getpid()  # a pid that exists, for the supervisor's log lines and metrics files
        self.returncode = None
        self.calls = calls

    def poll(self) -> None:
        return None

    def send_signal(self, number: int) -> None:
        pass

    def kill(self) -> None:
        self.calls.append(("kill", self))

    def wait(self, timeout: float) -> None:
        self.calls.append(("wait", timeout))
        time.sleep(timeout)
        raise subprocess.TimeoutExpired("worker", timeout)


def supervisor_of_stuck_workers(bundle, count: int, start_deadline: float) -> tuple[workers.Supervisor, list[tuple]]:
    """A supervisor of `count` StuckProcess workers, none serving, started to serve by `start_deadline`: (it, the
    calls its workers record)."""
    settings = Settings(bundle=bundle, host="127.0.0.1", port=0, metrics_port=None)
    supervisor = workers.Supervisor(settings, [], count, cascade.ServedModels.read(bundle))
    calls = []
    for index in range(count):
        read, write = os.pipe()
        os.close(write)
        reports = os.fdopen(read, "rb", buffering=0)
        supervisor.workers.append(workers.Worker(index, StuckProcess(calls), reports, start_deadline))
    return supervisor, calls


@pytest.fixture
def killed_stuck_workers(bundle, temp_root, monkeypatch):
    """The calls three stuck workers record as the supervisor kills them all (KILL_WAIT_S 0.2 s)."""
    monkeypatch.setattr(workers, "KILL_WAIT_S", 0.2)
    supervisor, calls = supervisor_of_stuck_workers(bundle, 3, start_deadline=float("inf"))
    supervisor._kill_all()
    supervisor._close()
    return calls


def test_the_supervisor_sigkills_every_stuck_worker_before_it_waits_for_any(killed_stuck_workers):
    kinds = [kind for kind, _ in killed_stuck_workers]
    assert kinds == ["kill"] * 3 + ["wait"] * 3


def test_the_supervisor_waits_for_its_killed_workers_kill_wait_s_in_all(killed_stuck_workers):
    waited = sum(timeout for kind, timeout in killed_stuck_workers if kind == "wait")
    assert waited <= workers.KILL_WAIT_S


def test_every_worker_past_its_start_deadline_is_killed_in_one_pass(bundle, temp_root):
    supervisor, calls = supervisor_of_stuck_workers(bundle, 3, start_deadline=0.0)
    supervisor._time_out_starts()
    killed = {id(process) for kind, process in calls if kind == "kill"}
    for worker in supervisor.workers:
        supervisor._forget(worker)
    supervisor._close()
    assert killed == {id(worker.proc) for worker in supervisor.workers}
