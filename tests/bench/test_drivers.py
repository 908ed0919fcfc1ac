"""The load drivers against a fake `Classify`: pacing, saturation, and the figures of a tally."""

import asyncio

import grpc
import pytest
from edgedistill.bench import BenchError, drivers


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


def test_paced_calls_come_at_the_rate_one_at_a_time():
    classify = FakeClassify()
    tally = asyncio.run(drivers.paced(classify, ["r"], rate=100, duration=0.5))
    assert 45 <= len(tally.latencies) <= 50
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
    assert (record["requests"], record["failures"], record["error_codes"]) == (4, 1, {"UNAVAILABLE": 1})
    assert record["texts_per_s"] == 12.0
    assert record["rate_share"] == 0.375  # 3 successful calls in 2 s of 4/s
    assert record["p50_ms"] == pytest.approx(2.0)


def test_a_load_without_one_success_cannot_be_measured():
    tally = asyncio.run(drivers.saturate(FakeClassify(fail=True), ["r"], concurrency=2, duration=0.05))
    with pytest.raises(BenchError, match=r"no call succeeded; failures by status: \{'UNAVAILABLE': \d+\}"):
        tally.record(seconds=0.05, texts_per_call=1)
