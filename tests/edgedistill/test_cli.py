"""The `edgedistill` command: it lists every command, hands each its own help and errors, imports a stage only
when that stage runs, and runs the whole pipeline stage by stage until one fails."""

import errno
import functools
import importlib
import os
import select
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from edgedistill.common.atomic import FileTooLarge
from edgedistill.common.processes import Terminated
from pydantic import BaseModel, model_serializer
from pydantic_core import PydanticSerializationError

from edgedistill import cli
from tests.conftest import ROOT
from tests.serve.conftest import write_bundle

SCRIPT = Path(sys.executable).with_name("edgedistill")
NAMES = [*cli.COMMANDS, "all"]


@pytest.fixture(scope="module")
def top_help() -> str:
    """`edgedistill --help` from the installed script, run outside the checkout."""
    result = subprocess.run([SCRIPT, "--help"], cwd="/", capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("name", NAMES)
def test_the_help_lists_every_command(top_help, name):
    assert f"    {name} " in top_help or f"    {name}\n" in top_help


@pytest.mark.parametrize("name", NAMES)
def test_every_command_has_its_own_help(capsys, name):
    with pytest.raises(SystemExit) as exit_:
        cli.main([name, "--help"])
    assert exit_.value.code == 0


@pytest.mark.parametrize("name", NAMES)
def test_a_command_help_names_the_command(capsys, name):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    assert capsys.readouterr().out.startswith(f"usage: edgedistill {name} ")


@pytest.mark.parametrize("name", NAMES)
def test_a_command_help_names_no_module_of_the_checkout(capsys, name):
    with pytest.raises(SystemExit):
        cli.main([name, "--help"])
    assert "python -m" not in capsys.readouterr().out


def test_an_unknown_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(["no-such-command"])
    assert exit_.value.code == 2


def test_teacher_with_a_missing_recipe_fails(tmp_path):
    assert cli.main(["teacher", str(tmp_path / "missing.yaml")]) == 2


def test_teacher_with_a_missing_recipe_says_so(tmp_path, capsys):
    cli.main(["teacher", str(tmp_path / "missing.yaml")])
    assert "missing.yaml does not exist" in capsys.readouterr().err


def test_a_missing_dependency_names_the_install_command(monkeypatch, capsys):
    def absent(name):
        raise ModuleNotFoundError(f"No module named {name!r}", name="locust")

    monkeypatch.setattr(cli.importlib, "import_module", absent)
    assert cli.main(["loadtest", "recipes/smoke.yaml"]) == 2
    assert "pip install 'edgedistill[loadtest]'" in capsys.readouterr().err


def test_a_file_past_the_size_limit_stops_the_command_with_one_line(monkeypatch, capsys):
    def too_large(name):
        raise FileTooLarge(errno.EFBIG, "checkpoint.pt in runs/smoke/.work/teacher reached this process's limit")

    monkeypatch.setattr(cli.importlib, "import_module", too_large)
    assert cli.main(["teacher", "recipes/smoke.yaml"]) == 2
    assert capsys.readouterr().err == "error: checkpoint.pt in runs/smoke/.work/teacher reached this process's limit\n"


def run_without(blocked: str, argv: list[str], module: str | None = None) -> subprocess.CompletedProcess:
    """`edgedistill *argv`, or `python -m edgedistill.<module> *argv`, in a process where the package `blocked` is not
    installed."""
    run = (
        f"from edgedistill import cli\nsys.exit(cli.main({argv!r}))"
        if module is None
        else f"import runpy\nsys.argv[1:] = {argv!r}\nrunpy.run_module('edgedistill.{module}', run_name='__main__', alter_sys=True)"
    )
    probe = (
        f"import importlib.util, sys\nsys.modules[{blocked!r}] = None\n"
        f"find = importlib.util.find_spec\nimportlib.util.find_spec = lambda n, *a: None if n == {blocked!r} else find(n, *a)\n"
        + run
    )
    return subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=120)


def test_a_missing_export_package_names_the_install_command_not_a_traceback():
    result = run_without("tritonclient", ["triton-repo", "--help"])
    assert (
        result.stderr.strip()
        == "edgedistill triton-repo: needs tritonclient, which is not installed: pip install 'edgedistill[export]'"
    )


@pytest.fixture(params=["1", "2"], ids=["one process", "a supervisor"])
def serve_argv(request, tmp_path) -> list[str]:
    """`edgedistill serve` of a bundle with one worker, or two under a supervisor."""
    return ["serve", "--bundle", str(write_bundle(tmp_path / "bundle")), "--port", "0", "--workers", request.param]


ONNX_RUNTIME_INSTALL = "'edgedistill[cpu]' ('edgedistill[gpu]' on an NVIDIA GPU machine)"  # a wheel each


@pytest.mark.parametrize(
    ("blocked", "hint"),
    [("onnxruntime", ONNX_RUNTIME_INSTALL), ("grpc", "'edgedistill[serve]'")],
    ids=["onnxruntime", "grpc"],
)
def test_a_server_without_its_runtime_names_the_install_command_not_a_traceback(serve_argv, blocked, hint):
    result = run_without(blocked, serve_argv)
    assert result.stderr.strip() == f"edgedistill serve: needs {blocked}, which is not installed: pip install {hint}"


def test_a_server_without_its_runtime_exits_2(serve_argv):
    assert run_without("onnxruntime", serve_argv).returncode == 2


@pytest.mark.parametrize(
    ("blocked", "hint"),
    [("onnxruntime", ONNX_RUNTIME_INSTALL), ("grpc", "'edgedistill[serve]'")],
    ids=["onnxruntime", "grpc"],
)
def test_the_server_module_without_its_runtime_names_the_install_command_not_a_traceback(serve_argv, blocked, hint):
    result = run_without(blocked, serve_argv[1:], module="serve")
    expected = f"python -m edgedistill.serve: needs {blocked}, which is not installed: pip install {hint}"
    assert result.stderr.strip() == expected


def test_the_server_module_without_its_runtime_exits_2(serve_argv):
    assert run_without("onnxruntime", serve_argv[1:], module="serve").returncode == 2


@pytest.mark.parametrize(
    ("module", "blocked", "extra"), [("report", "matplotlib", "report"), ("loadtests", "grpc", "loadtest")]
)
def test_a_module_that_imports_a_missing_package_for_its_work_names_the_install_command(module, blocked, extra):
    result = run_without(blocked, ["smoke"], module=module)
    assert (
        result.stderr.strip()
        == f"python -m edgedistill.{module}: needs {blocked}, which is not installed: pip install 'edgedistill[{extra}]'"
    )


def test_the_servers_help_needs_no_runtime():
    assert run_without("onnxruntime", ["serve", "--help"]).returncode == 0


@pytest.mark.parametrize("argv", [["report", "--help"], ["headline", "--help"]], ids=" ".join)
def test_the_report_role_runs_without_onnx_runtime(argv):
    probe = f"import sys\nsys.modules['onnxruntime'] = None\nfrom edgedistill import cli\nsys.exit(cli.main({argv!r}))"
    result = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"], ["call", "--help"]], ids=" ".join)
def test_help_and_the_server_import_no_torch(argv):
    probe = (
        "import sys\nfrom edgedistill import cli\n"
        f"try:\n    cli.main({argv!r})\nexcept SystemExit:\n    pass\n"
        "print('torch' in sys.modules, 'transformers' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", probe], cwd="/", capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "False False", result.stderr


def test_python_m_edgedistill_is_the_command():
    result = subprocess.run([sys.executable, "-m", "edgedistill", "--version"], capture_output=True, text=True)
    assert result.stdout.startswith("edgedistill ")


ENTRY_POINTS = ("serve", "distill", "export", "bench", "loadtests", "report")  # and the modules with their own `-m`:
ENTRY_POINTS += ("serve.call", "export.triton", "serve.proto.generate", "report.headline")


@functools.cache
def module_help(module: str) -> str:
    """The output of `python -m edgedistill.<module> --help`, run in an empty folder outside the checkout."""
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", f"edgedistill.{module}", "--help"]
        return subprocess.run(command, capture_output=True, text=True, cwd=folder, timeout=120).stdout


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_of_the_package_names_itself_in_its_usage(module):
    assert module_help(module).startswith(f"usage: python -m edgedistill.{module} ")


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_of_the_package_names_no_module_of_the_checkout_in_its_help(module):
    assert "python -m " not in module_help(module).replace("python -m edgedistill.", "")


# Makes every entry point's argument parsing raise `error`, then runs `module` as `python -m` would.
FAILING_PROBE = """
import argparse, runpy, sys

def fail(*args, **kwargs):
    raise {error}

argparse.ArgumentParser.parse_known_args = fail  # parse_args calls it too
runpy.run_module("edgedistill.{module}", run_name="__main__", alter_sys=True)
"""
FIRST_ARGUMENT = {"distill": "teacher", "export": "bundles"}  # the modules whose first argument names the command


@functools.cache
def failed_entry_point(module: str, error: str) -> subprocess.CompletedProcess:
    """`python -m edgedistill.<module> [command] x` whose main raised `error` (e.g. `KeyboardInterrupt`)."""
    argv = [*([FIRST_ARGUMENT[module]] if module in FIRST_ARGUMENT else []), "x"]
    probe = FAILING_PROBE.format(error=error, module=module)
    return subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_stopped_by_ctrl_c_exits_130(module):
    assert failed_entry_point(module, "KeyboardInterrupt").returncode == cli.INTERRUPTED


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_stopped_by_ctrl_c_says_so_in_one_line_naming_itself(module):
    command = " ".join(
        [f"python -m edgedistill.{module}", *([FIRST_ARGUMENT[module]] if module in FIRST_ARGUMENT else [])]
    )
    lines = failed_entry_point(module, "KeyboardInterrupt").stderr.splitlines()
    assert [line.startswith(f"{command}: interrupted") for line in lines] == [True]


def test_a_training_module_stopped_by_ctrl_c_says_training_resumes():
    assert "(training resumes from its last checkpoint)" in failed_entry_point("distill", "KeyboardInterrupt").stderr


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_stopped_by_an_unexpected_error_exits_70(module):
    assert failed_entry_point(module, "RuntimeError('a bug')").returncode == cli.CRASHED


# the `edgedistill` command each entry point is, whose extra installs what it lacks
ENTRY_COMMANDS = {
    "serve": "serve",
    "distill": "teacher",
    "export": "bundles",
    "bench": "bench",
    "loadtests": "loadtest",
}
ENTRY_COMMANDS |= {"report": "report", "serve.call": "call", "export.triton": "triton-repo"}
ENTRY_COMMANDS |= {"serve.proto.generate": "proto", "report.headline": "headline"}
WITHOUT_LOCUST = "ModuleNotFoundError(\"No module named 'locust'\", name='locust')"


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_without_a_package_says_only_the_install_of_its_extra(module):
    command = " ".join(
        [f"python -m edgedistill.{module}", *([FIRST_ARGUMENT[module]] if module in FIRST_ARGUMENT else [])]
    )
    extra = cli.COMMANDS[ENTRY_COMMANDS[module]].extra
    hint = f"{command}: needs locust, which is not installed: pip install 'edgedistill[{extra}]'"
    assert failed_entry_point(module, WITHOUT_LOCUST).stderr.splitlines() == [hint]


@pytest.mark.parametrize("module", ENTRY_POINTS)
def test_a_module_entry_point_without_a_package_exits_2(module):
    assert failed_entry_point(module, WITHOUT_LOCUST).returncode == 2


def test_a_module_entry_point_stopped_by_an_unexpected_error_names_itself_after_the_traceback():
    stderr = failed_entry_point("report", "RuntimeError('a bug')").stderr
    assert "RuntimeError: a bug\npython -m edgedistill.report: stopped by an unexpected error" in stderr


def test_a_stage_killed_by_a_signal_gives_its_status_as_a_shell_does():
    kill = "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"
    assert cli.run_stage([sys.executable, "-c", kill]) == 128 + 9


class Stages:
    """Stands in for `cli.run_stage` in `edgedistill all`: records each stage, fails the one named `failing`."""

    def __init__(self, failing: str | None = None, status: int = 3):
        self.failing, self.status, self.ran = failing, status, []

    def __call__(self, command):
        step = command[4:]  # after python -P -m edgedistill
        self.ran.append(step)
        failed = self.failing in (step[0], " ".join(step[:2]))
        return self.status if failed else 0


def step_name(args: list[str]) -> str:
    """`bench serving` for the benchmarks, else the command alone."""
    return " ".join(args[:2]) if args[0] == "bench" else args[0]


def make_all_steps() -> list[str]:
    """The edgedistill commands `make all` runs, in order, as `make -n` prints them (installing nothing)."""
    result = subprocess.run(
        ["make", "-n", "--no-print-directory", "all", "RECIPE=recipes/smoke.yaml"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    return [step_name(words[words.index(w) + 1 :]) for words in lines for w in words if w.endswith("bin/edgedistill")]


def test_all_runs_the_stages_of_make_all_in_order(monkeypatch):
    expected = make_all_steps()  # before subprocess.run is replaced
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    assert cli.main(["all", "recipes/smoke.yaml"]) == 0
    assert [step_name(step) for step in stages.ran] == expected


def test_make_all_runs_the_whole_pipeline():
    assert make_all_steps()[:6] == ["teacher", "labeller", "transfer", "distill", "bundles", "bench models"]


def test_all_runs_each_stage_as_a_process_of_this_interpreter(monkeypatch):
    commands = []
    monkeypatch.setattr(cli, "run_stage", lambda command: commands.append(command) or Stages()(command))
    cli.main(["all", "recipes/smoke.yaml"])
    assert {tuple(command[:4]) for command in commands} == {(sys.executable, "-P", "-m", "edgedistill")}


def test_all_stops_at_the_first_failing_stage(monkeypatch):
    stages = Stages(failing="bundles")
    monkeypatch.setattr(cli, "run_stage", stages)
    cli.main(["all", "recipes/smoke.yaml"])
    assert stages.ran[-1][0] == "bundles"


def test_all_exits_with_the_failing_stage_status(monkeypatch):
    monkeypatch.setattr(cli, "run_stage", Stages(failing="bench serving", status=5))
    assert cli.main(["all", "recipes/smoke.yaml"]) == 5


def test_all_names_a_failing_benchmark_by_its_whole_command(monkeypatch, capsys):
    monkeypatch.setattr(cli, "run_stage", Stages(failing="bench serving", status=5))
    cli.main(["all", "recipes/smoke.yaml"])
    assert "[all] edgedistill bench serving failed with exit status 5" in capsys.readouterr().err


def test_all_echoes_each_stage_as_a_command_line_to_paste(monkeypatch, capsys):
    monkeypatch.setattr(cli, "run_stage", Stages())
    cli.main(["all", "recipes/smoke.yaml", "--finetune.optim={lr: 0.001}"])
    echoed = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("[all] edgedistill teacher"))
    assert shlex.split(echoed.removeprefix("[all] ")) == [
        "edgedistill",
        "teacher",
        "recipes/smoke.yaml",
        "--finetune.optim={lr: 0.001}",
    ]


def test_all_whose_load_test_missed_its_slo_still_runs_the_report_and_headline(monkeypatch):
    stages = Stages(failing="loadtest", status=1)
    monkeypatch.setattr(cli, "run_stage", stages)
    cli.main(["all", "recipes/smoke.yaml"])
    assert [step_name(step) for step in stages.ran[-3:]] == ["loadtest", "report", "headline"]


def test_all_whose_load_test_missed_its_slo_exits_1(monkeypatch):
    monkeypatch.setattr(cli, "run_stage", Stages(failing="loadtest", status=1))
    assert cli.main(["all", "recipes/smoke.yaml"]) == 1


def test_all_whose_load_test_could_not_run_stops_there(monkeypatch):
    stages = Stages(failing="loadtest", status=2)
    monkeypatch.setattr(cli, "run_stage", stages)
    assert cli.main(["all", "recipes/smoke.yaml"]) == 2
    assert stages.ran[-1][0] == "loadtest"


def test_all_passes_jobs_and_overrides_on(monkeypatch):
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    cli.main(["all", "recipes/smoke.yaml", "--jobs", "3", "--name=x"])
    assert stages.ran[3] == ["distill", "recipes/smoke.yaml", "--jobs", "3", "--name=x"]


def test_all_refuses_jobs_below_one_before_any_stage_runs(monkeypatch, capsys):
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    with pytest.raises(SystemExit):
        cli.main(["all", "recipes/smoke.yaml", "--jobs", "0"])
    assert stages.ran == []


def test_all_refuses_a_variable_the_benchmarks_refuse_before_any_stage_runs(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_THREADS", "4")  # a measured server's flag would override it
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    cli.main(["all", "recipes/smoke.yaml"])
    assert stages.ran == []


def test_all_names_the_variable_the_benchmarks_refuse(monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_WORKERS", "2")
    monkeypatch.setattr(cli, "run_stage", Stages())
    assert cli.main(["all", "recipes/smoke.yaml"]) == 2
    assert "EDGEDISTILL_WORKERS would do nothing: a measurement sets" in capsys.readouterr().err


def test_all_refuses_tls_for_the_measured_servers_before_any_stage_runs(monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_TLS_CERT", "/etc/ssl/server.pem")
    monkeypatch.setattr(cli, "run_stage", Stages())
    assert cli.main(["all", "recipes/smoke.yaml"]) == 2
    assert "measurements call the server over plaintext loopback" in capsys.readouterr().err


def test_all_refuses_scenario_weights_beside_an_override_of_them_before_any_stage_runs(monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "single=1")
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    assert cli.main(["all", "recipes/smoke.yaml", "--loadtest.smoke.scenarios={batch: 1}"]) == 2
    assert stages.ran == []
    assert "--loadtest.smoke.scenarios would do nothing: $EDGEDISTILL_LOADTEST_SCENARIOS" in capsys.readouterr().err


def test_all_refuses_scenario_weights_that_do_not_parse_before_any_stage_runs(monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_LOADTEST_SCENARIOS", "singel=1")
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    assert cli.main(["all", "recipes/smoke.yaml"]) == 2
    assert stages.ran == []
    assert "scenario weight 'singel=1': want NAME=INT" in capsys.readouterr().err


def test_all_passes_overrides_to_every_stage(monkeypatch):
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    assert cli.main(["all", "recipes/smoke.yaml", "--name=x"]) == 0
    assert stages.ran and all(step[-1] == "--name=x" for step in stages.ran)


@pytest.mark.parametrize("name", [name for name, command in cli.COMMANDS.items() if command.dispatches])
def test_a_stage_command_has_the_stages_own_summary(name):
    stages = importlib.import_module(cli.COMMANDS[name].module)
    assert cli.COMMANDS[name].help == getattr(stages, "STAGES", {}).get(name, getattr(stages, "COMMANDS", {}).get(name))


def test_all_force_rebuilds_every_stage(monkeypatch):
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    cli.main(["all", "recipes/smoke.yaml", "--force"])
    assert [step[0] for step in stages.ran if step[-1] != "--force"] == ["headline"]


def all_steps(monkeypatch, *overrides: str) -> dict[str, list[str]]:
    """The commands `edgedistill all recipes/smoke.yaml *overrides` runs, by name (`bench serving`)."""
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    cli.main(["all", str(ROOT / "recipes" / "smoke.yaml"), *overrides])
    return {step_name(step): step for step in stages.ran}


def test_all_leaves_an_override_out_of_a_stage_that_does_not_read_its_section(monkeypatch):
    assert "--bench.serving.threads=4" not in all_steps(monkeypatch, "--bench.serving.threads=4")["teacher"]


def test_all_gives_an_override_to_a_stage_that_reads_its_section(monkeypatch):
    assert "--bench.serving.threads=4" in all_steps(monkeypatch, "--bench.serving.threads=4")["bench serving"]


def test_all_gives_an_override_of_the_teachers_settings_to_a_stage_built_on_the_teacher(monkeypatch):
    assert "--finetune.optim.lr=1e-4" in all_steps(monkeypatch, "--finetune.optim.lr=1e-4")["bundles"]


def test_all_gives_a_stage_an_override_it_does_not_read_that_the_recipe_needs_beside_one_it_reads(monkeypatch):
    # the serving benchmark reads the deployed bundle's id alone: a bundle of a student the recipe lacks cannot load
    extra = (
        "--distill.students.extra.model.arch=cnn",
        "--export.bundles.extra-fp32.source=extra",
        "--export.deploy=extra-fp32",
    )
    assert extra[0] in all_steps(monkeypatch, *extra)["bench serving"]


def test_all_gives_the_teacher_an_override_of_a_teacher_bundles_fusion(monkeypatch):
    unfused = "--export.bundles.teacher-fused.fused=false"
    assert unfused in all_steps(monkeypatch, unfused)["teacher"]


def test_all_gives_a_stage_that_reads_neither_no_override_needed_only_beside_another(monkeypatch):
    gpt = ("--model.family=gpt", "--distill.students.transformer.init_from_teacher=false")
    assert gpt[1] not in all_steps(monkeypatch, *gpt)["bench serving"]


def test_all_leaves_out_of_a_stage_an_override_needed_only_beside_one_it_leaves_out(monkeypatch):
    # the serving benchmark reads no distill setting: the new student is needed only by the student deployed
    extra = ("--distill.students.extra.model.arch=cnn", "--distill.deploy=extra")
    assert extra[0] not in all_steps(monkeypatch, *extra)["bench serving"]


def test_all_gives_a_stage_that_reads_them_an_override_and_the_one_it_needs(monkeypatch):
    extra = ("--distill.students.extra.model.arch=cnn", "--distill.deploy=extra")
    assert all(override in all_steps(monkeypatch, *extra)["bundles"] for override in extra)


def test_all_refuses_a_recipe_without_a_section_a_later_stage_needs_before_any_stage_runs(monkeypatch):
    assert all_steps(monkeypatch, "--export=null") == {}


def test_all_names_the_section_a_recipe_lacks_and_the_commands_that_apply(monkeypatch, capsys):
    all_steps(monkeypatch, "--export=null")
    commands = (
        "edgedistill teacher, edgedistill transfer, edgedistill distill, edgedistill report, edgedistill headline"
    )
    assert f"the recipe has no export: add it, or run the commands that apply on their own ({commands})" in (
        capsys.readouterr().err
    )


def test_all_refuses_an_override_no_stage_reads_before_any_stage_runs(monkeypatch):
    assert all_steps(monkeypatch, "--bench.peers.workers=1") == {}


def test_all_names_the_command_that_reads_an_override_no_stage_reads(monkeypatch, capsys):
    all_steps(monkeypatch, "--bench.peers.workers=1")
    assert "give it to edgedistill bench peers" in capsys.readouterr().err


def test_all_refuses_an_override_of_a_profile_it_does_not_load_test_before_any_stage_runs(monkeypatch):
    assert all_steps(monkeypatch, "--loadtest.steady.rate=5") == {}


def test_all_names_the_load_test_that_reads_an_override_of_another_profile(monkeypatch, capsys):
    all_steps(monkeypatch, "--loadtest.steady.rate=5")
    assert "give it to edgedistill loadtest --profile steady" in capsys.readouterr().err


@pytest.mark.parametrize("override", ["--loadtest.smoke.rate=5", "--loadtest.timeout_s=5"])
def test_all_gives_the_smoke_load_test_an_override_of_its_profile_or_of_every_profiles_settings(monkeypatch, override):
    assert override in all_steps(monkeypatch, override)["loadtest"]


def test_all_names_the_benchmark_a_misspelt_override_meant(monkeypatch, capsys):
    all_steps(monkeypatch, "--bench.servng.threads=4")
    assert "bench.servng: unknown key: did you mean serving?" in capsys.readouterr().err


def test_all_names_the_recipe_section_a_misspelt_override_meant(monkeypatch, capsys):
    all_steps(monkeypatch, "--runtim.device=cpu")
    assert "runtim: unknown key: did you mean runtime?" in capsys.readouterr().err


def test_all_refuses_a_malformed_override_before_any_stage_runs(monkeypatch):
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    with pytest.raises(SystemExit):
        cli.main(["all", str(ROOT / "recipes" / "smoke.yaml"), "--name"])
    assert stages.ran == []


def test_all_exits_2_on_a_malformed_override(monkeypatch):
    monkeypatch.setattr(cli, "run_stage", Stages())
    assert cli.main(["all", str(ROOT / "recipes" / "smoke.yaml"), "--finetune.optim.lr"]) == 2


def test_all_describes_its_recipe_argument_as_every_stage_does(capsys):
    from edgedistill.common.recipe import RECIPE_HELP

    with pytest.raises(SystemExit):
        cli.main(["all", "--help"])
    assert " ".join(RECIPE_HELP.split()) in " ".join(capsys.readouterr().out.split())


def test_all_force_gives_the_headline_only_what_it_takes(capsys):
    headline = cli.pipeline("recipes/smoke.yaml", cli.JOBS, [], force=True)[-1]
    cli.main(headline)  # no run yet: it says so, but it took its arguments
    assert "override" not in capsys.readouterr().err


def interrupted(monkeypatch, capsys, name: str, *options: str) -> str:
    """What `edgedistill <name> x <options>` prints when Ctrl-C stops it."""

    def stopped(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli.Command, "run", stopped)
    assert cli.main([name, "x", *options]) == cli.INTERRUPTED
    return capsys.readouterr().err


def test_an_interrupted_client_says_only_that(monkeypatch, capsys):
    assert interrupted(monkeypatch, capsys, "call") == "edgedistill call: interrupted\n"


def test_an_interrupted_stage_says_it_goes_on_when_run_again(monkeypatch, capsys):
    assert "run it again to go on" in interrupted(monkeypatch, capsys, "bundles")


def test_an_interrupted_forced_command_says_its_finished_stages_are_built_again(monkeypatch, capsys):
    err = interrupted(monkeypatch, capsys, "distill", "--force")
    assert "; with --force, the stages it had finished are built again first (to build only those left" in err


def test_an_interrupted_command_without_force_says_nothing_of_it(monkeypatch, capsys):
    assert "--force" not in interrupted(monkeypatch, capsys, "distill")


def test_an_interrupted_training_stage_says_it_resumes_from_its_checkpoint(monkeypatch, capsys):
    assert "(training resumes from its last checkpoint)" in interrupted(monkeypatch, capsys, "teacher")


def test_an_interrupted_benchmark_speaks_of_no_training(monkeypatch, capsys):
    assert "training" not in interrupted(monkeypatch, capsys, "bench")


def stopped_by(monkeypatch, capsys, error: BaseException) -> tuple[int, str]:
    """The status and stderr of `edgedistill bundles x` when its stage raises `error`."""

    def stopped(*_):
        raise error

    monkeypatch.setattr(cli.Command, "run", stopped)
    return cli.main(["bundles", "x"]), capsys.readouterr().err


def test_a_stage_stopped_by_sigterm_exits_143(monkeypatch, capsys):
    assert stopped_by(monkeypatch, capsys, Terminated())[0] == 143


def test_a_stage_stopped_by_sigterm_says_so_and_that_it_goes_on(monkeypatch, capsys):
    line = "edgedistill bundles: stopped by SIGTERM; no artifact was half written: run it again to go on\n"
    assert stopped_by(monkeypatch, capsys, Terminated())[1] == line


def hashing_stopped_by(stop: type[KeyboardInterrupt]) -> Exception:
    """The error pydantic raises where `stop` lands in a serializer of ours, as in a recipe's hash."""

    class Hashed(BaseModel):
        @model_serializer(mode="wrap")
        def _stopped(self, handler):
            raise stop

    with pytest.raises(PydanticSerializationError) as raised:
        Hashed().model_dump()
    return raised.value


@pytest.mark.parametrize("stop, status", [(KeyboardInterrupt, 130), (Terminated, 143)])
def test_ctrl_c_or_sigterm_while_a_recipe_is_hashed_is_an_interrupt_not_a_crash(monkeypatch, capsys, stop, status):
    assert stopped_by(monkeypatch, capsys, hashing_stopped_by(stop))[0] == status


def test_ctrl_c_while_a_recipe_is_hashed_prints_no_traceback(monkeypatch, capsys):
    assert "Traceback" not in stopped_by(monkeypatch, capsys, hashing_stopped_by(KeyboardInterrupt))[1]


A_BUG = RuntimeError("a bug")


def crashed(monkeypatch, error: Exception = A_BUG) -> int:
    """The status of `edgedistill bundles` when the stage raises an error nobody expected."""

    def broken(*_):
        raise error

    monkeypatch.setattr(cli.Command, "run", broken)
    return cli.main(["bundles", "x"])


def test_an_unexpected_error_exits_70_not_the_1_of_a_failed_check(monkeypatch):
    assert crashed(monkeypatch) == 70


def test_an_unexpected_os_error_exits_70_too(monkeypatch):
    assert crashed(monkeypatch, ConnectionResetError(104, "Connection reset by peer")) == 70


def test_an_unexpected_error_prints_its_traceback(monkeypatch, capsys):
    crashed(monkeypatch)
    assert "RuntimeError: a bug\nedgedistill bundles: stopped by an unexpected error" in capsys.readouterr().err


@functools.cache
def to_a_closed_pipe() -> subprocess.CompletedProcess:
    """`edgedistill labeller recipes/smoke.yaml | head -0`: its one line (no labeller needed) to a pipe nobody reads."""
    reader, writer = os.pipe()
    os.close(reader)
    with os.fdopen(writer, "wb") as stdout:
        command = [SCRIPT, "labeller", str(ROOT / "recipes" / "smoke.yaml")]
        return subprocess.run(command, stdout=stdout, stderr=subprocess.PIPE, text=True, timeout=120)


def test_a_command_whose_reader_stopped_early_exits_141_as_a_shell_reports_it():
    assert to_a_closed_pipe().returncode == cli.READER_GONE


def test_a_command_whose_reader_stopped_early_prints_no_traceback():
    assert "Traceback" not in to_a_closed_pipe().stderr


@pytest.mark.parametrize(
    "status",
    [
        "0 done",
        "1 a check failed",
        "2 bad arguments",
        "130 interrupted",
        "141 the reader",
        "70 an unexp",
        "3 after a fault",
        "71 a worker that could not be started",
        "128 + N killed by signal N",
    ],
)
def test_the_help_gives_each_exit_status(top_help, status):
    assert status in " ".join(top_help.split())


TAKING_A_RECIPE = [
    *([name] for name, command in cli.COMMANDS.items() if command.dispatches),
    *(["bench", name] for name in ("models", "serving", "accuracy", "cascade", "peers", "scaling")),
    ["loadtest"],
    ["report"],
    ["headline"],
]


@pytest.mark.parametrize("argv", TAKING_A_RECIPE, ids=" ".join)
def test_a_command_taking_a_recipe_says_how_to_override_it(capsys, argv):
    from edgedistill.common.recipe import overrides_help

    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    assert overrides_help(" ".join(argv)) in " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("argv", TAKING_A_RECIPE, ids=" ".join)
def test_the_override_a_command_help_shows_is_one_it_takes(argv):
    import re

    from edgedistill.common.recipe import overrides_help
    from edgedistill.common.sections import outside

    shown = re.findall(r"e.g. --([\w.]+)=", overrides_help(" ".join(argv)))
    assert outside(shown, " ".join(argv)) == []


@pytest.mark.parametrize("name", ["models", "serving", "accuracy", "cascade", "peers", "scaling"])
def test_a_benchmark_help_says_what_it_measures(capsys, name):
    from edgedistill.bench.__main__ import main

    with pytest.raises(SystemExit):
        main([name, "--help"], prog="edgedistill bench")
    assert not capsys.readouterr().out.split("\n\n")[1].startswith("positional arguments")  # a description first


def test_a_bad_environment_setting_exits_2(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TORCH_THREADS", "abc")
    assert cli.main(["teacher", "recipes/smoke.yaml"]) == 2


def test_a_bad_environment_setting_is_one_line_naming_it(monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_PROGRESS", "bogus")
    cli.main(["bundles", "recipes/smoke.yaml", "--only", "bilstm-int8"])
    assert capsys.readouterr().err == "error: EDGEDISTILL_PROGRESS='bogus': expected one of auto, bar, lines, off\n"


# Runs `module`'s `main` with --help, then prints whether torch was imported.
HELP_IMPORTS_PROBE = """
import importlib, sys
try:
    importlib.import_module({module!r}).main(["--help"])
except SystemExit:
    pass
print("torch" in sys.modules)
"""


@pytest.mark.parametrize("module", ["edgedistill.distill.__main__", "edgedistill.export.__main__"])
def test_the_help_of_a_training_or_export_module_answers_without_importing_torch(module):
    probe = HELP_IMPORTS_PROBE.format(module=module)
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert result.stdout.splitlines()[-1] == "False"


@pytest.mark.parametrize("argv", TAKING_A_RECIPE, ids=" ".join)
def test_a_command_taking_a_recipe_names_the_sections_it_reads(capsys, argv):
    from edgedistill.common.recipe import reads_help

    with pytest.raises(SystemExit):
        cli.main([*argv, "--help"])
    assert reads_help(" ".join(argv)) in " ".join(capsys.readouterr().out.split())


def unread_override(command: str) -> str:
    """An override of a section `command` does not read."""
    from edgedistill.common.sections import outside

    return "--runtime.device=cpu" if outside(["runtime.device"], command) else "--bench.peers.workers=1"


@pytest.mark.parametrize("argv", TAKING_A_RECIPE, ids=" ".join)
def test_a_command_refuses_an_override_of_a_section_it_does_not_read_with_status_2(argv):
    command = " ".join(argv)
    assert cli.main([*argv, str(ROOT / "recipes" / "smoke.yaml"), unread_override(command)]) == 2


@pytest.mark.parametrize(
    "args", [["pretrain", "smoke", "--forc"], ["bundles", "smoke", "--forc"], ["bench", "serving", "smoke", "--chec"]]
)
def test_an_abbreviated_option_is_refused_not_read_as_the_option(args, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path))
    with pytest.raises(SystemExit):
        cli.main(args)
    assert f"{args[-1]}: no such option" in capsys.readouterr().err


def test_an_override_before_the_recipe_is_refused_saying_to_give_the_recipe_first(capsys):
    with pytest.raises(SystemExit):
        cli.main(["teacher", "--finetune.optim={lr: 0.001}", "recipes/smoke.yaml"])
    assert "came where the recipe goes: give the recipe first, then the overrides" in capsys.readouterr().err


def test_an_override_before_the_recipe_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_:
        cli.main(["teacher", "--finetune.optim={lr: 0.001}", "recipes/smoke.yaml"])
    assert exit_.value.code == 2


@pytest.mark.parametrize(
    "args",
    [["distill", "smoke", "--job=2"], ["distill", "smoke", "--job", "2"], ["all", "smoke", "--job=2"]],
    ids=" ".join,
)
def test_a_misspelt_option_is_answered_with_the_commands_nearest_option(args, capsys):
    with pytest.raises(SystemExit):
        cli.main(args)
    assert "--job: no such option, nor a recipe section: did you mean --jobs? " in capsys.readouterr().err


def test_a_misspelt_option_given_a_value_after_an_equals_sign_is_a_usage_error():
    with pytest.raises(SystemExit) as exit_:
        cli.main(["loadtest", "smoke", "--profle=steady"])
    assert exit_.value.code == 2


def test_all_refuses_an_abbreviated_force_before_any_stage_runs(monkeypatch):
    stages = Stages()
    monkeypatch.setattr(cli, "run_stage", stages)
    with pytest.raises(SystemExit):
        cli.main(["all", "recipes/smoke.yaml", "--f"])
    assert stages.ran == []


# a command whose work prints a line on stdout, then waits for its stdin to close
PRINTS_THEN_WAITS = """
import sys
from edgedistill.cli import guarded

def work():
    print("[stage] a summary line")
    sys.stdin.read()
    return 0

sys.exit(guarded("edgedistill teacher", "teacher", work))
"""


def test_a_command_writing_to_a_pipe_gives_each_stdout_line_as_it_is_printed():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    command = [sys.executable, "-c", PRINTS_THEN_WAITS]
    with subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env) as process:
        ready, _, _ = select.select([process.stdout], [], [], 60)
        line = process.stdout.readline() if ready else ""
        process.stdin.close()
    assert line == "[stage] a summary line\n"
