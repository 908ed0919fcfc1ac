"""A load test's scenario weights: `--scenarios`, else `$EDGEDISTILL_LOADTEST_SCENARIOS`, else its profile's in the
recipe. Read before the load test and by `edgedistill all`, which refuses them before the teacher trains."""

from typing import get_args

from edgedistill.common import settings
from edgedistill.common.config.measure import Scenario

SCENARIOS_VAR = "EDGEDISTILL_LOADTEST_SCENARIOS"


def parse_scenarios(text: str, given_as: str = "--scenarios") -> dict[str, int]:
    """`"single=3,batch=1"` -> `{"single": 3, "batch": 1}`; `ValueError` naming what is wrong and where the weights
    were given (`given_as`: the flag, or the variable)."""
    known = get_args(Scenario)
    weights = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, weight = part.partition("=")
        if name not in known or not (weight.isascii() and weight.isdigit()):  # isdigit() alone takes '²'
            raise ValueError(f"{given_as}: scenario weight {part!r}: want NAME=INT with NAME one of {', '.join(known)}")
        if name in weights:
            raise ValueError(f"{given_as}: scenario {name} is given twice ({text!r}): give each once")
        weights[name] = int(weight)
    if not sum(weights.values()):
        raise ValueError(f"{given_as}: scenarios {text!r}: give at least one a weight above 0")
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
    weights = option if option is not None else variable
    if weights is None:
        return None
    flag = option is not None
    name = settings.env_name(SCENARIOS_VAR)  # the old name, where the weights were set under it
    if key := scenarios_override(overrides, profile):
        given_as = f"--scenarios {option!r}" if flag else f"${name}={variable!r}"
        raise ValueError(f"--{key} would do nothing: {given_as} gives the weights instead; give one of them")
    return parse_scenarios(weights, "--scenarios" if flag else name)
