"""An asyncio dynamic batcher: concurrent requests share one backend call.

Each request is a list of rows; a row is `{input name: 1-D array of length L}` (token ids, masks).
Rows wait in a bounded queue until `max_batch_size` rows are waiting or the oldest has waited
`max_delay` seconds; a batch then takes up to `max_batch_size` rows of similar length (the oldest
row always included, so nothing starves), and runs the backend in a worker thread so the event loop
never blocks on it. The backend's cost model (`serve.costmodel`) splits a batch of mixed lengths into
groups of similar length, each padded to its longest with `pad_values` and run as its own call, and
decides what runs inline: a batch whose expected backend time is within `inline_max` seconds runs on
the event loop (for a small model the hop to the thread and back costs more than the batch itself),
and such a request that comes at light load runs at once, in its own task, without waking the
batcher task.
Outputs are split back per row and returned to each request in its row order, stacked along axis 0.

Admission: the queue holds at most `max_queued` rows, counting the rows of requests admitted with
`admit` while their rows are still being made (tokenized), so overload is refused before any work is
spent on a request. Rows of a request that was cancelled (or whose deadline passed) while queued are
dropped before the batch runs. A request of more than `max_batch_size` rows always goes through the queue, which
takes it in batches of at most that many.

Faults: a backend call that raises fails the requests of its batch, their rows still queued are dropped (a request
of more than `max_batch_size` rows fails as a whole), and the batcher goes on. An error
of the batcher itself (while taking a batch or handing its outputs back), or a backend call running
past `batch_timeout` seconds (the watchdog: a hung backend; one hung inline blocks the loop, which the server's
loop watchdog, `serve.watchdog`, sees), or a backend call answering another number of rows than it was given,
leaves it in an unknown state, as does a backend call failing on the GPU (`DeviceError`: a CUDA error leaves the
device's context broken for every later call): it fails
every request it holds with `ServerFault`, refuses new ones, and calls `on_fault` once, so the server
can report NOT_SERVING and exit for its supervisor to restart it (a hung call cannot be taken back
from its thread). Imports no grpc: the transport maps the errors raised here (`Overloaded`,
`DeadlineExpired`, `BatcherClosed`, `ServerFault`, from `serve.errors`) to status codes.
"""

import asyncio
import contextlib
import contextvars
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

import numpy as np
from edgedistill.common.runtime import DeviceError
from edgedistill.serve.costmodel import BackendCost, Load, Timing, group_shapes, runs_inline
from edgedistill.serve.errors import DEADLINE_SLACK_S, BatcherClosed, DeadlineExpired, Overloaded, ServerFault

log = logging.getLogger(__name__)

Arrays = dict[str, np.ndarray]
InferFn = Callable[[Arrays], Mapping[str, np.ndarray]]
T = TypeVar("T")
DEVICE_FAULT = "a backend call failed on its device"  # what the callers are told of a `DeviceError`
ENDED_BY_SERVER = "the server ended the call"  # the message of a cancellation by the server, not the client


class DropReason(StrEnum):
    """Why queued rows were removed without running."""

    CANCELLED = "cancelled"
    ENDED = "ended"  # its call was ended by the server (a stream it closed): cancelled with `ENDED_BY_SERVER`
    DEADLINE = "deadline"
    FAILED = "failed"  # another of its request's rows failed in the backend: nobody waits for these
    FAULT = "fault"  # the batcher faulted (a hung or failed device call, an error of its own): it fails all it holds
    CLOSED = "closed"  # the batcher was closed (a shutdown, a reload) and its queue did not finish within the limit


class BatchObserver:
    """Hooks for metrics; the default does nothing. Called on the event loop thread."""

    def queue_depth(self, rows: int) -> None:
        """Rows waiting now."""

    def batch_done(self, rows: int, seconds: float) -> None:
        """One backend call of `rows` rows took `seconds`."""

    def request_done(self, queue_wait: float) -> None:
        """A request finished; its first row waited `queue_wait` seconds before a batch took it."""

    def rows_dropped(self, rows: int, reason: DropReason) -> None:
        """Rows removed from the queue without running."""

    def rows_admitted(self, rows: int) -> None:
        """`rows` more (fewer, when negative) rows hold places in the queue while they are made off the event loop."""

    def retired(self) -> None:
        """The batcher was replaced (`DynamicBatcher.retire`): the queue depth is the new one's from now on."""

    def closed(self) -> None:
        """The batcher closed (its queue finished, or failed at its close's limit): it reports no more rows."""


class _Retiring:
    """A replaced batcher's observer: every hook but `queue_depth` is `observer`'s."""

    def __init__(self, observer: BatchObserver):
        self._observer = observer

    def __getattr__(self, name: str):
        return getattr(self._observer, name)

    def queue_depth(self, rows: int) -> None:
        """Not reported: the gauge shows the queue of the batcher that serves."""


# Backend calls that a closed batcher left running in their threads: a normal interpreter exit would wait for them.
_left_running: set[Future] = set()


def calls_left_running() -> int:
    """Backend calls still running that a closed batcher left in their threads (hung, or slower than its close's
    limit); the server's process exits without waiting for them (`serve.__main__`)."""
    return len(_left_running)


class _Hung(Exception):
    """A backend call of `rows` rows ran past the batcher's `batch_timeout`."""

    def __init__(self, rows: int):
        super().__init__(rows)
        self.rows = rows


@dataclass
class BatchResult:
    """A request's outputs stacked in row order, and how long its first row waited."""

    outputs: Arrays
    queue_wait: float = 0.0


@dataclass(eq=False)
class _Request:
    rows: list[Arrays]
    future: asyncio.Future
    enqueued: float
    deadline: float | None
    outputs: list[tuple[Arrays, int] | None] = field(default_factory=list)  # per row: batch outputs, position
    remaining: int = 0
    started: float | None = None


class _Admission:
    """The `with` block of `DynamicBatcher.admit`. A class rather than a `contextlib.contextmanager` generator, which
    cost as much as the rest of a light request's way through the batcher."""

    __slots__ = ("batcher", "rows")

    def __init__(self, batcher: "DynamicBatcher", rows: int):
        self.batcher = batcher
        self.rows = rows

    def __enter__(self) -> "_Admission":
        self.batcher._check_room(self.rows)
        self.batcher._admitted += self.rows
        return self

    def __exit__(self, *exc_info) -> None:
        self.batcher._admitted -= self.rows

    async def making(self, pool: Executor, make: Callable[..., T], *args) -> T:
        """`make(*args)` run in `pool` (rows tokenized in a thread), the admitted rows reported to the observer from
        before it starts until it ends: made on the event loop, they are queued in the same step, before any scrape
        could see them."""
        self.batcher.observer.rows_admitted(self.rows)
        try:
            return await asyncio.get_running_loop().run_in_executor(pool, make, *args)
        finally:
            self.batcher.observer.rows_admitted(-self.rows)


@dataclass(eq=False)
class _Call:
    """A batch's backend calls sent to the worker thread: the one running now, as (its rows, its start in
    `time.perf_counter` seconds), which the thread sets as each begins (in one assignment, so the event loop never
    reads half of it), and the future of them all."""

    running: tuple[int, float]
    future: Future = field(init=False)


@dataclass(eq=False)
class _Row:
    request: _Request
    index: int
    length: int


class DynamicBatcher:
    """Gathers rows from concurrent `submit` calls into padded batches for `infer`."""

    def __init__(
        self,
        infer: InferFn,
        *,
        max_batch_size: int,
        max_delay: float,
        max_queued: int,
        inline_max: float = 0.0,
        pad_values: Mapping[str, int | float] | None = None,
        observer: BatchObserver | None = None,
        batch_timeout: float | None = None,
        on_fault: Callable[[ServerFault], None] | None = None,
    ):
        if max_batch_size < 1 or max_queued < 1 or max_delay < 0 or inline_max < 0:
            raise ValueError("max_batch_size and max_queued must be >= 1, max_delay and inline_max >= 0")
        if batch_timeout is not None and batch_timeout <= 0:
            raise ValueError("batch_timeout must be > 0 (None: no limit)")
        self.infer = infer
        self.max_batch_size = max_batch_size
        self.max_delay = max_delay
        self.max_queued = max_queued
        self.inline_max = inline_max
        self.cost: BackendCost | None = None  # from `calibrate`, else from the first batch's time per token
        self.pad_values = dict(pad_values or {})
        self.observer = observer or BatchObserver()
        self.batch_timeout = batch_timeout
        self.on_fault = on_fault
        self.fault: ServerFault | None = None
        self._pending: dict[_Request, list[_Row]] = {}  # each queued request's rows still queued, oldest first
        self._queued = 0  # rows in `_pending`
        self._admitted = 0  # rows held by `admit` blocks: admitted, not yet submitted
        self._running: list[list[_Row]] = []  # batches taken from the queue and not yet answered
        self._busy = False  # a batch is running in the worker thread
        self._call: _Call | None = None  # the last batch sent to the worker thread
        self._last_done = -math.inf  # loop time at which the last batch finished
        self._arrived = asyncio.Event()
        self._closing = False
        self._grace_end: float | None = None  # the loop time a shutdown cancels the calls still running
        self._task: asyncio.Task | None = None
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="infer")

    @property
    def queued_rows(self) -> int:
        return self._queued

    def grace_ends(self, deadline: float) -> None:
        """The server is stopping: the rows of calls it cancels at loop time `deadline` or later were dropped for the
        shutdown (`DropReason.CLOSED`), not by their clients."""
        self._grace_end = deadline

    @property
    def room(self) -> int:
        """Rows the queue can admit now, beside those queued and those admitted."""
        return max(0, self.max_queued - self._queued - self._admitted)

    def calibrate(self, timings: Sequence[Timing]) -> None:
        """Fit the backend's cost to single calls at several shapes."""
        self.cost = BackendCost.fit(timings)

    def start(self) -> None:
        """Start taking batches, and reporting the queue depth: the gauge is this batcher's from now on (a reload's
        old batcher is retired)."""
        self.observer.queue_depth(self._queued)
        if self._task is None:
            # in a context of its own: the starter's (a Reload call's request id) is no later call's
            self._task = asyncio.get_running_loop().create_task(
                self._run_forever(), name="batcher", context=contextvars.Context()
            )

    def retire(self) -> None:
        """Leave the queue-depth gauge to the batcher that replaced this one, as a reload's two queues share it (its
        observer, told at `close`, clears what only this batcher wrote); a batcher closed at shutdown is not retired,
        so the gauge drains to 0 with its queue."""
        if not isinstance(self.observer, _Retiring):
            self.observer.retired()
            self.observer = _Retiring(self.observer)

    async def close(self, timeout: float | None = None) -> bool:
        """Take no new work, run what is queued within `timeout` seconds (None: no limit), then stop the worker
        thread; what is still queued or running at the limit fails with `BatcherClosed`. False when a backend call
        still runs in the worker thread (hung, or slower than the limit): it is left there, as a thread cannot be
        stopped, and counted by `calls_left_running`; the backend must not be closed under it. The observer is told
        (`closed`) either way."""
        self._closing = True
        self._arrived.set()
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), timeout)
            except TimeoutError:
                self._task.cancel()
                if self._pending or self._running:  # else it was idle, only not yet woken to return (a limit of 0)
                    self._fail_all(
                        BatcherClosed(f"the model was closed before this request finished ({timeout:g} s limit)"),
                        DropReason.CLOSED,
                    )
                    log.warning(
                        "the batcher did not finish its queue within %.1f s; its requests failed",
                        timeout,
                        extra={"event": "batcher_close_timeout"},
                    )
        # never join the worker thread here: on the event loop, a backend call hung in it (one that ran past
        # `batch_timeout` while the queue finished, or past `timeout`) would block every coroutine
        self._executor.shutdown(wait=False, cancel_futures=True)
        self.observer.closed()
        call = self._call
        if call is None or call.future.done():
            return True
        _left_running.add(call.future)
        call.future.add_done_callback(_left_running.discard)
        rows, started = call.running
        running = time.perf_counter() - started
        log.warning(
            "a backend call of %d rows is still running after %.1f s: it is left in its thread, and its model stays "
            "open under it",
            rows,
            running,
            extra={"event": "backend_call_left_running", "rows": rows, "running_s": round(running, 3)},
        )
        return False

    def _check_room(self, rows: int) -> None:
        """Raise unless `rows` more rows fit in the queue beside those queued and those admitted."""
        if self.fault is not None:
            raise ServerFault(str(self.fault))
        if self._closing:
            raise BatcherClosed("the model is shutting down or being replaced; retry")
        if rows > self.room:
            raise Overloaded(
                f"server overloaded: {self._queued} rows queued and {self._admitted} being prepared, "
                f"{rows} more would exceed the limit of {self.max_queued}; retry with backoff"
            )

    def admit(self, rows: int) -> "_Admission":
        """Hold `rows` places in the queue while a request's rows are made (e.g. tokenized), refusing it at once
        (`Overloaded`, `BatcherClosed`, `ServerFault`) when they do not fit. `submit` the rows after the block:
        the places are given back as the block ends, and the rows take them in the same step of the event loop.
        Rows made off the event loop are awaited through the block's `making`, which reports them."""
        return _Admission(self, rows)

    async def submit(self, rows: list[Arrays], deadline: float | None = None) -> BatchResult:
        """Queue `rows` and wait for their outputs, stacked in row order.

        `deadline` is in `loop.time()` seconds; rows still queued past it are dropped and
        `DeadlineExpired` is raised. Cancelling the awaiting task drops the queued rows too (counted as dropped for
        the deadline when it is at most `DEADLINE_SLACK_S` away, as a client's deadline cancels its call, and as
        closed once the shutdown's grace has run out, `grace_ends`).
        """
        if not rows:
            raise ValueError("submit needs at least one row")
        self._check_room(len(rows))
        lengths = [_length(row) for row in rows]
        loop = asyncio.get_running_loop()
        now = loop.time()
        shapes = self._shapes(sorted(lengths))
        inline = len(rows) <= self.max_batch_size and runs_inline(
            self._expected(shapes), self.inline_max, self._load(now)
        )
        if inline and deadline is not None and deadline <= now:
            raise DeadlineExpired("deadline exceeded before the request was queued")
        if inline and len(shapes) == 1:  # light load and one quick backend call: run it now, as it is
            return self._run_now(rows, shapes[0], loop)
        request = _Request(rows, loop.create_future(), now, deadline, [None] * len(rows), len(rows))
        batch = [_Row(request, i, length) for i, length in enumerate(lengths)]
        if inline:  # light load and a quick batch in several calls: run it now, without the batcher task
            await self._run(batch)
        else:
            self._pending[request] = batch
            self._queued += len(batch)
            self.observer.queue_depth(self._queued)
            self._arrived.set()
        try:
            outputs = await request.future
        except asyncio.CancelledError as err:  # gRPC cancels the call at its deadline, often before `_expire` sees it
            self._drop(request, self._cancel_reason(err, deadline, loop.time()))
            raise
        return BatchResult(outputs, request.started - request.enqueued)

    def _run_now(self, rows: list[Arrays], shape: tuple[int, int], loop: asyncio.AbstractEventLoop) -> BatchResult:
        """One request as one backend call on `loop`, nothing else running: no queue, no bookkeeping of a batch (the
        call ends before any other coroutine runs); the backend's error is the request's, but for a `DeviceError`, a
        fault. `loop` is the caller's:
        `asyncio.get_running_loop` calls getpid, a system call, on Python 3.11."""
        try:
            outputs, seconds = self._timed_infer([pad_rows(rows, self.pad_values)])[0]
        except DeviceError as err:
            self._fault(DEVICE_FAULT, err)
            raise ServerFault(str(self.fault)) from None
        self._last_done = loop.time()
        if miscount := _miscounted(outputs, len(rows)):
            self._fault(miscount)
            raise ServerFault(str(self.fault))
        self._learn([shape], seconds)
        self.observer.batch_done(len(rows), seconds)
        self.observer.request_done(0.0)
        return BatchResult(dict(outputs), 0.0)

    def _cancel_reason(self, err: asyncio.CancelledError, deadline: float | None, now: float) -> DropReason:
        """Why the queued rows of a request cancelled with `err` at loop time `now` are dropped: for the shutdown once
        its grace has run out, not for the client; for the server's ending of its call; for its `deadline` when it is at
        most `DEADLINE_SLACK_S` away; else for its client."""
        if self._grace_end is not None and now >= self._grace_end:
            return DropReason.CLOSED
        if err.args[:1] == (ENDED_BY_SERVER,):
            return DropReason.ENDED
        late = deadline is not None and deadline - DEADLINE_SLACK_S <= now
        return DropReason.DEADLINE if late else DropReason.CANCELLED

    def _drop(self, request: _Request, reason: DropReason) -> None:
        """Remove `request`'s queued rows, if any, counted as dropped for `reason`."""
        if rows := self._pending.pop(request, None):
            self._queued -= len(rows)
            self.observer.rows_dropped(len(rows), reason)
            self.observer.queue_depth(self._queued)

    def _expire(self, now: float) -> None:
        """Drop the queued requests past their deadline, all in one step, and fail them with `DeadlineExpired`."""
        expired = [request for request in self._pending if request.deadline is not None and request.deadline <= now]
        if not expired:
            return
        rows = sum(len(self._pending.pop(request)) for request in expired)
        self._queued -= rows
        self.observer.rows_dropped(rows, DropReason.DEADLINE)
        self.observer.queue_depth(self._queued)
        for request in expired:
            if not request.future.done():
                request.future.set_exception(DeadlineExpired("deadline exceeded while queued"))

    def _fail_all(self, err: Exception, reason: DropReason) -> None:
        """Fail every request queued or in a running batch with `err`; the queued rows count as dropped for `reason`,
        but those of a request cancelled in this step, its task not yet woken to drop them, for its cancellation."""
        now = asyncio.get_running_loop().time()
        for request in [request for request in self._pending if request.future.cancelled()]:
            try:
                request.future.result()
            except asyncio.CancelledError as cancelled:  # the error its task will be woken with
                self._drop(request, self._cancel_reason(cancelled, request.deadline, now))
        requests = {*self._pending, *(row.request for batch in self._running for row in batch)}
        if self._queued:
            self.observer.rows_dropped(self._queued, reason)
        self._pending, self._queued, self._running = {}, 0, []
        self.observer.queue_depth(0)
        for request in requests:
            if not request.future.done():
                request.future.set_exception(err)

    def _fault(self, message: str, err: BaseException | None = None) -> None:
        """Stop for good on an internal fault: fail what is held, refuse what comes, tell `on_fault` once. The
        callers are told `message`; the error `err`, whose text may name the server's files and internals, only
        the log."""
        if self.fault is None:
            self.fault = ServerFault(f"{message}; the server is restarting: retry (another replica, or this one soon)")
            self._closing = True
            self._arrived.set()
            cause = "" if err is None else f": {err!r}"
            log.error("batcher fault: %s%s", message, cause, exc_info=err, extra={"event": "batcher_fault"})
            if self.on_fault is not None:
                self.on_fault(self.fault)
        self._fail_all(ServerFault(str(self.fault)), DropReason.FAULT)

    async def _run_forever(self) -> None:
        try:
            await self._serve_queue()
        except Exception as err:  # an error of the batcher itself: its state is unknown
            self._fault("the batcher stopped on an internal error", err)

    async def _serve_queue(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._arrived.clear()
                await self._arrived.wait()
                continue
            while self._queued < self.max_batch_size and not self._closing:
                wait = next(iter(self._pending)).enqueued + self.max_delay - loop.time()
                if wait <= 0:
                    break
                self._arrived.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._arrived.wait(), wait)
                if not self._pending:
                    break
            self._expire(loop.time())
            if batch := self._take():
                await self._run(batch)
            else:  # only cancelled requests are queued: a step lets their tasks drop them
                await asyncio.sleep(0)

    def _take(self) -> list[_Row]:
        """Up to `max_batch_size` rows: all if they fit, else the window of similar lengths holding the oldest. A
        request cancelled since it queued is left out, its rows queued for its own task to drop, for its reason."""
        queued, cancelled = [], {}
        for request, rows in self._pending.items():
            if request.future.done():
                cancelled[request] = rows
            else:
                queued += rows
        if len(queued) <= self.max_batch_size:
            batch, self._pending = queued, cancelled
        else:
            chosen = self._window(queued)
            batch, self._pending = [row for i, row in enumerate(queued) if i in chosen], cancelled
            for i, row in enumerate(queued):
                if i not in chosen:
                    self._pending.setdefault(row.request, []).append(row)
        self._queued -= len(batch)
        self.observer.queue_depth(self._queued)
        return batch

    def _window(self, queued: list[_Row]) -> set[int]:
        """The places in `queued` (oldest first) of the `max_batch_size` rows of least padding that hold the oldest."""
        size = self.max_batch_size
        order = sorted(range(len(queued)), key=lambda i: (queued[i].length, i))
        anchor = order.index(0)
        lengths = [queued[i].length for i in order]
        prefix = np.concatenate([[0], np.cumsum(lengths)])
        first = max(0, anchor - size + 1)
        last = min(anchor, len(order) - size)
        # padding cost of window [s, s + size): size * longest - sum of lengths
        start = min(range(first, last + 1), key=lambda s: size * lengths[s + size - 1] - (prefix[s + size] - prefix[s]))
        return set(order[start : start + size])

    async def _run(self, batch: list[_Row]) -> None:
        loop = asyncio.get_running_loop()
        now = loop.time()
        for row in batch:
            if row.request.started is None:
                row.request.started = now
        groups = self._groups(batch)
        shapes = [(len(group), max(row.length for row in group)) for group in groups]
        self._running.append(batch)
        try:
            inputs = [pad_rows([row.request.rows[row.index] for row in group], self.pad_values) for group in groups]
            if runs_inline(self._expected(shapes), self.inline_max):
                results = self._timed_infer(inputs)
            else:
                self._busy = True
                try:
                    call = _Call((len(groups[0]), time.perf_counter()))
                    call.future = self._executor.submit(self._timed_infer, inputs, call)
                    self._call = call
                    results = await self._watched(call)
                finally:
                    self._busy = False
        except _Hung as hung:
            self._fault(f"a backend call of {hung.rows} rows ran past its {self.batch_timeout:g} s limit")
            return
        except DeviceError as err:
            self._fault(DEVICE_FAULT, err)
            return
        except Exception as err:  # the backend's failure belongs to every request in the batch, and its queued rows
            for request in {row.request for row in batch}:
                self._drop(request, DropReason.FAILED)
                if not request.future.done():
                    request.future.set_exception(err)
            return
        finally:
            self._last_done = loop.time()
            if batch in self._running:
                self._running.remove(batch)
        for group, (outputs, _) in zip(groups, results, strict=True):
            if miscount := _miscounted(outputs, len(group)):  # before any caller is answered: the batch fails whole
                self._running.append(batch)
                self._fault(miscount)
                return
        try:
            self._deliver(batch, groups, shapes, results)
        except Exception as err:  # handing outputs back failed: the batcher's state is unknown
            self._running.append(batch)
            self._fault("the batcher failed handing a batch's outputs back", err)

    async def _watched(self, call: _Call):
        """The results of a batch's backend calls in the worker thread; `_Hung` when one of them runs past
        `batch_timeout`, each timed on its own."""
        done = asyncio.wrap_future(call.future)
        if self.batch_timeout is None:
            return await asyncio.shield(done)
        while True:
            rows, started = call.running
            left = started + self.batch_timeout - time.perf_counter()
            if left <= 0:
                raise _Hung(rows)
            try:
                return await asyncio.wait_for(asyncio.shield(done), left)
            except TimeoutError:
                if done.done():  # the backend's own TimeoutError, or its results as the limit passed
                    return done.result()

    def _deliver(self, batch: list[_Row], groups: list[list[_Row]], shapes, results) -> None:
        """Hand each request its rows' outputs; answer the requests whose rows are all done."""
        self._learn(shapes, sum(seconds for _, seconds in results))
        for group, (outputs, seconds) in zip(groups, results, strict=True):
            self.observer.batch_done(len(group), seconds)
            for position, row in enumerate(group):
                row.request.outputs[row.index] = (outputs, position)
                row.request.remaining -= 1
        for request in {row.request for row in batch}:
            if request.remaining == 0 and not request.future.done():
                request.future.set_result(_gather(request.outputs))
                self.observer.request_done(request.started - request.enqueued)

    def _groups(self, batch: list[_Row]) -> list[list[_Row]]:
        """The batch as backend calls: one, or groups of similar length when the cost says splitting pays."""
        ordered = sorted(batch, key=lambda row: row.length)
        cuts = self._cuts([row.length for row in ordered])
        return [ordered[start:end] for start, end in zip([0, *cuts], cuts, strict=False)]

    def _shapes(self, lengths: list[int]) -> list[tuple[int, int]]:
        """(rows, longest) of the calls that rows of these ascending lengths would make."""
        return group_shapes(lengths, self._cuts(lengths))

    def _cuts(self, lengths: list[int]) -> list[int]:
        return [len(lengths)] if self.cost is None or len(lengths) == 1 else self.cost.split(lengths)

    def _learn(self, shapes: list[tuple[int, int]], seconds: float) -> None:
        if self.cost is None:  # not calibrated: all of the first batch's time counts per token
            self.cost = BackendCost.per_token_only(shapes, seconds)
        else:
            self.cost.observe(shapes, seconds)

    def _load(self, now: float) -> Load:
        return Load(self.max_delay, self._queued, self._busy, now - self._last_done)

    def _expected(self, shapes: list[tuple[int, int]]) -> float:
        """Seconds that calls of these (rows, longest) shapes are expected to take; unknown before any was timed."""
        return math.inf if self.cost is None else self.cost.seconds(shapes)

    def _timed_infer(
        self, inputs: list[Arrays], call: _Call | None = None
    ) -> list[tuple[Mapping[str, np.ndarray], float]]:
        """One backend call per group: its outputs and seconds; each call's rows and start told to `call`, which the
        watchdog reads."""
        results = []
        for group in inputs:
            start = time.perf_counter()
            if call is not None:
                call.running = (len(next(iter(group.values()))), start)
            outputs = self.infer(group)
            results.append((outputs, time.perf_counter() - start))
        return results


def _miscounted(outputs: Mapping[str, np.ndarray], rows: int) -> str | None:
    """What is wrong with a backend call's outputs for `rows` rows: None when each output has as many."""
    if wrong := {name: len(value) for name, value in outputs.items() if len(value) != rows}:
        return f"the backend answered a call of {rows} rows with {wrong} rows"
    return None


def _gather(parts: list[tuple[Arrays, int]]) -> Arrays:
    """A request's outputs in row order from (batch outputs, position) per row: one take per batch output, or the
    batch outputs themselves when the request was the whole batch, in order."""
    first = parts[0][0]
    if all(outputs is first for outputs, _ in parts):
        positions = np.fromiter((position for _, position in parts), dtype=np.intp, count=len(parts))
        if all(len(value) == len(parts) for value in first.values()) and (positions == np.arange(len(parts))).all():
            return dict(first)
        return {name: value[positions] for name, value in first.items()}
    return {name: np.stack([outputs[name][position] for outputs, position in parts]) for name in first}


def _length(row: Arrays) -> int:
    lengths = {value.shape[0] for value in row.values()}
    if len(lengths) != 1:
        raise ValueError(f"the arrays of one row differ in length: {sorted(lengths)}")
    return lengths.pop()


def pad_rows(rows: list[Arrays], pad_values: Mapping[str, int | float]) -> Arrays:
    """Stack 1-D rows into (batch, longest) arrays, right-padded with each input's pad value (one row: views of it)."""
    if len(rows) == 1:
        return {name: value[np.newaxis] for name, value in rows[0].items()}
    longest = max(_length(row) for row in rows)
    batch = {}
    for name, first in rows[0].items():
        out = np.full((len(rows), longest), pad_values.get(name, 0), dtype=first.dtype)
        for i, row in enumerate(rows):
            out[i, : row[name].shape[0]] = row[name]
        batch[name] = out
    return batch
