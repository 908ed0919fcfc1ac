"""What one locust run does, shared by the runner and the locust process: `plan.json`.

The runner writes the plan into the run folder and points `EDGEDISTILL_LOADTEST_PLAN` at it; the locustfile and
the shapes read it with `current()`. It holds the profile and its settings, the scenario weights
(`EDGEDISTILL_LOADTEST_SCENARIOS=single=3,batch=1` overrides the recipe's), the served model's name, the texts
file (and their pairs, for a pair model) and where the locust process writes its per-call samples.
"""

import functools
from pathlib import Path

from edgedistill.common import settings
from edgedistill.common.config.measure import ConstantLoad, LoadtestConfig, Profile, Scenario, SpikeLoad, StepLoad
from edgedistill.common.config.strict import Strict
from edgedistill.common.manifest import MANIFEST
from pydantic import Field

PLAN_VAR = "EDGEDISTILL_LOADTEST_PLAN"


class Stage(Strict):
    """A stretch of constant load: seconds from the start of the run, users, calls/s they offer together."""

    name: str
    start_s: float
    end_s: float
    users: int
    offered_rate: float


class Plan(Strict):
    profile: Profile
    loadtest: LoadtestConfig
    scenarios: dict[Scenario, int] = Field(description="scenario -> weight, after EDGEDISTILL_LOADTEST_SCENARIOS")
    model: str = Field(description="the served model's name, sent with KServe ModelInfer")
    texts: Path = Field(description="texts to send, one per line (relative: to the plan's folder)")
    pairs: Path | None = Field(
        None, description="for a pair model, each text's pair, one per line in the texts' order (relative: likewise)"
    )
    samples: Path = Field(description="where the locust process writes its per-call samples (relative: likewise)")

    @property
    def settings(self) -> ConstantLoad | StepLoad | SpikeLoad:
        return self.loadtest.profile(self.profile)

    @property
    def stages(self) -> list[Stage]:
        return stages(self.settings)

    @property
    def duration_s(self) -> float:
        return self.stages[-1].end_s


def stages(settings: ConstantLoad | StepLoad | SpikeLoad) -> list[Stage]:
    """The profile's schedule, stage after stage."""
    if isinstance(settings, StepLoad):
        counts = [settings.users + k * settings.step_users for k in range(settings.steps)]
        spans = [(f"step {k + 1}", settings.step_s, users) for k, users in enumerate(counts)]
    elif isinstance(settings, SpikeLoad):
        spans = [
            ("before", settings.before_s, settings.users),
            ("spike", settings.spike_s, settings.spike_users),
            ("after", settings.after_s, settings.users),
        ]
    else:
        spans = [("constant", settings.duration_s, settings.users)]
    out, start = [], 0.0
    for name, seconds, users in spans:
        end = start + seconds
        out.append(Stage(name=name, start_s=start, end_s=end, users=users, offered_rate=users * settings.user_rate))
        start = end
    return out


@functools.cache
def current() -> Plan:
    """The plan at `$EDGEDISTILL_LOADTEST_PLAN` (written by `python -m loadtests`)."""
    path = settings.env(PLAN_VAR)
    if not path:
        raise RuntimeError(
            f"{PLAN_VAR} is not set: run `python -m loadtests RECIPE --profile NAME`, "
            f"or point {PLAN_VAR} at the plan.json of an earlier run"
        )
    folder = Path(path).parent
    loaded = Plan.model_validate_json(Path(path).read_text(encoding="utf-8"))
    samples = folder / loaded.samples
    if (folder / MANIFEST).is_file():
        # the plan of a finished run (its folder published, every file hashed), which locust run on its own reads: its
        # samples go to the working folder, where they cannot replace the run's own, unless that is the run's folder
        samples, own = Path.cwd() / loaded.samples, samples
        if samples.resolve() == own.resolve():
            raise RuntimeError(
                f"locust run in {folder} on the plan of its finished run would replace the run's {loaded.samples}, "
                f"which its manifest hashes: run locust from another folder, where it writes its own"
            )
    return loaded.model_copy(
        update={
            "texts": folder / loaded.texts,
            "pairs": None if loaded.pairs is None else folder / loaded.pairs,
            "samples": samples,
        }
    )
