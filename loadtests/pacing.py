"""A locust `User` paced on a schedule of its own: `user_rate` task starts a second, on a grid with a random phase.

locust's constant_throughput anchors each user's schedule where the user was created and restarts it whenever a
wait comes up short, so users spawned together (or delayed together by a busy moment of the locust process) call in
step, and the server sees bursts of all of them at once instead of a steady rate. Here a late user skips the start
times it missed and keeps its phase; and since locust runs a user's first task as soon as the user starts, the user
waits for its phase before that one too.
"""

import math
import random
import time

from locust import User


class PacedUser(User):
    """A user whose task starts, the first included, keep `user_rate` a second on its own grid; subclasses that add an
    `on_start` call this one."""

    abstract = True
    user_rate: float = 1.0
    """Task starts per second."""
    next_start: float | None = None
    """When the next task starts (`time.perf_counter`); None until the first wait."""

    def on_start(self):
        """Start as the classes after this one do (a `GrpcUser` connects), then wait for the phase."""
        super().on_start()
        self.wait()  # a wait locust can end, as it ends the user's later waits, where a sleep would hold the stop

    def wait_time(self) -> float:
        interval = 1 / self.user_rate
        now = time.perf_counter()
        if self.next_start is None:
            due = now + random.random() * interval
        else:
            due = self.next_start + interval
            if due < now:
                due += math.ceil((now - due) / interval) * interval
        self.next_start = due
        return due - now
