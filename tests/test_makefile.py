"""The Makefile's targets as `make -n` prints them: which folders they take from the recipe."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from edgedistill.common import manifest as mf
from edgedistill.common.machine import usable_cores
from edgedistill.common.settings import MEASURED_SETTINGS
from edgedistill.serve.call import build_parser, parse_arguments
from edgedistill.serve.settings import env_name

from tests.conftest import ROOT
from tests.serve.conftest import write_bundle, write_cascade


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


def triton_repo_words(tmp_path, *args: str) -> list[str]:
    """The words the shell passes to `edgedistill triton-repo` in `make triton-repo ARGS`."""
    (line,) = [line for line in make_dry_run(tmp_path, "triton-repo", *args).splitlines() if "triton-repo" in line]
    command = line.replace(".venv/bin/edgedistill triton-repo", "printf '%s\\n'", 1)
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True).stdout.splitlines()


def test_make_triton_repo_writes_the_deployed_bundles_repository_in_the_run_folder(tmp_path):
    assert triton_repo_words(tmp_path) == ["runs/renamed/bundle-bilstm-int8", "runs/renamed/triton"]


def test_make_triton_repo_of_a_bundle_given_runs_no_stage_before_it(tmp_path):
    planned = make_dry_run(tmp_path, "triton-repo", "BUNDLE=/srv/bundle-tiny").splitlines()
    assert [line.split()[1] for line in planned if line.startswith(".venv/bin/edgedistill ")] == ["triton-repo"]


@pytest.mark.parametrize("bundle", ["/srv/bundle-tiny", "/srv/bundle-tiny/"])
def test_make_triton_repo_of_a_bundle_given_writes_the_repository_beside_it(tmp_path, bundle):
    assert triton_repo_words(tmp_path, f"BUNDLE={bundle}") == [bundle, "/srv/triton"]


def test_make_triton_repo_of_a_bundle_given_quoted_with_a_space_writes_the_repository_beside_it(tmp_path):
    words = triton_repo_words(tmp_path, "BUNDLE='/srv/my runs/bundle-tiny'")
    assert words == ["/srv/my runs/bundle-tiny", "/srv/my runs/triton"]


def test_make_clean_removes_the_run_folder_of_the_recipes_name(tmp_path):
    assert 'rm -rf -- "runs/renamed"' in make_dry_run(tmp_path, "clean")


@pytest.mark.parametrize("nproc", ["0", "two", "-1"])
def test_nproc_that_is_no_count_of_processes_stops_make(nproc):
    assert make_refusal(f"NPROC={nproc}").returncode == 2


def test_nproc_that_is_no_count_of_processes_says_what_to_give():
    assert "NPROC=0: give the processes per stage under torchrun" in make_refusal("NPROC=0").stderr


@pytest.mark.parametrize("jobs", ["0", "two", "-1"])
def test_jobs_that_is_no_count_of_students_stops_make_before_any_stage(jobs):
    assert make_refusal(f"JOBS={jobs}").returncode == 2


def test_jobs_that_is_no_count_of_students_says_what_to_give():
    assert "JOBS=0: give the students trained at once, a whole number from 1" in make_refusal("JOBS=0").stderr


def test_jobs_above_one_under_torchrun_stops_make():
    assert make_refusal("NPROC=2", "JOBS=3").returncode == 2


def test_jobs_above_one_under_torchrun_says_what_to_drop():
    assert "drop JOBS, or NPROC=1 for JOBS students at once" in make_refusal("NPROC=2", "JOBS=3").stderr


def test_jobs_above_one_from_the_environment_under_torchrun_stops_make():
    assert make_with_environ("teacher", "NPROC=2", JOBS="4").returncode == 2


def test_make_distill_under_torchrun_takes_jobs_of_one(tmp_path):
    assert f"edgedistill distill {tmp_path / 'mine.yaml'} \n" in make_dry_run(tmp_path, "distill", "NPROC=2", "JOBS=1")


def test_make_distill_under_torchrun_passes_no_jobs_by_default(tmp_path):
    assert "--jobs" not in make_dry_run(tmp_path, "distill", "NPROC=2")


def _launch_line(tmp_path, nproc: int) -> str:
    """The line `make -n teacher NPROC=nproc` runs the stage with."""
    return next(line for line in make_dry_run(tmp_path, "teacher", f"NPROC={nproc}").splitlines() if "torchrun" in line)


def _rank_threads(tmp_path, nproc: int, environ: dict) -> str:
    """OMP_NUM_THREADS as `make teacher NPROC=nproc`'s launch line sets it for torchrun, in `environ`."""
    prefix = _launch_line(tmp_path, nproc).partition(".venv/bin/torchrun")[0]
    shown = subprocess.run(["sh", "-c", f"{prefix} env"], env=environ, capture_output=True, text=True, check=True)
    return next(line for line in shown.stdout.splitlines() if line.startswith("OMP_NUM_THREADS="))


@pytest.mark.parametrize("nproc", [2, 64])
def test_torchrun_ranks_take_their_share_of_the_cores(tmp_path, nproc):
    share = max(1, usable_cores() // nproc)
    environ = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}
    assert _rank_threads(tmp_path, nproc, environ) == f"OMP_NUM_THREADS={share}"


def test_make_test_counts_the_cores_within_the_cgroup_cpu_quota(tmp_path):
    quota_of_one = "from edgedistill.common import machine\nmachine.cpu_quota = lambda *args: 1\n"
    (tmp_path / "sitecustomize.py").write_text(quota_of_one)  # what the project's Python sees in a 1-CPU container
    result = make_with_environ("test", PYTHONPATH=str(tmp_path))
    assert "pytest -q -n 2 --dist" in result.stdout, result.stderr


def test_torchrun_ranks_keep_an_omp_num_threads_given(tmp_path):
    assert _rank_threads(tmp_path, 2, {**os.environ, "OMP_NUM_THREADS": "3"}) == "OMP_NUM_THREADS=3"


SST2_QUOTED = "the `` best '' film, at $5"  # SST-2 quotes with `` and ''; a $ as written


def make_call_arguments(tmp_path, *args: str):
    """The arguments `edgedistill call` reads from the words the shell passes it in `make call ARGS`."""
    sent = shlex.split(make_dry_run(tmp_path, "call", *args))
    return parse_arguments(build_parser(), sent[sent.index("--address") :])


def test_make_call_sends_text_as_written(tmp_path):
    assert make_call_arguments(tmp_path, f"TEXT={SST2_QUOTED}").texts == [SST2_QUOTED]


def test_make_call_sends_a_pair_as_written(tmp_path):
    assert make_call_arguments(tmp_path, "TEXT=a", f"PAIR={SST2_QUOTED}").pair == [SST2_QUOTED]


def test_make_call_sends_a_text_starting_with_a_dash_as_a_text(tmp_path):
    assert make_call_arguments(tmp_path, "TEXT=-awful").texts == ["-awful"]


def test_make_call_sends_a_pair_starting_with_a_dash_as_a_pair(tmp_path):
    assert make_call_arguments(tmp_path, "TEXT=good", "PAIR=-x").pair == ["-x"]


def test_make_soak_with_another_profile_stops_make():
    command = ["make", "-n", "--no-print-directory", "soak", "PROFILE=steady", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "PROFILE=steady: make soak runs the soak profile" in result.stderr


def test_make_all_with_an_echo_load_test_stops_make():
    args = "LOADTEST_ARGS=--echo --scenarios single=1,batch=1"
    command = ["make", "-n", "--no-print-directory", "all", args, "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "--echo would load-test the echo server in place of the deployed bundle in make all" in result.stderr


@pytest.mark.parametrize(
    "goal, given",
    [("all", "--profile=steady"), ("loadtest", "--profile steady"), ("soak", "--bundle x"), ("loadtest", "--bundle=x")],
)
def test_a_profile_or_bundle_in_loadtest_args_stops_make_pointing_to_its_variable(goal, given):
    command = ["make", "-n", "--no-print-directory", goal, f"LOADTEST_ARGS={given}", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert f"{given.split()[0]} would replace make's own; give PROFILE=NAME" in result.stderr


def test_make_loadtest_takes_an_echo_load_test(tmp_path):
    assert "--echo" in make_dry_run(tmp_path, "loadtest", "LOADTEST_ARGS=--echo")


@pytest.mark.parametrize("setting", ["PROFILE=steady", "LOADTEST_ARGS=--echo"])
def test_make_with_no_goal_prints_its_help_whatever_the_load_test_settings(setting):
    result = subprocess.run(
        ["make", "--no-print-directory", setting], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert "variables (make TARGET NAME=value)" in result.stdout, result.stderr


def test_make_all_with_another_profile_stops_make():
    command = ["make", "-n", "--no-print-directory", "all", "PROFILE=steady", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "PROFILE=steady: make all runs the smoke load test" in result.stderr


def test_make_soak_runs_the_soak_profile(tmp_path):
    assert "loadtest PROFILE=soak" in make_dry_run(tmp_path, "soak")


def test_make_all_measures_the_cascade_given(tmp_path):
    assert f"bench cascade {tmp_path / 'mine.yaml'} --cascade fast\n" in make_dry_run(tmp_path, "all", "CASCADE=fast")


def make_refusal(*args: str) -> subprocess.CompletedProcess:
    """`make -n teacher ARGS`, which fails where make refuses a variable."""
    command = ["make", "-n", "--no-print-directory", "teacher", *args]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


def make_with_environ(*goals: str, **environ: str) -> subprocess.CompletedProcess:
    """`make -n GOALS` on the smoke recipe with `environ` exported."""
    command = ["make", "-n", "--no-print-directory", *goals, "RECIPE=recipes/smoke.yaml"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120, env=os.environ | environ)


def test_a_variable_the_benchmarks_refuse_stops_make_all_before_it_trains():
    assert make_with_environ("all", EDGEDISTILL_THREADS="4").returncode == 2


def test_a_variable_the_benchmarks_refuse_is_named_by_make():
    stderr = make_with_environ("serve-bench", EDGEDISTILL_WORKERS="2").stderr
    assert "EDGEDISTILL_WORKERS would do nothing: a measurement sets its servers'" in stderr


def make_without_export(tmp_path, goal: str) -> subprocess.CompletedProcess:
    """`make -n GOAL` on the smoke recipe with no `export` section."""
    recipe = tmp_path / "without-export.yaml"
    recipe.write_text(f"extends: {ROOT / 'recipes' / 'smoke.yaml'}\nexport: null\n")
    command = ["make", "-n", "--no-print-directory", goal, f"RECIPE={recipe}"]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("goal", ["all", "bundles", "serve-bench"])
def test_a_recipe_without_export_stops_make_before_any_stage(tmp_path, goal):
    assert make_without_export(tmp_path, goal).stdout == ""


def test_a_recipe_without_export_is_refused_by_make_as_by_edgedistill_all(tmp_path):
    refusal = make_without_export(tmp_path, "all").stderr
    assert "edgedistill all needs the sections transfer, distill and export" in refusal


def test_tls_for_the_measured_servers_stops_make_serve_bench_naming_it():
    stderr = make_with_environ("serve-bench", EDGEDISTILL_TLS_CERT="/etc/ssl/server.pem").stderr
    assert "EDGEDISTILL_TLS_CERT: a measurement calls its servers over plaintext loopback" in stderr


def test_tls_passes_for_make_serve():
    assert make_with_environ("serve", EDGEDISTILL_TLS_CERT="/etc/ssl/server.pem").returncode == 0


def test_a_variable_the_benchmarks_refuse_passes_for_make_serve():
    assert make_with_environ("serve", EDGEDISTILL_THREADS="4").returncode == 0


def test_make_serve_serves_the_bundle_of_edgedistill_bundle():
    assert "--bundle /srv/bundle-b " in make_with_environ("serve", EDGEDISTILL_BUNDLE="/srv/bundle-b").stdout


def test_make_serve_serves_on_edgedistill_port():
    assert "--port 50099\n" in make_with_environ("serve", EDGEDISTILL_PORT="50099").stdout


def test_make_call_calls_edgedistill_port():
    assert "--address localhost:50099 " in make_with_environ("call", EDGEDISTILL_PORT="50099").stdout


SERVICE_LINK = "tcp://10.0.0.5:50051"  # EDGEDISTILL_PORT as Kubernetes sets it in a pod for a Service `edgedistill`


def test_a_service_link_on_edgedistill_port_passes_for_make_all():
    assert make_with_environ("all", EDGEDISTILL_PORT=SERVICE_LINK).returncode == 0


def test_make_serve_serves_on_the_default_port_beside_a_service_link():
    assert "--port 50051\n" in make_with_environ("serve", EDGEDISTILL_PORT=SERVICE_LINK).stdout


def test_make_call_calls_the_default_port_beside_a_service_link():
    assert "--address localhost:50051 " in make_with_environ("call", EDGEDISTILL_PORT=SERVICE_LINK).stdout


def test_bundle_given_to_make_serve_wins_over_edgedistill_bundle():
    served = make_with_environ("serve", "BUNDLE=/srv/bundle-a", EDGEDISTILL_BUNDLE="/srv/bundle-b").stdout
    assert "--bundle /srv/bundle-a " in served


def test_a_variable_the_benchmarks_refuse_passes_for_make_without_a_goal():
    assert make_with_environ(EDGEDISTILL_THREADS="4").returncode == 0  # the default goal, help, measures nothing


def test_a_variable_the_benchmarks_refuse_given_on_the_command_line_stops_make_all():
    # make exports a variable given on its command line to the commands, as it does one from the environment
    command = ["make", "-n", "--no-print-directory", "all", "RECIPE=recipes/smoke.yaml", "EDGEDISTILL_THREADS=4"]
    assert subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120).returncode == 2


def make_all_with(tmp_path, loadtest_status: int) -> tuple[int, list[str]]:
    """`make all` run with an `edgedistill` that notes each command and exits `loadtest_status` from the load test
    (0 from the others): make's status, and the commands run."""
    noted, fake = tmp_path / "ran", tmp_path / "edgedistill"
    shell_script(fake, f'echo "$1" >> {noted}\n[ "$1" = loadtest ] && exit {loadtest_status}\nexit 0')
    command = ["make", "--no-print-directory", "all", f"ED={fake}", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    return result.returncode, noted.read_text().split()


def test_make_all_whose_load_test_missed_its_slo_still_writes_the_report_and_headline(tmp_path):
    assert make_all_with(tmp_path, 1)[1][-3:] == ["loadtest", "report", "headline"]


def test_make_all_whose_load_test_missed_its_slo_fails(tmp_path):
    assert make_all_with(tmp_path, 1)[0] != 0


def test_make_all_whose_load_test_could_not_run_stops_there(tmp_path):
    assert make_all_with(tmp_path, 2)[1][-1] == "loadtest"


def test_make_refuses_the_variables_the_benchmarks_refuse():
    refused = [name for name in MEASURED_SETTINGS if make_with_environ("all", **{env_name(name): "1"}).returncode == 2]
    assert refused == list(MEASURED_SETTINGS)


def test_a_misspelt_variable_stops_make():
    assert make_refusal("RECPIE=recipes/smoke.yaml").returncode == 2


def test_a_misspelt_variable_names_the_one_meant():
    assert "unknown variable RECPIE: did you mean RECIPE?" in make_refusal("RECPIE=recipes/smoke.yaml").stderr


def test_a_variable_in_lower_case_stops_make():
    assert make_refusal("recipe=recipes/smoke.yaml").returncode == 2


def test_a_variable_in_lower_case_names_the_one_meant():
    assert "unknown variable recipe: did you mean RECIPE?" in make_refusal("recipe=recipes/smoke.yaml").stderr


def test_the_base_images_refresh_in_lower_case_names_the_one_meant():
    assert "unknown variable refresh: did you mean REFRESH?" in make_refusal("refresh=1").stderr


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


def path_without(tmp_path, command: str) -> str:
    """A PATH of one folder linking every command on this PATH but `command`."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for directory in reversed(os.environ["PATH"].split(os.pathsep)):
        for tool in Path(directory).glob("*") if Path(directory).is_dir() else []:
            if tool.name != command and os.access(tool, os.X_OK):
                (folder / tool.name).unlink(missing_ok=True)
                (folder / tool.name).symlink_to(tool)
    return str(folder)


def help_without_column(tmp_path) -> subprocess.CompletedProcess:
    """`make help` where column, of bsdextrautils (which a plain Debian may lack), is not installed."""
    env = os.environ | {"PATH": path_without(tmp_path, "column")}
    command = ["make", "--no-print-directory", "help"]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


def test_make_help_without_column_succeeds(tmp_path):
    assert help_without_column(tmp_path).returncode == 0


def test_make_help_without_column_aligns_the_targets(tmp_path):
    assert "\nsetup           make .venv and install the project" in help_without_column(tmp_path).stdout


def test_make_clean_without_an_answer_says_how_to_skip_the_question(tmp_path):
    command = ["make", "--no-print-directory", "clean", "RECIPE=recipes/smoke.yaml", f"RUNS_DIR={tmp_path}"]
    result = subprocess.run(command, cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert "not removed (CONFIRM=1 removes it without asking)" in result.stderr


def test_make_gpu_check_runs_the_gpu_tests(tmp_path):
    assert "-m gpu tests/distill/test_gpu.py tests/distill/test_device.py" in make_dry_run(tmp_path, "gpu-check")


def test_make_gpu_check_runs_the_gpu_tests_of_onnx_runtime_and_tensorrt_naming_their_skips(tmp_path):
    runs = "-rs -m gpu tests/export/test_tensorrt.py tests/common/test_runtime.py tests/serve/test_backend.py"
    assert runs in make_dry_run(tmp_path, "gpu-check")


def test_make_gpu_check_trains_the_recipe_on_cuda_under_its_own_run_name(tmp_path):
    assert "--name=gpu-check --runtime.device=cuda --force" in make_dry_run(tmp_path, "gpu-check")


def test_make_gpu_check_without_cuda_says_what_it_needs():
    if torch.cuda.is_available():
        pytest.skip("checks the message of a machine without CUDA")
    # -o: the installed environment counts as current, so make never installs anything here
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "gpu-check"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "gpu-check needs an NVIDIA GPU and a CUDA build of torch" in result.stderr


def test_make_gpu_check_on_a_cpu_build_of_torch_names_the_setup_that_installs_a_cuda_one():
    if torch.version.cuda is not None:
        pytest.skip("checks the message of a CPU-only build of torch")
    command = ["make", "--no-print-directory", "-o", ".venv/.installed", "gpu-check"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    # .venv exists here, and make setup refuses another TORCH_INDEX until it is removed
    assert "rm -rf .venv, then make setup TORCH_INDEX=https://download.pytorch.org/whl/cu130" in result.stderr


CPU_INDEX = "https://download.pytorch.org/whl/cpu"


@pytest.fixture
def checkout(tmp_path):
    """A folder whose .venv (this interpreter's) is current, its stamp recording torch from the CPU index and ONNX
    Runtime for the CPU."""
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    os.utime(tmp_path / "pyproject.toml", (0, 0))  # older than the stamp: setup is done
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").symlink_to(sys.executable)
    (tmp_path / ".venv" / ".installed").write_text(f"TORCH_INDEX={CPU_INDEX}\nORT=cpu\n")
    return tmp_path


def make_in(folder, *args: str) -> subprocess.CompletedProcess:
    """`make -n ARGS` with the Makefile, in `folder`."""
    command = ["make", "-n", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-C", str(folder), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def shell_script(path: Path, body: str) -> Path:
    """An executable `sh` script at `path` running `body`."""
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def other_python(tmp_path):
    """An interpreter that says it is another installation's Python."""
    return shell_script(tmp_path / "python", "echo /opt/other 3.99.0")


def test_make_on_a_current_venv_installs_nothing(checkout):
    assert "pip install" not in make_in(checkout, "lint").stdout


def test_a_python_other_than_the_venvs_stops_make(checkout, other_python):
    assert make_in(checkout, "lint", f"PYTHON={other_python}").returncode == 2


def test_a_python_other_than_the_venvs_names_the_venvs(checkout, other_python):
    refusal = make_in(checkout, "lint", f"PYTHON={other_python}").stderr
    assert f"PYTHON={other_python} would do nothing: .venv exists, made with Python 3." in refusal


def test_a_python_other_than_the_venvs_says_how_to_make_the_venv_with_it(checkout, other_python):
    refusal = make_in(checkout, "lint", f"PYTHON={other_python}").stderr
    assert f"rm -rf .venv, then make setup PYTHON={other_python}, or leave PYTHON out" in refusal


def test_the_venvs_python_by_another_name_passes(checkout):
    assert make_in(checkout, "lint", f"PYTHON={os.path.realpath(sys.executable)}").returncode == 0


def test_a_python_for_the_peers_environments_passes(checkout, other_python):
    assert make_in(checkout, "peers-setup", f"PYTHON={other_python}").returncode == 0


def test_a_python_for_the_wheel_tests_environment_passes(checkout, other_python):
    assert make_in(checkout, "wheel-test", "BUNDLE=runs/b", f"PYTHON={other_python}").returncode == 0


def test_a_torch_index_other_than_the_venvs_stops_make(checkout):
    assert make_in(checkout, "lint", "TORCH_INDEX=https://download.pytorch.org/whl/cu130").returncode == 2


def test_a_torch_index_other_than_the_venvs_names_where_its_torch_came_from(checkout):
    refusal = make_in(checkout, "lint", "TORCH_INDEX=https://download.pytorch.org/whl/cu130").stderr
    assert (
        f"TORCH_INDEX=https://download.pytorch.org/whl/cu130 would do nothing: .venv's torch came from {CPU_INDEX}"
        in (refusal)
    )


def test_an_empty_torch_index_on_a_venv_with_torch_from_an_index_stops_make(checkout):
    assert make_in(checkout, "lint", "TORCH_INDEX=").returncode == 2


def test_the_venvs_torch_index_passes(checkout):
    assert make_in(checkout, "lint", f"TORCH_INDEX={CPU_INDEX}").returncode == 0


def test_the_venvs_torch_index_with_a_trailing_slash_passes(checkout):
    assert make_in(checkout, "lint", f"TORCH_INDEX={CPU_INDEX}/").returncode == 0


def test_a_venv_whose_stamp_records_no_torch_index_takes_any(checkout):
    (checkout / ".venv" / ".installed").write_text("")  # as setup left it before it recorded the index
    assert make_in(checkout, "lint", "TORCH_INDEX=https://download.pytorch.org/whl/cu130").returncode == 0


def test_setup_records_the_torch_index_in_its_stamp(checkout):
    (checkout / ".venv" / ".installed").unlink()
    assert "printf 'TORCH_INDEX=%s\\nORT=%s\\n' 'https://example.org/whl' 'cpu' > .venv/.installed" in (
        make_in(checkout, "setup", "TORCH_INDEX=https://example.org/whl").stdout
    )


def test_a_torch_index_refusal_on_a_cpu_venv_names_no_onnx_runtime_to_keep(checkout):
    refusal = make_in(checkout, "lint", "TORCH_INDEX=https://download.pytorch.org/whl/cu130").stderr
    assert "(the ONNX Runtime it has)" not in refusal


@pytest.fixture
def no_ensurepip(tmp_path):
    """An interpreter without ensurepip, as Debian's python3 is without python3-venv."""
    return shell_script(tmp_path / "python-without-venv", "exit 1")


def setup_of_a_venv_without_pip(checkout, python) -> subprocess.CompletedProcess:
    """`make setup PYTHON=python` in `checkout`, whose .venv has no pip (a venv made half-way, without python3-venv)."""
    (checkout / ".venv" / "bin" / "python").unlink()
    shell_script(checkout / ".venv" / "bin" / "python", "exit 1")
    (checkout / ".venv" / ".installed").unlink()
    command = ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-C", str(checkout), "setup"]
    return subprocess.run([*command, f"PYTHON={python}"], capture_output=True, text=True, timeout=120)


def test_setup_removes_a_venv_without_pip_rather_than_installing_into_it(checkout, no_ensurepip):
    setup_of_a_venv_without_pip(checkout, no_ensurepip)
    assert not (checkout / ".venv").exists()


def test_setup_without_python3_venv_names_it(checkout, no_ensurepip):
    assert "without python3-venv" in setup_of_a_venv_without_pip(checkout, no_ensurepip).stderr


def test_make_peers_setup_without_python3_venv_installs_it_first(checkout, no_ensurepip):
    # no apt-get on PATH: setup-system names the install command rather than run it
    (checkout / ".venv" / "bin" / "python").unlink()
    command = ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-C", str(checkout), "peers-setup"]
    env = os.environ | {"PATH": path_without(checkout, "apt-get")}
    result = subprocess.run([*command, f"PYTHON={no_ensurepip}"], env=env, capture_output=True, text=True, timeout=120)
    assert re.search(r"apt-get install -y --no-install-recommends[\w -]* python3-venv", result.stderr)


def setup_with_stub_pip(checkout, failing: str = "''") -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make setup` in `checkout`, whose Python (a stub) succeeds at every command (pip finds any package installed)
    but those matching the shell pattern `failing` (by default none); its result and the pip commands it was given."""
    calls = checkout / "calls"
    python = checkout / ".venv" / "bin" / "python"
    python.unlink()
    shell_script(python, f'echo "$*" >> {calls}\ncase "$*" in {failing}) exit 1;; esac')
    command = ["make", "--no-print-directory", "-f", str(ROOT / "Makefile"), "-C", str(checkout), "setup"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return result, calls.read_text().splitlines()


@pytest.fixture
def offline_setup(checkout) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make setup` where pip installs anything but from an --index-url, as it does on an offline machine whose
    configured index is a local mirror."""
    (checkout / ".venv" / ".installed").unlink()
    return setup_with_stub_pip(checkout, failing="*--index-url*")


def test_setup_where_the_torch_index_fails_succeeds(offline_setup):
    assert offline_setup[0].returncode == 0


def test_setup_where_the_torch_index_fails_installs_torch_from_pips_configured_indexes(offline_setup):
    torch = next(line for line in (ROOT / "pyproject.toml").read_text().split('"') if line.startswith("torch=="))
    assert f"-m pip install --quiet {torch}" in offline_setup[1]


def test_setup_where_the_torch_index_fails_says_it_tries_pips_configured_indexes(offline_setup):
    assert "trying pip's configured indexes (TORCH_INDEX= goes there at once)" in offline_setup[0].stderr


CUDA_INDEX = "https://download.pytorch.org/whl/cu130"


def edited_after_setup(checkout, index: str, ort: str = "cpu"):
    """`checkout` with torch from `index` and ONNX Runtime for `ort` recorded in its stamp, and pyproject.toml edited
    since setup."""
    stamp = checkout / ".venv" / ".installed"
    stamp.write_text(f"TORCH_INDEX={index}\nORT={ort}\n")
    os.utime(stamp, (0, 0))
    os.utime(checkout / "pyproject.toml")
    return checkout


def test_setup_after_an_edit_of_pyproject_installs_torch_from_the_index_the_venv_records(checkout):
    setup = make_in(edited_after_setup(checkout, CUDA_INDEX), "setup").stdout
    assert f"--index-url {CUDA_INDEX}" in setup


def test_setup_after_an_edit_of_pyproject_on_torch_from_pips_indexes_installs_no_torch_from_an_index(checkout):
    setup = make_in(edited_after_setup(checkout, ""), "setup").stdout
    assert "--index-url" not in setup


def finished_bundle(folder):
    """`folder`, made a bundle folder with a manifest."""
    folder.mkdir(parents=True)
    (folder / "manifest.json").write_text("{}")
    return folder


def test_make_image_baking_a_bundle_sets_up_the_environment_that_reads_it_first(tmp_path):
    (tmp_path / "pyproject.toml").write_text((ROOT / "pyproject.toml").read_text())
    bundle = finished_bundle(tmp_path / "runs" / "r" / "bundle-b")
    assert "-m venv .venv" in make_in(tmp_path, "image", "BAKE=1", f"BUNDLE={bundle}").stdout


def test_make_image_bakes_a_bundle_of_the_build_context_named_by_its_absolute_path(checkout):
    bundle = finished_bundle(checkout / "runs" / "r" / "bundle-b")
    assert "--build-arg BUNDLE=runs/r/bundle-b " in make_in(checkout, "image", "BAKE=1", f"BUNDLE={bundle}").stdout


@pytest.fixture
def installed(checkout):
    """`checkout` whose .venv holds this project, as `make setup` leaves it: this interpreter's environment."""
    venv = Path(sys.prefix)
    (checkout / ".venv" / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (checkout / ".venv" / "lib").symlink_to(venv / "lib")
    return checkout


def baked_tag(checkout, bundle) -> str:
    """The tag `make image BAKE=1` gives `bundle`."""
    return re.search(r" -t (\S+) ", make_in(checkout, "image", "BAKE=1", f"BUNDLE={bundle}").stdout)[1]


def test_make_image_tags_a_bundle_given_with_a_trailing_slash_with_its_folders_name_and_content_version(installed):
    bundle = write_bundle(installed / "runs" / "r" / "bundle-b", version="0123abcd")
    assert baked_tag(installed, f"{bundle}/") == "edgedistill-serve:bundle-b-0123abcd"


def test_make_image_tags_bundles_of_one_folder_name_and_other_contents_apart(installed):
    first = write_bundle(installed / "runs" / "r" / "bundle-b", version="0123abcd")
    retrained = write_bundle(installed / "runs" / "q" / "bundle-b", version="4567ef01")
    assert baked_tag(installed, first) != baked_tag(installed, retrained)


def test_make_image_tags_a_cascade_with_its_content_version(installed):
    member = write_bundle(installed / "members" / "bundle-m")
    cascade = write_cascade(installed / "runs" / "r" / "bundle-c", {"small": member, "large": member}, [0.9])
    version = mf.load(cascade).info["cascade"]["version"]
    assert baked_tag(installed, cascade) == f"edgedistill-serve:bundle-c-{version}"


def test_make_image_refuses_to_bake_a_bundle_that_does_not_load(installed):
    bundle = finished_bundle(installed / "runs" / "r" / "bundle-b")
    assert (
        "no content version to tag its image with" in make_in(installed, "image", "BAKE=1", f"BUNDLE={bundle}").stdout
    )


def test_make_image_refuses_to_bake_a_bundle_outside_the_build_context(checkout, tmp_path_factory):
    bundle = finished_bundle(tmp_path_factory.mktemp("elsewhere") / "bundle-b")
    assert "is outside the build context" in make_in(checkout, "image", "BAKE=1", f"BUNDLE={bundle}").stdout


DOCKER_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


@pytest.fixture
def image_where_docker_does_not_answer(tmp_path) -> subprocess.CompletedProcess:
    """`make image` by user 1000 (id's stub) on a PATH of bash, grep, sed and a docker whose daemon is stopped: no
    podman."""
    folder = tmp_path / "bin"
    folder.mkdir()
    shell_script(folder / "docker", f'echo Client:\necho "{DOCKER_DOWN}" >&2\nexit 1')
    shell_script(folder / "id", "echo 1000")
    for tool in ("bash", "grep", "sed"):
        (folder / tool).symlink_to(shutil.which(tool))
    command = [shutil.which("make"), "--no-print-directory", "image"]
    env = os.environ | {"PATH": str(folder)}
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_make_image_where_docker_does_not_answer_says_why_before_it_takes_podman(image_where_docker_does_not_answer):
    assert f"docker did not answer, so podman builds the image instead: {DOCKER_DOWN}\n" in (
        image_where_docker_does_not_answer.stderr
    )


def test_make_image_where_docker_does_not_answer_and_podman_is_missing_says_podman_is_not_installed(
    image_where_docker_does_not_answer,
):
    assert "base-image: podman is not installed" in image_where_docker_does_not_answer.stderr


def test_runs_dir_given_in_the_environment_is_not_warned_of_as_an_old_name():
    env = {name: value for name, value in os.environ.items() if name != "EDGEDISTILL_RUNS_DIR"} | {"RUNS_DIR": "runs"}
    command = ["make", "-n", "--no-print-directory", "serve", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "FutureWarning" not in result.stderr


def test_runs_dir_in_the_environment_gives_way_to_its_new_name_set_beside_it():
    env = os.environ | {"RUNS_DIR": "old", "EDGEDISTILL_RUNS_DIR": "new"}
    command = ["make", "-n", "--no-print-directory", "serve", "RECIPE=recipes/smoke.yaml"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "--bundle new/smoke/" in result.stdout


def test_runs_dir_on_the_command_line_wins_over_both_names_in_the_environment():
    env = os.environ | {"RUNS_DIR": "old", "EDGEDISTILL_RUNS_DIR": "new"}
    command = ["make", "-n", "--no-print-directory", "serve", "RECIPE=recipes/smoke.yaml", "RUNS_DIR=given"]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert "--bundle given/smoke/" in result.stdout


def make_at_home(home: Path, *args: str, **environ: str) -> subprocess.CompletedProcess:
    """`make ARGS` on the smoke recipe with HOME at `home` and `environ` exported."""
    command = ["make", "--no-print-directory", *args, "RECIPE=recipes/smoke.yaml"]
    env = os.environ | {"HOME": str(home)} | environ
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_make_clean_removes_the_run_folder_under_a_runs_dir_given_from_the_home_folder(tmp_path):
    (tmp_path / "runs" / "smoke").mkdir(parents=True)
    make_at_home(tmp_path, "clean", "CONFIRM=1", EDGEDISTILL_RUNS_DIR="~/runs")
    assert not (tmp_path / "runs" / "smoke").exists()


def test_make_gpu_check_times_its_stages_under_a_runs_dir_given_from_the_home_folder(tmp_path):
    planned = make_at_home(tmp_path, "-n", "gpu-check", "RUNS_DIR=~/runs").stdout
    assert f'> "{tmp_path}/runs/gpu-check/timing.json"' in planned


def test_a_value_of_several_words_passes(tmp_path):
    assert "edgedistill call" in make_dry_run(tmp_path, "call", "TEXT=a pair of fine images")


def test_make_clean_of_a_recipe_that_does_not_load_stops_make(tmp_path):
    (tmp_path / "sst2").mkdir()
    command = ["make", "--no-print-directory", "clean", "RECIPE=", "CONFIRM=1", f"RUNS_DIR={tmp_path}"]
    assert subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120).returncode == 2


def test_make_clean_with_an_empty_runs_dir_stops_make():
    command = ["make", "-n", "--no-print-directory", "clean", "RECIPE=recipes/smoke.yaml", "CONFIRM=1", "RUNS_DIR="]
    refusal = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "RUNS_DIR is empty, so make clean would remove /smoke" in refusal.stderr


def test_make_clean_of_a_recipe_that_does_not_load_removes_no_run(tmp_path):
    (tmp_path / "sst2").mkdir()
    command = ["make", "--no-print-directory", "clean", "RECIPE=recipes/", "CONFIRM=1", f"RUNS_DIR={tmp_path}"]
    subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (tmp_path / "sst2").is_dir()


@pytest.fixture
def gpu_setup(checkout) -> tuple[subprocess.CompletedProcess, list[str]]:
    """`make setup` after an edit of pyproject.toml, on a .venv made with ORT=gpu where pip finds onnxruntime too."""
    return setup_with_stub_pip(edited_after_setup(checkout, CPU_INDEX, ort="gpu"))


def test_setup_after_an_edit_of_pyproject_installs_the_onnx_runtime_the_venv_records(gpu_setup):
    assert "-m pip install --quiet -e .[gpu,dev] --extra-index-url https://pypi.nvidia.com" in gpu_setup[1]


def test_setup_after_an_edit_of_pyproject_on_a_gpu_venv_installs_no_cpu_onnx_runtime(gpu_setup):
    assert not [call for call in gpu_setup[1] if ".[cpu,dev]" in call]


def test_setup_removes_both_onnx_runtimes_where_the_other_one_is_installed(gpu_setup):
    assert "-m pip uninstall --quiet --yes onnxruntime onnxruntime-gpu" in gpu_setup[1]


def test_setup_records_the_onnx_runtime_in_its_stamp(checkout, gpu_setup):
    assert "ORT=gpu\n" in (checkout / ".venv" / ".installed").read_text()


def test_an_onnx_runtime_other_than_the_venvs_stops_make(checkout):
    assert make_in(checkout, "setup", "ORT=gpu").returncode == 2


def test_an_onnx_runtime_other_than_the_venvs_names_the_venvs(checkout):
    refusal = make_in(checkout, "setup", "ORT=gpu").stderr
    assert "ORT=gpu would do nothing: .venv's ONNX Runtime is the cpu extra's" in refusal


def test_an_onnx_runtime_other_than_the_venvs_says_how_to_make_the_venv_with_it(checkout):
    refusal = make_in(checkout, "setup", "ORT=gpu").stderr
    assert "rm -rf .venv, then make setup ORT=gpu, or leave ORT out" in refusal


def test_an_onnx_runtime_refused_on_a_venv_with_cuda_torch_says_to_keep_its_torch_index(checkout):
    cuda = "https://download.pytorch.org/whl/cu130"
    (checkout / ".venv" / ".installed").write_text(f"TORCH_INDEX={cuda}\nORT=cpu\n")
    assert (
        f"make setup ORT=gpu TORCH_INDEX={cuda} (where its torch came from)"
        in make_in(checkout, "setup", "ORT=gpu").stderr
    )


def test_a_torch_index_refused_on_a_venv_with_the_gpu_onnx_runtime_says_to_keep_it(checkout):
    (checkout / ".venv" / ".installed").write_text(f"TORCH_INDEX={CPU_INDEX}\nORT=gpu\n")
    cuda = "https://download.pytorch.org/whl/cu130"
    refusal = make_in(checkout, "lint", f"TORCH_INDEX={cuda}").stderr
    assert f"make setup TORCH_INDEX={cuda} ORT=gpu (the ONNX Runtime it has)" in refusal


def test_the_venvs_onnx_runtime_passes(checkout):
    assert make_in(checkout, "lint", "ORT=cpu").returncode == 0


def test_a_venv_whose_stamp_records_no_onnx_runtime_has_the_cpu_one(checkout):
    (checkout / ".venv" / ".installed").write_text(f"TORCH_INDEX={CPU_INDEX}\n")  # as setup left it, cpu alone
    assert ".venv's ONNX Runtime is the cpu extra's" in make_in(checkout, "lint", "ORT=gpu").stderr


def test_an_onnx_runtime_other_than_cpu_or_gpu_stops_make(checkout):
    assert make_in(checkout, "lint", "ORT=cuda").returncode == 2


def test_an_onnx_runtime_other_than_cpu_or_gpu_says_what_ort_takes(checkout):
    assert "ORT=cuda: ORT=cpu installs ONNX Runtime for the CPU, ORT=gpu for NVIDIA GPUs" in (
        make_in(checkout, "lint", "ORT=cuda").stderr
    )


def test_make_gpu_check_trains_the_teacher_and_students_under_torchrun_with_nproc(tmp_path):
    ranks = "torchrun --standalone --nproc_per_node=2 --no-python .venv/bin/edgedistill $stage"
    assert ranks in make_dry_run(tmp_path, "gpu-check", "NPROC=2")


def test_make_gpu_check_with_nproc_trains_the_students_one_at_a_time(tmp_path):
    assert "--jobs" not in make_dry_run(tmp_path, "gpu-check", "NPROC=2")


def test_make_gpu_check_records_its_processes_per_stage(tmp_path):
    assert '\\"nproc\\": 2' in make_dry_run(tmp_path, "gpu-check", "NPROC=2")


def test_peers_bench_without_the_peer_environments_stops_make_before_any_stage():
    result = make_with_environ("peers-bench", "PEERS=/nonexistent/peers")
    assert "no peer environments in /nonexistent/peers/: run make peers-setup first" in result.stderr


def test_peers_bench_with_a_peer_interpreter_given_leaves_its_check_to_the_benchmark():
    args = "PEERS_BENCH_ARGS=--kserve-python /nonexistent/python"
    assert make_with_environ("peers-bench", "PEERS=/nonexistent/peers", args).returncode == 0


@pytest.fixture
def path_without_h2load(tmp_path) -> str:
    """A PATH of this machine's commands without h2load."""
    for program in Path("/usr/bin").iterdir():
        if program.name != "h2load":
            (tmp_path / program.name).symlink_to(program)
    return str(tmp_path)


@pytest.mark.parametrize("goal", ["peers-bench", "scaling-bench"])
def test_an_h2load_benchmark_without_h2load_stops_make_before_any_stage(goal, path_without_h2load):
    result = make_with_environ(goal, f"PEERS_BENCH_ARGS=--kserve-python {sys.executable}", PATH=path_without_h2load)
    assert f"h2load not found, which make {goal} drives its servers with" in result.stderr
