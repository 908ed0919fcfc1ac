"""The health service: `Watch` streams end when the server drains, after telling the watcher NOT_SERVING."""

import asyncio
import contextlib
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.serve.conftest import settings_for

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
GRACE_S = 5.0


def watch(channel, service: str = ""):
    return health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=service), timeout=30)


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


def test_a_watch_follows_the_status_while_the_server_serves(start_server, bundle):
    server = start_server(settings_for(bundle), warm=False)
    with server.channel() as channel:
        stream = watch(channel)
        assert next(stream).status == NOT_SERVING
        server.call(server.server.warm_up())
        assert next(stream).status == SERVING
