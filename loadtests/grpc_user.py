"""A reusable locust `User` for gRPC: one channel per user, every call reported as a locust request event.

`grpc.experimental.gevent.init_gevent()` runs on import, before any channel exists: without it a
blocking gRPC call holds the whole gevent-driven locust process and the users run one at a time.
A call is reported under its method's name (`Classify`) unless `GrpcUser.call` names it; the name
travels in the `x-locust-name` metadata key, which the interceptor removes before the call leaves. A user connects
in `on_start`, so that no reported call's latency includes setting up its connection.
"""

import collections
import time
from collections.abc import Callable

import grpc
import grpc.experimental.gevent as grpc_gevent
from edgedistill.serve.settings import DIRECT, on_loopback
from grpc_health.v1 import health_pb2, health_pb2_grpc
from locust import User
from locust.event import Events
from locust.exception import LocustError

grpc_gevent.init_gevent()

NAME_KEY = "x-locust-name"
CONNECT_NAME = "connect"  # the request name of a user's connection that no server answered in its timeout


class _CallDetails(
    collections.namedtuple(
        "_CallDetails", ("method", "timeout", "metadata", "credentials", "wait_for_ready", "compression")
    ),
    grpc.ClientCallDetails,
):
    pass


def _metadata(name: str | None, more: tuple) -> tuple | None:
    return (*more, *(((NAME_KEY, name),) if name else ())) or None


def _named(details: grpc.ClientCallDetails) -> tuple[str, grpc.ClientCallDetails]:
    """The call's report name and its details without the name key."""
    metadata = list(details.metadata or ())
    names = [value for key, value in metadata if key == NAME_KEY]
    rest = tuple((key, value) for key, value in metadata if key != NAME_KEY)
    name = names[-1] if names else details.method.rsplit("/", 1)[-1]
    fields = (details.timeout, rest or None, details.credentials, details.wait_for_ready, details.compression)
    return name, _CallDetails(details.method, *fields)


class EventInterceptor(grpc.UnaryUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Fires a locust `request` event per call: type "grpc", name, response time (ms), reply bytes, exception, and
    the `context` of the user that made it (`User.context`).

    A stream is one request: timed from the call to its last reply, its length is the sum of the replies.
    """

    def __init__(self, events: Events, context: Callable[[], dict] = dict):
        self.events = events
        self.context = context

    def intercept_unary_unary(self, continuation, client_call_details, request):
        name, details = _named(client_call_details)
        start = time.perf_counter()
        outcome = continuation(details, request)
        error = outcome.exception()
        self._fire(name, start, 0 if error else outcome.result().ByteSize(), error)
        return outcome

    def intercept_stream_stream(self, continuation, client_call_details, request_iterator):
        name, details = _named(client_call_details)
        start = time.perf_counter()
        return self._replies(continuation(details, request_iterator), name, start)

    def _replies(self, replies, name: str, start: float):
        size = 0
        try:
            for reply in replies:
                size += reply.ByteSize()
                yield reply
        except grpc.RpcError as err:
            self._fire(name, start, size, err)
            raise
        self._fire(name, start, size, None)

    def _fire(self, name: str, start: float, size: int, error: Exception | None) -> None:
        self.events.request.fire(
            request_type="grpc",
            name=name,
            response_time=(time.perf_counter() - start) * 1000,
            response_length=size,
            response=None,
            context=self.context(),
            exception=error,
        )


class GrpcUser(User):
    """A user with its own channel to `host` (`HOST:PORT`, locust's --host); subclasses add stubs and tasks."""

    abstract = True
    timeout: float = 10.0
    """Deadline of each call made with `call`, in seconds."""
    metadata: tuple[tuple[str, str], ...] = ()
    """Sent with every call (e.g. `serve.client.bearer(token)`)."""

    def __init__(self, environment):
        super().__init__(environment)
        if not self.host:
            raise LocustError("no server address: pass --host HOST:PORT")
        # A local subchannel pool gives each user its own connection, as separate clients would have;
        # by default channels to one target share a connection. A server on this machine is called past a proxy.
        options = [("grpc.use_local_subchannel_pool", 1)] + (DIRECT if on_loopback(self.host) else [])
        self._unreported = grpc.insecure_channel(self.host, options=options)
        self.channel = grpc.intercept_channel(self._unreported, EventInterceptor(environment.events, self.context))

    def on_start(self):
        """Connect before the first timed call; subclasses that add an `on_start` call this one."""
        self.connect()

    def connect(self) -> None:
        """Open the user's connection with a health check, waiting up to `timeout` for the server. (grpc.
        channel_ready_future polls the state every 200 ms: under gevent it held each first call.) An answer, even an
        error, is not reported: the timed calls report what the server does. No server answering by then is reported
        as a failed call named `CONNECT_NAME`: a run too short for any call to fall due would otherwise pass on none."""
        health = health_pb2_grpc.HealthStub(self._unreported)
        started = time.perf_counter()
        try:
            health.Check(health_pb2.HealthCheckRequest(), timeout=self.timeout, wait_for_ready=True)
        except grpc.RpcError as err:
            if err.code() in (grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.UNAVAILABLE):
                self.environment.events.request.fire(
                    request_type="grpc",
                    name=CONNECT_NAME,
                    response_time=(time.perf_counter() - started) * 1000,
                    response_length=0,
                    exception=err,
                    context={},
                )

    def call(self, method, request, name: str | None = None):
        """Unary `method(request)` reported as `name`; its reply, or None when it failed (the event has the error)."""
        try:
            return method(request, timeout=self.timeout, metadata=_metadata(name, self.metadata))
        except grpc.RpcError:
            return None

    def stream(self, method, requests: list, name: str | None = None) -> list | None:
        """Bidirectional-streaming `method` fed `requests`, reported as `name`; the replies, or None when it failed."""
        try:
            return list(method(iter(requests), timeout=self.timeout, metadata=_metadata(name, self.metadata)))
        except grpc.RpcError:
            return None

    def on_stop(self):
        self.channel.close()
