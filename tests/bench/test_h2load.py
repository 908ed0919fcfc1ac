"""h2load as the load generator: the gRPC frame it sends, its summary, and calls counted by the bytes of their replies."""

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import psutil
import pytest
from edgedistill.bench import BenchError, h2load, slo
from edgedistill.bench.calls import ABSENT_MODEL, infer_request
from edgedistill.bench.environ import measured_server
from edgedistill.bench.peers import launch
from edgedistill.bench.ports import free_port
from edgedistill.bench.processes import running, serving

from tests.conftest import gone

SUMMARY = """finished in 2.00s, 1031.00 req/s, 130.95KB/s
requests: 2062 total, 2070 started, 2062 done, 2062 succeeded, 0 failed, 0 errored, 0 timeout
status codes: 2062 2xx, 0 3xx, 0 4xx, 0 5xx
traffic: 261.89KB (268176) total, 6.11KB (6261) headers (space savings 96.25%), 142.97KB (146402) data
"""
needs_h2load = pytest.mark.skipif(
    subprocess.run(["sh", "-c", "command -v h2load"], capture_output=True).returncode != 0,
    reason="needs h2load (Debian's nghttp2-client: make setup-system)",
)


def test_frame_is_the_message_behind_a_flag_byte_and_its_big_endian_length():
    assert h2load.frame(b"abc") == b"\x00\x00\x00\x00\x03abc"


def test_summary_gives_started_done_succeeded_and_data_bytes():
    assert h2load.parse_summary(SUMMARY) == {"started": 2070, "done": 2062, "succeeded": 2062, "data_bytes": 146402}


def test_summary_without_the_traffic_line_is_a_bench_error():
    with pytest.raises(BenchError, match="data_bytes"):
        h2load.parse_summary(SUMMARY.replace("traffic", "bytes"))


def test_replies_are_the_data_bytes_in_whole_replies():
    assert h2load.Replies(71, 5).count({"done": 10, "succeeded": 10, "data_bytes": 710}) == 10


def test_failed_calls_that_carry_an_empty_message_are_not_replies():
    assert h2load.Replies(71, 5).count({"done": 10, "succeeded": 10, "data_bytes": 8 * 71 + 2 * 5}) == 8


def test_failed_calls_that_carry_nothing_are_not_replies():
    assert h2load.Replies(71, 0).count({"done": 10, "succeeded": 10, "data_bytes": 7 * 71}) == 7


def test_failures_whose_bytes_would_also_fit_whole_replies_are_counted_as_failures():
    # 756 calls of 5 bytes are as many bytes as 60 replies of 63: the measured failure decides
    assert h2load.Replies(63, 5).count({"done": 756, "succeeded": 756, "data_bytes": 756 * 5}) == 0


def test_bytes_that_are_not_whole_replies_and_failures_are_a_bench_error():
    with pytest.raises(BenchError, match="not 71-byte replies and failed calls of 5 bytes"):
        h2load.Replies(71, 5).count({"done": 10, "succeeded": 10, "data_bytes": 700})


def test_more_bytes_than_one_reply_per_call_is_a_bench_error():
    with pytest.raises(BenchError, match="not 71-byte replies"):
        h2load.Replies(71, 0).count({"done": 9, "succeeded": 9, "data_bytes": 710})


def test_failures_no_smaller_than_a_reply_are_a_bench_error():
    with pytest.raises(BenchError, match="cannot be counted"):
        h2load.Replies(5, 5)


def test_paced_load_spreads_the_rate_over_the_connections():
    flags = h2load.Load(connections=4, streams=8, duration_s=2, rate=200).flags()
    assert flags[flags.index("--rps") + 1] == "50"


def test_a_missing_h2load_names_the_package(monkeypatch):
    monkeypatch.setattr(h2load.shutil, "which", lambda name: None)
    with pytest.raises(BenchError, match="nghttp2-client"):
        h2load.executable()


@pytest.fixture
def echo(tmp_path):
    server = launch.echo()
    with serving(server.command, server.port, tmp_path / "echo.log", launch.model_ready(server.model)) as process:
        yield server, process


def write_request(tmp_path, model: str) -> tuple:
    body = infer_request(model, "a fine film", None)
    path = tmp_path / "request"
    path.write_bytes(h2load.frame(body))
    return body, path


def run_on_echo(tmp_path, echo, load: h2load.Load) -> dict:
    """`h2load.run` of `load` against the echo server, its log `h2load.log` in `tmp_path`."""
    server, process = echo
    body, path = write_request(tmp_path, "echo")
    replies = h2load.Replies(len(h2load.frame(h2load.probe(server.port, body))), 0)
    return h2load.run(server.port, path, replies, load, tmp_path / "h2load.log", process)


@needs_h2load
def test_every_call_to_the_echo_server_is_counted_with_its_latency(tmp_path, echo):
    record = run_on_echo(tmp_path, echo, h2load.Load(1, 4, 0.5))
    assert record["requests"] > 0
    assert record["failures"] == 0
    assert record["p99_ms"] > 0
    assert record["server_cpu"] > 0


@needs_h2load
def test_calls_refused_with_a_grpc_status_are_failures(tmp_path, served):
    body, path = write_request(tmp_path, "no-such-model")
    good = h2load.probe(served.port, infer_request("tiny-sentiment", "a fine film", None))
    replies = h2load.Replies.measure(served.port, good, body, tmp_path)
    record = h2load.run(served.port, path, replies, h2load.Load(1, 2, 0.3), tmp_path / "h2load.log", None)
    assert record["failures"] == record["requests"]
    assert record["requests_per_s"] == 0


@needs_h2load
def test_a_run_in_which_no_call_finishes_is_a_bench_error(tmp_path):
    _, path = write_request(tmp_path, "echo")
    with socket.socket() as closed:  # a free port, nothing listening on it
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    with pytest.raises(BenchError, match=f"finished no call to port {port}"):
        h2load.run(port, path, h2load.Replies(71, 0), h2load.Load(1, 1, 0.3), tmp_path / "h2load.log", None)


@needs_h2load
def test_an_error_while_clients_run_leaves_no_h2load_running(tmp_path, monkeypatch):
    _, path = write_request(tmp_path, "echo")

    def interrupted(seconds):
        raise KeyboardInterrupt  # before the second client starts, while the first waits on a server that never answers

    monkeypatch.setattr(h2load.time, "sleep", interrupted)
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        load = h2load.Load(2, 1, 30, rate=10, clients=2)
        with pytest.raises(KeyboardInterrupt):
            h2load.run(silent.getsockname()[1], path, h2load.Replies(71, 0), load, tmp_path / "h2load.log", None)
    assert [child for child in psutil.Process().children() if child.name() == "h2load"] == []


MEASURES_A_SILENT_SERVER = """
import socket, sys
from pathlib import Path
from edgedistill.bench import h2load
with socket.socket() as silent:
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    print("measuring", flush=True)
    load = h2load.Load(2, 1, 120, rate=10, clients=2)
    h2load.run(silent.getsockname()[1], Path(sys.argv[1]), h2load.Replies(71, 0), load, Path(sys.argv[2]), None)
"""


def h2load_children(pid: int, count: int, within_s: float = 30.0) -> list[int]:
    """The pids of process `pid`'s `count` h2load children, once it has them all (fewer when time runs out)."""
    deadline = time.monotonic() + within_s
    while True:
        found = [child.pid for child in psutil.Process(pid).children() if child.name() == "h2load"]
        if len(found) == count or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@needs_h2load
def test_a_measurement_killed_with_sigkill_leaves_no_h2load_running(tmp_path):
    _, path = write_request(tmp_path, "echo")
    script = [sys.executable, "-c", MEASURES_A_SILENT_SERVER, str(path), str(tmp_path / "h2load.log")]
    measurement = subprocess.Popen(script, stdout=subprocess.PIPE, text=True)
    assert measurement.stdout.readline() == "measuring\n"
    clients = h2load_children(measurement.pid, 2)
    measurement.kill()
    measurement.wait()
    try:
        assert [pid for pid in clients if not gone(pid)] == []
    finally:
        for pid in clients:
            if not gone(pid, 0):
                os.kill(pid, signal.SIGKILL)


def test_a_failed_probe_names_the_status(served):
    with pytest.raises(BenchError, match="NOT_FOUND"):
        h2load.probe(served.port, infer_request("no-such-model", "a fine film", None))


@needs_h2load
def test_a_call_the_echo_server_aborts_is_measured_as_trailers_only(tmp_path, echo):
    server, _ = echo
    assert h2load.failed_bytes(server.port, infer_request(ABSENT_MODEL, "a fine film", None), tmp_path) == 0


@needs_h2load
def test_measuring_failures_on_a_request_the_server_answers_is_a_bench_error(tmp_path, echo):
    server, _ = echo
    with pytest.raises(BenchError, match="answered a request it must refuse"):
        h2load.failed_bytes(server.port, infer_request("echo", "a fine film", None), tmp_path)


def test_several_clients_share_the_connections_and_the_rate():
    part = h2load.Load(connections=4, streams=2, duration_s=1, rate=200, clients=4).part()
    assert part.connections == 1
    assert part.rate == 50
    assert part.clients == 1


def test_connections_that_do_not_split_over_the_clients_are_refused():
    with pytest.raises(BenchError, match="split evenly"):
        h2load.Load(connections=3, streams=1, duration_s=1, clients=2)


@needs_h2load
def test_the_calls_of_several_clients_are_counted_together(tmp_path, echo):
    record = run_on_echo(tmp_path, echo, h2load.Load(2, 1, 0.5, rate=100, clients=2))
    logged = [len(h2load.latencies_ms(tmp_path / f"h2load.log.{i}")) for i in range(2)]
    assert record["failures"] == 0
    assert min(logged) > 0, "each client called"
    assert record["requests"] == sum(logged), "the calls of both clients, not a rate: a stall holds calls back"


def test_a_probe_goes_straight_to_the_server_past_a_proxy_of_the_environment(served, monkeypatch):
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")
    assert h2load.probe(served.port, infer_request("tiny-sentiment", "a fine film", None))


@pytest.fixture
def hanging():
    """The port of a gRPC server whose `ModelInfer` answers b"reply" to every call but every 4th, which it leaves
    unanswered until the test ends."""
    released, calls = threading.Event(), itertools.count(1)

    def infer(request, context):
        if next(calls) % 4 == 0:
            released.wait()
        return b"reply"

    server = grpc.server(ThreadPoolExecutor(max_workers=16))
    method = {"ModelInfer": grpc.unary_unary_rpc_method_handler(infer)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("inference.GRPCInferenceService", method)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield port
    released.set()
    server.stop(None)


@needs_h2load
def test_calls_in_flight_when_a_saturated_run_ends_are_unanswered_not_failed(tmp_path, echo):
    record = run_on_echo(tmp_path, echo, h2load.Load(2, 4, 0.5))
    assert record["unanswered"] == 2 * 4, "every stream busy when it ended"
    assert record["failures"] == 0


@needs_h2load
def test_a_paced_run_against_a_healthy_server_answers_the_calls_due(tmp_path, echo):
    record = run_on_echo(tmp_path, echo, h2load.Load(4, 2, 1.0, rate=200, clients=4))
    assert record["rate_share"] >= slo.MIN_PACED_SHARE


@needs_h2load
def test_calls_a_server_never_answers_leave_the_paced_calls_due_behind_them_unanswered(tmp_path, hanging):
    _, path = write_request(tmp_path, "echo")
    load = h2load.Load(4, 2, 1.0, rate=200, clients=4)
    record = h2load.run(hanging, path, h2load.Replies(len(h2load.frame(b"reply")), 0), load, tmp_path / "log", None)
    assert record["rate_share"] < slo.MIN_PACED_SHARE


@needs_h2load
def test_a_server_process_that_exits_during_a_run_is_a_bench_error_naming_the_server(tmp_path, bundle, monkeypatch):
    for name in [name for name in os.environ if name.startswith("EDGEDISTILL_")]:
        monkeypatch.delenv(name)
    server = launch.edgedistill(bundle, "tiny-sentiment", threads=1, workers=2)
    log = tmp_path / "server.log"
    with serving(server.command, server.port, log, launch.all_serving(log, server.model)) as process:
        body, path = write_request(tmp_path, server.model)
        replies = h2load.Replies(len(h2load.frame(h2load.probe(server.port, body))), 0)
        worker, release = process.children()[0], h2load.release

        def killing_a_worker(client):  # as the load starts, once run() has counted the server's processes
            if worker.is_running():
                worker.kill()
                worker.wait(30)  # reaped by the server, which starts another in its place
            release(client)

        monkeypatch.setattr(h2load, "release", killing_a_worker)
        with pytest.raises(BenchError, match=f"process {worker.pid} of the server on port {server.port} exited"):
            h2load.run(server.port, path, replies, h2load.Load(2, 2, 0.5), tmp_path / "h2load.log", process)


@needs_h2load
def test_a_phase_whose_every_call_failed_is_refused_quoting_the_servers_log_of_their_status(tmp_path, bundle):
    flags, settings = measured_server(bundle, 1)
    port = settings.port
    failed = pytest.raises(
        BenchError, match=r'(?s)no call succeeded in the median repeat of server capacity.*"NOT_FOUND"'
    )
    with failed, running("edgedistill.serve", flags, port, tmp_path / "server.log") as process:
        good = h2load.probe(port, infer_request("tiny-sentiment", "a fine film", None))
        body, path = write_request(tmp_path, ABSENT_MODEL)  # each call NOT_FOUND, which h2load counts as HTTP 200
        replies = h2load.Replies.measure(port, good, body, tmp_path)
        target = h2load.Target(port, path, replies, process, {"capacity": h2load.Load(1, 2, 0.3)})
        h2load.interleaved({"server": target}, 1, tmp_path, "test")
