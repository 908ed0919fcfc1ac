"""The health service (grpc.health.v1): `Check`, and a `Watch` that no watcher can use to hold up a status change.

grpcio-health-checking's servicer writes to a `Watch` stream while holding the lock that a status change takes, so a
watcher that never reads (an HTTP/2 window of 0) blocked every later change: the SERVING flip after warm-up, the
drain's NOT_SERVING, and a fault's exit behind it. Here a change only records the status and wakes the watchers; each
stream reads the status and writes it with no lock held. A write that never goes out leaves its call to gRPC (which
cannot end one call alone: trailers wait behind the unsent message), so it ends with the shutdown's grace or
`CONNECTION_AGE_S`, as any call its client stalls.

A watcher (a gRPC client's own health checking, a mesh) holds its `Watch` call open for as long as the server serves.
Once shutdown begins, each stream sends the watcher its last status (NOT_SERVING) and ends with OK; a `Watch` opened
during the drain does the same at once. Clients open the stream again with backoff, and meet a server that refuses
new calls.
"""

import asyncio

import grpc
from edgedistill.serve.observe import refuse
from grpc_health.v1 import health_pb2, health_pb2_grpc

NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthServicer(health_pb2_grpc.HealthServicer):
    """The statuses by service name ("" is the server's); `set` changes one, `enter_graceful_shutdown` turns all
    NOT_SERVING for good. Neither waits for a watcher."""

    def __init__(self) -> None:
        self._statuses: dict[str, int] = {"": NOT_SERVING}
        self._draining = False
        self._watchers: set[asyncio.Event] = set()  # one per open `Watch`, set on each change

    async def set(self, service: str, status: health_pb2.HealthCheckResponse.ServingStatus) -> None:
        """Record `status` for `service`; ignored once the drain began."""
        if not self._draining:
            self._statuses[service] = status
            self._wake()

    async def enter_graceful_shutdown(self) -> None:
        """Every service NOT_SERVING from now on; each `Watch` stream sends it and ends."""
        self._draining = True
        self._statuses = dict.fromkeys(self._statuses, NOT_SERVING)
        self._wake()

    def _wake(self) -> None:
        for changed in self._watchers:
            changed.set()

    async def Check(self, request: health_pb2.HealthCheckRequest, context) -> health_pb2.HealthCheckResponse | None:
        if request.service not in self._statuses:
            refuse(context, grpc.StatusCode.NOT_FOUND, f"no service {request.service!r}")
            return None
        return health_pb2.HealthCheckResponse(status=self._statuses[request.service])

    async def Watch(self, request: health_pb2.HealthCheckRequest, context) -> None:
        changed = asyncio.Event()
        self._watchers.add(changed)
        sent = None
        try:
            while True:
                changed.clear()
                # read together: a drain that begins while the status is written is seen on the next turn
                draining, status = self._draining, self._statuses.get(request.service, SERVICE_UNKNOWN)
                if status != sent:
                    await context.write(health_pb2.HealthCheckResponse(status=status))
                    sent = status
                if draining:
                    return
                await changed.wait()
        finally:
            self._watchers.discard(changed)
