"""A stream's idle timer: cancels the task serving it once nothing has touched the timer for a while."""

import asyncio


class IdleWatch:
    """Cancels `task` once `touch` has not been called for `seconds`; `expired` says it did. One timer, re-armed
    only when it fires, so a touch costs a clock read."""

    def __init__(self, seconds: float, task: asyncio.Task):
        self.seconds = seconds
        self.task = task
        self.expired = False
        self.loop = asyncio.get_running_loop()
        self.last = self.loop.time()
        self._timer = self.loop.call_later(seconds, self._check)

    def touch(self) -> None:
        self.last = self.loop.time()

    def _check(self) -> None:
        remaining = self.last + self.seconds - self.loop.time()
        if remaining > 0:
            self._timer = self.loop.call_later(remaining, self._check)
        else:
            self.expired = True
            self.task.cancel()

    def stop(self) -> None:
        self._timer.cancel()
