"""The reflection service: grpcio-reflection's servicer, whose streams end when the server drains or they idle.

grpcurl and IDE clients hold a `ServerReflectionInfo` stream open between their requests. The library's stream ends
only when its client ends it, so one open stream held every drain for its whole grace, and was then cut. Here a stream
ends as an open `ClassifyStream` does: once the drain begins, after the reply to the request being answered, with
UNAVAILABLE (open a new stream); one opened during the drain at once. Reflection clients open a new stream for their
next request. A stream that receives no request for STREAM_IDLE_S (or whose client reads no reply) ends with
DEADLINE_EXCEEDED.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterable, AsyncIterator

import grpc
from edgedistill.serve.errors import NotReady
from edgedistill.serve.idle import IdleWatch, idle_limit
from edgedistill.serve.observe import refuse
from edgedistill.serve.transport import SHUTDOWN_STREAM
from google.protobuf.message import DecodeError
from grpc_reflection.v1alpha import reflection, reflection_pb2


class ReflectionServicer(reflection.aio.ReflectionServicer):
    """The library's servicer for `service_names` from `pool`; a stream ends once `shutting_down` is set or it
    receives no request for `idle_s` seconds."""

    def __init__(self, service_names, pool, idle_s: float, shutting_down: asyncio.Event):
        super().__init__(service_names, pool=pool)
        self.idle_s = idle_s
        self.shutting_down = shutting_down

    async def ServerReflectionInfo(self, request_iterator, context) -> None:  # the library's name
        with idle_limit(self.idle_s, context) as idle:
            requests = _until_drain(request_iterator, self.shutting_down, idle)
            try:
                async with contextlib.aclosing(super().ServerReflectionInfo(requests, context)) as replies:
                    async for reply in replies:
                        await context.write(reply)
            except NotReady as err:
                refuse(context, grpc.StatusCode.UNAVAILABLE, str(err))
            except DecodeError as err:  # bytes from the client that do not parse as a ServerReflectionRequest
                refuse(context, grpc.StatusCode.INVALID_ARGUMENT, f"a stream message does not parse: {err}")
            except grpc.aio.BaseError:  # a failed read or write: the call already ended, its client went away
                context.set_code(grpc.StatusCode.CANCELLED)


async def _until_drain(
    requests: AsyncIterable[reflection_pb2.ServerReflectionRequest], shutting_down: asyncio.Event, idle: IdleWatch
) -> AsyncIterator[reflection_pb2.ServerReflectionRequest]:
    """`requests` as they arrive, each touching `idle`, until `shutting_down` is set: then `NotReady`."""
    if shutting_down.is_set():  # opened during the drain: the request reader is left unstarted
        raise NotReady(SHUTDOWN_STREAM)
    iterator = aiter(requests)
    draining = asyncio.ensure_future(shutting_down.wait())
    received: asyncio.Future | None = None
    try:
        while not shutting_down.is_set():
            received = asyncio.ensure_future(anext(iterator, None))
            await asyncio.wait((received, draining), return_when=asyncio.FIRST_COMPLETED)
            if not received.done():
                break
            if (request := received.result()) is None:  # the client ended its side
                return
            idle.touch()
            yield request
        raise NotReady(SHUTDOWN_STREAM)
    finally:
        draining.cancel()
        if received is not None:
            received.cancel()
