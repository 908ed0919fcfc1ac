"""The process group's checks, with two real gloo processes on this machine."""

import pytest
import torch.distributed as torch_dist
from edgedistill.common.recipe import RecipeError
from edgedistill.distill import dist

from tests.distill.ranks import on_two_ranks


def _check(folders: list[str]) -> str:
    """What `check_shared` says on this rank, given its own folder of `folders`."""
    try:
        dist.check_shared(folders[torch_dist.get_rank()])
        return "ok"
    except RecipeError as err:
        return str(err)


def check_from_two_ranks(tmp_path, folders: list[str]) -> dict[int, str]:
    """What `check_shared` said on each of two ranks, each given its own folder."""
    return on_two_ranks(tmp_path, _check, folders)


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
