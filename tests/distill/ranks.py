"""Run a function on two real gloo ranks, each a process of its own, as torchrun would on one machine."""

import multiprocessing
import os
from datetime import timedelta

import torch.distributed as torch_dist
from edgedistill.common.config.training import RuntimeConfig
from edgedistill.distill import dist

# What the ranks' server imports once, so that each rank starts without importing torch again (seconds each).
PRELOAD = ["torch.distributed", "edgedistill.distill.dist", "edgedistill.distill.trainer"]
HOST = "127.0.0.1"


def _on_rank(rank: int, store: str | None, environ: dict, cwd: str, timeout_s: int, job, args, results) -> None:
    # the server was started by an earlier test: take this test's environment and folder, as a spawned process would
    os.environ.clear()
    os.environ.update(environ)
    os.chdir(cwd)
    if store is None:  # launched as torchrun launches a rank: it joins as the pipeline does
        dist.init("cpu", timeout_s)
    else:
        torch_dist.init_process_group(
            "gloo", init_method=f"file://{store}", rank=rank, world_size=2, timeout=timedelta(seconds=timeout_s)
        )
    try:
        results.put((rank, job(*args)))
        # a job without collectives lets rank 0 end, closing its sockets, while the other rank still finishes gloo's
        # connection handshake (which then fails "closed by peer" on a loaded machine): both leave together
        torch_dist.barrier()
    finally:
        torch_dist.destroy_process_group()


def on_two_ranks(
    tmp_path, job, *args, timeout_s: int = RuntimeConfig().collective_timeout_s, torchrun: bool = False
) -> dict:
    """`job(*args)`'s result on each of two gloo ranks, by rank (a module-level `job`, for the new processes), whose
    collectives fail after `timeout_s`. The ranks are forked from multiprocessing's forkserver, a clean process that
    imported PRELOAD, not from pytest. `torchrun`: each rank finds its rank, the world size and the store of this
    process (as torchrun's agent holds one) in its environment, and joins through `dist.init`; else they meet in a
    file under `tmp_path`, with no torchrun variables set."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)  # read when the server starts: the first call of the test process
    results = context.Queue()
    environs, store = [dict(os.environ)] * 2, str(tmp_path / "store")
    if torchrun:
        # held till this call returns, as torchrun's agent holds it for its ranks
        agent = torch_dist.TCPStore(HOST, 0, is_master=True, wait_for_workers=False)
        launch = {"WORLD_SIZE": "2", "MASTER_ADDR": HOST, "MASTER_PORT": str(agent.port)}
        launch["TORCHELASTIC_USE_AGENT_STORE"] = "True"  # the ranks' store is the agent's
        environs = [environ | launch | {"RANK": str(r), "LOCAL_RANK": str(r)} for r, environ in enumerate(environs)]
        store = None
    cwd = os.getcwd()
    procs = [
        context.Process(target=_on_rank, args=(r, store, environs[r], cwd, timeout_s, job, args, results), daemon=True)
        for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    said = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(30)
    return said
