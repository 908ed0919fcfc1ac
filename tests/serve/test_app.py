"""The server's own process: the address it binds, a stop while the model warms up, the exit when its event loop
stalls."""

import asyncio
import contextlib
import json
import logging
import os
import platform
import signal
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
import pytest
from edgedistill.serve.app import EXIT_FAULT, EXIT_LINE_WAIT_S, exit_on_stall
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc
from edgedistill.serve.watchdog import LoopWatchdog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve import conftest
from tests.serve.conftest import serve_command, settings_for

EXIT_WAIT_S = 2.0  # an exit "at once", with room for a loaded machine


def test_an_ipv6_host_written_without_brackets_is_bound(start_server, bundle):
    server = start_server(settings_for(bundle, host="::1"))
    with grpc.insecure_channel(f"[::1]:{server.port}") as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_a_batch_size_past_the_queue_is_warmed_up_and_served_at_the_queues_size(start_server, bundle):
    server = start_server(settings_for(bundle, max_batch_size=10**12))  # a warm-up batch of it: terabytes
    with server.channel() as channel:
        request = classifier_pb2.ClassifyRequest(texts=["a good film"])
        reply = classifier_pb2_grpc.ClassifierStub(channel).Classify(request, timeout=30)
    assert len(reply.predictions) == 1


@pytest.mark.parametrize(
    ("tokens", "named"),
    [
        ({"token": "user-token-1"}, ["TOKEN"]),
        ({"admin_token": "admin-token-1"}, ["ADMIN_TOKEN"]),
        ({"token": "user-token-1", "admin_token": "admin-token-1"}, ["TOKEN", "ADMIN_TOKEN"]),
    ],
    ids=["token", "admin_token", "both"],
)
def test_tokens_on_a_plaintext_port_beyond_loopback_are_warned_of_naming_which(
    start_server, bundle, caplog, tokens, named
):
    with caplog.at_level(logging.WARNING, logger="serve"):
        start_server(settings_for(bundle, host="0.0.0.0", **tokens), warm=False)
    assert [r.tokens for r in caplog.records if getattr(r, "event", None) == "plaintext_token"] == [named]


REFUSED_START_S = 30  # a refusal at start: the interpreter and the server's imports, on a loaded machine


@pytest.fixture(scope="module")
def refused_for_an_arena_limit_glibc_ignores(bundle):
    """A server started where MALLOC_ARENA_MAX is empty (a compose file's `${MALLOC_ARENA_MAX:-}`), which glibc
    ignores, keeping its default of 8 arenas per core: its exit status and its log lines."""
    done = subprocess.run(
        serve_command(bundle),
        cwd=conftest.ROOT,
        env=conftest.subprocess_env(MALLOC_ARENA_MAX=""),
        capture_output=True,
        text=True,
        timeout=REFUSED_START_S,  # a server that takes the limit serves until stopped
    )
    return done.returncode, [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_an_arena_limit_glibc_ignores_stops_the_server_with_status_2(refused_for_an_arena_limit_glibc_ignores):
    assert refused_for_an_arena_limit_glibc_ignores[0] == 2


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")
def test_an_arena_limit_glibc_ignores_is_named_in_the_start_failed_line(refused_for_an_arena_limit_glibc_ignores):
    (line,) = [line for line in refused_for_an_arena_limit_glibc_ignores[1] if line["event"] == "start_failed"]
    assert "MALLOC_ARENA_MAX is ''" in line["msg"]


CALLS_EACH = 20  # calls in a row per caller: each new one opens a stream as the previous ends


def test_one_connection_carrying_every_call_the_server_allows_has_none_refused(start_server, bundle):
    settings = settings_for(bundle)
    server = start_server(settings)
    request = classifier_pb2.ClassifyRequest(texts=["a good film"])
    # no retries: a refused stream would be tried again unseen
    with grpc.insecure_channel(server.address, options=[("grpc.enable_retries", 0)]) as channel:
        stub = classifier_pb2_grpc.ClassifierStub(channel)

        def caller() -> list[grpc.StatusCode]:
            codes = []
            for _ in range(CALLS_EACH):
                try:
                    stub.Classify(request, timeout=60)
                    codes.append(grpc.StatusCode.OK)
                except grpc.RpcError as err:
                    codes.append(err.code())
            return codes

        with ThreadPoolExecutor(settings.max_concurrent_rpcs) as callers:
            calls = [callers.submit(caller) for _ in range(settings.max_concurrent_rpcs)]
            codes = [code for call in calls for code in call.result()]
    assert set(codes) == {grpc.StatusCode.OK}


# `python -m edgedistill.serve` whose warm-up takes 5 s, saying `warming_up` as it begins
SLOW_WARM_UP = """
import json, runpy, sys, time
from edgedistill.serve.host import ModelRuntime

def warm_up(self):
    print(json.dumps({"event": "warming_up"}), file=sys.stderr, flush=True)
    time.sleep(5)
    warmed(self)

warmed, ModelRuntime.warm_up = ModelRuntime.warm_up, warm_up
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


# `python -m edgedistill.serve` whose warm-up is stuck in a log line, holding the handler's lock while it writes to a
# full stderr (`full_stderr`); it says `warming_up` on stdout, which the test still reads, once stuck there
STUCK_IN_A_LOG_LINE = """
import json, logging, runpy, threading, time
from edgedistill.serve.host import ModelRuntime
from tests.serve.test_app import full_stderr

def say_warming_up():
    time.sleep(1)
    print(json.dumps({"event": "warming_up"}), flush=True)

def warm_up(self):
    threading.Thread(target=say_warming_up, daemon=True).start()
    with full_stderr():
        logging.getLogger("serve").info("a line that stderr does not take")

ModelRuntime.warm_up = warm_up
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


def stop_while_warming_up(spawn, bundle, monkeypatch, script: str, wait: float):
    """A server running `script` sent SIGTERM while it warms up; its exit status, or None when it runs on past
    `wait` seconds."""
    monkeypatch.setattr(
        conftest, "serve_command", lambda *args: [sys.executable, "-c", script, *serve_command(*args)[3:]]
    )
    server = spawn(bundle)
    server.wait_for("warming_up", timeout=60)
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.status = server.proc.wait(wait)
    except subprocess.TimeoutExpired:
        server.status = None
    return server


@pytest.fixture
def stopped_while_warming_up(spawn, bundle, monkeypatch):
    """A server sent SIGTERM while it warms up its model (for 5 s, `SLOW_WARM_UP`), see `stop_while_warming_up`."""
    return stop_while_warming_up(spawn, bundle, monkeypatch, SLOW_WARM_UP, EXIT_WAIT_S)


def test_a_sigterm_while_the_warm_up_is_stuck_in_a_log_line_exits_within_its_line_wait(spawn, bundle, monkeypatch):
    server = stop_while_warming_up(spawn, bundle, monkeypatch, STUCK_IN_A_LOG_LINE, EXIT_LINE_WAIT_S + EXIT_WAIT_S)
    assert server.status == 0


def test_a_sigterm_while_warming_up_exits_zero_at_once(stopped_while_warming_up):
    assert stopped_while_warming_up.status == 0


def test_a_sigterm_while_warming_up_never_serves(stopped_while_warming_up):
    with pytest.raises(AssertionError, match="no 'serving' log line"):  # read to the end of its log
        stopped_while_warming_up.wait_for("serving")


def test_a_sigterm_while_warming_up_logs_stopped_with_its_signal(stopped_while_warming_up):
    assert stopped_while_warming_up.wait_for("stopped")["reason"] == "signal SIGTERM"


STALL_LIMIT_S = 0.2
STUCK_S = 5.0  # how long the loop stays stuck in its log line, unless the process exits first


class StuckHandler(logging.Handler):
    """A handler whose first line holds its lock until the process exits (`exited`), at most STUCK_S: as one writing
    to a stderr pipe that nobody reads. `exited_meanwhile`: whether the exit came while it held the lock."""

    def __init__(self, exited: threading.Event):
        super().__init__()
        self.exited = exited
        self.exited_meanwhile: bool | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.exited_meanwhile is None:
            self.exited_meanwhile = self.exited.wait(STUCK_S)


@dataclass
class Stall:
    handler: StuckHandler
    statuses: list[int]  # what `os._exit` was called with
    stderr: str


@pytest.fixture
def stalled_in_logging(monkeypatch, capfd) -> Stall:
    """An event loop stuck in a log line under the loop's watchdog with `exit_on_stall`, whose `os._exit` is recorded,
    not done."""
    statuses, exited = [], threading.Event()

    def record_exit(status: int) -> None:
        statuses.append(status)
        exited.set()

    monkeypatch.setattr(os, "_exit", record_exit)
    handler = StuckHandler(exited)
    logger = logging.getLogger("serve")
    logger.addHandler(handler)

    async def main():
        watchdog = LoopWatchdog(asyncio.get_running_loop(), STALL_LIMIT_S, exit_on_stall)
        watchdog.start()
        try:
            logger.error("a line that the loop cannot write")
        finally:
            watchdog.stop()

    try:
        asyncio.run(main())
    finally:
        logger.removeHandler(handler)
    return Stall(handler, statuses, capfd.readouterr().err)


def test_a_loop_stalled_in_a_log_line_exits_while_it_holds_the_handler(stalled_in_logging):
    assert stalled_in_logging.handler.exited_meanwhile is True


def test_a_loop_stalled_in_a_log_line_exits_with_the_fault_status(stalled_in_logging):
    assert stalled_in_logging.statuses == [EXIT_FAULT]


def server_fault_line(stall: Stall) -> dict:
    return json.loads(stall.stderr.splitlines()[-1])


def test_a_loop_stalled_in_a_log_line_writes_its_server_fault_line_to_stderr(stalled_in_logging):
    line = server_fault_line(stalled_in_logging)
    assert {key: line.get(key) for key in ("level", "logger", "event")} == {
        "level": "ERROR",
        "logger": "serve",
        "event": "server_fault",
    }


def test_the_server_fault_line_says_how_long_the_loop_stalled(stalled_in_logging):
    assert server_fault_line(stalled_in_logging)["stalled_s"] > STALL_LIMIT_S


@contextlib.contextmanager
def full_stderr():
    """fd 2 a full pipe that nobody reads, with the server's log handler on it (as `configure_logging` sets one);
    restored after, and the pipe's reader closed, so that a write still blocked on it fails. Not a fixture: pytest
    sets fd 2 to its own capture file again after a fixture's setup."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write, b"x" * 65536)
    os.set_blocking(write, True)
    saved = os.dup(2)
    os.dup2(write, 2)
    os.close(write)
    handler = logging.StreamHandler(open(2, "w", closefd=False))  # noqa: SIM115 - fd 2 stays open, as stderr
    logging.getLogger("serve").addHandler(handler)
    try:
        yield
    finally:
        logging.getLogger("serve").removeHandler(handler)
        os.dup2(saved, 2)
        os.close(saved)
        os.close(read)


def test_a_stall_exits_within_its_line_wait_where_stderr_is_a_full_pipe(monkeypatch):
    exited = threading.Event()
    monkeypatch.setattr(os, "_exit", lambda status: exited.set())
    with full_stderr():
        threading.Thread(target=exit_on_stall, args=(STALL_LIMIT_S,), daemon=True).start()
        exited_in_time = exited.wait(EXIT_LINE_WAIT_S + 2)
    assert exited_in_time
