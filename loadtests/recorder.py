"""Every call's exact latency, from locust's request events, saved as `requests.npz` when locust quits.

Locust's own statistics round latencies under 100 ms to whole milliseconds, too coarse for a 3 ms
SLO, so the runner computes its figures from these samples. The file holds `started` (when the load started, on
the system's monotonic clock, which the runner's process samples share and a stepped wall clock does not move),
`end_s` (when each call returned, seconds after `started`), `ms` (latency from the send), `due_ms` (latency from the
due time: `ms` and how late a paced user sent the call, `loadtests.pacing`), `due_s` (when a paced user's call was due,
seconds after `started`; NaN for a call of no schedule), `ok` (no exception), `name` (index into
`names`), `names`, `code` (index into `codes`) and `codes`: each call's gRPC status name (`OK`,
`RESOURCE_EXHAUSTED`, ...; the exception's type for a failure without one, `NotSent` for a call due that a paced user
never sent, which is no call at all).
"""

import math
import time
from array import array
from pathlib import Path

import numpy as np
from edgedistill.common.atomic import atomic_write

SAMPLES_FILE = "requests.npz"
LATE_KEY = "late_ms"  # in a request event's context: how late (ms) the call was sent after its due time
DUE_KEY = "due_at"  # in a request event's context: when the call was due (`time.perf_counter`)
UNSENT_NAME = "not sent"  # the request name of a `NotSent` event: a task due that a stopped user never started


class NotSent(Exception):
    """The exception of a request event for a call due that a paced user never sent (`loadtests.pacing`): the load
    generator fell behind, so `loadtests.analysis` counts it as unsent, not as a failed call."""


def status_of(exception: BaseException | None) -> str:
    """The gRPC status name of a call that raised `exception` (None: `OK`), else the exception's type."""
    if exception is None:
        return "OK"
    code = getattr(exception, "code", None)
    return code().name if callable(code) else type(exception).__name__


class Recorder:
    """Collects one sample per request event; `attach` it to a locust environment's events."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.started: float | None = None
        self.end, self.ms, self.due_ms, self.due, self.ok = array("d"), array("d"), array("d"), array("d"), array("b")
        self.name, self.code = array("h"), array("h")
        self.names: dict[str, int] = {}
        self.codes: dict[str, int] = {}

    def attach(self, events) -> None:
        events.test_start.add_listener(self.on_start)
        events.request.add_listener(self.on_request)
        events.quitting.add_listener(self.on_quitting)

    def on_start(self, **_kwargs) -> None:
        self.started = time.monotonic()

    def on_request(self, name: str, response_time: float, exception=None, context=None, **_kwargs) -> None:
        now = time.monotonic()
        context = context or {}
        self.end.append(now)
        self.ms.append(response_time)
        self.due_ms.append(response_time + context.get(LATE_KEY, 0.0))
        # on the monotonic clock, from the pacing's: the two read one after the other, microseconds apart
        due = context.get(DUE_KEY)
        self.due.append(math.nan if due is None else now - (time.perf_counter() - due))
        self.ok.append(exception is None)
        self.name.append(self.names.setdefault(name, len(self.names)))
        self.code.append(self.codes.setdefault(status_of(exception), len(self.codes)))

    def on_quitting(self, **_kwargs) -> None:
        self.save()

    def save(self) -> None:
        started = self.started if self.started is not None else time.monotonic()
        columns = {
            "started": np.float64(started),
            "end_s": np.asarray(self.end, np.float64) - started,
            "ms": np.asarray(self.ms, np.float64),
            "due_ms": np.asarray(self.due_ms, np.float64),
            "due_s": np.asarray(self.due, np.float64) - started,
            "ok": np.asarray(self.ok, bool),
            "name": np.asarray(self.name, np.int16),
            "names": np.array(list(self.names) or [""]),
            "code": np.asarray(self.code, np.int16),
            "codes": np.array(list(self.codes) or [""]),
        }
        atomic_write(self.path, lambda tmp: np.savez_compressed(tmp, **columns))
