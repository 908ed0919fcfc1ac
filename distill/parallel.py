"""Train several students and baselines at once, one process each, sharing the CPU threads.

Small students use few cores well, so on a CPU host two single-threaded jobs finish sooner than
the same jobs one after another on two threads. Each job runs one student stage; jobs are
independent (each writes its own artifact and resumes on its own).
"""

import concurrent.futures as cf
import multiprocessing as mp
import os

import torch
from edgedistill.common.processes import die_with_parent
from edgedistill.common.recipe import Recipe
from edgedistill.distill import device, student_stage

_bar_position: int | None = None
"""This worker process's terminal line for its jobs' progress bars, taken from the free lines when it starts."""


def _start_worker(parent: int, threads: int, slots) -> None:
    global _bar_position
    die_with_parent(parent)  # a killed `distill` takes its jobs with it, none left training unwatched
    device.configure_process(threads)
    _bar_position = slots.get()


def _run(recipe: Recipe, name: str, baseline: bool, force: bool) -> None:
    student_stage.stage(recipe, name, baseline, _bar_position).run(force)


def run_all(recipe: Recipe, jobs: list[tuple[str, bool]], workers: int, force: bool = False) -> None:
    """Run `(student name, baseline?)` jobs on `workers` processes; raise the first failure after all end."""
    threads = max(1, torch.get_num_threads() // workers)
    ctx = mp.get_context("spawn")
    slots = ctx.Queue()
    for slot in range(workers):
        slots.put(slot)
    print(f"[distill] {len(jobs)} jobs on {workers} processes x {threads} threads")
    errors = []
    with cf.ProcessPoolExecutor(
        workers, mp_context=ctx, initializer=_start_worker, initargs=(os.getpid(), threads, slots)
    ) as pool:
        pending = {pool.submit(_run, recipe, name, baseline, force): (name, baseline) for name, baseline in jobs}
        for done, future in enumerate(cf.as_completed(pending), 1):
            name, baseline = pending[future]
            stage = f"{'baseline' if baseline else 'student'}-{name}"
            if future.exception() is not None:
                errors.append(future.exception())
            print(f"[distill] {done}/{len(jobs)} {stage}: {'failed' if future.exception() else 'done'}")
    if errors:
        raise errors[0]
