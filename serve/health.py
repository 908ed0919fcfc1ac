"""The health service: grpcio-health-checking's servicer, whose `Watch` streams end when the server drains.

A watcher (a gRPC client's own health checking, a mesh) holds its `Watch` call open for as long as the server serves.
The library's `Watch` never ends, so one open stream held every drain for its whole grace, and was then cut with
UNAVAILABLE. Here each stream, once shutdown begins, sends the watcher its last status (NOT_SERVING) and ends with OK;
a `Watch` opened during the drain does the same at once. Clients open the stream again with backoff, and meet a
server that refuses new calls.
"""

import asyncio
import contextlib

from grpc_health.v1 import health, health_pb2

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class _Replies:
    """A `Watch` call's context whose writes run one at a time, under `lock`, remembering the last status sent."""

    def __init__(self, context, lock: asyncio.Lock):
        self._context = context
        self._lock = lock
        self.last: int | None = None

    def __getattr__(self, name: str):
        return getattr(self._context, name)

    async def write(self, reply: health_pb2.HealthCheckResponse) -> None:
        async with self._lock:
            await self._context.write(reply)
            self.last = reply.status


class HealthServicer(health.aio.HealthServicer):
    """The library's servicer; `Watch` ends once `enter_graceful_shutdown` was called, its last reply the status."""

    def __init__(self) -> None:
        super().__init__()
        self._draining = asyncio.Event()
        self._services: set[str] = {""}

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        self._services.add(service)
        await super().set(service, status)

    async def enter_graceful_shutdown(self) -> None:
        await super().enter_graceful_shutdown()
        self._draining.set()

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:  # the library's name
        lock = asyncio.Lock()
        replies = _Replies(context, lock)
        watching = asyncio.ensure_future(super().Watch(request, replies))
        draining = asyncio.ensure_future(self._draining.wait())
        try:
            await asyncio.wait((watching, draining), return_when=asyncio.FIRST_COMPLETED)
        finally:
            draining.cancel()
            async with lock:  # gRPC takes one write at a time: the library's is cancelled between two
                watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
        status = NOT_SERVING if request.service in self._services else SERVICE_UNKNOWN
        if replies.last != status:
            await context.write(health_pb2.HealthCheckResponse(status=status))
