"""A stream's idle timer: cancels the task serving it once its client has kept it waiting for a while."""

import asyncio
import contextlib
from collections.abc import Iterator

import grpc
from edgedistill.serve.batching import ENDED_BY_SERVER
from edgedistill.serve.observe import refuse


class IdleWatch:
    """Cancels `task` once `touch` has not been called for `seconds`, not counting time `paused`; `expired` says it
    did. One timer, re-armed only when it fires, so a touch costs a clock read."""

    def __init__(self, seconds: float, task: asyncio.Task):
        self.seconds = seconds
        self.task = task
        self.expired = False
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._paused = False
        self._timer = self.loop.call_later(seconds, self._check)

    def touch(self) -> None:
        self.last = self.loop.time()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The clock stands still inside the block (the stream waits on the server, not its client); it restarts
        from the block's end."""
        self._paused = True
        try:
            yield
        finally:
            self._paused = False
            self.touch()

    def _check(self) -> None:
        remaining = self.seconds if self._paused else self.last + self.seconds - self.loop.time()
        if remaining > 0:
            self._timer = self.loop.call_later(remaining, self._check)
        else:
            self.expired = True
            self.task.cancel(ENDED_BY_SERVER)  # and the call it awaits: its queued rows count as ended

    def stop(self) -> None:
        self._timer.cancel()


@contextlib.contextmanager
def idle_limit(seconds: float, context: grpc.aio.ServicerContext) -> Iterator[IdleWatch]:
    """An `IdleWatch` of `seconds` (STREAM_IDLE_S) on the task serving a stream: once it expires, the stream ends
    with DEADLINE_EXCEEDED."""
    idle = IdleWatch(seconds, asyncio.current_task())
    try:
        yield idle
    except asyncio.CancelledError:
        if not idle.expired:
            raise
        idle.task.uncancel()  # the timer's own cancellation, handled here
        refuse(
            context,
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"no request on this stream for {seconds:g} s (STREAM_IDLE_S), or no reply read: the server ended it; "
            "open a new stream to send more",
        )
    finally:
        idle.stop()
