"""Process-group set-up for `torchrun`: nccl when the ranks run on GPUs, gloo on the CPU; a no-op in one process.
Across nodes the run folder must be shared (`check_shared`)."""

import contextlib
import itertools
import os
import re
import secrets
import socket
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from edgedistill.common.recipe import RecipeError
from torch.distributed import distributed_c10d

WAIT_POLL_S = 0.5  # how often a rank waiting for rank 0 (`wait_for_main`) looks again
SHARED_PROBE = ".shared-probe"  # how the files rank 0 writes for the other ranks to find start (`probe_file`)
_main_calls = itertools.count()  # `wait_for_main`'s calls in this process, the same sequence on every rank
# how gloo ("Timed out waiting 1800000ms for recv operation") and NCCL ("Watchdog caught collective operation timeout")
# say that a collective ran past the process group's timeout
_TIMED_OUT = re.compile(r"timed out|timeout", re.IGNORECASE)


class CollectiveTimeout(RuntimeError):
    """A rank waited for rank 0 in a collective past the process group's timeout (`runtime.collective_timeout_s`)."""


def probe_file(folder: Path, token: str) -> Path:
    """The probe the launch whose rank 0 drew `token` writes into `folder`: one name per launch, so that two launches
    at once on one run folder neither overwrite nor remove each other's."""
    return Path(folder) / f"{SHARED_PROBE}-{token}"


def launched() -> tuple[int, int, int]:
    """(local rank, processes on this node, world size) as `torchrun` sets them (`LOCAL_RANK`, `LOCAL_WORLD_SIZE`,
    `WORLD_SIZE`); (0, 1, 1) in a plain process."""
    world_size = os.environ.get("WORLD_SIZE", "1")
    return int(os.environ.get("LOCAL_RANK", "0")), int(os.environ.get("LOCAL_WORLD_SIZE", world_size)), int(world_size)


def init(device_type: str, timeout_s: int) -> None:
    """Join the process group when launched by `torchrun` (at any world size, so one process under torchrun runs
    DDP too), with the backend for `device_type` ('cuda' or 'cpu'), whose collectives fail after `timeout_s`
    (`runtime.collective_timeout_s`; torch's own default is 10 min under NCCL, too short for some evaluations and
    checkpoints on slow storage)."""
    if "RANK" in os.environ and not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        try:
            dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_s))
        except RuntimeError as err:  # torch's DistStoreError: the other ranks did not all join within the timeout
            if not _TIMED_OUT.search(str(err)):
                raise
            raise CollectiveTimeout(
                f"rank {os.environ['RANK']} waited {timeout_s} s (runtime.collective_timeout_s) for the other ranks "
                f"to join, and gave up: where they start later (a busy machine, another node), raise it, e.g. "
                f"--runtime.collective_timeout_s={2 * timeout_s}"
            ) from None


def collective_timeout() -> timedelta:
    """How long a collective of this process's group waits before it fails."""
    device = torch.device("cuda" if dist.get_backend() == "nccl" else "cpu")
    # torch has no public getter for a group's timeout
    return distributed_c10d._get_default_group()._get_backend(device).options._timeout


@contextlib.contextmanager
def waiting_for_main(what: str):
    """Around the collectives in which the other ranks wait while rank 0 does `what` ('evaluate'): a rank other than 0
    whose collective there times out raises `CollectiveTimeout`, naming its rank, `what` and the setting to raise,
    rather than torch's bare message. Under NCCL torch's watchdog may end the process first, with its own message."""
    try:
        yield
    except RuntimeError as err:
        if is_main() or not _TIMED_OUT.search(str(err)):
            raise
        waited = round(collective_timeout().total_seconds())
        raise CollectiveTimeout(
            f"rank {rank()} waited {waited} s (runtime.collective_timeout_s) for rank 0 to {what}, and gave up: where "
            f"that takes longer (a large evaluation set, slow storage), raise it, e.g. "
            f"--runtime.collective_timeout_s={2 * waited}"
        ) from err


def check_shared(folder: Path) -> None:
    """Refuse to train when some rank cannot see `folder` as rank 0 wrote it: rank 0 alone writes checkpoints and
    artifacts, and every rank reads them back (to resume, and as the next stage's input), so across nodes the run
    folder must be on storage they share. A no-op in one process; on failure every rank raises, naming the hosts."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    token = [secrets.token_hex(8) if is_main() else None]
    if is_main():
        probe = probe_file(folder, token[0])
        probe.parent.mkdir(parents=True, exist_ok=True)
        probe.write_text(token[0])
    dist.broadcast_object_list(token, src=0)
    probe = probe_file(folder, token[0])
    try:
        seen = probe.read_text() == token[0]
    except OSError:
        seen = False
    hosts: list = [None] * dist.get_world_size()
    dist.all_gather_object(hosts, (socket.gethostname(), seen))
    barrier()
    if is_main():
        probe.unlink(missing_ok=True)
    if blind := sorted({host for host, ok in hosts if not ok}):
        raise RecipeError(
            f"ranks on {', '.join(blind)} cannot see {folder} as rank 0 wrote it: across nodes, the run folder "
            "(EDGEDISTILL_RUNS_DIR) must be on storage every node shares (NFS, a cluster file system)"
        )


def check_same_precision(device_name: str, precision: str) -> None:
    """Refuse to train where the ranks chose different precisions: `runtime.precision: auto` chooses by each rank's
    GPU (bf16 where it computes it, fp16 with a loss scaler where not), and DDP averaging loss-scaled gradients with
    unscaled ones would let the ranks' models drift apart without a word. A no-op in one process; on a mismatch every
    rank raises, naming each rank's GPU and precision."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return
    chosen: list = [None] * dist.get_world_size()
    dist.all_gather_object(chosen, (socket.gethostname(), device_name, precision))
    if len({choice for _, _, choice in chosen}) > 1:
        ranks = "; ".join(f"rank {i} on {host}: {name}, {choice}" for i, (host, name, choice) in enumerate(chosen))
        raise RecipeError(
            f"the ranks would train in different precisions ({ranks}), so DDP would average unlike gradients: on "
            "GPUs of different kinds set runtime.precision for every rank, e.g. --runtime.precision=fp16 (or fp32)"
        )


def initialized() -> bool:
    return dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def is_main() -> bool:
    return not dist.is_initialized() or dist.get_rank() == 0


def gather(obj) -> list | None:
    """Every rank's `obj` in rank order on rank 0, None on the others; `[obj]` in one process."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if is_main() else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast(obj):
    """Rank 0's `obj` on every rank; `obj` itself in one process."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def mean_over_ranks(mean: float, count: int, device: torch.device) -> float:
    """The mean over every rank's examples of a figure whose mean over this rank's `count` examples is `mean` (0 for
    none); `mean` itself in one process."""
    if not dist.is_initialized():
        return mean
    both = torch.tensor([mean * count, count], dtype=torch.float64, device=device)
    dist.all_reduce(both)
    return (both[0] / both[1]).item()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def wait_for_main() -> None:
    """Hold every other rank until rank 0 makes this call too, however long rank 0 takes to: a collective (`barrier`)
    fails after the process group's timeout (`runtime.collective_timeout_s`), and torchrun then ends the job,
    while rank 0 may wait longer for a stage's lock that another job holds. Every rank makes these calls in the same
    order: the n-th call of each waits for rank 0's n-th. A no-op in one process."""
    if not dist.is_initialized():
        return
    store = distributed_c10d._get_default_store()  # the process group's own: torch has no public getter for it
    key = f"edgedistill/rank-0-reached/{next(_main_calls)}"
    if is_main():
        store.set(key, "1")
        return
    while not store.check([key]):
        time.sleep(WAIT_POLL_S)


def run_stage(stage, force: bool = False):
    """Run a `common.stage.Stage` on every rank. Every rank decides whether to build it once rank 0 holds its
    lock (and has put back what a publish killed half-way left), so that all skip it or all build it even while
    another job holds the lock for hours; the others then wait until rank 0 has published its artifact, so the next
    stage finds it."""
    stage.parents_built()
    with stage.lock() if is_main() else contextlib.nullcontext():
        wait_for_main()
        manifest = stage.run_locked(force)
    wait_for_main()
    return manifest


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
