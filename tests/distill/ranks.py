"""Run a function on two real gloo ranks, each a spawned process, as torchrun would on one machine."""

import multiprocessing

import torch.distributed as torch_dist


def _on_rank(rank: int, store: str, job, args, results) -> None:
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        results.put((rank, job(*args)))
    finally:
        torch_dist.destroy_process_group()


def on_two_ranks(tmp_path, job, *args) -> dict:
    """`job(*args)`'s result on each of two gloo ranks, by rank (a module-level `job`, for the spawned processes)."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [
        context.Process(target=_on_rank, args=(r, str(tmp_path / "store"), job, args, results), daemon=True)
        for r in (0, 1)
    ]
    for proc in procs:
        proc.start()
    said = dict(results.get(timeout=120) for _ in procs)
    for proc in procs:
        proc.join(30)
    return said
