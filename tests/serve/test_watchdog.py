"""The event loop's watchdog: a stalled loop is reported once from the watchdog's thread, a running one never."""

import asyncio
import threading
import time

import pytest
from edgedistill.serve.watchdog import LoopWatchdog

LIMIT_S = 0.2


def watch(body, limit: float = LIMIT_S) -> list[float]:
    """Run `body()` on a fresh loop under a watchdog of `limit` seconds; the stalls it reported."""
    stalls: list[float] = []
    reported = threading.Event()

    def on_stall(seconds: float) -> None:
        stalls.append(seconds)
        reported.set()

    async def main():
        watchdog = LoopWatchdog(asyncio.get_running_loop(), limit, on_stall)
        watchdog.start()
        try:
            await body()
        finally:
            watchdog.stop()

    asyncio.run(main())
    return stalls


def test_a_loop_blocked_past_the_limit_is_reported_once():
    async def blocked():
        time.sleep(LIMIT_S * 4)  # a call that hangs on the loop

    stalls = watch(blocked)
    assert len(stalls) == 1


def test_the_reported_stall_is_longer_than_the_limit():
    async def blocked():
        time.sleep(LIMIT_S * 4)

    assert watch(blocked)[0] > LIMIT_S


@pytest.mark.serial  # a bound on time: a loaded machine runs the loop's heartbeat late
def test_a_loop_that_keeps_running_is_never_reported():
    async def busy_but_responsive():
        for _ in range(40):  # 4 limits of short blocking steps
            time.sleep(LIMIT_S / 10)
            await asyncio.sleep(0)

    assert watch(busy_but_responsive) == []


@pytest.mark.serial  # a bound on time: a loaded machine runs the loop's heartbeat late
def test_an_idle_loop_is_never_reported():
    async def idle():
        await asyncio.sleep(LIMIT_S * 4)

    assert watch(idle) == []


class PausedClock:
    """`time` for the watchdog: the monotonic clock, which jumps by `skipped` seconds, as both threads see it after
    SIGSTOP and SIGCONT."""

    skipped = 0.0

    def monotonic(self) -> float:
        return time.monotonic() + self.skipped


@pytest.fixture
def clock(monkeypatch) -> PausedClock:
    clock = PausedClock()
    monkeypatch.setattr("edgedistill.serve.watchdog.time", clock)
    return clock


def test_a_pause_of_the_whole_process_while_idle_is_never_reported(clock):
    async def idle_then_paused():
        await asyncio.sleep(LIMIT_S)
        clock.skipped = LIMIT_S * 4
        await asyncio.sleep(LIMIT_S * 2)

    assert watch(idle_then_paused) == []


class PausedWhileBusyClock(PausedClock):
    """Jumps at the watchdog's third reading (it reads the clock as it starts, then once a pass: the second pass,
    after the first asked a heartbeat), while the loop runs a step that then ends (`resumed`)."""

    def __init__(self):
        self.readings = 0
        self.resumed = threading.Event()

    def monotonic(self) -> float:
        self.readings += 1
        if self.readings == 3:
            self.skipped = LIMIT_S * 4
            self.resumed.set()
        return super().monotonic()


def test_a_pause_of_the_whole_process_while_a_heartbeat_waits_is_never_reported(monkeypatch):
    clock = PausedWhileBusyClock()
    monkeypatch.setattr("edgedistill.serve.watchdog.time", clock)

    async def busy_then_paused():
        clock.resumed.wait(LIMIT_S * 4)  # a blocking step, paused midway
        await asyncio.sleep(LIMIT_S * 2)

    assert watch(busy_then_paused) == []


def test_a_watchdog_whose_loop_closed_with_a_heartbeat_asked_never_reports():
    stalls = []
    loop = asyncio.new_event_loop()
    watchdog = LoopWatchdog(loop, LIMIT_S, stalls.append)
    watchdog.start()
    time.sleep(LIMIT_S / 2)  # the loop is not running: the heartbeat asked meanwhile waits
    loop.close()
    time.sleep(LIMIT_S * 2)
    watchdog.stop()
    assert stalls == []


def test_stop_ends_the_watchdog_thread():
    async def body():
        watchdog = LoopWatchdog(asyncio.get_running_loop(), LIMIT_S, lambda seconds: None)
        watchdog.start()
        watchdog.stop()
        return watchdog._thread.is_alive()

    assert asyncio.run(body()) is False


def test_a_limit_of_zero_is_refused():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="limit"):
            LoopWatchdog(loop, 0, lambda seconds: None)
    finally:
        loop.close()
