"""The commands the report and the headline name to build or measure a folder again (`report.plan.Target`)."""

import shlex

import pytest
from edgedistill.bench import cascade
from edgedistill.common import manifest as mf
from edgedistill.common.recipe import load_recipe, run_dir
from edgedistill.common.stage import Stage
from edgedistill.distill import stages
from edgedistill.report import plan

from tests.conftest import ROOT
from tests.test_makefile import make_dry_run

TARGETS = [
    *(plan.Target(name) for name in plan.COMMANDS if name not in plan.VARIABLE),
    plan.Target("loadtest", "steady"),
    plan.Target("serve-cascade", "bilstm-cascade"),
]


@pytest.fixture(autouse=True)
def at_the_checkouts_top(monkeypatch):
    """Where make runs: the make lines name relative paths as given there (`plan.for_make`)."""
    monkeypatch.chdir(ROOT)


def made(tmp_path, target: plan.Target) -> list[list[str]]:
    """The words of the last commands `make -n` runs for `target` (its own, after its prerequisites'), with the
    binary's path as its name and the deployed bundle's option, which the commands take by default, left out."""
    recipe = tmp_path / "mine.yaml"
    peers = f"PEERS={tmp_path}"  # as `make peers-setup` leaves them: make refuses the peer comparison without them
    lines = make_dry_run(tmp_path, *target.make().split(), peers).splitlines()[-len(plan.COMMANDS[target.name]) :]
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


SMOKE = str(ROOT / "recipes" / "smoke.yaml")
LR = "--distill.students.bilstm.optim.lr=1e-3"  # read by the stages that train or export, by no benchmark


def test_a_command_is_named_with_the_recipe_overrides_of_the_sections_it_reads():
    assert plan.command_line(plan.DISTILL, SMOKE, [LR]) == f"edgedistill distill {SMOKE} --jobs 2 {LR}"


def test_a_command_is_named_without_the_recipe_overrides_of_sections_it_does_not_read():
    targets = (plan.Target("bundles"), plan.Target("serve-bench"))
    assert plan.command_line(targets, SMOKE, [LR]) == (
        f"edgedistill bundles {SMOKE} {LR} && edgedistill bench serving {SMOKE}"
    )


def test_a_load_test_is_named_with_the_recipe_overrides_of_its_own_profile():
    target = plan.Target("loadtest", "steady")
    assert plan.command_line((target,), SMOKE, ["--loadtest.steady.rate=5"]) == (
        f"edgedistill loadtest {SMOKE} --profile steady --loadtest.steady.rate=5"
    )


def test_an_override_value_is_quoted_for_the_shell():
    labels = "--data.label_names=[negative, positive]"
    assert shlex.split(plan.command_line((plan.Target("teacher"),), SMOKE, [labels]))[-1] == labels


def test_a_make_line_given_a_recipe_outside_the_checkouts_top_folder_names_it_by_its_absolute_path(
    tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    assert plan.in_checkout(plan.DISTILL, "mine.yaml") == (
        f"in a checkout, make distill RECIPE={shlex.quote(str(tmp_path / 'mine.yaml'))}"
    )


def test_a_path_for_make_is_quoted_for_the_shell(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert shlex.split(plan.for_make("my runs/bundle-a")) == [str(tmp_path / "my runs" / "bundle-a")]


def test_a_rerun_with_recipe_overrides_gives_no_make_line_which_would_drop_them():
    assert plan.rerun(plan.DISTILL, SMOKE, [LR]).endswith(
        "; the same in a checkout, where make takes no recipe overrides"
    )


def publish(folder, parents=(), result="{}", built_as: Stage | None = None):
    """An artifact in `folder` built from the artifacts `parents` beside it, pinned as a build pins them, recording what
    the stage `built_as` hashes where given."""
    pinned = {name: mf.parent_of(folder.parent / name) for name in parents}
    hashed = {"config_hash": built_as.config_hash, "hashed": built_as.hashed} if built_as else {"config_hash": "c"}
    with mf.stage_folder(folder) as tmp:
        (tmp / "result.json").write_text(result)
        base = mf.Manifest(stage=folder.name, recipe="smoke", recipe_hash="h", parents=pinned, **hashed)
        mf.commit(tmp, folder, base)


@pytest.fixture
def smoke_run(tmp_path, monkeypatch):
    """The smoke recipe, and its run folder with a bundle of a student distilled from a transfer set built again
    since."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    root = run_dir(recipe)
    publish(root / "transfer")
    publish(root / "student-bilstm", parents=["transfer"])
    publish(root / "bundle-bilstm-int8", parents=["student-bilstm"])
    publish(root / "transfer", result='{"labelled": "again"}')  # built again
    return recipe, root


def test_a_bundle_of_an_out_of_date_student_is_stale_saying_why(smoke_run):
    recipe, root = smoke_run
    assert plan.stale(recipe, root)["bundle-bilstm-int8"].why == (
        "its parent student-bilstm is out of date (its parent transfer was built again)"
    )


def test_a_bundle_of_an_out_of_date_student_is_built_again_after_the_student(smoke_run):
    recipe, root = smoke_run
    assert plan.stale(recipe, root)["bundle-bilstm-int8"].targets == (plan.Target("distill"), plan.Target("bundles"))


def distilled(tmp_path, monkeypatch, setting: str, value, baseline: bool = False) -> dict[str, plan.Stale]:
    """What `plan.stale` names in a smoke run whose student bilstm (or its baseline), and the bundle bilstm-int8 built
    from it, were built before the recipe's `distill.students.bilstm.<setting>` was edited from `value`."""
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    built = load_recipe(ROOT / "recipes" / "smoke.yaml", {f"distill.students.bilstm.{setting}": value})
    stage = stages.student(built, "bilstm", baseline)
    root = run_dir(recipe)
    publish(root / stage.name, built_as=stage)
    publish(root / "bundle-bilstm-int8", parents=[stage.name])
    return plan.stale(recipe, root)


def test_a_student_distilled_before_its_learning_rate_was_edited_is_stale_saying_which(tmp_path, monkeypatch):
    assert distilled(tmp_path, monkeypatch, "optim.lr", 0.002)["student-bilstm"].why == (
        "student-bilstm was built with other optim settings (optim.lr 0.002 -> 0.003)"
    )


def test_a_student_distilled_before_its_model_was_edited_is_distilled_again(tmp_path, monkeypatch):
    stale = distilled(tmp_path, monkeypatch, "model.hidden_size", 16)
    assert stale["student-bilstm"].targets == (plan.Target("distill"),)


def test_a_bundle_of_a_student_distilled_before_its_settings_were_edited_is_stale_saying_why(tmp_path, monkeypatch):
    assert distilled(tmp_path, monkeypatch, "optim.lr", 0.002)["bundle-bilstm-int8"].why == (
        "student-bilstm was built with other optim settings (optim.lr 0.002 -> 0.003)"
    )


def test_a_baseline_trained_before_its_learning_rate_was_edited_is_stale(tmp_path, monkeypatch):
    assert "baseline-bilstm" in distilled(tmp_path, monkeypatch, "optim.lr", 0.002, baseline=True)


def test_a_student_whose_only_edit_is_its_gradient_accumulation_is_not_stale(tmp_path, monkeypatch):
    assert distilled(tmp_path, monkeypatch, "optim.grad_accum", 2) == {}


def test_a_baseline_whose_only_edit_is_the_students_losses_it_never_reads_is_not_stale(tmp_path, monkeypatch):
    assert distilled(tmp_path, monkeypatch, "losses.ce", 0.5, baseline=True) == {}


def test_the_cascade_benchmark_is_planned_in_the_folder_it_measures_into():
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml")
    assert cascade.stage(recipe, recipe.export.default_cascade).name in plan.planned(recipe)
