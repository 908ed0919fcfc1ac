"""Run a function on two real gloo ranks, each a process of its own, as torchrun would on one machine."""

import multiprocessing
import os
from datetime import timedelta

import torch.distributed as torch_dist

# What the ranks' server imports once, so that each rank starts without importing torch again (seconds each).
PRELOAD = ["torch.distributed", "edgedistill.distill.dist", "edgedistill.distill.trainer"]


def _on_rank(rank: int, store: str, environ: dict, cwd: str, timeout: timedelta | None, job, args, results) -> None:
    # the server was started by an earlier test: take this test's environment and folder, as a spawned process would
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timeout)
    try:
        results.put((rank, job(*args)))
        # a job without collectives lets rank 0 end, closing its sockets, while the other rank still finishes gloo's
        # connection handshake (which then fails "closed by peer" on a loaded machine): both leave together
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def on_two_ranks(tmp_path, job, *args, timeout_s: float | None = None) -> dict:
    """`job(*args)`'s result on each of two gloo ranks, by rank (a module-level `job`, for the new processes), whose
    collectives fail after `timeout_s` (default: gloo's 30 min). The ranks are forked from multiprocessing's
    forkserver, a clean process that imported PRELOAD, not from pytest."""
    timeout = None if timeout_s is None else timedelta(seconds=timeout_s)
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts: the first call of the test process
    results = context.Queue()
    environ, cwd = dict(os.environ), os.getcwd()
    procs = [
        context.Process(
            target=_on_rank, args=(r, str(tmp_path / "store"), environ, cwd, timeout, job, args, results), daemon=True
        )
        for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    said = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(30)
    return said
