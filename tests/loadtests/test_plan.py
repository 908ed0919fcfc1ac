"""The `loadtest` recipe section, its presets and schedules, scenario weights, and a task for each scenario."""

import ast
from importlib.util import find_spec
from pathlib import Path
from typing import get_args

import pytest
from edgedistill.bench import serving as bench_serving
from edgedistill.common.config.measure import ConstantLoad, LoadtestConfig, Scenario, SpikeLoad, StepLoad
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.loadtests import __main__ as loadtests_main
from edgedistill.loadtests import plan

from tests.conftest import ROOT

MINIMAL = "data: {train: a.tsv, dev: b.tsv, label_names: [negative, positive]}\nmodel: {init: some/model}\n"


def write(tmp_path, text):
    path = tmp_path / "exp.yaml"
    path.write_text(text)
    return path


def test_presets_fill_what_a_recipe_leaves_out():
    cfg = LoadtestConfig.model_validate({"smoke": {"duration_s": 3}, "steady": {"slo": {"p99_ms": 3}}})
    assert cfg.smoke.users == 2
    assert cfg.smoke.rate == 20.0
    assert cfg.smoke.duration_s == 3
    assert set(cfg.smoke.scenarios) == {"single", "batch", "stream", "kserve"}
    assert cfg.steady.slo.p99_ms == 3
    assert cfg.steady.slo.max_error_rate == 0
    assert cfg.steady.user_rate == 20.0
    assert cfg.soak.duration_s == 600


TREC_RECIPE = ROOT / "recipes" / "trec.yaml"  # a recipe that sets no scenarios: its profiles run the preset mixes


def test_an_override_of_one_smoke_weight_keeps_the_other_weights_of_the_preset():
    recipe = load_recipe(TREC_RECIPE, {"loadtest.smoke.scenarios.batch": 2})
    assert recipe.loadtest.smoke.scenarios == {"single": 1, "batch": 2, "stream": 1, "kserve": 1}


def test_an_override_of_one_steady_weight_keeps_the_default_weights():
    recipe = load_recipe(TREC_RECIPE, {"loadtest.steady.scenarios.batch": 1})
    assert recipe.loadtest.steady.scenarios == {"single": 1, "batch": 1}


def test_an_override_of_the_whole_mix_replaces_the_preset():
    recipe = load_recipe(TREC_RECIPE, {"loadtest.smoke.scenarios": {"batch": 2}})
    assert recipe.loadtest.smoke.scenarios == {"batch": 2}


def test_scenarios_a_recipe_spells_out_replace_the_preset(tmp_path):
    recipe = load_recipe(write(tmp_path, MINIMAL + "loadtest: {smoke: {scenarios: {batch: 2}}}\n"))
    assert recipe.loadtest.smoke.scenarios == {"batch": 2}


def test_bad_loadtest_settings_are_named(tmp_path):
    with pytest.raises(RecipeError, match=r"loadtest\.step.*settle_s"):
        load_recipe(write(tmp_path, MINIMAL + "loadtest: {step: {step_s: 1, settle_s: 2}}\n"))
    with pytest.raises(RecipeError, match=r"loadtest\.smoke\.scenarios"):
        load_recipe(write(tmp_path, MINIMAL + "loadtest: {smoke: {scenarios: {sing: 1}}}\n"))
    with pytest.raises(RecipeError, match=r"loadtest\.spike"):
        load_recipe(write(tmp_path, MINIMAL + "loadtest: {spike: {users: 5, spike_users: 5}}\n"))


def test_a_stage_shorter_than_the_shapes_tick_is_refused_naming_its_key():
    with pytest.raises(ValueError, match=r"spike_s=0\.3 is shorter than the 1-second tick"):
        SpikeLoad(before_s=20, spike_s=0.3)


@pytest.mark.parametrize("key", ["before_s", "spike_s", "after_s"])
def test_a_spike_stage_of_a_fraction_of_a_second_more_is_refused_naming_its_key_and_locusts_tick(key):
    with pytest.raises(ValueError, match=rf"{key}=1\.5 is not a whole number of the 1-second ticks at which locust"):
        SpikeLoad(**{key: 1.5})


def test_a_step_of_a_fraction_of_a_second_more_is_refused_naming_locusts_tick():
    with pytest.raises(ValueError, match=r"step_s=1\.3 is not a whole number of the 1-second ticks at which locust"):
        StepLoad(step_s=1.3, settle_s=0.5)


def test_a_constant_load_of_a_fraction_of_a_second_more_is_taken():
    assert ConstantLoad(users=2, rate=20, duration_s=2.5).duration_s == 2.5


def test_a_constant_load_shorter_than_the_shapes_tick_is_refused_naming_its_key():
    with pytest.raises(ValueError, match=r"duration_s=0\.5 is shorter than the 1-second tick"):
        ConstantLoad(duration_s=0.5)


def test_a_constant_load_offering_fewer_calls_than_its_users_is_refused():
    with pytest.raises(ValueError, match=r"offers 0\.03 calls, fewer than its 2 users"):
        ConstantLoad(users=2, rate=0.01, duration_s=3)


def test_a_constant_load_offering_a_call_per_user_is_taken():
    assert ConstantLoad(users=2, rate=1, duration_s=2).user_rate == 0.5


def test_loadtest_section_leaves_artifact_hashes_alone(tmp_path):
    without = load_recipe(write(tmp_path, MINIMAL))
    with_it = load_recipe(write(tmp_path, MINIMAL + "loadtest: {steady: {rate: 100}}\n"))
    assert without.hash == with_it.hash
    assert with_it.section_hash("loadtest") != without.section_hash("loadtest")


SCHEDULES = LoadtestConfig.model_validate(
    {
        "step": {"users": 2, "step_users": 3, "steps": 3, "step_s": 5, "user_rate": 10},
        "spike": {"users": 1, "spike_users": 4, "user_rate": 5, "before_s": 2, "spike_s": 3, "after_s": 4},
        "steady": {"users": 4, "rate": 100, "duration_s": 7},
    }
)


def test_step_profile_adds_step_users_each_step_at_the_user_rate():
    step = plan.stages(SCHEDULES.step)
    assert [(s.start_s, s.end_s, s.users, s.offered_rate) for s in step] == [
        (0, 5, 2, 20),
        (5, 10, 5, 50),
        (10, 15, 8, 80),
    ]


def test_spike_profile_is_before_spike_and_after_phases():
    spike = plan.stages(SCHEDULES.spike)
    assert [(s.name, s.end_s, s.users, s.offered_rate) for s in spike] == [
        ("before", 2, 1, 5),
        ("spike", 5, 4, 20),
        ("after", 9, 1, 5),
    ]


def test_steady_profile_is_one_stage_at_its_rate():
    (steady,) = plan.stages(SCHEDULES.steady)
    assert steady.end_s == 7
    assert steady.users == 4
    assert steady.offered_rate == 100


def locustfile_scenarios() -> set[str]:
    """The names of the locustfile's `SCENARIOS` table, read from its source: importing locust patches this process."""
    tree = ast.parse(Path(find_spec("edgedistill.loadtests.locustfile").origin).read_text())
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "SCENARIOS" for t in node.targets)
    )
    return {key.value for key in table.keys}


def test_every_scenario_a_recipe_can_name_has_a_task_in_the_locustfile():
    assert locustfile_scenarios() == set(get_args(Scenario))


SMOKE_RECIPE = str(ROOT / "recipes" / "smoke.yaml")


@pytest.mark.parametrize(
    "override",
    [
        "--loadtest.smoke.scenarios={batch: 1}",
        "--loadtest.smoke={scenarios: {batch: 1}}",
        "--loadtest.smoke.scenarios.batch=3",
    ],
    ids=["key", "section", "one-weight"],
)
def test_scenarios_with_an_override_of_the_profiles_scenarios_are_refused_naming_both(capsys, override):
    assert loadtests_main.main([SMOKE_RECIPE, "--scenarios", "single=1", override]) == 2
    assert f"{override.partition('=')[0]} would do nothing: --scenarios" in capsys.readouterr().err


def test_scenarios_from_the_variable_with_an_override_of_them_are_refused_naming_the_variable(capsys, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "single=1")
    loadtests_main.main([SMOKE_RECIPE, "--loadtest.smoke.scenarios={batch: 1}"])
    assert "would do nothing: $EDGEDISTILL_LOADTEST_SCENARIOS='single=1' gives" in capsys.readouterr().err


def test_scenarios_given_as_the_option_are_not_said_to_come_from_the_variable(capsys, monkeypatch):
    monkeypatch.delenv("EDGEDISTILL_LOADTEST_SCENARIOS", raising=False)
    loadtests_main.main([SMOKE_RECIPE, "--scenarios", "single=1", "--loadtest.smoke.scenarios={batch: 1}"])
    assert "$EDGEDISTILL_LOADTEST_SCENARIOS" not in capsys.readouterr().err


def test_the_option_wins_over_the_variable_where_both_give_scenarios(capsys, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "batch=1")
    loadtests_main.main([SMOKE_RECIPE, "--scenarios", "single=1", "--loadtest.smoke.scenarios={batch: 1}"])
    assert "would do nothing: --scenarios 'single=1' gives" in capsys.readouterr().err


def test_an_override_of_a_section_the_load_test_does_not_read_is_refused_naming_it(capsys):
    loadtests_main.main([SMOKE_RECIPE, "--bench.serving.threads=4"])
    refused = capsys.readouterr().err
    assert "--bench.serving.threads: python -m loadtests --profile smoke reads no bench.serving" in refused


def test_an_override_of_another_profiles_settings_is_refused_before_the_bundle_is_looked_for(monkeypatch):
    looked_for = []
    monkeypatch.setattr(bench_serving, "bundle_to_serve", lambda *args: looked_for.append(args))
    loadtests_main.main([SMOKE_RECIPE, "--profile", "smoke", "--loadtest.steady.rate=5"])
    assert looked_for == []


def test_an_override_of_another_profiles_settings_is_refused_naming_the_load_test_that_reads_it(capsys):
    loadtests_main.main([SMOKE_RECIPE, "--profile", "smoke", "--loadtest.steady.rate=5"])
    assert "give it to edgedistill loadtest --profile steady" in capsys.readouterr().err


def test_the_load_test_help_names_the_option_its_own_profiles_settings_follow(capsys):
    with pytest.raises(SystemExit):
        loadtests_main.main(["--help"])
    assert "--profile PROFILE" in capsys.readouterr().out


def plan_in(folder: Path, monkeypatch, working: Path | None = None) -> plan.Plan:
    """The plan `current()` reads from a plan.json in `folder`, the working folder `working` (default: the one
    above)."""
    folder.mkdir(exist_ok=True)
    written = plan.Plan(
        profile="smoke",
        loadtest=LoadtestConfig(),
        scenarios={"single": 1},
        model="tiny",
        texts="texts.txt",
        samples="requests.npz",
    )
    (folder / "plan.json").write_text(written.model_dump_json())
    monkeypatch.setenv(plan.PLAN_VAR, str(folder / "plan.json"))
    monkeypatch.chdir(working or folder.parent)
    plan.current.cache_clear()
    try:
        return plan.current()
    finally:
        plan.current.cache_clear()  # not kept for a later test


def test_a_running_load_tests_samples_go_to_its_folder(tmp_path, monkeypatch):
    assert plan_in(tmp_path / "run", monkeypatch).samples == tmp_path / "run" / "requests.npz"


def test_locust_run_on_a_finished_runs_plan_writes_its_samples_to_the_working_folder(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")  # published: its samples are hashed
    assert plan_in(tmp_path / "run", monkeypatch).samples == tmp_path / "requests.npz"


def test_locust_run_in_a_finished_runs_folder_on_its_plan_is_refused_naming_the_samples_it_would_replace(
    tmp_path, monkeypatch
):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    with pytest.raises(RuntimeError, match=r"on the plan of its finished run would replace the run's requests\.npz"):
        plan_in(tmp_path / "run", monkeypatch, working=tmp_path / "run")


def test_locust_run_in_a_finished_runs_folder_named_by_a_link_on_its_plan_is_refused(tmp_path, monkeypatch):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "manifest.json").write_text("{}")
    (tmp_path / "link").symlink_to(tmp_path / "run")
    with pytest.raises(RuntimeError, match="would replace the run's requests.npz"):
        plan_in(tmp_path / "link", monkeypatch, working=tmp_path / "run")
