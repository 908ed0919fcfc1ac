"""Load profiles as locust `LoadTestShape`s, one class per profile, picked by name from `SHAPES`.

Each runs the stages `loadtests.plan.stages` gives for the plan's settings (see `common.config.measure`):
smoke, steady and soak hold `users` for `duration_s`; step adds `step_users` every `step_s`; spike
jumps from `users` to `spike_users` and back. Locust calls `tick` once a second, so the settings refuse a stage
that is not a whole number of seconds (`common.config.measure.SHAPE_TICK_S`).

Each change of users, up or down, comes in one batch: the plan counts a stage's calls as offered by all its users from
the stage's start (`loadtests.plan.stages`), and a paced user's schedule starts when the user does, so users started
over seconds (locust starts as many a second as the spawn rate) would leave out calls that the rate share counts.
"""

import logging

from edgedistill.loadtests import plan
from locust import LoadTestShape

# locust warns at each change whose spawn rate is above 100 users a second, asking whether the ramp needs to be that
# fast: the shapes' does, and the warning is left out of locust.log
FAST_SPAWN_WARNING = "Your selected spawn rate is very high"


def not_fast_spawn_warning(record: logging.LogRecord) -> bool:
    """A `logging` filter: False for locust's warning about a high spawn rate."""
    return not record.getMessage().startswith(FAST_SPAWN_WARNING)


class ProfileShape(LoadTestShape):
    """Users per stage of the current plan; None (stop) after the last stage."""

    abstract = True

    def __init__(self):
        super().__init__()
        self.settings = plan.current().settings
        self.stages = plan.stages(self.settings)
        # users started or stopped a second: any change of users at once
        self.spawn_rate = float(max(s.users for s in self.stages))
        logging.getLogger("locust.runners").addFilter(not_fast_spawn_warning)

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time()
        stage = next((s for s in self.stages if elapsed < s.end_s), None)
        return None if stage is None else (stage.users, self.spawn_rate)


class SmokeShape(ProfileShape):
    """A few users, every scenario, briefly: does everything answer?"""


class SteadyShape(ProfileShape):
    """Fixed users paced to a fixed total rate: the latency SLO."""


class StepShape(ProfileShape):
    """More users every step: the capacity within the SLO."""


class SpikeShape(ProfileShape):
    """A burst of users and the recovery after it."""


class SoakShape(ProfileShape):
    """A fixed rate for long: memory growth."""


SHAPES: dict[str, type[ProfileShape]] = {
    "smoke": SmokeShape,
    "steady": SteadyShape,
    "step": StepShape,
    "spike": SpikeShape,
    "soak": SoakShape,
}
