"""The load drivers against a fake `Classify`: pacing, saturation, and the figures of a tally; and their channel to a
real server."""

import asyncio
import contextlib
import functools
import time
import types

import grpc
import pytest
from edgedistill.bench import BenchError, drivers
from edgedistill.bench.ports import free_port
from edgedistill.serve.proto import classifier_pb2


class FakeClassify:
    """Answers after `delay` seconds; counts the calls in flight at once."""

    def __init__(self, delay: float = 0.0, fail: bool = False):
        self.delay, self.fail = delay, fail
        self.calls = self.in_flight = self.most_in_flight = 0

    async def __call__(self, request):
        self.calls += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.fail:
                raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, None, None)
        finally:
            self.in_flight -= 1


def test_each_repeat_starts_with_the_phase_after_the_last_repeats_first():
    assert drivers.rotated(["paced", "capacity", "raw"], 1) == ["capacity", "raw", "paced"]


def test_the_order_of_the_phases_differs_in_every_repeat_until_it_comes_round():
    orders = [tuple(drivers.rotated(["cascade", "last", "echo"], repeat)) for repeat in range(4)]
    assert orders[:3] == [("cascade", "last", "echo"), ("last", "echo", "cascade"), ("echo", "cascade", "last")]
    assert orders[3] == orders[0]


class VirtualClock:
    """`drivers`' clock, whose time passes in its `asyncio.sleep` alone: a stall of the machine takes none of it (on the
    wall clock a 0.15 s stall near the end of the 0.5 s left 41 calls of 50 sent)."""

    def __init__(self):
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds
        await asyncio.sleep(0)


def test_paced_calls_come_at_the_rate_one_at_a_time(monkeypatch):
    clock, sent = VirtualClock(), []
    monkeypatch.setattr(drivers, "time", clock)
    monkeypatch.setattr(drivers, "asyncio", types.SimpleNamespace(sleep=clock.sleep, gather=asyncio.gather))

    class Timed(FakeClassify):
        async def __call__(self, request):
            sent.append(clock.now - 1000.0)
            await super().__call__(request)

    classify = Timed()
    tally = asyncio.run(drivers.paced(classify, ["r"], rate=100, duration=0.5))
    assert sent == pytest.approx([i / 100 for i in range(50)])  # each at its due time: none ahead, none skipped
    assert len(tally.latencies) == 50
    assert classify.most_in_flight == 1


def test_saturate_keeps_the_concurrency_in_flight():
    classify = FakeClassify(delay=0.01)
    tally = asyncio.run(drivers.saturate(classify, ["a", "b"], concurrency=4, duration=0.3))
    assert classify.most_in_flight == 4
    assert len(tally.latencies) == classify.calls


def test_a_record_counts_texts_and_failures():
    tally = drivers.Tally(latencies=[0.001, 0.002, 0.003])
    tally.errors["UNAVAILABLE"] += 1
    record = tally.record(seconds=2.0, texts_per_call=8, offered_rate=4.0)
    assert record["requests"] == 4
    assert record["failures"] == 1
    assert record["error_codes"] == {"UNAVAILABLE": 1}
    assert record["texts_per_s"] == 12.0
    assert record["rate_share"] == 0.375  # 3 successful calls in 2 s of 4/s
    assert record["p50_ms"] == pytest.approx(2.0)


def test_a_load_without_one_success_cannot_be_measured():
    tally = asyncio.run(drivers.saturate(FakeClassify(fail=True), ["r"], concurrency=2, duration=0.05))
    with pytest.raises(BenchError, match=r"no call succeeded; failures by status: \{'UNAVAILABLE': \d+\}"):
        tally.record(seconds=0.05, texts_per_call=1)


def test_a_measured_load_without_one_success_is_refused_naming_what_was_measured():
    load = functools.partial(drivers.saturate, FakeClassify(fail=True), ["r"], concurrency=2, duration=0.05)
    with pytest.raises(BenchError, match=r"^repeat 2/3 server, paced 200/s: no call succeeded"):
        asyncio.run(drivers.measure(load, 1, None, what="repeat 2/3 server, paced 200/s"))


class SlowOnce(FakeClassify):
    """Answers at once, but the `slow`-th call takes `delay` seconds."""

    def __init__(self, slow: int, delay: float):
        super().__init__()
        self.slow, self.slow_delay = slow, delay

    async def __call__(self, request):
        self.delay = self.slow_delay if self.calls == self.slow else 0.0
        await super().__call__(request)


@pytest.fixture(scope="module")
def stalled():
    """A paced tally of 100 calls at 100 calls/s whose sixth call took 55 ms, holding back the calls due behind it."""
    return asyncio.run(drivers.paced(SlowOnce(slow=5, delay=0.055), ["r"], rate=100, duration=1.0))


def test_calls_due_while_a_slow_call_runs_count_as_late(stalled):
    assert stalled.record(seconds=1.0, texts_per_call=1)["late_calls"] >= 4


def test_the_p99_from_the_due_time_counts_a_slow_calls_delay_to_the_calls_behind_it(stalled):
    record = stalled.record(seconds=1.0, texts_per_call=1)
    assert record["p99_from_due_ms"] >= record["p99_ms"] + 20


@pytest.mark.serial  # a bound on time: a loaded machine wakes a call late
def test_paced_calls_on_time_wait_for_none_before_them():
    tally = asyncio.run(drivers.paced(FakeClassify(), ["r"], rate=100, duration=0.2))
    assert tally.record(seconds=0.2, texts_per_call=1)["late_calls"] == 0


class HangsAfter(FakeClassify):
    """Answers at once until `after` seconds past its first call, then takes `delay` seconds over each call."""

    def __init__(self, after: float, delay: float):
        super().__init__()
        self.after, self.hang = after, delay
        self.first: float | None = None

    async def __call__(self, request):
        now = asyncio.get_running_loop().time()
        self.first = now if self.first is None else self.first
        self.delay = self.hang if now - self.first >= self.after else 0.0
        await super().__call__(request)


@pytest.fixture(scope="module")
def stalled_at_the_end() -> dict:
    """The record of the 100 calls due in 0.5 s at 200 calls/s, the server hanging 0.3 s over each call from 0.45 s
    on: the run ends with the calls due in its last 0.05 s never sent, each having waited 0.25 s and more."""
    tally = asyncio.run(drivers.paced(HangsAfter(after=0.45, delay=0.3), ["r"], rate=200, duration=0.5))
    return tally.record(seconds=0.75, texts_per_call=1)


def test_paced_calls_due_but_unsent_at_the_end_count_as_unsent(stalled_at_the_end):
    assert stalled_at_the_end["unsent_calls"] >= 5, stalled_at_the_end  # those due in the last 0.05 s: 9


def test_paced_calls_due_but_unsent_at_the_end_are_not_failures(stalled_at_the_end):
    assert stalled_at_the_end["error_codes"] == {}


def test_paced_calls_are_requests_or_unsent(stalled_at_the_end):
    assert stalled_at_the_end["requests"] + stalled_at_the_end["unsent_calls"] == 100, stalled_at_the_end


def test_paced_calls_due_but_unsent_at_the_end_raise_the_p99_from_the_due_time(stalled_at_the_end):
    # the one hung call alone, of 91 sent, puts the p99 of the calls sent at about 30 ms
    assert stalled_at_the_end["p99_from_due_ms"] >= 200, stalled_at_the_end


@pytest.mark.serial  # a bound on time: a loaded machine that falls 100 ms behind leaves the last call unsent
def test_a_slow_last_paced_call_keeps_the_whole_rate_share():
    load = functools.partial(drivers.paced, SlowOnce(slow=9, delay=0.5), ["r"], rate=10, duration=1.0)
    assert asyncio.run(drivers.measure(load, 1, None, offered_rate=10))["rate_share"] == 1.0


def test_saturating_calls_have_no_due_time():
    tally = asyncio.run(drivers.saturate(FakeClassify(), ["r"], concurrency=2, duration=0.05))
    assert "p99_from_due_ms" not in tally.record(seconds=0.05, texts_per_call=1)


def test_the_calls_due_in_a_run_whose_rate_times_seconds_rounds_up_are_not_one_too_many():
    assert drivers.calls_due(rate=8.3, duration=30) == 249  # 8.3 * 30 is 249.00000000000003 in floats


def test_the_drivers_call_the_server_past_a_proxy_of_the_environment(served, monkeypatch):
    monkeypatch.setenv("http_proxy", f"http://127.0.0.1:{free_port()}")

    async def one_call():
        async with contextlib.AsyncExitStack() as stack:
            classify = await drivers.classify_call(stack, served.port)
            return await classify(classifier_pb2.ClassifyRequest(texts=["a fine film"]))

    assert len(asyncio.run(one_call()).predictions) == 1


class ClosingBackend:
    """A backend whose calls take 20 ms; counts the calls begun after `close`, which would run on freed buffers."""

    def __init__(self):
        self.closed = False
        self.calls_after_close = 0

    def infer(self, batch):
        self.calls_after_close += self.closed
        time.sleep(0.02)

    def close(self):
        self.closed = True


@pytest.fixture(scope="module")
def cancelled_backend_load() -> tuple[ClosingBackend, float]:
    """A 30 s backend load cancelled after 0.2 s (as Ctrl-C cancels the benchmark's task), its backend closed by the
    exit stack the load was made in; the backend, and the seconds until the stack had closed."""
    backend = ClosingBackend()

    async def cancelled():
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(backend.close)
            load = drivers.infer_in_thread(stack, backend, [{}], 30.0)
            await asyncio.wait_for(drivers.measure(load, 1, None), 0.2)

    start = time.perf_counter()
    with pytest.raises(TimeoutError):
        asyncio.run(cancelled())
    return backend, time.perf_counter() - start


def test_a_cancelled_backend_load_calls_the_backend_no_more_once_it_is_closed(cancelled_backend_load):
    assert cancelled_backend_load[0].calls_after_close == 0


def test_a_cancelled_backend_load_stops_calling_the_backend_at_once(cancelled_backend_load):
    assert cancelled_backend_load[1] < 5.0


def test_a_backend_load_in_its_own_thread_is_measured():
    async def measured():
        async with contextlib.AsyncExitStack() as stack:
            return await drivers.measure(drivers.infer_in_thread(stack, ClosingBackend(), [{}], 0.1), 1, None)

    assert asyncio.run(measured())["requests"] > 0
