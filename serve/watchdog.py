"""The event loop's watchdog: a thread that expects the loop to run a heartbeat within `limit` seconds.

A backend call expected to be quick runs on the event loop itself (`INLINE_INFER_MS`), where the batcher's own
watchdog (`DynamicBatcher.batch_timeout`) cannot time it: one that hangs there blocks the loop, and with it every
coroutine that could fail the waiting calls or turn health off. This thread asks the loop for a heartbeat each
period, and when one waits unanswered past the limit, calls `on_stall` from its own thread with the seconds it waited;
the server then exits for its supervisor to restart it, and the clients' calls end with UNAVAILABLE as their
connections close. Time the whole process was paused (SIGSTOP, `docker pause`, a frozen cgroup) is not counted.
"""

import asyncio
import threading
import time
from collections.abc import Callable

MAX_PERIOD_S = 1.0  # longest wait between two heartbeats asked of the loop


class LoopWatchdog:
    """Calls `on_stall(seconds)` once, from its thread, when a heartbeat asked of `loop` waits over `limit` seconds."""

    def __init__(self, loop: asyncio.AbstractEventLoop, limit: float, on_stall: Callable[[float], None]):
        if limit <= 0:
            raise ValueError("limit must be > 0")
        self.loop = loop
        self.limit = limit
        self.on_stall = on_stall
        self.period = min(MAX_PERIOD_S, limit / 4)
        self._answered = 0  # the number of the last heartbeat the loop ran
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="loop-watchdog", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def _heartbeat(self, number: int) -> None:
        self._answered = number

    def _watch(self) -> None:
        """Each period, ask the next heartbeat once the last was answered, else time the one asked."""
        asked = last = time.monotonic()
        number = 0
        while not self._stopped.wait(self.period):
            if self.loop.is_closed():  # nothing left to watch, nor to answer the heartbeat asked
                return
            now = time.monotonic()
            late = now - last - self.period
            if late > self.period:  # this thread did not run either: the whole process was paused, not the loop
                asked += late
            last = now
            if self._answered == number:
                number += 1
                asked = now
                try:
                    self.loop.call_soon_threadsafe(self._heartbeat, number)
                except RuntimeError:  # the loop was closed meanwhile
                    return
            elif now - asked > self.limit:
                self.on_stall(now - asked)
                return
