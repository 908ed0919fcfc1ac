"""What one locust run does, shared by the runner and the locust process: `plan.json`.

The runner writes the plan into the run folder and points `EDGEDISTILL_LOADTEST_PLAN` at it; the locustfile and
the shapes read it with `current()`. It holds the profile and its settings, the scenario weights
(`EDGEDISTILL_LOADTEST_SCENARIOS=single=3,batch=1` overrides the recipe's), the served model's name, the texts
file (and their pairs, for a pair model) and where the locust process writes its per-call samples.
"""

import functools
from pathlib import Path
from typing import get_args

from edgedistill.common import settings
from edgedistill.common.config.measure import ConstantLoad, LoadtestConfig, Profile, Scenario, SpikeLoad, StepLoad
from edgedistill.common.config.strict import Strict
from pydantic import Field

PLAN_VAR = "EDGEDISTILL_LOADTEST_PLAN"
SCENARIOS_VAR = "EDGEDISTILL_LOADTEST_SCENARIOS"


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
        out.append(
            Stage(name=name, start_s=start, end_s=start + seconds, users=users, offered_rate=users * settings.user_rate)
        )
        start += seconds
    return out


def parse_scenarios(text: str) -> dict[str, int]:
    """`"single=3,batch=1"` -> `{"single": 3, "batch": 1}`; `ValueError` naming what is wrong."""
    known = get_args(Scenario)
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in known or not weight.isdigit():
            raise ValueError(f"scenario weight {part!r}: want NAME=INT with NAME one of {', '.join(known)}")
        weights[name] = int(weight)
    if not sum(weights.values()):
        raise ValueError(f"scenarios {text!r}: give at least one a weight above 0")
    return weights


def scenarios_override(overrides: dict[str, object], profile: str) -> str | None:
    """The override that sets `profile`'s scenarios (`loadtest.<profile>.scenarios`, one scenario's weight under it,
    or a section above it holding them), which `--scenarios` would override in turn; None where none does."""
    path = ["loadtest", profile, "scenarios"]
    for key, value in overrides.items():
        parts = key.split(".")
        if parts[: len(path)] == path:  # the scenarios, or one weight of them
            return key
        if parts != path[: len(parts)]:
            continue
        for part in path[len(parts) :]:
            if not isinstance(value, dict) or part not in value:
                break
            value = value[part]
        else:
            return key
    return None


def scenario_weights(overrides: dict[str, object], profile: str, option: str | None = None) -> dict[str, int] | None:
    """The weights a load test of `profile` runs: `--scenarios` (`option`), else `$EDGEDISTILL_LOADTEST_SCENARIOS`;
    None for the recipe's. `ValueError` for weights that do not parse, or that come beside an override of the
    profile's scenarios, which would then do nothing."""
    variable = settings.env(SCENARIOS_VAR)
    weights = option or variable
    if not weights:
        return None
    if key := scenarios_override(overrides, profile):
        given_as = f"--scenarios {option!r}" if option else f"${SCENARIOS_VAR}={variable!r}"
        raise ValueError(f"--{key} would do nothing: {given_as} gives the weights instead; give one of them")
    return parse_scenarios(weights)


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
    return loaded.model_copy(
        update={
            "texts": folder / loaded.texts,
            "pairs": None if loaded.pairs is None else folder / loaded.pairs,
            "samples": folder / loaded.samples,
        }
    )
