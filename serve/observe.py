"""Every call's request id, bearer-token check, metrics and log line, wrapped around the method handlers.

The wrapping happens once, when a servicer is registered (`ObservedServer` stands in for the
server), not per call: a `grpc.aio` server interceptor runs an extra coroutine for every call, which
cost a third of an echo server's throughput. Auth rejections are counted like any call. With a token, a unary
method is registered as one whose request streams, so that the token is checked before the request is read.
"""

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Callable
from contextvars import ContextVar

import grpc
from edgedistill.serve.errors import DEADLINE_SLACK_S
from edgedistill.serve.logs import MODEL, REQUEST_ID
from edgedistill.serve.metrics import Metrics
from google.protobuf.message import DecodeError

log = logging.getLogger("serve.access")

REQUEST_ID_KEY = "x-request-id"
MAX_REQUEST_ID = 128  # characters of a client's request id; a longer one is replaced by a new one
# The status message travels percent-encoded in a trailer, and clients drop trailers over 8-16 KiB with a
# misleading RESOURCE_EXHAUSTED; messages echo client strings (model, input and service names), so they are capped.
MAX_DETAILS_BYTES = 1024
CUT_MARK = " ... (message truncated) ... "  # ASCII: its characters are its bytes
# A new request id: 16 random bytes in hex, the 32 characters of `uuid.uuid4().hex` (with 128 random bits to its 122)
# for a quarter of its time, since building a UUID object per call costs more than the random bytes.
NEW_ID_BYTES = 16
HEALTH_PREFIX = "/grpc.health.v1.Health/"
LOGGED_AS_ERRORS = frozenset({grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN, grpc.StatusCode.DATA_LOSS})
# An overload refuses thousands of calls a second, each as cheaply as it can; anyone who can reach the port can send as
# many without the token, a client with a bug as many invalid requests, and clients whose deadlines are too short for
# a loaded server as many expired calls: a line each (about 30 us of the event loop, 300-600 bytes) would slow the
# refusals and fill a small disk (one client's invalid or expired calls wrote 450 KB of lines a second). One line a
# second per method and code says it, with the count left out; only the server's own errors are logged every time.
THROTTLE_S = 1.0
CUT_DETAILS = "cut by the server's shutdown: still running when SHUTDOWN_GRACE_S ran out"
UNSENT_DETAILS = "ended by the server's shutdown: its request had not arrived when SHUTDOWN_GRACE_S ran out"
_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


class _Throttle:
    """At most one line per `interval` seconds of `clock` for each key, counting those left out in between."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        self.interval = interval
        self.clock = clock
        self._next: dict[tuple, float] = {}
        self._left_out: dict[tuple, int] = {}

    def admit(self, key: tuple) -> int | None:
        """None: leave this line out; else how many lines of `key` were left out since the last one logged."""
        now = self.clock()
        if now < self._next.get(key, 0.0):
            self._left_out[key] = self._left_out.get(key, 0) + 1
            return None
        self._next[key] = now + self.interval
        return self._left_out.pop(key, 0)


def _status_code(context: grpc.aio.ServicerContext, err: BaseException | None, cut: bool) -> grpc.StatusCode:
    """The status the call ended with, as its client sees it; `cut`: a cancelled call was ended by the server's
    shutdown, not by its client."""
    if isinstance(err, asyncio.CancelledError):
        if cut:
            return grpc.StatusCode.UNAVAILABLE  # gRPC's "Cancelling all calls", as the client gets it
        remaining = context.time_remaining()
        expired = remaining is not None and remaining <= DEADLINE_SLACK_S
        return grpc.StatusCode.DEADLINE_EXCEEDED if expired else grpc.StatusCode.CANCELLED
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.OK if err is None else grpc.StatusCode.UNKNOWN


def _returnable(request_id: str) -> str:
    """The client's request id if the call can carry it whole, else "": printable ASCII of at most MAX_REQUEST_ID
    characters. gRPC receives other bytes (a tab, UTF-8) from clients that do not check, but refuses to send them,
    which would lose the reply; a longer id would be another, cut, in the trailer and the log."""
    if len(request_id) <= MAX_REQUEST_ID and request_id.isascii() and request_id.isprintable():
        return request_id
    return ""


def caller(context: grpc.aio.ServicerContext) -> str:
    """The call's peer address, and the names its client certificate proves where mutual TLS checked one."""
    names = ", ".join(name.decode(errors="replace") for name in context.peer_identities() or ())
    return f"{context.peer()} ({names})" if names else context.peer()


def _metadata(context) -> dict[str, str]:
    """The call's text metadata."""
    return {key: value for key, value in context.invocation_metadata() or () if isinstance(value, str)}


class Refused:
    """Stands for request bytes refused before or while parsing: `reason` says why (INVALID_ARGUMENT)."""

    def __init__(self, reason: str):
        self.reason = reason


async def _without_request(context: grpc.aio.ServicerContext) -> Refused:
    """The stand-in for the request of a call whose request stream ended before its one message: `Refused` where its
    client half-closed. gRPC ends the stream the same way for a call that ended (cancelled, past its deadline, its
    message over the limit, its connection gone): sending the initial metadata tells them apart, as only a live call
    takes it; for an ended one this raises `CancelledError`, as it would while a handler works."""
    try:
        await context.send_initial_metadata(())
    except grpc.aio.BaseError:  # the batch failed before gRPC cancelled this task
        raise asyncio.CancelledError from None
    return Refused("the call ended before its request")


Precheck = Callable[[bytes], str | None]
"""Looks at a request's bytes before they are parsed: why the request is refused, or None."""


def _tolerant(deserializer, precheck: Precheck | None):
    def deserialize(data: bytes):
        if precheck is not None and (reason := precheck(data)) is not None:
            return Refused(reason)
        try:
            return deserializer(data)
        except DecodeError as err:
            return Refused(f"the request does not parse: {err}")

    return deserialize


# Set by `refuse` for the call being handled: its request, not the server, is at fault whatever the code says.
_CLIENTS_FAULT: ContextVar[bool] = ContextVar("clients_fault", default=False)


def bounded(details: str) -> str:
    """`details` within MAX_DETAILS_BYTES of UTF-8: its start and its end (which says why), with CUT_MARK between."""
    encoded = details.encode(errors="backslashreplace")
    if len(encoded) <= MAX_DETAILS_BYTES:
        return details
    half = (MAX_DETAILS_BYTES - len(CUT_MARK)) // 2
    # a character cut at either edge is dropped whole
    head, tail = encoded[:half].decode(errors="ignore"), encoded[-half:].decode(errors="ignore")
    return f"{head}{CUT_MARK}{tail}"


def refuse(context: grpc.aio.ServicerContext, code: grpc.StatusCode, details: str, clients_fault: bool = False) -> None:
    """End the call with `code` and `details` (`bounded`) once the handler returns, with no reply: a unary-response
    handler is wrapped in `status_alone`, which sends the status alone. Unlike a handler's own `context.abort`, no
    exception is raised in the handler: gRPC keeps an abort's exception, whose traceback holds the frames it passed
    and so the request, in a reference cycle with the call, so a refused request would live until the collector's
    next pass (a large parsed request holds megabytes). `clients_fault`: the request caused it where the code does not
    say so (RESOURCE_EXHAUSTED for a request over a limit): the metrics count it as a client's error, not the
    server's."""
    context.set_code(code)
    context.set_details(bounded(details))
    if clients_fault:
        _CLIENTS_FAULT.set(True)


def status_alone(behavior):
    """`behavior`, a handler of one reply, whose refusal (`refuse`: a status set, no reply) goes out as the status alone.
    Returned, it would go out as an empty reply message and the status: gRPC clients take a call that sent a message
    as committed and never retry it, the server's UNAVAILABLE and a full queue's RESOURCE_EXHAUSTED included. The
    abort's exception, which gRPC keeps in a cycle with the call, holds this frame: the request and the context are
    let go first, so the refused call is freed at once."""

    async def unary_response(request, context):
        reply = await behavior(request, context)
        code = context.code()
        if reply is not None or not isinstance(code, grpc.StatusCode) or code is grpc.StatusCode.OK:
            return reply
        del request
        try:
            await context.abort(code, context.details())
        except grpc.aio.AbortError:
            del context
            raise

    return unary_response


def _bearer(authorization: str) -> bytes:
    """The credentials of an `authorization: Bearer <token>` value, its scheme in any case (RFC 9110 11.1); b"" for
    another scheme."""
    scheme, _, credentials = authorization.partition(" ")
    return credentials.encode() if scheme.lower() == "bearer" else b""


class CallObserver:
    """Gives each call a request id (the client's `x-request-id`, else a KServe request's `id`, if printable ASCII of
    at most MAX_REQUEST_ID characters; else a new one) returned in trailing metadata and attached to its log lines;
    with `token`, requires `authorization: Bearer <token>` (health checks exempt, so probes work), and with
    `admin_token` that one instead for `admin_methods`; records status and latency in `metrics`; logs failed calls
    (once a second per method and code, unless `access_log`; the server's own errors, `LOGGED_AS_ERRORS`, every
    time), and successful ones too with `access_log`. `prechecks` maps a unary method to a look at its request's bytes
    before they are parsed. Calls still running when the shutdown's grace runs out (`grace_ends`) are recorded as the
    server's UNAVAILABLE, not as calls their clients cancelled; those whose request had not arrived then, as their
    clients' UNAVAILABLE."""

    def __init__(
        self,
        metrics: Metrics,
        access_log: bool = False,
        token: str | None = None,
        admin_token: str | None = None,
        admin_methods: tuple[str, ...] = (),
        prechecks: dict[str, Precheck] | None = None,
    ):
        self.metrics = metrics
        self.access_log = access_log
        self._expected = None if token is None else token.encode()
        self._admin = None if admin_token is None else admin_token.encode()
        self.admin_methods = frozenset(admin_methods)
        self.prechecks = dict(prechecks or {})
        self._throttle = _Throttle(THROTTLE_S)
        self._grace_end: float | None = None
        self.cut_calls = 0

    def grace_ends(self, deadline: float) -> None:
        """The server is stopping: gRPC cancels the calls still running at event-loop time `deadline`, and their
        clients get UNAVAILABLE."""
        self._grace_end = deadline

    def _cut(self, err: BaseException | None) -> bool:
        """Whether a call that ended with `err` was cut by the shutdown: cancelled once its grace ran out."""
        return (
            isinstance(err, asyncio.CancelledError)
            and self._grace_end is not None
            and asyncio.get_running_loop().time() >= self._grace_end
        )

    def wrap(self, method: str, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        """The same kind of handler for `method` (e.g. `/pkg.Service/Call`), its behavior observed.

        A unary request that its precheck refuses, or that does not parse, reaches the behavior as `Refused` and
        is answered INVALID_ARGUMENT (gRPC itself would answer UNKNOWN); streamed requests are checked by the
        servicer. A unary-unary method that needs a token is registered as one whose request streams (the same on
        the wire): its token is checked on the call's metadata before its request is read, so a client without one
        is refused at once and holds no place among the server's concurrent calls while it sends (or never sends)
        its message.
        """
        for kind, build in _KINDS:
            behavior = getattr(handler, kind)
            if behavior is not None:
                deserializer = handler.request_deserializer
                if kind.startswith("unary_") and deserializer is not None:
                    deserializer = _tolerant(deserializer, self.prechecks.get(method))
                read = kind == "unary_unary" and self._expected_by(method) is not None
                observed = self._observed(behavior, method, read)
                return (grpc.stream_unary_rpc_method_handler if read else build)(
                    status_alone(observed) if kind.endswith("_unary") else observed,
                    request_deserializer=deserializer,
                    response_serializer=handler.response_serializer,
                )
        raise ValueError(f"{method}: a method handler without a behavior")

    def _expected_by(self, method: str) -> bytes | None:
        """The token `method` needs (`admin_token` for an admin method), or None where it needs none: an admin method
        of a server without an admin token is refused whatever a call sends (`PERMISSION_DENIED`, naming
        ADMIN_TOKEN), so it is not first refused for want of the other calls' token."""
        if method.startswith(HEALTH_PREFIX):
            return None
        return self._admin if method in self.admin_methods else self._expected

    def _denied(self, method: str, metadata: dict[str, str]) -> str | None:
        """Why a call of `method` with `metadata` is refused UNAUTHENTICATED, or None."""
        expected = self._expected_by(method)
        if expected is None or hmac.compare_digest(_bearer(metadata.get("authorization", "")), expected):
            return None
        if self._admin is not None and method in self.admin_methods:
            return (
                "missing or invalid admin token: this method needs 'authorization: Bearer <ADMIN_TOKEN>', the server's "
                "admin token, not the token of the other calls"
            )
        return "missing or invalid bearer token: send 'authorization: Bearer <token>'"

    def _begin(self, request, context, metadata: dict[str, str], denied: str | None):
        """The call's request id and its context tokens (request id, model); and whether the call is refused (auth:
        `denied`, or a `Refused` request), its status then set."""
        request_id = (
            _returnable(metadata.get(REQUEST_ID_KEY, ""))
            or _returnable(getattr(request, "id", ""))  # KServe's: a Triton client's request_id
            or os.urandom(NEW_ID_BYTES).hex()
        )
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        # the call's own; no model until one takes it, no fault yet
        token = REQUEST_ID.set(request_id), MODEL.set(None), _CLIENTS_FAULT.set(False)
        if denied is not None:
            refuse(context, grpc.StatusCode.UNAUTHENTICATED, denied)
            return request_id, token, True
        if isinstance(request, Refused):
            refuse(context, grpc.StatusCode.INVALID_ARGUMENT, request.reason)
            return request_id, token, True
        return request_id, token, False

    def _end(self, context, method, request_id, started, token, err, awaited: bool = False) -> None:
        try:
            self._record(context, method, request_id, time.perf_counter() - started, err, awaited)
        finally:
            REQUEST_ID.reset(token[0])
            MODEL.reset(token[1])
            _CLIENTS_FAULT.reset(token[2])

    def _record(self, context, method, request_id, seconds, err, awaited: bool = False) -> None:
        """The call's metrics, and its log line where one is due; `awaited`: it ended while its request was awaited.
        Such a call ended by the shutdown lost no work of the server's, which its client never gave it: UNAVAILABLE as
        its client gets it, but the client's error, and not cut."""
        ended_by_shutdown = self._cut(err)
        unsent = awaited and ended_by_shutdown
        cut = ended_by_shutdown and not unsent
        self.cut_calls += cut
        code = _status_code(context, err, cut or unsent)
        self.metrics.observe_call(method, code, seconds, _CLIENTS_FAULT.get() or unsent)
        if code is grpc.StatusCode.OK and not self.access_log:
            return
        left_out = 0
        if code not in LOGGED_AS_ERRORS and not self.access_log:
            left_out = self._throttle.admit((method, code, cut))
            if left_out is None:
                return
        if code in LOGGED_AS_ERRORS:
            level = logging.ERROR
        elif cut:
            level = logging.WARNING  # work lost at a shutdown: SHUTDOWN_GRACE_S too short for it, or a hung call
        elif code is grpc.StatusCode.OK and method.startswith(HEALTH_PREFIX):
            level = logging.DEBUG  # probes every few seconds would drown the rest
        else:
            level = logging.INFO
        log.log(
            level,
            "%s %s %.1f ms",
            method,
            code.name,
            seconds * 1000,
            extra={
                "event": "rpc",
                "method": method,
                "code": code.name,
                "ms": round(seconds * 1000, 3),
                "peer": caller(context),
                "request_id": request_id,
                "details": CUT_DETAILS if cut else UNSENT_DETAILS if unsent else context.details() or "",
                **({"left_out": left_out} if left_out else {}),
            },
        )

    def _observed(self, behavior, method: str, read: bool = False):
        """`behavior`, a coroutine function (a streaming one writes its replies), observed; with `read`, a unary-unary
        one registered as one whose request streams (`wrap`)."""

        async def call(request, context):
            metadata = _metadata(context)
            denied = self._denied(method, metadata)
            if read:  # `request` streams: its one message is read only once the call is admitted
                request = None
                if denied is None:
                    waiting = time.perf_counter()
                    try:
                        request = await context.read()
                        if request is grpc.aio.EOF:
                            request = await _without_request(context)
                    except asyncio.CancelledError as caught:  # the call ended first: recorded as any call that did
                        request_id, token, _ = self._begin(None, context, metadata, None)
                        self._end(context, method, request_id, waiting, token, caught, awaited=True)
                        raise
            started = time.perf_counter()
            request_id, token, refused = self._begin(request, context, metadata, denied)
            err = None
            try:
                return None if refused else await behavior(request, context)
            except BaseException as caught:
                err = caught
                raise
            finally:
                self._end(context, method, request_id, started, token, err)
                err = None  # the exception's traceback holds this frame: no cycle to keep the request alive

        return call


class ObservedServer:
    """Stands in for a `grpc.aio.Server` in the generated `add_*Servicer_to_server` functions and
    registers every method handler on the real server wrapped by `observer`."""

    def __init__(self, server: grpc.aio.Server, observer: CallObserver):
        self.server = server
        self.observer = observer
        self._unpaired = 0

    def add_generic_rpc_handlers(self, handlers) -> None:
        # The generated code passes the same handlers again to add_registered_method_handlers,
        # where they are wrapped and added (generic and registered) to the real server.
        self._unpaired += len(handlers)

    def add_registered_method_handlers(self, service: str, handlers: dict[str, grpc.RpcMethodHandler]) -> None:
        wrapped = {name: self.observer.wrap(f"/{service}/{name}", h) for name, h in handlers.items()}
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service, wrapped),))
        self.server.add_registered_method_handlers(service, wrapped)
        self._unpaired -= 1

    def check(self) -> None:
        """Raise if a servicer registered generic handlers only (they would be missing from the server)."""
        if self._unpaired:
            raise RuntimeError(f"{self._unpaired} generic handler(s) came without their method handlers")
