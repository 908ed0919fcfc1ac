"""A locust `User` paced on a schedule of its own: `user_rate` task starts a second, on a grid with a random phase.

locust's constant_throughput anchors each user's schedule where the user was created and restarts it whenever a
wait comes up short, so users spawned together (or delayed together by a busy moment of the locust process) call in
step, and the server sees bursts of all of them at once instead of a steady rate. Here a user keeps its phase, and
since locust runs a user's first task as soon as the user starts, the user waits for its phase before that one too.
The schedule starts when the user does, before it connects, as the plan counts a stage's calls as offered from its
start: calls due while the server is slow to accept the connection are sent late, or counted unsent, as those held up
by a call are.

The schedule is open: a user whose task overran the start times after it (a call the server held) starts the tasks
due meanwhile at once, one after another, as clients calling on schedule would have sent them, and passes how late
each started to its calls' request events (`loadtests.recorder.LATE_KEY` in their context), so that their latency
counts from their due time as well as from their send. Skipping those start times instead would send fewer calls
and leave the wait out of every latency: a server that stalls would pass. A user that locust stops while still
behind (held up by its connection or by a call at the end of the schedule, or removed at a spike's end) reports each
task due before then that it never started as a request event of `loadtests.recorder.NotSent`, late by how long
before the user stopped it was due: counted as unsent (not as a failed call: the server never saw it) and timed from
its due time, so that a server that stalls at the end misses the rate share and the p99.
"""

import itertools
import math
import random
import time

from edgedistill.loadtests.recorder import DUE_KEY, LATE_KEY, UNSENT_NAME, NotSent
from locust import User
from locust.user.task import LOCUST_STATE_WAITING

UNTIL_STOPPED_S = 1e9  # the wait of a user whose schedule has ended: locust stops it at its shape's next tick


class PacedUser(User):
    """A user whose task starts, the first included, keep `user_rate` a second on its own grid; subclasses that add an
    `on_start` call this one."""

    abstract = True
    user_rate: float = 1.0
    """Task starts per second."""
    schedule_s: float | None = None
    """Seconds into the run's shape (`environment.shape_class`) at which the schedule ends: no task due later starts.
    None: no end."""
    first_due: float | None = None
    """When the first task is due (`time.perf_counter`): the user's start, before it connects, plus its phase; None
    until `on_start`."""
    next_start: float | None = None
    """When the next task is due (`time.perf_counter`); None until the first wait."""
    late_s: float = 0.0
    """How long after its due time the current task started, held up by the task before it."""
    stop_asked: float | None = None
    """When locust asked the user to stop (`time.perf_counter`): no task due later is owed."""

    def on_start(self):
        """Draw the phase, start as the classes after this one do (a `GrpcUser` connects), then wait for the phase."""
        self.first_due = time.perf_counter() + random.random() / self.user_rate
        super().on_start()
        self.wait()  # a wait locust can end, as it ends the user's later waits, where a sleep would hold the stop

    def wait_time(self) -> float:
        interval = 1 / self.user_rate
        now = time.perf_counter()
        due = self.first_due if self.next_start is None else self.next_start + interval
        self.next_start = due
        self.late_s = max(0.0, now - due)
        if due >= self.schedule_end(now):
            return UNTIL_STOPPED_S
        return max(0.0, due - now)

    def schedule_end(self, now: float) -> float:
        """When (`time.perf_counter`, `now` being the time) the schedule ends; infinity without an end."""
        if self.schedule_s is None:
            return math.inf
        return now + self.schedule_s - self.environment.shape_class.get_run_time()

    def stop(self, force: bool = False):
        """Note when locust first asked the user to stop, then stop as locust does."""
        self.stop_asked = time.perf_counter() if self.stop_asked is None else self.stop_asked
        return super().stop(force)

    def on_stop(self):
        """Report the tasks due before the schedule's end or locust's stop, whichever came first, that never started,
        then stop as the classes after this one do (a `GrpcUser` closes its channel)."""
        self.report_unsent()
        super().on_stop()

    def report_unsent(self) -> None:
        """One request event of `NotSent` (as UNSENT_NAME) per task due before the user stopped that never started,
        its lateness (`LATE_KEY`) how long before now it was due: a client on schedule would have waited that long."""
        first = self.first_unsent()
        if first is None:  # stopped before it started: no schedule yet
            return
        now = time.perf_counter()
        end = min(self.schedule_end(now), now if self.stop_asked is None else self.stop_asked)
        interval = 1 / self.user_rate
        for due in itertools.takewhile(lambda due: due < end, (first + k * interval for k in itertools.count())):
            self.environment.events.request.fire(
                request_type="paced",
                name=UNSENT_NAME,
                response_time=0.0,
                response_length=0,
                response=None,
                # read at each event, as the recorder stamps each, so that the due time it gives back is this one
                context=self.context() | {LATE_KEY: (time.perf_counter() - due) * 1000, DUE_KEY: due},
                exception=NotSent("due before the user stopped, held up by its connection or a call before it"),
            )

    def first_unsent(self) -> float | None:
        """When the first task that never started was due (`time.perf_counter`); None before `on_start`."""
        if self.next_start is None:  # stopped before its first wait (while connecting): no task started
            return self.first_due
        # stopped in its wait, the task due at next_start never started; else that task ran (or runs: a forced stop)
        return self.next_start if self._state == LOCUST_STATE_WAITING else self.next_start + 1 / self.user_rate

    def context(self) -> dict:
        """The request events' context of the current task's calls: how late (ms) the task started, and when it was
        due."""
        return super().context() | {LATE_KEY: self.late_s * 1000, DUE_KEY: self.next_start}
