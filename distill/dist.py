"""Process-group set-up for `torchrun`: gloo on CPU, nccl on GPU; a no-op in a single process."""

import os

import torch
import torch.distributed as dist


def init() -> tuple[int, int]:
    """(rank, world_size), initialising the process group when launched by `torchrun`."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
    return (dist.get_rank(), world_size) if world_size > 1 else (0, 1)


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def run_stage(stage, force: bool = False):
    """Run a `common.stage.Stage` on every rank; the others wait until rank 0 has published its artifact,
    so the next stage finds it."""
    manifest = stage.run(force)
    barrier()
    return manifest


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
