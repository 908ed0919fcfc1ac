"""Load profiles as locust `LoadTestShape`s, one class per profile, picked by name from `SHAPES`.

Each runs the stages `loadtests.plan.stages` gives for the plan's settings (see `common.config.measure`):
smoke, steady and soak hold `users` for `duration_s`; step adds `step_users` every `step_s`; spike
jumps from `users` to `spike_users` and back. Locust calls `tick` about once a second, so the settings refuse a stage
shorter than that (`common.config.measure.SHAPE_TICK_S`).
"""

from edgedistill.loadtests import plan
from locust import LoadTestShape

SPAWN_RATE = 100.0  # users started or stopped per second: a step or a spike is near instant


class ProfileShape(LoadTestShape):
    """Users per stage of the current plan; None (stop) after the last stage."""

    abstract = True

    def __init__(self):
        super().__init__()
        self.settings = plan.current().settings
        self.stages = plan.stages(self.settings)

    def tick(self) -> tuple[int, float] | None:
        elapsed = self.get_run_time()
        stage = next((s for s in self.stages if elapsed < s.end_s), None)
        return None if stage is None else (stage.users, SPAWN_RATE)


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
