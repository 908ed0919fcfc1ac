"""The recipe sections each command reads (common.sections), against what its stages hash."""

import re
from functools import partial

import pytest
from edgedistill.common import sections
from edgedistill.common.recipe import load_recipe, overrides_help, parse_overrides, run_dir
from edgedistill.common.stage import Stage

from tests.conftest import ROOT

SMOKE = ROOT / "recipes" / "smoke.yaml"
# the commands that serve one bundle, by default the deployed one
BENCHMARKS_OF_A_BUNDLE = ["bench serving", "bench accuracy", "bench peers", "bench scaling", "loadtest"]


def test_an_override_in_a_shared_section_sets_its_subsection():
    assert sections.scope("bench.serving.threads") == "bench.serving"


def test_an_override_in_another_section_sets_that_section():
    assert sections.scope("runtime.device") == "runtime"


def test_an_override_in_a_section_a_command_reads_a_part_of_sets_that_part_for_it():
    assert sections.scope("runtime.precision", "bench models") == "runtime.precision"


def test_the_model_benchmark_reads_no_runtime_precision():
    assert sections.outside(["runtime.precision"], "bench models") == ["runtime.precision"]


def test_a_benchmark_does_not_read_another_benchmarks_subsection():
    assert sections.outside(["bench.peers.workers"], "bench serving") == ["bench.peers.workers"]


def test_an_override_of_a_whole_shared_section_sets_the_subsection_a_benchmark_reads():
    assert sections.outside(["bench"], "bench serving") == []


def test_an_override_in_a_load_test_profile_sets_that_profile():
    assert sections.scope("loadtest.steady.rate") == "loadtest.steady"


def test_a_load_test_does_not_read_another_profiles_settings():
    assert sections.outside(["loadtest.steady.rate"], sections.loadtest("smoke")) == ["loadtest.steady.rate"]


@pytest.mark.parametrize("profile", sections.PROFILES)
def test_a_load_test_reads_its_own_profiles_settings(profile):
    assert sections.outside([f"loadtest.{profile}.users"], sections.loadtest(profile)) == []


@pytest.mark.parametrize("profile", sections.PROFILES)
def test_a_load_test_reads_the_settings_every_profile_shares(profile):
    assert sections.outside(["loadtest.timeout_s"], sections.loadtest(profile)) == []


def test_a_load_test_given_no_profile_reads_the_one_it_runs_by_default():
    assert sections.outside([f"loadtest.{sections.DEFAULT_PROFILE}.rate"], "loadtest") == []


def test_a_load_tests_help_names_its_own_profiles_settings_by_the_option():
    assert sections.named("loadtest")[-1] == "loadtest.PROFILE"


def test_a_setting_every_profile_shares_is_read_by_the_load_test_whatever_its_profile():
    assert sections.readers("loadtest.timeout_s") == ["loadtest"]


def test_a_profiles_setting_is_read_by_the_load_test_of_that_profile():
    assert sections.readers("loadtest.steady.rate") == ["loadtest --profile steady"]


def test_a_benchmarks_setting_is_read_by_the_commands_that_run_it():
    assert sections.readers("bench.serving.threads") == ["bench serving", "bench cascade"]


@pytest.mark.parametrize("command", BENCHMARKS_OF_A_BUNDLE)
def test_a_benchmark_of_a_bundle_does_not_read_how_bundles_are_built(command):
    assert sections.outside(["export.bundles.cnn-folded.precision"], command) == ["export.bundles.cnn-folded.precision"]


@pytest.mark.parametrize("command", BENCHMARKS_OF_A_BUNDLE)
def test_a_benchmark_of_a_bundle_reads_the_bundle_it_serves_by_default(command):
    assert sections.outside(["export.deploy"], command) == []


def test_the_accuracy_benchmark_reads_the_near_tie_margin():
    assert sections.outside(["export.tie_margin"], "bench accuracy") == []


def test_the_cascade_benchmark_reads_the_cascades():
    assert sections.outside(["export.cascades.bilstm-cascade.target_agreement"], "bench cascade") == []


@pytest.mark.parametrize("command", ["pretrain", "finetune", "teacher"])
def test_the_teachers_commands_read_the_students_they_warn_about(command):
    assert sections.outside(["distill.students.cnn.optim.lr"], command) == []


@pytest.mark.parametrize("command", ["pretrain", "finetune", "teacher"])
def test_the_teachers_commands_read_the_teacher_bundles_whose_fusion_they_check(command):
    assert sections.outside(["export.bundles.teacher-fused.fused"], command) == []


def test_pretraining_reads_the_task_the_students_it_warns_about_are_built_for():
    assert sections.outside(["data.pairs"], "pretrain") == []


@pytest.mark.parametrize("command", sections.READS)
def test_every_command_reads_the_run_name(command):
    assert sections.outside(["name"], command) == []


def hashed(stage: Stage) -> set[str]:
    """The settings (or sections) `stage` and its parent stages hash."""
    own = set(stage.settings)
    return own.union(*(hashed(parent) for parent in stage.parents if isinstance(parent, Stage)))


def unread(keys: set[str], command: str) -> set[str]:
    """Those of `keys` that are not a section `command` reads, nor inside one."""
    read = sections.reads(command)
    return {key for key in keys if not any(key == section or key.startswith(f"{section}.") for section in read)}


def stages(command: str, overrides: dict | None = None) -> list[Stage]:
    """The stages `command` runs on recipes/smoke.yaml (with `overrides`), built and not run."""
    from edgedistill.bench import accuracy, cascade, model_stage, scaling, serving
    from edgedistill.bench.peers import compare
    from edgedistill.distill import stages as trained
    from edgedistill.export import stages as exported
    from edgedistill.loadtests import runner

    recipe = load_recipe(
        SMOKE, {"transfer.labeller": "teacher-int8", "transfer.relabel_margin": 1.0, **(overrides or {})}
    )
    bundle = run_dir(recipe) / f"bundle-{recipe.export.deploy}"
    return {
        **{
            command: partial(trained.of_command, recipe, str(SMOKE), command)
            for command in ("pretrain", "finetune", "teacher", "transfer", "distill")
        },
        "labeller": lambda: [exported.bundle(recipe, recipe.transfer.labeller)],
        "bundles": lambda: [  # every bundle, those this machine cannot build too
            *(exported.bundle(recipe, name) for name in recipe.export.bundles),
            *(exported.cascade(recipe, name) for name in recipe.export.cascades),
        ],
        "bench models": lambda: [model_stage.stage(recipe)],
        "bench serving": lambda: [serving.stage(recipe, bundle)],
        "bench accuracy": lambda: [accuracy.stage(recipe, bundle)],
        "bench cascade": lambda: [cascade.stage(recipe, next(iter(recipe.export.cascades)))],
        "bench peers": lambda: [compare.stage(recipe, bundle, {})],
        "bench scaling": lambda: [scaling.stage(recipe, bundle)],
        "loadtest": lambda: [runner.stage(recipe, "smoke", bundle)],
    }[command]()


# the report's stage needs finished stages to be made, and the headline runs no stage
STAGED = [command for command in sections.READS if command not in ("report", "headline")]


@pytest.mark.parametrize("command", STAGED)
def test_a_command_reads_every_section_its_stages_and_their_parents_hash(command):
    assert unread(set().union(*(hashed(stage) for stage in stages(command))), command) == set()


@pytest.mark.parametrize("profile", sections.PROFILES)
def test_a_load_test_reads_every_section_its_profiles_stage_hashes(profile):
    from edgedistill.loadtests import runner

    recipe = load_recipe(SMOKE)
    stage = runner.stage(recipe, profile, run_dir(recipe) / f"bundle-{recipe.export.deploy}")
    assert unread(hashed(stage), sections.loadtest(profile)) == set()


def own(built: list[Stage]) -> list[tuple[dict, dict]]:
    """What each of `built` is built from besides its parents: its settings and `extra`."""
    return [(stage.hashed["settings"], stage.hashed["extra"]) for stage in built]


@pytest.mark.parametrize("command", STAGED)
def test_the_override_a_commands_help_shows_changes_what_its_own_stages_are_built_from(command):
    example = re.search(r"e\.g\. (--\S+) \(", overrides_help(command)).group(1)
    assert own(stages(command, parse_overrides([example]))) != own(stages(command))
