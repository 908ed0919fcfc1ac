"""The health service: `Watch` streams end when the server drains, after telling the watcher NOT_SERVING."""

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time

import grpc
import pytest
from edgedistill.bench.ports import free_port
from edgedistill.serve.app import EXIT_FAULT
from edgedistill.serve.health import HealthServicer
from edgedistill.serve.observe import MAX_DETAILS_BYTES
from edgedistill.serve.proto import classifier_pb2, classifier_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve.conftest import ROOT, serve_command, settings_for, subprocess_env
from tests.serve.rawh2 import END_STREAM, Kind, RawClient, frame, message_prefix
from tests.serve.test_faults import HANG_ON, HANGING_SERVER

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
GRACE_S = 5.0
WATCH = "/grpc.health.v1.Health/Watch"
EXIT_SLACK_S = 10.0  # past the grace, for a process on a busy machine to stop and exit


def watch(channel, service: str = ""):
    return health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)


def unread_watch(port: int) -> RawClient:
    """A raw client's `Watch("")` that takes no reply (a window of 0), once the server has begun its first reply."""
    client = RawClient(port)
    client.read_nothing()
    client.open_call(1, WATCH)
    client.send(frame(Kind.DATA, END_STREAM, 1, message_prefix(0)))  # the empty request: service ""
    deadline = time.monotonic() + 10
    while not any(kind == Kind.HEADERS and stream == 1 for kind, _, stream, _ in client.frames):
        assert time.monotonic() < deadline, "the server never began its reply to the Watch"
        time.sleep(0.01)
    return client


@pytest.fixture
def drained_while_watched(start_server, bundle):
    """A server stopped with a grace of `GRACE_S` while a client watched its health: the statuses the watcher got,
    how its stream ended, and how long the stop took."""
    server = start_server(settings_for(bundle))
    with server.channel() as channel:
        stream = watch(channel)
        statuses = [next(stream).status]
        began = time.monotonic()
        stopping = asyncio.run_coroutine_threadsafe(server.server.stop(grace=GRACE_S), server.loop)
        with contextlib.suppress(grpc.RpcError):  # the stream cut, whose code is read below
            for reply in stream:
                statuses.append(reply.status)
        stopping.result(2 * GRACE_S)
        return {"statuses": statuses, "code": stream.code(), "stop_s": time.monotonic() - began}


def test_a_watcher_is_told_not_serving_when_the_server_drains(drained_while_watched):
    assert drained_while_watched["statuses"][-1] == NOT_SERVING


def test_a_watch_stream_ends_with_ok_when_the_server_drains(drained_while_watched):
    assert drained_while_watched["code"] == grpc.StatusCode.OK


@pytest.mark.serial  # a bound on time
def test_an_open_watch_stream_does_not_hold_the_drain_for_its_grace(drained_while_watched):
    assert drained_while_watched["stop_s"] < GRACE_S / 2


def test_a_watch_opened_during_the_drain_gets_not_serving_and_ends(start_server, bundle):
    server = start_server(settings_for(bundle))
    server.call(server.server.health.enter_graceful_shutdown())
    with server.channel() as channel:
        stream = watch(channel)
        assert [reply.status for reply in stream] == [NOT_SERVING]


def test_a_watch_of_an_unknown_service_ends_when_the_server_drains(start_server, bundle):
    server = start_server(settings_for(bundle))
    with server.channel() as channel:
        stream = watch(channel, "no.such.Service")
        assert next(stream).status == SERVICE_UNKNOWN
        server.call(server.server.health.enter_graceful_shutdown())
        assert list(stream) == []


def test_a_watch_of_an_unknown_service_follows_it_once_it_is_set(start_server, bundle):
    server = start_server(settings_for(bundle))
    with server.channel() as channel:
        stream = watch(channel, "later.Service")
        next(stream)  # SERVICE_UNKNOWN, checked above
        server.call(server.server.health.set("later.Service", SERVING))
        assert next(stream).status == SERVING
        stream.cancel()


def test_a_check_of_an_unknown_service_is_not_found(start_server, bundle):
    server = start_server(settings_for(bundle))
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


def test_a_check_of_an_unknown_service_of_a_long_name_is_not_found_with_bounded_details(start_server, bundle):
    server = start_server(settings_for(bundle))
    request = health_pb2.HealthCheckRequest(service="x" * 100_000)
    with server.channel() as channel, pytest.raises(grpc.RpcError) as caught:
        health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert len(caught.value.details().encode()) < 2 * MAX_DETAILS_BYTES


def test_a_check_of_an_unknown_service_on_the_health_port_goes_out_as_its_status_alone(
    start_server, bundle, monkeypatch
):
    checks = []
    check = HealthServicer.Check

    async def counted(self, request, context):
        checks.append(request.service)
        return await check(self, request, context)

    monkeypatch.setattr(HealthServicer, "Check", counted)
    port = free_port()
    start_server(settings_for(bundle, health_port=port))
    retry_not_found = {
        "methodConfig": [{"name": [{"service": "grpc.health.v1.Health"}], "retryPolicy": {
            "maxAttempts": 2, "initialBackoff": "0.01s", "maxBackoff": "0.01s", "backoffMultiplier": 1,
            "retryableStatusCodes": ["NOT_FOUND"]}}]
    }  # fmt: skip
    options = [("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(retry_not_found))]
    request = health_pb2.HealthCheckRequest(service="no.such.Service")
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=options) as channel, pytest.raises(grpc.RpcError):
        health_pb2_grpc.HealthStub(channel).Check(request, timeout=5)
    assert len(checks) == 2, "sent again: a status with no reply message leaves the call uncommitted"


def test_a_watch_follows_the_status_while_the_server_serves(start_server, bundle):
    server = start_server(settings_for(bundle), warm=False)
    with server.channel() as channel:
        stream = watch(channel)
        assert next(stream).status == NOT_SERVING
        server.call(server.server.warm_up())
        assert next(stream).status == SERVING


def test_a_watcher_that_takes_no_reply_does_not_hold_up_the_serving_flip(start_server, bundle):
    server = start_server(settings_for(bundle), warm=False)
    with contextlib.closing(unread_watch(server.port)), server.channel() as channel:
        server.call(server.server.warm_up(), timeout=10)
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        assert reply.status == SERVING


@pytest.mark.serial  # a bound on time
def test_a_watcher_that_takes_no_reply_does_not_hold_up_the_exit_after_a_fault(bundle):
    command = [sys.executable, "-c", HANGING_SERVER, *serve_command(bundle)[3:], "--inline-infer-ms", "0",
               "--batch-timeout-s", "0.5", "--shutdown-grace-s", "1", "--metrics-port", "off"]  # fmt: skip
    proc = subprocess.Popen(
        command, cwd=ROOT, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        port = next(entry for line in proc.stdout if (entry := json.loads(line)).get("event") == "serving")["port"]
        with contextlib.closing(unread_watch(port)), grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            with contextlib.suppress(grpc.RpcError):  # UNAVAILABLE: the batcher's fault
                request = classifier_pb2.ClassifyRequest(texts=[HANG_ON])
                classifier_pb2_grpc.ClassifierStub(channel).Classify(request, timeout=20)
            assert proc.wait(1 + EXIT_SLACK_S) == EXIT_FAULT
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)


@pytest.mark.serial  # a bound on time
def test_a_watcher_that_takes_no_reply_does_not_hold_up_the_exit_on_sigterm(spawn, bundle):
    process = spawn(bundle, "--shutdown-grace-s", "1")
    port = process.wait_for("serving")["port"]
    with contextlib.closing(unread_watch(port)):
        process.proc.send_signal(signal.SIGTERM)
        assert process.proc.wait(1 + EXIT_SLACK_S) == 0
