"""A locust `User` paced on a schedule of its own: `user_rate` task starts a second, on a grid with a random phase.

locust's constant_throughput anchors each user's schedule where the user was created and restarts it whenever a
wait comes up short, so users spawned together (or delayed together by a busy moment of the locust process) call in
step, and the server sees bursts of all of them at once instead of a steady rate. Here a user keeps its phase, and
since locust runs a user's first task as soon as the user starts, the user waits for its phase before that one too.

The schedule is open: a user whose task overran the start times after it (a call the server held) starts the tasks
due meanwhile at once, one after another, as clients calling on schedule would have sent them, and passes how late
each started to its calls' request events (`loadtests.recorder.LATE_KEY` in their context), so that their latency
counts from their due time as well as from their send. Skipping those start times instead would send fewer calls
and leave the wait out of every latency: a server that stalls would pass.
"""

import random
import time

from edgedistill.loadtests.recorder import LATE_KEY
from locust import User

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
    next_start: float | None = None
    """When the next task is due (`time.perf_counter`); None until the first wait."""
    late_s: float = 0.0
    """How long after its due time the current task started, held up by the task before it."""

    def on_start(self):
        """Start as the classes after this one do (a `GrpcUser` connects), then wait for the phase."""
        super().on_start()
        self.wait()  # a wait locust can end, as it ends the user's later waits, where a sleep would hold the stop

    def wait_time(self) -> float:
        interval = 1 / self.user_rate
        now = time.perf_counter()
        due = now + random.random() * interval if self.next_start is None else self.next_start + interval
        self.next_start = due
        self.late_s = max(0.0, now - due)
        if self.schedule_s is not None and self.environment.shape_class.get_run_time() + due - now >= self.schedule_s:
            return UNTIL_STOPPED_S
        return max(0.0, due - now)

    def context(self) -> dict:
        """The request events' context of the current task's calls: how late (ms) the task started."""
        return super().context() | {LATE_KEY: self.late_s * 1000}
