"""The process pool that trains students and baselines side by side."""

import concurrent.futures as cf
import multiprocessing as mp
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from edgedistill.common.recipe import load_recipe
from edgedistill.distill import parallel

from tests.common.test_processes import child_ends_with_parent
from tests.conftest import ROOT

DISTILL = textwrap.dedent(
    """
    import concurrent.futures as cf, multiprocessing as mp, os, time
    from edgedistill.distill import parallel
    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    slots.put(0)
    pool = cf.ProcessPoolExecutor(1, mp_context=ctx, initializer=parallel._start_worker, initargs=(os.getpid(), 1, slots))
    print(pool.submit(os.getpid).result(), flush=True)
    pool.submit(time.sleep, 600)
    time.sleep(600)
    """
)


def test_a_job_stops_when_the_distill_process_is_terminated():
    parent = subprocess.Popen([sys.executable, "-c", DISTILL], stdout=subprocess.PIPE, text=True)
    worker = int(parent.stdout.readline())
    assert child_ends_with_parent(parent, worker, signal.SIGTERM)


def held_until_stopped(work: Path) -> None:
    """A job that says it started, waits, and notes the exception that stops it where a stage keeps its wall time."""
    try:
        (work / "started").touch()
        time.sleep(60)
    except BaseException as err:
        (work / "stopped").write_text(type(err).__name__)
        raise


@pytest.fixture
def stopped_jobs(tmp_path) -> tuple[Path, Path]:
    """The work folders of a job stopped as `run_all` stops its jobs, and of one queued after it in its process."""
    first, queued = tmp_path / "first", tmp_path / "queued"
    first.mkdir()
    queued.mkdir()
    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    slots.put(0)
    with cf.ProcessPoolExecutor(
        1, mp_context=ctx, initializer=parallel._start_worker, initargs=(os.getpid(), 1, slots)
    ) as pool:
        running = pool.submit(parallel._stoppable, held_until_stopped, first)
        pool.submit(parallel._stoppable, held_until_stopped, queued)
        deadline = time.monotonic() + 60
        while not (first / "started").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        for worker in mp.active_children():
            worker.terminate()
        cf.wait([running], 60)
    return first, queued


def test_a_job_stopped_by_sigterm_runs_its_clean_ups(stopped_jobs):
    first, _ = stopped_jobs
    assert (first / "stopped").read_text() == "Terminated"


def test_a_process_whose_job_was_stopped_starts_no_job_queued_for_it(stopped_jobs):
    _, queued = stopped_jobs
    assert not (queued / "started").exists()


def failed(error: Exception) -> cf.Future:
    future = cf.Future()
    future.set_exception(error)
    return future


def test_each_failed_job_s_error_is_printed_not_only_the_first_raised(capsys):
    pending = {failed(ValueError("bilstm diverged")): ("bilstm", False), failed(OSError("cnn disk")): ("cnn", False)}
    with pytest.raises((ValueError, OSError)):
        parallel.wait(pending)
    out = capsys.readouterr().out
    assert "student-bilstm: failed: ValueError: bilstm diverged" in out
    assert "student-cnn: failed: OSError: cnn disk" in out


def test_a_job_killed_by_a_signal_names_the_jobs_it_stopped_and_the_way_on():
    with cf.ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
        pending = {pool.submit(os.abort): ("bilstm", False), pool.submit(os.getpid): ("bilstm", True)}
        with pytest.raises(parallel.JobKilled, match=r"which stopped .*student-bilstm.*: run distill again"):
            parallel.wait(pending)


@pytest.fixture
def own_run(smoke_run, tmp_path) -> Path:
    """A copy of `smoke_run` this test may change (the session's copy is shared by this process's tests)."""
    shutil.copytree(smoke_run, tmp_path / "runs" / "smoke", symlinks=True)
    return tmp_path / "runs" / "smoke"


def distill_with_jobs(run: Path, capsys, monkeypatch) -> str:
    """What `distill --jobs 2` of the smoke recipe printed over the smoke run folder `run`."""
    from edgedistill.distill.__main__ import main

    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(run.parent))
    assert main(["distill", str(ROOT / "recipes" / "smoke.yaml"), "--jobs", "2"]) == 0
    return capsys.readouterr().out


def test_jobs_whose_students_are_up_to_date_start_no_process(own_run, capsys, monkeypatch):
    started = []
    monkeypatch.setattr(parallel.cf, "ProcessPoolExecutor", lambda *args, **kwargs: started.append(args))
    distill_with_jobs(own_run, capsys, monkeypatch)
    assert started == []


def test_jobs_whose_students_are_up_to_date_are_said_to_be(own_run, capsys, monkeypatch):
    out = distill_with_jobs(own_run, capsys, monkeypatch)
    assert f"[baseline-transformer] up to date: {own_run / 'baseline-transformer'}" in out


@pytest.fixture
def submitted(monkeypatch) -> list[tuple[str, bool]]:
    """The jobs `run_all` submits, run in threads that train nothing."""
    jobs = []

    class Pool(cf.ThreadPoolExecutor):
        def __init__(self, workers, **kwargs):
            super().__init__(workers)

        def submit(self, fn, job, recipe, name, baseline, force):
            jobs.append((name, baseline))
            return super().submit(lambda: None)

    monkeypatch.setattr(parallel.cf, "ProcessPoolExecutor", Pool)
    return jobs


def test_a_job_made_stale_alone_gets_a_process(own_run, capsys, monkeypatch, submitted):
    (own_run / "student-cnn" / "manifest.json").unlink()
    distill_with_jobs(own_run, capsys, monkeypatch)
    assert submitted == [("cnn", False)]


def test_a_job_left_alone_is_said_to_take_one_process_with_the_share_of_its_jobs(
    own_run, capsys, monkeypatch, submitted
):
    (own_run / "student-cnn" / "manifest.json").unlink()
    assert "[distill] 1 job(s) on 1 process(es) x " in distill_with_jobs(own_run, capsys, monkeypatch)


@pytest.fixture
def four_gpus(monkeypatch):
    """A machine that says it has four CUDA GPUs."""
    monkeypatch.setattr(parallel.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parallel.torch.cuda, "device_count", lambda: 4)


def _device_of_job(device: str, slot: int) -> str:
    recipe = load_recipe(ROOT / "recipes" / "smoke.yaml", {"runtime.device": device})
    return parallel.on_own_gpu(recipe, slot).runtime.device


@pytest.mark.parametrize(("slot", "gpu"), [(0, "cuda:0"), (1, "cuda:1"), (5, "cuda:1")])
def test_jobs_at_once_train_on_the_gpus_in_turn(four_gpus, slot, gpu):
    assert _device_of_job("auto", slot) == gpu


def test_jobs_on_cuda_without_an_index_train_on_the_gpus_in_turn(four_gpus):
    assert _device_of_job("cuda", 3) == "cuda:3"


def test_a_job_keeps_the_gpu_its_recipe_names(four_gpus):
    assert _device_of_job("cuda:2", 1) == "cuda:2"


def test_a_job_keeps_the_cpu_its_recipe_names(four_gpus):
    assert _device_of_job("cpu", 1) == "cpu"


def test_jobs_on_one_gpu_share_it(monkeypatch):
    monkeypatch.setattr(parallel.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(parallel.torch.cuda, "device_count", lambda: 1)
    assert _device_of_job("auto", 1) == "auto"


def test_jobs_without_a_gpu_keep_their_device():
    assert _device_of_job("auto", 1) == "auto"
