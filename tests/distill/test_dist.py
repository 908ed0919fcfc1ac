"""The process group's checks, with two real gloo processes on this machine."""

import multiprocessing

import pytest
import torch.distributed as torch_dist
from edgedistill.common.recipe import RecipeError
from edgedistill.distill import dist


def _rank(rank: int, store: str, folders: list[str], results) -> None:
    torch_dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        dist.check_shared(folders[rank])
        results.put((rank, "ok"))
    except RecipeError as err:
        results.put((rank, str(err)))
    finally:
        torch_dist.destroy_process_group()


def check_from_two_ranks(tmp_path, folders: list[str]) -> dict[int, str]:
    """What `check_shared` said on each of two ranks, each given its own folder."""
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    procs = [context.Process(target=_rank, args=(r, str(tmp_path / "store"), folders, results)) for r in (0, 1)]
    for proc in procs:
        proc.start()
    said = dict(results.get(timeout=60) for _ in procs)
    for proc in procs:
        proc.join(30)
    return said


def test_ranks_that_share_the_run_folder_pass(tmp_path):
    shared = str(tmp_path / "runs")
    assert check_from_two_ranks(tmp_path, [shared, shared]) == {0: "ok", 1: "ok"}


def test_the_probe_is_removed_after_the_check(tmp_path):
    shared = tmp_path / "runs"
    check_from_two_ranks(tmp_path, [str(shared), str(shared)])
    assert not (shared / dist.SHARED_PROBE).exists()


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_cannot_see_the_run_folder_fails_on_every_rank(tmp_path, rank):
    said = check_from_two_ranks(tmp_path, [str(tmp_path / "node-a"), str(tmp_path / "node-b")])
    assert "must be on storage every node shares" in said[rank]


def test_one_process_is_not_checked(tmp_path):
    dist.check_shared(tmp_path / "runs")
    assert not (tmp_path / "runs").exists()
