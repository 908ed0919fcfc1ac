"""Train several students and baselines at once, one process each, sharing the CPU threads.

Small students use few cores well, so on a CPU host two single-threaded jobs finish sooner than
the same jobs one after another on two threads. Each job runs one student stage; jobs are
independent (each writes its own artifact and resumes on its own). The jobs' processes ignore Ctrl-C;
the process that started them stops them (SIGTERM), so that one line, not a traceback per process, says so.
"""

import concurrent.futures as cf
import multiprocessing as mp
import os
import signal
import sys
import threading
from collections.abc import Callable
from concurrent.futures.process import BrokenProcessPool

import torch
from edgedistill.common.processes import (
    Terminated,
    children_ignore_interrupts,
    die_with_parent,
    terminated_as_interrupted,
)
from edgedistill.common.recipe import Recipe
from edgedistill.distill import device, stages
from tqdm import tqdm

_bar_position: int | None = None
"""This worker process's terminal line for its jobs' progress bars, taken from the free lines when it starts."""


def _start_worker(parent: int, threads: int, slots) -> None:
    global _bar_position
    die_with_parent(parent)  # a killed `distill` takes its jobs with it, none left training unwatched
    # tqdm's default lock holds a semaphore that only a clean exit releases: a job stopped by Ctrl-C would leave
    # the resource tracker warning of it. Spawned jobs share no lock anyway; each guards its own bar.
    tqdm.set_lock(threading.RLock())
    device.configure_process(threads)
    _bar_position = slots.get()


class JobKilled(RuntimeError):
    """A job's process killed by a signal (the OOM killer, kill -9), which stops every job of the pool with it."""


def _train(recipe: Recipe, name: str, baseline: bool, force: bool) -> None:
    stages.student(on_own_gpu(recipe, _bar_position), name, baseline, _bar_position).run(force)


def _stoppable(job: Callable[..., None], *args) -> None:
    """`job(*args)` with SIGTERM raising `Terminated`, as in the main process, so that a stopped job's stage runs its
    clean-ups (keeps its wall time, closes its tracked run); then the process ends as the signal ends it, starting
    none of the jobs queued for it."""
    try:
        with terminated_as_interrupted():
            job(*args)
    except Terminated:
        sys.stdout.flush()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def on_own_gpu(recipe: Recipe, slot: int) -> Recipe:
    """`recipe` for a job of worker `slot`: where `runtime.device` leaves the GPU to choose (auto or cuda) and the
    machine has several, the worker's own (`slot` mod their count), so that jobs at once train on different GPUs
    rather than all on the first. `runtime` is hashed by no stage, so the artifacts are the same either way."""
    if recipe.runtime.device not in ("auto", "cuda") or not torch.cuda.is_available():
        return recipe
    if (count := torch.cuda.device_count()) < 2:
        return recipe
    return recipe.model_copy(update={"runtime": recipe.runtime.model_copy(update={"device": f"cuda:{slot % count}"})})


def run_all(recipe: Recipe, jobs: list[tuple[str, bool]], workers: int, force: bool = False) -> None:
    """Run `(student name, baseline?)` jobs on `workers` processes; raise the first failure after all end. A job
    whose artifact is up to date (unless `force`) is said so here, starting no process for it."""
    if not force:
        jobs = [(name, baseline) for name, baseline in jobs if not _skipped(recipe, name, baseline)]
        if not jobs:
            return
    threads = max(1, torch.get_num_threads() // workers)
    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    for slot in range(workers):
        slots.put(slot)
    # each job takes the threads of `workers` whatever the jobs left, so that its result does not depend on them
    print(
        f"[distill] {len(jobs)} job(s) on {min(workers, len(jobs))} process(es) x {threads} thread(s), "
        f"the share of --jobs {workers}"
    )
    with cf.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_start_worker, initargs=(os.getpid(), threads, slots)
    ) as pool:
        with children_ignore_interrupts():  # the pool starts its processes as jobs are submitted
            pending = {
                pool.submit(_stoppable, _train, recipe, name, baseline, force): (name, baseline)
                for name, baseline in jobs
            }
        try:
            wait(pending)
        except KeyboardInterrupt:
            for worker in mp.active_children():
                worker.terminate()  # checkpoints are written atomically: each job resumes from its last one
            raise


def _skipped(recipe: Recipe, name: str, baseline: bool) -> bool:
    """Whether the job's artifact is up to date, which its stage then says as it says it (deciding again under its
    lock); one another process is building now is not, and waits for it in a job."""
    stage = stages.student(recipe, name, baseline)
    if stage.staleness() is not None:
        return False
    stage.run()
    return True


def wait(pending: dict[cf.Future, tuple[str, bool]]) -> None:
    """Say how each job (future -> (student name, baseline?)) ends, a failed one with its error; raise the first
    failure after all end, or `JobKilled` naming the jobs a killed process stopped."""
    errors, stopped = [], []
    for done, future in enumerate(cf.as_completed(pending), 1):
        name, baseline = pending[future]
        stage = f"{'baseline' if baseline else 'student'}-{name}"
        error = future.exception()
        if isinstance(error, BrokenProcessPool):
            stopped.append(stage)
        elif error is not None:
            errors.append(error)
        outcome = "stopped" if stage in stopped else f"failed: {type(error).__name__}: {error}" if error else "done"
        print(f"[distill] {done}/{len(pending)} {stage}: {outcome}")
    if errors:
        raise errors[0]
    if stopped:
        raise JobKilled(
            f"a job's process was killed (by the out-of-memory killer? fewer --jobs take less memory), which stopped "
            f"{', '.join(stopped)}: run distill again, each goes on from its last checkpoint"
        )
