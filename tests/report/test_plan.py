"""The commands the report and the headline name to build or measure a folder again (`report.plan.Target`)."""

import shlex

import pytest
from edgedistill.report import plan

from tests.test_makefile import make_dry_run

TARGETS = [
    *(plan.Target(name) for name in plan.COMMANDS if name not in plan.VARIABLE),
    plan.Target("loadtest", "steady"),
    plan.Target("serve-cascade", "bilstm-cascade"),
]


def made(tmp_path, target: plan.Target) -> list[list[str]]:
    """The words of the last commands `make -n` runs for `target` (its own, after its prerequisites'), with the
    binary's path as its name and the deployed bundle's option, which the commands take by default, left out."""
    recipe = tmp_path / "mine.yaml"
    lines = make_dry_run(tmp_path, *target.make().split()).splitlines()[-len(plan.COMMANDS[target.name]) :]
    commands = []
    for line in lines:
        words = [word.replace(str(recipe), "RECIPE") for word in shlex.split(line)]
        words[0] = words[0].rpartition("/")[2]
        if "--bundle" in words:
            del words[words.index("--bundle") : words.index("--bundle") + 2]
        commands.append(words)
    return commands


@pytest.mark.parametrize("target", TARGETS, ids=lambda target: target.make())
def test_each_target_is_named_with_the_commands_its_make_target_runs(tmp_path, target):
    assert [shlex.split(command) for command in target.commands("RECIPE")] == made(tmp_path, target)


def test_a_measurement_of_a_bundle_built_again_is_run_again_after_the_bundles():
    targets = (plan.Target("bundles"), plan.Target("serve-bench"))
    assert plan.rerun(targets, "mine.yaml") == (
        "edgedistill bundles mine.yaml && edgedistill bench serving mine.yaml; in a checkout, "
        "make bundles serve-bench RECIPE=mine.yaml"
    )
