"""Process-group set-up for `torchrun`: nccl when the ranks run on GPUs, gloo on the CPU; a no-op in one process."""

import os

import torch.distributed as dist


def launched() -> tuple[int, int]:
    """(local rank, world size) as `torchrun` sets them; (0, 1) in a plain process."""
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def init(device_type: str) -> None:
    """Join the process group when launched by `torchrun` (at any world size, so one process under torchrun runs
    DDP too), with the backend for `device_type` ('cuda' or 'cpu')."""
    if "RANK" in os.environ and not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_type == "cuda" else "gloo")


def initialized() -> bool:
    return dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


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
