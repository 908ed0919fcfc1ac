"""Ctrl-C in the middle of a stage: one line says so, with exit status 130, and no process is left behind; a
killed `edgedistill all` takes its running stage with it.

A terminal's Ctrl-C sends SIGINT to every process of the command's group, the jobs of `distill --jobs N` and
the stage `edgedistill all` runs included.
"""

import contextlib
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from tests.conftest import PYTHON, ROOT, build_stages, gone, wait_until
from tests.faults.conftest import environment, tiny_recipe

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A tiny recipe whose teacher and transfer set are built, and the environment its stages run in."""
    folder = tmp_path_factory.mktemp("interrupts")
    recipe = tiny_recipe(folder)
    build_stages(folder / "runs", recipe, ["distill", "teacher"], ["distill", "transfer"])
    return recipe, environment(folder / "runs")


def in_session(sid: int) -> list[psutil.Process]:
    """The processes of session `sid` still running (zombies left out)."""
    running = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error, OSError):  # ended meanwhile
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                running.append(process)
    return running


def interrupt_when(
    printed: str, env: dict[str, str], *args: str, timeout: float = 300, sig: signal.Signals = signal.SIGINT
) -> tuple[int, str, list]:
    """Run `edgedistill *args` in its own session, send its process group `sig` (SIGINT: as Ctrl-C does) once its
    output matches `printed`; its exit status, its output and the processes of its session, whenever started, still
    running 10 s after it exited (then killed)."""
    log = Path(env["EDGEDISTILL_RUNS_DIR"]) / f"interrupted-{time.monotonic_ns()}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [PYTHON, "-m", "edgedistill", *args],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # as a terminal's foreground job has it
        )
    deadline = time.monotonic() + timeout
    while not re.search(printed, log.read_text()):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no {printed!r} before the command ended: {log.read_text()[-2000:]}")
        time.sleep(0.1)
    os.killpg(proc.pid, sig)
    try:
        status = proc.wait(60)
    except subprocess.TimeoutExpired:  # killed, with its stages: left running, it would hold their locks
        os.killpg(proc.pid, signal.SIGKILL)
        raise AssertionError(f"still running 60 s after {sig.name}: {log.read_text()[-2000:]}") from None
    deadline = time.monotonic() + 10
    while (left := in_session(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()  # not left training after the test
    return status, log.read_text(), left


STOPPED_BY = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM"}


@pytest.fixture(scope="module", params=list(STOPPED_BY), ids=lambda sig: sig.name)
def distilling(tiny, request) -> dict:
    """`edgedistill distill --jobs 2` sent SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop, a CI timeout) while its two
    jobs train: the signal, its exit status, output and processes left."""
    recipe, env = tiny
    args = ("distill", str(recipe), "--jobs", "2", "--force")
    status, output, left = interrupt_when(r"\[(student|baseline)-bilstm\] step", env, *args, sig=request.param)
    return {"signal": request.param, "status": status, "output": output, "left": left}


# a teacher of more epochs than the built one, and the export section `edgedistill all` needs (the tiny recipe has none)
ALL_OVERRIDES = (
    "--finetune.optim.epochs=30",
    "--export={deploy: bilstm-fp32, bundles: {bilstm-fp32: {source: bilstm}}}",
)


@pytest.fixture(scope="module")
def all_stages(tiny):
    """`edgedistill all` interrupted while its first stage trains (a teacher with more epochs than the built one)."""
    recipe, env = tiny
    return interrupt_when(r"\[teacher\] building again", env, "all", str(recipe), *ALL_OVERRIDES)


def test_a_stopped_stage_exits_with_its_signals_status(distilling):
    assert distilling["status"] == 128 + distilling["signal"]


def test_a_stopped_stage_says_so_in_a_line(distilling):
    line = f"edgedistill distill: {STOPPED_BY[distilling['signal']]}; no artifact was half written: run it again"
    assert line in distilling["output"]


def test_a_stopped_stage_prints_no_traceback(distilling):
    assert "Traceback" not in distilling["output"]


def test_a_stopped_stage_leaves_no_warning_of_leaked_semaphores(distilling):
    assert "leaked" not in distilling["output"]


def test_a_stopped_stage_leaves_no_job_running(distilling):
    assert distilling["left"] == []


def test_an_interrupted_pipeline_exits_130(all_stages):
    assert all_stages[0] == 130


def test_an_interrupted_pipeline_prints_no_traceback(all_stages):
    assert "Traceback" not in all_stages[1]


def test_an_interrupted_pipeline_says_so_once(all_stages):
    assert all_stages[1].count("interrupted") == 1


def pipeline_training(tiny, log: str) -> tuple[subprocess.Popen, Path]:
    """`edgedistill all` (a teacher of more epochs than the built one) once its teacher stage trains, and its log
    `log` in the runs folder; killed, with its stages, where that stage never starts."""
    recipe, env = tiny
    path = Path(env["EDGEDISTILL_RUNS_DIR"]) / log
    with open(path, "w") as out:
        pipeline = subprocess.Popen(
            [PYTHON, "-m", "edgedistill", "all", str(recipe), *ALL_OVERRIDES],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_until(lambda: "[teacher] building again" in path.read_text(), "the teacher stage never started", 300)
    except AssertionError:
        for process in [*psutil.Process(pipeline.pid).children(recursive=True), pipeline]:
            process.kill()  # nothing left training after the test
        raise
    return pipeline, path


def test_a_killed_pipeline_takes_its_running_stage_with_it(tiny):
    pipeline, _ = pipeline_training(tiny, "killed-all.log")
    stage = psutil.Process(pipeline.pid).children()[0]
    pipeline.kill()  # this process alone, as `kill -9 PID` does
    pipeline.wait()
    stopped = gone(stage.pid)
    if not stopped:
        stage.kill()  # not left training after the test
    assert stopped


@pytest.fixture(scope="module")
def pipeline_terminated(tiny) -> tuple[str, bool]:
    """`kill PID` of `edgedistill all` while its teacher trains, which the signal itself does not reach: the
    pipeline's output, and whether the teacher's process is gone after it."""
    pipeline, log = pipeline_training(tiny, "terminated-all.log")
    stages = []
    try:
        stages = psutil.Process(pipeline.pid).children()
        pipeline.terminate()
        pipeline.wait(60)
        stopped = all(gone(stage.pid) for stage in stages)
    finally:
        for process in [*stages, pipeline]:
            with contextlib.suppress(psutil.Error, ProcessLookupError):
                process.kill()  # nothing left training after the test
    return log.read_text(), stopped


def test_a_pipeline_sent_sigterm_alone_stops_its_stage(pipeline_terminated):
    assert pipeline_terminated[1]


def test_a_pipeline_sent_sigterm_alone_has_its_stage_say_so(pipeline_terminated):
    assert "edgedistill teacher: stopped by SIGTERM; no artifact was half written" in pipeline_terminated[0]
