"""The dynamic batcher against a fake backend: batching, order, padding, limits, cancellation."""

import asyncio
import json
import random
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from edgedistill.common.runtime import DeviceError
from edgedistill.serve.batching import (
    ENDED_BY_SERVER,
    BatchObserver,
    BatchResult,
    DropReason,
    DynamicBatcher,
    calls_left_running,
    pad_rows,
)
from edgedistill.serve.costmodel import BackendCost
from edgedistill.serve.errors import DEADLINE_SLACK_S, BatcherClosed, DeadlineExpired, Overloaded, ServerFault
from edgedistill.serve.logs import REQUEST_ID, JsonFormatter
from edgedistill.serve.metrics import Metrics
from edgedistill.serve.settings import Settings


class FakeBackend:
    """Sums each row's ids under its mask; records every batch's padded shape."""

    def __init__(self, delay: float = 0.0, gate: threading.Event | None = None):
        self.shapes: list[tuple[int, int]] = []
        self.seen: list[int] = []
        self.delay = delay
        self.gate = gate
        self.entered = threading.Event()
        self.returned = threading.Event()

    def __call__(self, inputs):
        self.entered.set()
        try:
            if self.gate is not None:
                assert self.gate.wait(10)
            time.sleep(self.delay)
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            self.shapes.append(ids.shape)
            self.seen.extend(ids[:, 0].tolist())
            return {"sum": (ids * mask).sum(axis=1).astype(np.float32), "length": mask.sum(axis=1)}
        finally:
            self.returned.set()


class Recorder(BatchObserver):
    def __init__(self):
        self.batches, self.dropped, self.waits, self.depths = [], [], [], []

    def queue_depth(self, rows):
        self.depths.append(rows)

    def batch_done(self, rows, seconds):
        self.batches.append(rows)

    def request_done(self, queue_wait):
        self.waits.append(queue_wait)

    def rows_dropped(self, rows, reason):
        self.dropped.append((rows, reason))


def row(*ids: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.array(ids, np.int64), "attention_mask": np.ones(len(ids), np.int64)}


class FailsFirstCall:
    """A backend that raises on its first call and sums each row's ids after; `calls` holds each call's rows."""

    def __init__(self):
        self.calls: list[int] = []

    def __call__(self, inputs):
        self.calls.append(inputs["input_ids"].shape[0])
        if len(self.calls) == 1:
            raise RuntimeError("backend exploded")
        return {"sum": inputs["input_ids"].sum(axis=1)}


def batcher(backend, **kwargs) -> DynamicBatcher:
    options = {"max_batch_size": 8, "max_delay": 0.02, "max_queued": 64, "pad_values": {"input_ids": 0}} | kwargs
    return DynamicBatcher(backend, **options)


def test_concurrent_requests_form_batches_with_unbatched_results_in_order():
    rng = random.Random(0)
    requests = [
        [row(*(rng.randrange(1, 50) for _ in range(rng.randrange(1, 12)))) for _ in range(rng.randrange(1, 4))]
        for _ in range(30)
    ]
    backend, observer = FakeBackend(), Recorder()

    async def main():
        b = batcher(backend, observer=observer)
        b.start()
        results = await asyncio.gather(*(b.submit(rows) for rows in requests))
        await b.close()
        return results

    results = asyncio.run(main())
    for rows, result in zip(requests, results, strict=True):
        assert result.outputs["sum"].tolist() == [float(r["input_ids"].sum()) for r in rows]
        assert result.outputs["length"].tolist() == [len(r["input_ids"]) for r in rows]
    assert max(observer.batches) > 1, "concurrent requests should share backend calls"
    assert all(size <= 8 for size in observer.batches)
    assert sum(observer.batches) == sum(len(rows) for rows in requests)
    assert len(observer.waits) == len(requests)


def test_batch_takes_similar_lengths_with_the_oldest_row():
    backend = FakeBackend()

    async def main():
        b = batcher(backend, max_batch_size=2, max_delay=0.05)
        b.start()
        lengths = [1, 9, 2, 10]
        await asyncio.gather(*(b.submit([row(*([n] * n))]) for n in lengths))
        await b.close()

    asyncio.run(main())
    # the oldest (length 1) goes with the closest length (2), then 9 with 10: 2 + 10 columns, not 9 + 10
    assert backend.shapes == [(2, 2), (2, 10)]


def test_a_partial_batch_waits_for_the_delay():
    backend = FakeBackend()

    async def main():
        b = batcher(backend, max_batch_size=2, max_delay=0.3)
        b.start()
        start = time.perf_counter()
        await b.submit([row(1)])
        partial = time.perf_counter() - start
        await b.close()
        return partial

    assert asyncio.run(main()) >= 0.29


def test_a_full_batch_does_not_wait_for_the_delay():
    backend = FakeBackend()

    async def main():
        b = batcher(backend, max_batch_size=2, max_delay=3600)
        b.start()
        # held for the delay (an hour), the full batch would still be queued when wait_for gives up
        result = await asyncio.wait_for(b.submit([row(1), row(2)]), 60)
        await b.close()
        return result

    assert asyncio.run(main()).outputs["sum"].tolist() == [1.0, 2.0]
    assert backend.shapes == [(2, 1)]


def test_large_request_is_split_across_batches_and_reassembled():
    backend, observer = FakeBackend(), Recorder()

    async def main():
        b = batcher(backend, max_batch_size=3, max_delay=0.0, observer=observer)
        b.start()
        result = await b.submit([row(i, i) for i in range(1, 8)])
        await b.close()
        return result

    result = asyncio.run(main())
    assert result.outputs["sum"].tolist() == [2.0 * i for i in range(1, 8)]
    assert [s[0] for s in backend.shapes] == [3, 3, 1]
    assert observer.batches == [3, 3, 1], "each batch is reported to the observer"


def test_rows_being_admitted_count_against_the_queue_limit():
    async def main():
        b = batcher(FakeBackend(), max_queued=4)
        b.start()
        with b.admit(3):
            with pytest.raises(Overloaded, match="3 being prepared"):
                await b.submit([row(1), row(2)])
            with pytest.raises(Overloaded, match="limit of 4"), b.admit(2):
                pass
        result = await b.submit([row(1), row(2), row(3), row(4)])  # the places were given back
        await b.close()
        return result

    assert asyncio.run(main()).outputs["sum"].tolist() == [1.0, 2.0, 3.0, 4.0]


def test_admitted_places_are_given_back_when_the_block_raises():
    b = batcher(FakeBackend(), max_queued=4)
    with pytest.raises(ValueError), b.admit(3):
        raise ValueError("tokenizing failed")
    assert b.room == 4


def test_rows_made_in_a_thread_are_reported_admitted_before_the_thread_starts_and_not_after():
    class Admitted(Recorder):
        rows = 0

        def rows_admitted(self, rows):
            self.rows += rows

    observer = Admitted()

    async def main():
        b = batcher(FakeBackend(), observer=observer)
        with ThreadPoolExecutor(1) as pool, b.admit(3) as admission:
            return await admission.making(pool, lambda: observer.rows)

    assert (asyncio.run(main()), observer.rows) == (3, 0)


def test_a_refused_admission_holds_no_places():
    b = batcher(FakeBackend(), max_queued=4)
    with pytest.raises(Overloaded), b.admit(5):
        pass
    assert b.room == 4


def test_overload_is_refused_then_recovers():
    gate = threading.Event()
    backend = FakeBackend(gate=gate)

    async def main():
        b = batcher(backend, max_batch_size=1, max_delay=0.0, max_queued=3)
        b.start()
        running = asyncio.ensure_future(b.submit([row(1)]))
        assert await asyncio.to_thread(backend.entered.wait, 5)  # the backend holds row 1, the queue is empty
        queued = [asyncio.ensure_future(b.submit([row(i)])) for i in (2, 3, 4)]
        await asyncio.sleep(0.05)
        with pytest.raises(Overloaded, match="limit of 3"):
            await b.submit([row(5)])
        gate.set()
        done = await asyncio.gather(running, *queued)
        after = await b.submit([row(6)])
        await b.close()
        return done, after

    done, after = asyncio.run(main())
    assert [r.outputs["sum"][0] for r in done] == [1.0, 2.0, 3.0, 4.0]
    assert after.outputs["sum"][0] == 6.0


def test_cancelled_request_is_dropped_before_the_batch_runs():
    backend, observer = FakeBackend(), Recorder()

    async def main():
        b = batcher(backend, max_delay=0.2, observer=observer)
        b.start()
        doomed = asyncio.ensure_future(b.submit([row(7), row(7)]))
        kept = asyncio.ensure_future(b.submit([row(3)]))
        await asyncio.sleep(0.05)
        doomed.cancel()
        result = await kept
        with pytest.raises(asyncio.CancelledError):
            await doomed
        await b.close()
        return result

    result = asyncio.run(main())
    assert result.outputs["sum"].tolist() == [3.0]
    assert backend.seen == [3], "the cancelled rows must not reach the backend"
    assert observer.dropped == [(2, DropReason.CANCELLED)]


def cancelled_as_its_batch_is_taken() -> tuple[list[int], list[tuple[int, DropReason]]]:
    """The rows the backend ran, and the drops counted, when of two queued one-row requests the second is cancelled in
    the step in which the batcher takes it (its batch of one after the first's, run on the event loop)."""
    backend, observer, clients = FakeBackend(), Recorder(), []

    def cancels_the_second_client(inputs):  # on the event loop: the batcher takes its next batch in this step
        clients[1].cancel()
        return backend(inputs)

    async def main():
        b = batcher(cancels_the_second_client, max_batch_size=1, max_delay=0.01, inline_max=1.0, observer=observer)
        b.calibrate([(1, 1, 1e-6), (4, 8, 2e-6)])  # quick: batches run on the event loop
        b.start()
        clients.extend(asyncio.ensure_future(b.submit([row(n)])) for n in (1, 2))
        await asyncio.gather(*clients, return_exceptions=True)
        await b.close()

    asyncio.run(main())
    return backend.seen, observer.dropped


def test_a_request_cancelled_in_the_step_its_batch_is_taken_does_not_run():
    assert cancelled_as_its_batch_is_taken()[0] == [1]


def test_a_request_cancelled_in_the_step_its_batch_is_taken_is_counted_as_cancelled():
    assert cancelled_as_its_batch_is_taken()[1] == [(1, DropReason.CANCELLED)]


def test_rows_a_shutdown_cuts_once_its_grace_ran_out_are_dropped_as_closed_not_cancelled():
    gate = threading.Event()
    backend, observer = FakeBackend(gate=gate), Recorder()

    async def main():
        b = batcher(backend, max_batch_size=1, max_delay=0.01, observer=observer)
        b.start()
        running = asyncio.ensure_future(b.submit([row(1)]))
        queued = asyncio.ensure_future(b.submit([row(2), row(2)]))
        await asyncio.to_thread(backend.entered.wait, 5)
        b.grace_ends(asyncio.get_running_loop().time())
        queued.cancel()  # as gRPC cancels a call still running when the grace runs out
        with pytest.raises(asyncio.CancelledError):
            await queued
        gate.set()
        await running
        await b.close()

    asyncio.run(main())
    assert observer.dropped == [(2, DropReason.CLOSED)]


def test_rows_past_their_deadline_are_dropped():
    backend, observer = FakeBackend(), Recorder()

    async def main():
        b = batcher(backend, max_delay=0.15, observer=observer)
        b.start()
        loop = asyncio.get_running_loop()
        late = asyncio.ensure_future(b.submit([row(9)], deadline=loop.time() + 0.02))
        on_time = asyncio.ensure_future(b.submit([row(4)], deadline=loop.time() + 5))
        with pytest.raises(DeadlineExpired):
            await late
        result = await on_time
        await b.close()
        return result

    result = asyncio.run(main())
    assert result.outputs["sum"].tolist() == [4.0]
    assert backend.seen == [4]
    assert observer.dropped == [(1, DropReason.DEADLINE)]


@pytest.mark.parametrize(
    ("deadline_s", "cancel_at_s"),
    # as gRPC cancels a call's handler at its deadline, before the batcher looks at the queue; and as a client's
    # deadline cancels its call, a little before the server's own timer ends
    [(0.02, 0.05), (0.1, 0.1 - DEADLINE_SLACK_S / 2)],
    ids=["past", "just_before"],
)
def test_a_request_cancelled_at_its_deadline_is_dropped_for_the_deadline(deadline_s, cancel_at_s):
    backend, observer = FakeBackend(), Recorder()

    async def main():
        b = batcher(backend, max_delay=0.3, observer=observer)
        b.start()
        late = asyncio.ensure_future(b.submit([row(9)], deadline=asyncio.get_running_loop().time() + deadline_s))
        await asyncio.sleep(cancel_at_s)
        late.cancel()
        with pytest.raises(asyncio.CancelledError):
            await late
        await b.close()

    asyncio.run(main())
    assert backend.seen == []
    assert observer.dropped == [(1, DropReason.DEADLINE)]


def rest_of_a_queue(drop: str) -> tuple[list[int], Recorder, list]:
    """Five requests queued, the second and fourth (2 and 3 rows) then cancelled or past their deadline: the rows the
    backend saw, the observer, and each request's result."""
    backend, observer = FakeBackend(), Recorder()

    async def main():
        b = batcher(backend, max_batch_size=16, max_delay=0.2, observer=observer)
        b.start()
        deadline = asyncio.get_running_loop().time() + 0.05
        sizes = {1: 1, 2: 2, 3: 1, 4: 3, 5: 1}
        held = {
            n: asyncio.ensure_future(b.submit([row(n)] * size, deadline if drop == "expired" and n in (2, 4) else None))
            for n, size in sizes.items()
        }
        if drop == "cancelled":
            await asyncio.sleep(0.05)
            held[2].cancel()
            held[4].cancel()
        results = await asyncio.gather(*held.values(), return_exceptions=True)
        await b.close()
        return results

    results = asyncio.run(main())
    return backend.seen, observer, results


@pytest.mark.parametrize("drop", ["cancelled", "expired"])
def test_the_rest_of_a_queue_runs_in_its_order_once_requests_in_it_are_dropped(drop):
    seen, _, _ = rest_of_a_queue(drop)
    assert seen == [1, 3, 5]


@pytest.mark.parametrize("drop", ["cancelled", "expired"])
def test_the_queue_depth_counts_only_the_rest_once_requests_in_it_are_dropped(drop):
    _, observer, _ = rest_of_a_queue(drop)
    assert observer.depths[-2:] == [3, 0], "3 rows left after the drop, none once the batch took them"


def test_requests_past_their_deadline_together_are_counted_as_dropped_at_once():
    _, observer, _ = rest_of_a_queue("expired")
    assert observer.dropped == [(5, DropReason.DEADLINE)]


def test_requests_past_their_deadline_while_queued_fail_with_deadline_expired():
    _, _, results = rest_of_a_queue("expired")
    assert [type(r) for r in results] == [BatchResult, DeadlineExpired, BatchResult, DeadlineExpired, BatchResult]


def batcher_lines(requests: int, drop: str) -> int:
    """Lines of the batcher's module run (`line` trace events) to drop `requests` queued requests of one row, all
    cancelled or all past their deadline: a count of its work that, unlike a timing, does not vary with the load."""
    module = DynamicBatcher.__init__.__code__.co_filename
    lines = 0

    def count(frame, event, arg):
        nonlocal lines
        lines += event == "line"
        return count

    async def main():
        b = batcher(FakeBackend(), max_delay=0.0, max_queued=requests)
        deadline = asyncio.get_running_loop().time() if drop == "expired" else None
        held = [asyncio.ensure_future(b.submit([row(1)], deadline)) for _ in range(requests)]
        await asyncio.sleep(0)  # all queued: the batcher is not started yet
        tracing = sys.gettrace()
        sys.settrace(lambda frame, event, arg: count if frame.f_code.co_filename == module else None)
        try:
            if drop == "expired":
                b.start()
            else:
                for request in held:
                    request.cancel()
            await asyncio.gather(*held, return_exceptions=True)
        finally:
            sys.settrace(tracing)
        await b.close()

    asyncio.run(main())
    return lines


@pytest.mark.parametrize("drop", ["cancelled", "expired"])
def test_dropping_four_times_the_queued_requests_takes_about_four_times_the_work(drop):
    assert batcher_lines(400, drop) < 6 * batcher_lines(100, drop), "each drop went over the whole queue"


def test_backend_failure_reaches_every_request_of_the_batch_and_the_batcher_goes_on():
    flaky = FailsFirstCall()

    async def main():
        b = batcher(flaky, max_delay=0.05)
        b.start()
        results = await asyncio.gather(b.submit([row(1)]), b.submit([row(2)]), return_exceptions=True)
        after = await b.submit([row(5)])
        await b.close()
        return results, after

    results, after = asyncio.run(main())
    assert all(isinstance(r, RuntimeError) and "exploded" in str(r) for r in results)
    assert after.outputs["sum"].tolist() == [5]


def test_a_backend_failure_drops_the_rest_of_a_request_spanning_several_batches():
    """4 rows, batches of 3: the first batch fails while the fourth row waits out the delay for company."""
    flaky, observer = FailsFirstCall(), Recorder()

    async def main():
        b = batcher(flaky, max_batch_size=3, max_delay=0.5, observer=observer)
        b.start()
        with pytest.raises(RuntimeError, match="exploded"):
            await b.submit([row(1), row(2), row(3), row(4)])
        queued = b.queued_rows
        await b.close()
        return queued

    assert asyncio.run(main()) == 0
    assert flaky.calls == [3], "the failed request's last row must not run"
    assert observer.dropped == [(1, DropReason.FAILED)]


def test_close_finishes_queued_work_and_refuses_new():
    backend = FakeBackend()

    async def main():
        b = batcher(backend, max_delay=10.0)
        b.start()
        queued = asyncio.ensure_future(b.submit([row(8)]))
        await asyncio.sleep(0.01)
        start = time.perf_counter()
        await b.close()
        closing = time.perf_counter() - start
        with pytest.raises(BatcherClosed):
            await b.submit([row(1)])
        return await queued, closing

    result, closing = asyncio.run(main())
    assert result.outputs["sum"].tolist() == [8.0]
    assert closing < 5, "close flushes at once instead of waiting for the delay"


def closed_at_once(caplog, queued: bool) -> tuple[list[BaseException | BatchResult], list[str]]:
    """What `close(0)` of a started batcher leaves its requests (one of one row, waiting for a batch, when `queued`),
    and the events it logged."""

    async def main():
        b = batcher(FakeBackend(), max_delay=10.0)
        b.start()
        requests = [asyncio.ensure_future(b.submit([row(1)]))] if queued else []
        await asyncio.sleep(0.01)
        await b.close(0)
        return await asyncio.gather(*requests, return_exceptions=True)

    with caplog.at_level("WARNING", logger="edgedistill.serve.batching"):
        results = asyncio.run(main())
    return results, [getattr(record, "event", None) for record in caplog.records]


def test_closing_an_idle_batcher_at_once_logs_nothing(caplog):
    assert closed_at_once(caplog, queued=False)[1] == []


def test_closing_a_batcher_at_once_fails_its_queued_requests(caplog):
    (result,), _ = closed_at_once(caplog, queued=True)
    assert isinstance(result, BatcherClosed)


def test_closing_a_batcher_at_once_warns_that_its_queued_requests_failed(caplog):
    assert closed_at_once(caplog, queued=True)[1] == ["batcher_close_timeout"]


def test_a_retired_batcher_leaves_the_shared_queue_depth_to_the_batcher_that_replaced_it():
    metrics = Metrics()  # one gauge for both, as a reload's old and new models share it

    async def main():
        old, new = (batcher(FakeBackend(), max_delay=10.0, observer=metrics) for _ in range(2))
        old.start()
        new.start()
        draining = asyncio.ensure_future(old.submit([row(1), row(2)]))
        waiting = asyncio.ensure_future(new.submit([row(3), row(4), row(5)]))
        await asyncio.sleep(0.01)  # both queued
        old.retire()
        await old.close()
        depth = metrics.registry.get_sample_value("edgedistill_queue_depth")
        await new.close()
        await asyncio.gather(draining, waiting)
        return depth

    assert asyncio.run(main()) == 3


def test_a_batcher_closed_without_a_successor_drains_the_queue_depth_to_zero():
    metrics = Metrics()

    async def main():
        b = batcher(FakeBackend(), max_delay=10.0, observer=metrics)
        b.start()
        waiting = asyncio.ensure_future(b.submit([row(1), row(2)]))
        await asyncio.sleep(0.01)  # queued
        await b.close()
        await waiting
        return metrics.registry.get_sample_value("edgedistill_queue_depth")

    assert asyncio.run(main()) == 0


def test_a_started_batcher_takes_the_shared_queue_depth_over_from_the_one_it_replaces():
    metrics = Metrics()

    async def main():
        old, new = (batcher(FakeBackend(), max_delay=10.0, observer=metrics) for _ in range(2))
        old.start()
        draining = asyncio.ensure_future(old.submit([row(1), row(2)]))
        await asyncio.sleep(0.01)  # queued
        new.start()
        old.retire()
        await old.close()
        depth = metrics.registry.get_sample_value("edgedistill_queue_depth")
        await new.close()
        await draining
        return depth

    assert asyncio.run(main()) == 0


def depth_after_a_member_is_retired(new_observer, closed: bool = True) -> float:
    """The server's queue depth once a retired cascade member's batcher (2 rows queued) closed (with `closed`; else
    while it drains) beside the batcher that replaced it, with 3 rows queued and `new_observer`: the Metrics' own for
    a bundle, a member's for a cascade."""
    metrics = Metrics()

    async def main():
        old = batcher(FakeBackend(), max_delay=10.0, observer=metrics.member("tiny-cascade", "student"))
        new = batcher(FakeBackend(), max_delay=10.0, observer=new_observer(metrics))
        old.start()
        draining = asyncio.ensure_future(old.submit([row(1), row(2)]))
        await asyncio.sleep(0.01)  # queued
        new.start()
        waiting = asyncio.ensure_future(new.submit([row(3), row(4), row(5)]))
        await asyncio.sleep(0.01)  # queued
        old.retire()
        if closed:
            await old.close()
        depth = metrics.registry.get_sample_value("edgedistill_queue_depth")
        if not closed:
            await old.close()
        await new.close()
        await asyncio.gather(draining, waiting)
        return depth

    return asyncio.run(main())


def test_a_retired_members_close_leaves_the_queue_depth_to_the_member_of_its_id_that_replaced_it():
    assert depth_after_a_member_is_retired(lambda metrics: metrics.member("tiny-cascade", "student")) == 3


def test_a_retired_members_close_leaves_the_queue_depth_to_the_bundle_that_replaced_its_cascade():
    assert depth_after_a_member_is_retired(lambda metrics: metrics) == 3


def test_a_retired_member_of_another_name_leaves_the_server_queue_depth_to_the_new_cascade_while_it_drains():
    def new_cascade(metrics: Metrics):
        return metrics.member("new-cascade", "teacher")

    assert depth_after_a_member_is_retired(new_cascade, closed=False) == 3


def test_backend_runs_off_the_event_loop():
    gate = threading.Event()
    backend = FakeBackend(gate=gate)  # returns once the event loop has ticked 10 times while it waits

    async def main():
        b = batcher(backend, max_delay=0.0)
        b.start()
        ticks = 0

        async def tick():
            nonlocal ticks
            while not backend.entered.is_set():
                await asyncio.sleep(0.001)
            while ticks < 10:
                await asyncio.sleep(0.01)
                ticks += 1
            gate.set()

        ticker = asyncio.ensure_future(tick())
        await b.submit([row(1)])
        ticker.cancel()
        await b.close()
        return ticks

    assert asyncio.run(main()) == 10, "the event loop kept running while the backend worked"


SERVER_INLINE_MAX = Settings.model_fields["inline_infer_ms"].default / 1000


class ThreadRecorder(FakeBackend):
    """Records which thread ran each batch."""

    def __init__(self, delay: float = 0.0):
        super().__init__(delay)
        self.threads: list[str] = []

    def __call__(self, inputs):
        self.threads.append(threading.current_thread().name)
        return super().__call__(inputs)


@pytest.mark.parametrize(
    ("delay", "inline_max", "inline"),
    [(0.0, 0.05, True), (0.0, 0.0, False), (0.02, SERVER_INLINE_MAX, False)],
    ids=["fast-backend-inline", "inline-off", "slow-backend-in-thread-at-the-server-default"],
)
def test_only_batches_expected_to_be_quick_run_on_the_event_loop(delay, inline_max, inline):
    backend = ThreadRecorder(delay)

    async def main():
        b = batcher(backend, max_delay=0.0, inline_max=inline_max)
        b.start()
        results = [await b.submit([row(i, i + 1)]) for i in range(1, 6)]
        await b.close()
        return results, b.cost

    results, cost = asyncio.run(main())
    assert [r.outputs["sum"].tolist() for r in results] == [[2.0 * i + 1] for i in range(1, 6)]
    assert backend.threads[0].startswith("infer"), "with no measured time yet, the first batch goes to the thread"
    on_loop = [name == threading.main_thread().name for name in backend.threads[1:]]
    assert on_loop == [inline] * 4
    assert cost.seconds([(1, 2)]) >= 0.9 * delay, "the learnt cost of a call like these covers its measured time"


def test_rows_with_mismatched_lengths_are_refused():
    async def main():
        b = batcher(FakeBackend())
        with pytest.raises(ValueError, match="differ in length"):
            await b.submit([{"input_ids": np.ones(3, np.int64), "attention_mask": np.ones(2, np.int64)}])
        await b.close()

    asyncio.run(main())


class TaskRecorder(FakeBackend):
    """Records which asyncio task ran each batch on the event loop (None: the worker thread)."""

    def __init__(self, gate: threading.Event | None = None):
        super().__init__(gate=gate)
        self.tasks: list[str | None] = []

    def __call__(self, inputs):
        on_loop = threading.current_thread() is threading.main_thread()
        self.tasks.append(asyncio.current_task().get_name() if on_loop else None)
        return super().__call__(inputs)


def test_a_quick_request_at_light_load_runs_in_its_own_task():
    backend = TaskRecorder()

    async def main():
        b = batcher(backend, max_delay=0.0, inline_max=0.05)
        b.start()
        first = await b.submit([row(1, 2)])  # no time measured yet: the worker thread
        right_after = await asyncio.create_task(b.submit([row(3, 4)]), name="caller")
        await asyncio.sleep(0.06)  # idle for longer than inline_max
        later = await asyncio.create_task(b.submit([row(5, 6)]), name="caller")
        await b.close()
        return first, right_after, later

    results = asyncio.run(main())
    assert [r.outputs["sum"].tolist() for r in results] == [[3.0], [7.0], [11.0]]
    assert backend.tasks == [None, "batcher", "caller"], "right after a batch, requests queue to batch together"


def test_a_quick_request_waits_while_a_batch_runs_in_the_thread():
    gate = threading.Event()
    backend = TaskRecorder(gate)

    async def main():
        b = batcher(backend, max_delay=0.0, inline_max=0.05)
        b.cost = BackendCost(0.0, 1e-3)
        b.start()
        slow = asyncio.ensure_future(b.submit([row(*range(1, 60))] * 8))  # 472 tokens, expected 0.47 s: the thread
        await asyncio.to_thread(backend.entered.wait, 10)
        quick = asyncio.ensure_future(b.submit([row(5)]))
        await asyncio.sleep(0.05)
        assert not quick.done(), "the quick request must queue behind the running batch"
        gate.set()
        results = await asyncio.gather(slow, quick)
        await b.close()
        return results

    slow, quick = asyncio.run(main())
    assert quick.outputs["sum"].tolist() == [5.0]
    assert backend.tasks == [None, "batcher"]


def test_a_queue_delay_holds_even_a_quick_request_to_an_idle_batcher():
    backend = TaskRecorder()

    async def main():
        b = batcher(backend, max_delay=0.05, inline_max=0.05)
        b.cost = BackendCost(0.0, 1e-6)
        b.start()
        started = time.perf_counter()
        await asyncio.create_task(b.submit([row(1)]), name="caller")
        waited = time.perf_counter() - started
        await b.close()
        return waited

    assert asyncio.run(main()) >= 0.04
    assert backend.tasks == ["batcher"]


def test_a_batch_of_mixed_lengths_runs_as_groups_of_similar_length():
    gate = threading.Event()
    backend, observer = FakeBackend(gate=gate), Recorder()

    async def main():
        b = batcher(backend, max_delay=0.0, observer=observer)
        b.calibrate([(1, 1, 3e-4 + 1e-5), (1, 64, 3e-4 + 64e-5), (32, 64, 3e-4 + 2048e-5)])
        b.start()
        first = asyncio.ensure_future(b.submit([row(1)]))
        await asyncio.to_thread(backend.entered.wait, 10)  # the rows below queue while the backend is busy
        lengths = [40, 2, 3, 38, 2]
        waiting = [asyncio.ensure_future(b.submit([row(*([n] * n))])) for n in lengths]
        await asyncio.sleep(0.05)
        gate.set()
        results = await asyncio.gather(first, *waiting)
        await b.close()
        return lengths, results

    lengths, results = asyncio.run(main())
    assert [r.outputs["sum"].tolist() for r in results[1:]] == [[float(n * n)] for n in lengths]
    # one call for the three short rows padded to 3, one for the two long ones padded to 40
    assert backend.shapes[1:] == [(3, 3), (2, 40)]
    assert observer.batches == [1, 3, 2]


class FailingObserver(BatchObserver):
    """Fails handing outputs back with an error whose text names a file of the server."""

    def batch_done(self, rows: int, seconds: float) -> None:
        raise RuntimeError("cannot write /srv/private/stats.db")


def test_an_error_handing_outputs_back_fails_every_held_request_at_once_and_reports_the_fault():
    faults = []

    async def main():
        b = batcher(FakeBackend(), max_batch_size=2, max_delay=0.05, observer=FailingObserver(), on_fault=faults.append)
        b.start()
        held = [b.submit([row(n)]) for n in (1, 2, 3)]  # two in the first batch, one left queued
        results = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), 5)
        with pytest.raises(ServerFault):
            await b.submit([row(4)])
        await b.close()
        return results

    results = asyncio.run(main())
    assert [type(r) for r in results] == [ServerFault] * 3
    assert len(faults) == 1


def fault_of_failing_observer(caplog) -> ServerFault:
    async def main():
        b = batcher(FakeBackend(), observer=FailingObserver())
        b.start()
        (result,) = await asyncio.gather(b.submit([row(1)]), return_exceptions=True)
        await b.close()
        return result

    with caplog.at_level("ERROR", logger="edgedistill.serve.batching"):
        return asyncio.run(main())


def test_a_fault_tells_the_callers_its_kind_but_not_the_errors_text(caplog):
    assert "/srv/private" not in str(fault_of_failing_observer(caplog))


def test_a_fault_logs_the_errors_text(caplog):
    fault_of_failing_observer(caplog)
    assert "/srv/private" in caplog.text


def one_row_too_many(inputs):
    """A backend that answers each call with one row more than it was given."""
    return {"sum": np.append(inputs["input_ids"].sum(axis=1), 0)}


def miscounted_batch(backend=one_row_too_many) -> tuple[list, list[ServerFault]]:
    """Two requests batched together (max_delay 0.05 s) for `backend`: what each got, and the faults."""
    faults = []

    async def main():
        b = batcher(backend, max_delay=0.05, on_fault=faults.append)
        b.start()
        results = await asyncio.wait_for(
            asyncio.gather(b.submit([row(1)]), b.submit([row(2)]), return_exceptions=True), 5
        )
        await b.close()
        return results

    return asyncio.run(main()), faults


def test_a_batch_answered_with_too_many_rows_fails_each_of_its_requests():
    results, _ = miscounted_batch()
    assert [type(r) for r in results] == [ServerFault, ServerFault]


def test_a_batch_answered_with_too_many_rows_reports_the_fault_once():
    _, faults = miscounted_batch()
    assert len(faults) == 1


def test_a_batch_answered_with_too_many_rows_tells_the_callers_what_the_backend_did():
    results, _ = miscounted_batch()
    assert "answered a call of 2 rows with {'sum': 3} rows" in str(results[0])


def test_a_fault_of_a_batcher_started_during_a_call_logs_no_request_id(caplog, monkeypatch):
    async def main():
        started_by = REQUEST_ID.set("the-reload-call")
        b = batcher(one_row_too_many)
        b.start()
        REQUEST_ID.reset(started_by)
        await asyncio.gather(b.submit([row(1)]), return_exceptions=True)
        await b.close()

    # formats each record as it is logged, in the logging task; pytest keeps one handler for every test: put back
    monkeypatch.setattr(caplog.handler, "formatter", JsonFormatter())
    with caplog.at_level("ERROR", logger="edgedistill.serve.batching"):
        asyncio.run(main())
    (fault,) = [entry for entry in map(json.loads, caplog.text.splitlines()) if entry.get("event") == "batcher_fault"]
    assert "request_id" not in fault


def test_a_batch_answered_with_too_few_rows_answers_none_of_its_requests():
    def one_row_too_few(inputs):
        return {"sum": inputs["input_ids"].sum(axis=1)[:-1]}

    results, _ = miscounted_batch(one_row_too_few)
    assert [type(r) for r in results] == [ServerFault, ServerFault]


def test_a_backend_call_past_the_time_limit_fails_every_held_request_and_reports_the_fault():
    gate, faults = threading.Event(), []
    backend = FakeBackend(gate=gate)

    async def main():
        b = batcher(backend, max_batch_size=1, max_delay=0.0, batch_timeout=0.2, on_fault=faults.append)
        b.start()
        held = [b.submit([row(n)]) for n in (1, 2)]  # one in the hung call, one queued behind it
        results = await asyncio.wait_for(asyncio.gather(*held, return_exceptions=True), 5)
        hung = not backend.returned.is_set()
        await b.close()
        return results, hung

    try:
        results, hung = asyncio.run(main())
    finally:
        gate.set()
    assert [type(r) for r in results] == [ServerFault] * 2
    assert len(faults) == 1
    assert hung, "the held requests waited for the hung call instead of failing at its time limit"


def split_in_two_calls(backend, rows: list[dict[str, np.ndarray]], **kwargs) -> list:
    """The results of a request whose `rows` of lengths 2 and 512 a batcher runs as two backend calls, one per length,
    and the faults it reported."""
    faults = []

    async def main():
        b = batcher(backend, max_delay=0.0, on_fault=faults.append, **kwargs)
        b.calibrate([(1, 1, 3e-4 + 1e-5), (1, 64, 3e-4 + 64e-5), (32, 64, 3e-4 + 2048e-5)])  # splitting pays
        b.start()
        result = await asyncio.wait_for(asyncio.gather(b.submit(rows), return_exceptions=True), 5)
        await b.close(timeout=0.1)
        return result

    return [*asyncio.run(main()), *faults]


def test_a_batch_whose_calls_each_end_within_the_time_limit_passes_though_together_they_take_longer():
    backend = FakeBackend(delay=0.35)
    results = split_in_two_calls(backend, [row(*[1] * 2), row(*[1] * 512)] * 2, batch_timeout=0.6)
    assert backend.shapes == [(2, 2), (2, 512)], "the batch ran as two calls"
    assert [type(r) for r in results] == [BatchResult], "no fault"


class HangsOnLongRows(FakeBackend):
    """Hangs on calls of rows longer than 2 until `release` is set; `returned` is set once such a call returns."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def __call__(self, inputs):
        if inputs["input_ids"].shape[1] > 2:
            self.returned.clear()
            self.release.wait(10)
        return super().__call__(inputs)


def test_a_hung_call_of_a_batch_faults_naming_that_calls_rows():
    backend = HangsOnLongRows()
    try:
        results = split_in_two_calls(backend, [row(*[1] * 2), row(*[1] * 512), row(*[1] * 512)], batch_timeout=0.2)
    finally:
        backend.release.set()
        backend.returned.wait(10)
    assert "a backend call of 2 rows ran past its 0.2 s limit" in str(results[0])


async def hung_in_its_call(backend, **kwargs) -> tuple[DynamicBatcher, asyncio.Future]:
    """A started batcher and its one request of one row, once the request's backend call has begun in `backend`
    (one given a gate holds it there)."""
    b = batcher(backend, max_delay=0.0, **kwargs)
    b.start()
    held = asyncio.ensure_future(b.submit([row(1)]))
    await asyncio.to_thread(backend.entered.wait, 10)
    return b, held


def dropped_behind_a_hung_call(close_timeout: float | None, **kwargs) -> list[tuple[int, DropReason]]:
    """The drops a batcher reports once a call hangs with requests of 1 and 2 rows queued behind it, and its time limit
    (`batch_timeout` in `kwargs`) or close's `close_timeout` passes."""
    gate, observer = threading.Event(), Recorder()
    backend = FakeBackend(gate=gate)

    async def main():
        b, held = await hung_in_its_call(backend, max_batch_size=1, observer=observer, **kwargs)
        queued = [asyncio.ensure_future(b.submit(rows)) for rows in ([row(2)], [row(3), row(4)])]
        await asyncio.sleep(0)
        if close_timeout is None:
            await asyncio.wait_for(asyncio.gather(held, *queued, return_exceptions=True), 5)
        await asyncio.wait_for(b.close(timeout=close_timeout), 5)
        await asyncio.gather(held, *queued, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        gate.set()
    return observer.dropped


def test_rows_queued_at_a_fault_are_counted_as_dropped_for_the_fault():
    assert dropped_behind_a_hung_call(None, batch_timeout=0.2) == [(3, DropReason.FAULT)]


def test_rows_queued_when_close_gives_up_are_counted_as_dropped_for_the_close():
    assert dropped_behind_a_hung_call(0.2) == [(3, DropReason.CLOSED)]


def cancelled_as_close_gives_up(message: str | None) -> list[tuple[int, DropReason]]:
    """The drops a batcher reports when `close` gives up on its queue behind a hung call in the step in which a queued
    request of 2 rows was cancelled with `message`, its task not yet woken to drop them. The request's coroutine is
    stepped here as its task would step it: cancelling a task cancels the future it waits on at once, and wakes the
    task in a later step."""
    gate, observer = threading.Event(), Recorder()
    backend = FakeBackend(gate=gate)

    async def main():
        b, held = await hung_in_its_call(backend, max_batch_size=1, observer=observer)
        client = b.submit([row(2), row(3)])
        client.send(None).cancel(message)  # queued: the future its task waits on, cancelled
        await b.close(timeout=0)
        with pytest.raises(asyncio.CancelledError):
            client.throw(asyncio.CancelledError(message))  # its task woken, after the close
        await asyncio.gather(held, return_exceptions=True)

    try:
        asyncio.run(main())
    finally:
        gate.set()
    return observer.dropped


@pytest.mark.parametrize(
    ("message", "reason"), [(None, DropReason.CANCELLED), (ENDED_BY_SERVER, DropReason.ENDED)], ids=["client", "server"]
)
def test_rows_cancelled_in_the_step_close_gives_up_are_counted_for_their_cancellation_not_the_close(message, reason):
    assert cancelled_as_close_gives_up(message) == [(2, reason)]


def test_close_gives_up_on_a_hung_batch_at_its_time_limit():
    gate = threading.Event()
    backend = FakeBackend(gate=gate)

    async def main():
        b, held = await hung_in_its_call(backend)
        await asyncio.wait_for(b.close(timeout=0.2), 5)
        hung = not backend.returned.is_set()
        return await asyncio.gather(held, return_exceptions=True), hung

    try:
        (result,), hung = asyncio.run(main())
    finally:
        gate.set()
    assert isinstance(result, BatcherClosed)
    assert hung, "close waited for the hung call instead of giving up at its time limit"


def test_close_counts_a_hung_call_it_gives_up_on_as_left_running():
    gate = threading.Event()
    backend = FakeBackend(gate=gate)

    async def main():
        b, held = await hung_in_its_call(backend)
        await b.close(timeout=0.2)
        await asyncio.gather(held, return_exceptions=True)
        return calls_left_running()

    try:
        left = asyncio.run(main())
    finally:
        gate.set()
        backend.returned.wait(10)
    assert left == 1


def test_close_returns_at_the_time_limit_of_a_batch_that_hangs_while_it_closes():
    gate = threading.Event()
    backend = FakeBackend(gate=gate)
    release = threading.Timer(3.0, gate.set)  # the hung call returns 3 s on

    async def main():
        b, held = await hung_in_its_call(backend, batch_timeout=0.2)
        release.start()
        started = time.monotonic()
        await b.close(timeout=5)  # past the batch's time limit: the call faults while close waits
        closing = time.monotonic() - started
        await asyncio.gather(held, return_exceptions=True)
        return closing

    try:
        closing = asyncio.run(main())
    finally:
        release.cancel()
        gate.set()
    assert closing < 2, "close waited on the event loop for the hung call's thread"


def test_a_request_over_max_batch_size_at_light_load_is_split_into_calls_within_it():
    backend = FakeBackend()

    async def main():
        b = batcher(backend, max_batch_size=4, max_delay=0.0, inline_max=1.0)
        b.calibrate([(1, 1, 1e-6), (4, 8, 2e-6)])  # quick: the request may run at once
        b.start()
        result = await b.submit([row(n) for n in range(1, 11)])
        await b.close()
        return result

    result = asyncio.run(main())
    assert result.outputs["sum"].tolist() == [float(n) for n in range(1, 11)]
    assert max(rows for rows, _ in backend.shapes) <= 4


def quick_batcher(backend, **kwargs) -> DynamicBatcher:
    """A started batcher whose calls are expected to be quick, so that a request at light load runs at once."""
    b = batcher(backend, max_delay=0.0, inline_max=1.0, **kwargs)
    b.calibrate([(1, 1, 1e-6), (4, 8, 2e-6)])
    b.start()
    return b


def test_a_quick_request_at_light_load_is_one_backend_call_reported_to_the_observer():
    backend, recorder = TaskRecorder(), Recorder()

    async def main():
        b = quick_batcher(backend, observer=recorder)
        result = await asyncio.create_task(b.submit([row(1, 2), row(3, 4)]), name="caller")
        await b.close()
        return result

    result = asyncio.run(main())
    assert result.outputs["sum"].tolist() == [3.0, 7.0]
    assert backend.tasks == ["caller"]
    assert recorder.batches == [2]
    assert recorder.waits == [0.0]


def test_a_backend_error_at_light_load_is_the_requests_and_the_batcher_goes_on():
    flaky = FailsFirstCall()

    async def main():
        b = quick_batcher(flaky)
        with pytest.raises(RuntimeError, match="exploded"):
            await b.submit([row(1)])
        await asyncio.sleep(0.01)
        after = await b.submit([row(5)])
        await b.close()
        return after

    assert asyncio.run(main()).outputs["sum"].tolist() == [5]


def fails_on_its_device(inputs):
    raise DeviceError("CUDAExecutionProvider failed running the model: CUDA failure 700: an illegal memory access")


def after_a_device_failure(make) -> tuple[list[ServerFault], BaseException]:
    """The faults a batcher made by `make(backend, on_fault=...)` reports once its backend fails a call on its
    device, and the error of the request sent after that."""
    faults = []

    async def main():
        b = make(fails_on_its_device, on_fault=faults.append)
        b.start()
        with pytest.raises(ServerFault):
            await b.submit([row(1)])
        with pytest.raises(Exception) as refused:
            await b.submit([row(2)])
        await b.close()
        return refused.value

    return faults, asyncio.run(main())


@pytest.mark.parametrize("make", [batcher, quick_batcher], ids=["queued", "at_light_load"])
def test_a_backend_call_failing_on_its_device_reports_the_fault_once(make):
    faults, _ = after_a_device_failure(make)
    assert len(faults) == 1


@pytest.mark.parametrize("make", [batcher, quick_batcher], ids=["queued", "at_light_load"])
def test_a_backend_call_failing_on_its_device_refuses_the_next_request(make):
    _, refused = after_a_device_failure(make)
    assert isinstance(refused, ServerFault)


def test_pad_rows_of_one_row_is_that_row_with_a_batch_axis():
    batch = pad_rows([row(7, 8, 9)], {"input_ids": 0})
    assert {name: value.tolist() for name, value in batch.items()} == {
        "input_ids": [[7, 8, 9]],
        "attention_mask": [[1, 1, 1]],
    }


def test_pad_rows_pads_each_input_with_its_value():
    batch = pad_rows([row(7, 8, 9), row(5)], {"input_ids": -1})
    assert batch["input_ids"].tolist() == [[7, 8, 9], [5, -1, -1]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
