"""Subprocesses of a measurement: a server started until it reports SERVING and stopped with SIGTERM, or a
load generator run to its end; their output goes to a log file, whose tail a failure quotes."""

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import psutil
from edgedistill.bench import BenchError
from grpc_health.v1 import health_pb2, health_pb2_grpc

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 2000


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def log_tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]


def start(command: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """`command` in this process's working directory, its stdout and stderr written to `log`."""
    with open(log, "w") as sink:
        return subprocess.Popen(command, env=env, stdout=sink, stderr=sink)


def finish(process: subprocess.Popen, timeout: float) -> int | None:
    """Wait up to `timeout` seconds for `process` to exit; its exit status, or None when it hung and was killed."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def wait_serving(address: str, process: subprocess.Popen, name: str, log: Path) -> None:
    """Poll the health service until it reports SERVING; `BenchError` if the process exits or time runs out."""
    deadline = time.monotonic() + START_TIMEOUT_S
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise BenchError(f"{name} exited with {process.returncode} at start; its log ends:\n{log_tail(log)}")
            try:
                reply = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass  # not listening yet
            time.sleep(0.2)
    raise BenchError(f"{name} did not report SERVING within {START_TIMEOUT_S:.0f} s; its log ends:\n{log_tail(log)}")


@contextmanager
def running(module: str, args: list[str], port: int, log: Path) -> Iterator[psutil.Process]:
    """`python -m module args` with its output in `log`, SERVING on loopback `port`; stopped with SIGTERM after
    the block, and `BenchError` when it does not exit cleanly."""
    process = start([sys.executable, "-m", module, *args], log)
    try:
        wait_serving(f"127.0.0.1:{port}", process, module, log)
        yield psutil.Process(process.pid)
    finally:
        process.terminate()
        code = finish(process, STOP_TIMEOUT_S)
    if code != 0:
        raise BenchError(f"{module} did not stop cleanly on SIGTERM (exit {code}); its log ends:\n{log_tail(log)}")
