"""Load drivers of the serving benchmark: gRPC calls from asyncio tasks, paced or saturating, and a backend
called in a loop in a thread of its own; each returns a `Tally`, and `measure` turns one into figures with the CPU
it cost. `rotated` is the order of each repeat's phases, in every benchmark that repeats several."""

import asyncio
import functools
import itertools
import math
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import grpc
import numpy as np
import psutil
from edgedistill.bench import BenchError
from edgedistill.bench.processes import cpu_seconds
from edgedistill.bench.stats import call_stats, from_due, percentiles
from edgedistill.serve.proto import classifier_pb2_grpc
from edgedistill.serve.settings import DIRECT

CALL_TIMEOUT_S = 10.0


def rotated(order: list, repeat: int) -> list:
    """`order` as repeat `repeat` (from 0) runs it: rotated by one each repeat, so that each runs first in turn; each
    keeps its neighbours (the last of `order` runs before the first)."""
    shift = repeat % len(order)
    return order[shift:] + order[:shift]


@dataclass
class Tally:
    """Successful calls' latencies (seconds), failed calls by status code, and for paced calls how long each
    successful one waited past its due time for the call before it to return, how many were due, and how long each
    one due but never sent (`unsent`: held up by a call that overran the run) had waited when that call returned."""

    latencies: list[float] = field(default_factory=list)
    errors: Counter = field(default_factory=Counter)
    queued: list[float] = field(default_factory=list)
    due_calls: int | None = None
    unsent: list[float] = field(default_factory=list)

    async def call(self, classify, request, queued: float | None = None) -> None:
        start = time.perf_counter()
        try:
            await classify(request)
        except grpc.aio.AioRpcError as err:
            self.errors[err.code().name] += 1
            return
        self.latencies.append(time.perf_counter() - start)
        if queued is not None:
            self.queued.append(queued)

    def record(
        self, seconds: float, texts_per_call: int, offered_rate: float | None = None, what: str = "the load"
    ) -> dict:
        """`call_stats` over `seconds` of wall time, successful texts/s and failures by status code; for paced calls
        also the latencies timed from each call's due time (`p99_from_due_ms`, ...: what a client sending on schedule
        would have waited, as a slow call delays the ones due behind it, which timing from the send alone leaves out;
        an unsent call, until the call that held it up returned), how many were late, how many went unsent (no
        failures: the server never saw them), and the calls due as those offered; a `BenchError` naming `what` (what
        was measured) where no call succeeded."""
        if not self.latencies:
            raise BenchError(f"{what}: no call succeeded; failures by status: {dict(self.errors)}")
        ms = np.array(self.latencies) * 1e3
        stats = call_stats(ms, sum(self.errors.values()), seconds, offered_rate, self.due_calls)
        texts = len(self.latencies) * texts_per_call / seconds
        if self.queued:
            queued = np.array(self.queued) * 1e3
            due_ms = np.concatenate([ms + queued, np.array(self.unsent) * 1e3])
            stats |= {from_due(key): value for key, value in percentiles(due_ms).items()} | {
                "late_calls": int((queued > 0).sum()),
                "unsent_calls": len(self.unsent),
            }
        return stats | {"texts_per_s": texts, "seconds": seconds, "error_codes": dict(self.errors)}


async def classify_call(stack: AsyncExitStack, port: int, metadata: tuple = ()) -> Callable:
    """`Classify` on loopback `port` with the drivers' timeout, over a channel that `stack` closes."""
    channel = await stack.enter_async_context(grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=DIRECT))
    return functools.partial(
        classifier_pb2_grpc.ClassifierStub(channel).Classify, timeout=CALL_TIMEOUT_S, metadata=metadata
    )


def calls_due(rate: float, duration: float) -> int:
    """The calls due within `duration` seconds at `rate` calls/s (the i-th at i / rate), past the floats' rounding."""
    return math.ceil(round(duration * rate, 9))


async def paced(classify, requests: list, rate: float, duration: float) -> Tally:
    """One call at a time, the i-th due at start + i / rate and sent then, or at once when the call before it returned
    later, for the calls due within `duration` seconds. Those still unsent at the end, held up by a call that overran
    it, are kept with their wait from the due time until that call returned (`Tally.unsent`): left out, they would let a server that
    stalls at the end pass."""
    tally = Tally(due_calls=calls_due(rate, duration))
    start = returned = time.perf_counter()
    for i in range(tally.due_calls):
        due = start + i / rate
        if (now := time.perf_counter()) >= start + duration:
            tally.unsent = [now - start - k / rate for k in range(i, tally.due_calls)]
            break
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        await tally.call(classify, requests[i % len(requests)], max(0.0, returned - due))
        returned = time.perf_counter()
    return tally


async def saturate(classify, requests: list, concurrency: int, duration: float) -> Tally:
    """`concurrency` callers, each sending its next call as soon as the last returns, for `duration` seconds."""
    tally = Tally()
    end = time.perf_counter() + duration

    async def caller(first: int) -> None:
        for i in itertools.count(first, concurrency):
            if time.perf_counter() >= end:
                return
            await tally.call(classify, requests[i % len(requests)])

    await asyncio.gather(*(caller(k) for k in range(concurrency)))
    return tally


def infer_for(
    backend, batches: list[dict[str, np.ndarray]], duration: float, stop: threading.Event | None = None
) -> Tally:
    """Run the backend on `batches` in turn for `duration` seconds, or until `stop` is set."""
    tally = Tally()
    end = time.perf_counter() + duration
    for i in itertools.count():
        if time.perf_counter() >= end or stop is not None and stop.is_set():
            return tally
        start = time.perf_counter()
        backend.infer(batches[i % len(batches)])
        tally.latencies.append(time.perf_counter() - start)


def infer_in_thread(
    stack: AsyncExitStack, backend, batches: list[dict[str, np.ndarray]], duration: float
) -> Callable[[], Awaitable[Tally]]:
    """`infer_for` as a load, run in a thread of its own that closing `stack` stops and waits for: a cancelled task
    (Ctrl-C) leaves its thread calling the backend, so `stack` must close the backend after this, by a callback
    entered before."""
    stop = threading.Event()
    thread = stack.enter_context(ThreadPoolExecutor(1, thread_name_prefix="infer"))
    stack.callback(stop.set)

    async def load() -> Tally:
        return await asyncio.get_running_loop().run_in_executor(thread, infer_for, backend, batches, duration, stop)

    return load


async def measure(
    load: Callable[[], Awaitable[Tally]],
    texts_per_call: int,
    server: psutil.Process | None,
    offered_rate: float | None = None,
    what: str = "the load",
) -> dict:
    """Await `load()`; its record (`Tally.record`, `what` naming it) plus the CPU % (100 = one core) of this process and
    of `server`."""
    processes = {"client": psutil.Process()} | ({"server": server} if server else {})
    before = {name: cpu_seconds(p) for name, p in processes.items()}
    start = time.perf_counter()
    tally = await load()
    seconds = time.perf_counter() - start
    usage = {f"{name}_cpu": 100 * (cpu_seconds(p) - before[name]) / seconds for name, p in processes.items()}
    return tally.record(seconds, texts_per_call, offered_rate, what) | usage
