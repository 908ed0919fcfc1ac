"""The Makefile's targets as `make -n` prints them: which folders they take from the recipe."""

import subprocess

import pytest
import torch

from tests.conftest import ROOT


def make_dry_run(tmp_path, *args: str) -> str:
    """What `make -n ARGS` would run, for a smoke recipe whose `name:` differs from its file's."""
    recipe = tmp_path / "mine.yaml"
    recipe.write_text(f"extends: {ROOT / 'recipes' / 'smoke.yaml'}\nname: renamed\n")
    command = ["make", "-n", "--no-print-directory", *args, f"RECIPE={recipe}", "RUNS_DIR=runs", "CONFIRM=1"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_make_serve_serves_the_bundle_of_the_recipes_name(tmp_path):
    assert "--bundle runs/renamed/bundle-bilstm-int8" in make_dry_run(tmp_path, "serve")


def test_make_clean_removes_the_run_folder_of_the_recipes_name(tmp_path):
    assert 'rm -rf -- "runs/renamed"' in make_dry_run(tmp_path, "clean")


def test_make_distill_passes_jobs_given_under_torchrun_on_to_be_refused(tmp_path):
    assert f"edgedistill distill {tmp_path / 'mine.yaml'} --jobs 3\n" in make_dry_run(
        tmp_path, "distill", "NPROC=2", "JOBS=3"
    )


def test_make_distill_under_torchrun_passes_no_jobs_by_default(tmp_path):
    assert "--jobs" not in make_dry_run(tmp_path, "distill", "NPROC=2")


def test_make_soak_with_another_profile_stops_make():
    command = ["make", "-n", "--no-print-directory", "soak", "PROFILE=steady", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "PROFILE=steady: make soak runs the soak profile" in result.stderr


def test_make_soak_runs_the_soak_profile(tmp_path):
    assert "loadtest PROFILE=soak" in make_dry_run(tmp_path, "soak")


def test_make_all_measures_the_cascade_given(tmp_path):
    assert f"bench cascade {tmp_path / 'mine.yaml'} --name fast\n" in make_dry_run(tmp_path, "all", "CASCADE=fast")


def make_refusal(*args: str) -> subprocess.CompletedProcess:
    """`make -n teacher ARGS`, which fails where make refuses a variable."""
    command = ["make", "-n", "--no-print-directory", "teacher", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_a_misspelt_variable_stops_make():
    assert make_refusal("RECPIE=recipes/smoke.yaml").returncode == 2


def test_a_misspelt_variable_names_the_one_meant():
    assert "unknown variable RECPIE: did you mean RECIPE?" in make_refusal("RECPIE=recipes/smoke.yaml").stderr


def test_a_bake_value_other_than_1_stops_make():
    assert make_refusal("BAKE=yes").returncode == 2


def test_a_bake_value_other_than_1_says_what_bake_takes():
    assert "BAKE=yes: BAKE=1 bakes BUNDLE into the image" in make_refusal("BAKE=yes").stderr


def test_a_variable_for_the_commands_environment_passes(tmp_path):
    assert "edgedistill call" in make_dry_run(tmp_path, "call", "TEXT=it's a  film", "OMP_NUM_THREADS=2")


def test_a_variable_that_extends_one_of_makes_passes(tmp_path):
    assert "edgedistill call" in make_dry_run(tmp_path, "call", "PYTHONPATH=/opt/lib")


def test_make_help_lists_the_variables_and_where_each_is_described():
    result = subprocess.run(
        ["make", "--no-print-directory", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert "variables (make TARGET NAME=value), each in docs/settings.md#make-variables:\n  RECIPE " in result.stdout


def test_make_clean_without_an_answer_says_how_to_skip_the_question(tmp_path):
    command = ["make", "--no-print-directory", "clean", "RECIPE=recipes/smoke.yaml", f"RUNS_DIR={tmp_path}"]
    result = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert "not removed (CONFIRM=1 removes it without asking)" in result.stderr


def test_make_gpu_check_runs_the_gpu_tests(tmp_path):
    assert "-m gpu tests/distill/test_gpu.py tests/distill/test_device.py" in make_dry_run(tmp_path, "gpu-check")


def test_make_gpu_check_trains_the_recipe_on_cuda_under_its_own_run_name(tmp_path):
    assert "--name=gpu-check --runtime.device=cuda --force" in make_dry_run(tmp_path, "gpu-check")


def test_make_gpu_check_without_cuda_says_what_it_needs():
    if torch.cuda.is_available():
        pytest.skip("checks the message of a machine without CUDA")
    # -o: the installed environment counts as current, so make never installs anything here
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "gpu-check"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "gpu-check needs an NVIDIA GPU and a CUDA build of torch" in result.stderr
