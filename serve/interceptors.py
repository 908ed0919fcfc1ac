"""Server interceptors: request ids, metrics and access logs for every call; bearer-token auth.

`ObservingInterceptor` goes first so it also counts and logs the calls that auth rejects.
"""

import asyncio
import hmac
import inspect
import logging
import time
import uuid

import grpc

from serve.logs import REQUEST_ID
from serve.metrics import Metrics

log = logging.getLogger("serve.access")

REQUEST_ID_KEY = "x-request-id"
MAX_REQUEST_ID = 128
HEALTH_PREFIX = "/grpc.health.v1.Health/"
_KINDS = (
    ("unary_unary", grpc.unary_unary_rpc_method_handler),
    ("unary_stream", grpc.unary_stream_rpc_method_handler),
    ("stream_unary", grpc.stream_unary_rpc_method_handler),
    ("stream_stream", grpc.stream_stream_rpc_method_handler),
)


def _metadata(details: grpc.HandlerCallDetails) -> dict[str, str]:
    return {key: value for key, value in (details.invocation_metadata or ()) if isinstance(value, str)}


def _replace_behavior(handler: grpc.RpcMethodHandler, make) -> grpc.RpcMethodHandler:
    """The same kind of handler, with its behavior `b` replaced by `make(b)`."""
    for kind, build in _KINDS:
        behavior = getattr(handler, kind)
        if behavior is not None:
            return build(
                make(behavior),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
    raise ValueError("a method handler without a behavior")


def _status_code(context: grpc.aio.ServicerContext, err: BaseException | None) -> grpc.StatusCode:
    if isinstance(err, asyncio.CancelledError):
        remaining = context.time_remaining()
        return (
            grpc.StatusCode.DEADLINE_EXCEEDED if remaining is not None and remaining <= 0 else grpc.StatusCode.CANCELLED
        )
    code = context.code()
    if isinstance(code, grpc.StatusCode):
        return code
    return grpc.StatusCode.OK if err is None else grpc.StatusCode.UNKNOWN


class ObservingInterceptor(grpc.aio.ServerInterceptor):
    """Gives each call a request id (the client's `x-request-id`, or a new one) returned in trailing
    metadata and attached to its log lines; records its status and latency in `metrics`; logs failed
    calls, and successful ones too with `access_log`."""

    def __init__(self, metrics: Metrics, access_log: bool = False):
        self.metrics = metrics
        self.access_log = access_log

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None:
            return None
        method = details.method
        request_id = _metadata(details).get(REQUEST_ID_KEY, "")[:MAX_REQUEST_ID] or uuid.uuid4().hex
        return _replace_behavior(handler, lambda behavior: self._observed(behavior, method, request_id))

    def _begin(self, context, request_id):
        context.set_trailing_metadata(((REQUEST_ID_KEY, request_id),))
        return REQUEST_ID.set(request_id), time.perf_counter()

    def _end(self, context, method, request_id, started, token, err):
        seconds = time.perf_counter() - started
        code = _status_code(context, err).name
        self.metrics.observe_call(method, code, seconds)
        REQUEST_ID.reset(token)
        if code == "OK" and not self.access_log:
            return
        if code in ("INTERNAL", "UNKNOWN", "DATA_LOSS"):
            level = logging.ERROR
        elif code == "OK" and method.startswith(HEALTH_PREFIX):
            level = logging.DEBUG  # probes every few seconds would drown the rest
        else:
            level = logging.INFO
        log.log(
            level,
            "%s %s %.1f ms",
            method,
            code,
            seconds * 1000,
            extra={
                "event": "rpc",
                "method": method,
                "code": code,
                "ms": round(seconds * 1000, 3),
                "peer": context.peer(),
                "request_id": request_id,
            },
        )

    def _observed(self, behavior, method, request_id):
        if inspect.isasyncgenfunction(behavior):

            async def stream(request, context):
                token, started = self._begin(context, request_id)
                err = None
                try:
                    async for response in behavior(request, context):
                        yield response
                except BaseException as caught:
                    err = caught
                    raise
                finally:
                    self._end(context, method, request_id, started, token, err)

            return stream

        async def call(request, context):
            token, started = self._begin(context, request_id)
            err = None
            try:
                return await behavior(request, context)
            except BaseException as caught:
                err = caught
                raise
            finally:
                self._end(context, method, request_id, started, token, err)

        return call


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call except health checks (so probes work)."""

    def __init__(self, token: str, exempt: tuple[str, ...] = (HEALTH_PREFIX,)):
        self._expected = f"Bearer {token}".encode()
        self.exempt = exempt

    def _authorized(self, details) -> bool:
        sent = _metadata(details).get("authorization", "")
        return hmac.compare_digest(sent.encode(), self._expected)

    async def intercept_service(self, continuation, details):
        handler = await continuation(details)
        if handler is None or details.method.startswith(self.exempt) or self._authorized(details):
            return handler

        async def reject(request, context):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED, "missing or invalid bearer token: send 'authorization: Bearer <token>'"
            )

        return _replace_behavior(handler, lambda behavior: reject)
