"""The process group's checks, with two real gloo processes on this machine."""

import contextlib
import io
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest
import torch.distributed as torch_dist
from edgedistill.bench.ports import free_port
from edgedistill.common import manifest as mf
from edgedistill.common import stage as stage_module
from edgedistill.common.atomic import temporary_name
from edgedistill.common.recipe import RecipeError, load_recipe
from edgedistill.common.stage import Artifact, Built, Stage
from edgedistill.distill import dist

from tests.conftest import PYTHON
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


def _environment_variable(name: str) -> str | None:
    return os.environ.get(name)


def test_ranks_see_the_environment_of_the_test_that_starts_them(tmp_path, monkeypatch):
    (tmp_path / "before").mkdir()
    on_two_ranks(tmp_path / "before", _environment_variable, "PATH")  # the ranks' server runs from here on
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "this-test"))
    said = on_two_ranks(tmp_path, _environment_variable, "EDGEDISTILL_RUNS_DIR")
    assert said == {0: str(tmp_path / "this-test"), 1: str(tmp_path / "this-test")}


def test_ranks_that_share_the_run_folder_pass(tmp_path):
    shared = str(tmp_path / "runs")
    assert check_from_two_ranks(tmp_path, [shared, shared]) == {0: "ok", 1: "ok"}


def test_the_probe_is_removed_after_the_check(tmp_path):
    shared = tmp_path / "runs"
    check_from_two_ranks(tmp_path, [str(shared), str(shared)])
    assert list(shared.iterdir()) == []


def _check_while_another_launch_probes(folder: str) -> str:
    """What `check_shared` says on this rank when, once rank 0 has written its probe, another launch's rank 0 writes
    its own into the same run folder."""
    broadcast = torch_dist.broadcast_object_list

    def then_another_launch_probes(*args, **kwargs):
        broadcast(*args, **kwargs)
        if torch_dist.get_rank() == 0:
            dist.probe_file(Path(folder), "another-launch").write_text("another-launch")
        torch_dist.barrier()  # before rank 1 reads the probe

    torch_dist.broadcast_object_list = then_another_launch_probes
    return _check([folder, folder])


def test_another_launch_probing_the_same_run_folder_does_not_make_the_check_refuse(tmp_path):
    shared = str(tmp_path / "runs")
    assert on_two_ranks(tmp_path, _check_while_another_launch_probes, shared) == {0: "ok", 1: "ok"}


@pytest.mark.parametrize("rank", [0, 1])
def test_a_rank_that_cannot_see_the_run_folder_fails_on_every_rank(tmp_path, rank):
    said = check_from_two_ranks(tmp_path, [str(tmp_path / "node-a"), str(tmp_path / "node-b")])
    assert "must be on storage every node shares" in said[rank]


def test_one_process_is_not_checked(tmp_path):
    dist.check_shared(tmp_path / "runs")
    assert not (tmp_path / "runs").exists()


def _check_precision(precisions: list[str]) -> str:
    """What `check_same_precision` says on this rank, given its own precision of `precisions`."""
    try:
        dist.check_same_precision("cpu", precisions[torch_dist.get_rank()])
        return "ok"
    except RecipeError as err:
        return str(err)


def test_ranks_of_one_precision_pass(tmp_path):
    assert on_two_ranks(tmp_path, _check_precision, ["fp16", "fp16"]) == {0: "ok", 1: "ok"}


@pytest.mark.parametrize("rank", [0, 1])
def test_ranks_of_different_precisions_fail_on_every_rank_naming_each(tmp_path, rank):
    said = on_two_ranks(tmp_path, _check_precision, ["bf16", "fp16"])
    assert "rank 0 on" in said[rank] and "cpu, bf16; rank 1 on" in said[rank] and "cpu, fp16)" in said[rank]


def test_a_mismatch_names_the_setting_to_set_for_every_rank(tmp_path):
    said = on_two_ranks(tmp_path, _check_precision, ["bf16", "fp16"])
    assert "set runtime.precision for every rank" in said[0]


def _build_on_rank_0(inputs):
    """A build body as the training stages have: rank 0 publishes, the others return None."""
    if torch_dist.get_rank() != 0:
        return None
    (Path(os.environ["EDGEDISTILL_RUNS_DIR"]) / "builds").open("a").write("built\n")
    return Built(lambda folder: (folder / "a.txt").write_text("x"), line="built", size_of="a.txt")


def _run_stage(recipe_path: str, runs: str) -> bool:
    """`dist.run_stage` of a small stage on this rank; whether this rank then finds its artifact."""
    os.environ["EDGEDISTILL_RUNS_DIR"] = runs
    stage = Stage("up", load_recipe(recipe_path), ("data",), _build_on_rank_0)
    dist.run_stage(stage)
    return mf.staleness(stage.folder, stage.config_hash) is None


def small_recipe(folder: Path) -> Path:
    """A recipe in `folder` of a stage that reads `data` alone (`_build_on_rank_0`'s)."""
    recipe = folder / "r.yaml"
    recipe.write_text("data: {train: a.tsv, dev: b.tsv, label_names: [n, p]}\nmodel: {init: m}\n")
    return recipe


def built_by_another_job(tmp_path: Path, recipe: Path, runs: Path) -> None:
    """The stage of `recipe` built in `runs` by two ranks of an earlier job, run from `tmp_path/first`; a later job runs
    from `tmp_path/second`."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    on_two_ranks(tmp_path / "first", _run_stage, str(recipe), str(runs))


def test_two_ranks_build_a_stage_once_and_both_find_it(tmp_path):
    recipe = small_recipe(tmp_path)
    runs = tmp_path / "runs"
    assert on_two_ranks(tmp_path, _run_stage, str(recipe), str(runs)) == {0: True, 1: True}
    assert (runs / "builds").read_text() == "built\n"


def test_ranks_that_find_their_stage_built_by_another_job_skip_it_together(tmp_path):
    recipe = small_recipe(tmp_path)
    runs = tmp_path / "runs"
    built_by_another_job(tmp_path, recipe, runs)
    assert on_two_ranks(tmp_path / "second", _run_stage, str(recipe), str(runs)) == {0: True, 1: True}
    assert (runs / "builds").read_text() == "built\n"


def _found_current_restoring_slowly(recipe_path: str, runs: str) -> bool:
    """Whether `dist.run_stage` of a small stage found it current on this rank (the others' build returns None),
    where rank 0 takes a second to put back what a killed publish left (a slow file system)."""
    if torch_dist.get_rank() == 0:
        restore = stage_module.remove_orphans
        stage_module.remove_orphans = lambda *args, **kwargs: time.sleep(1) or restore(*args, **kwargs)
    os.environ["EDGEDISTILL_RUNS_DIR"] = runs
    return dist.run_stage(Stage("up", load_recipe(recipe_path), ("data",), _build_on_rank_0)) is not None


def test_ranks_skip_together_a_stage_a_killed_publish_left_aside(tmp_path, monkeypatch):
    recipe = small_recipe(tmp_path)
    runs = tmp_path / "runs"
    built_by_another_job(tmp_path, recipe, runs)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
    folder = Stage("up", load_recipe(recipe), ("data",), _build_on_rank_0).folder
    folder.rename(temporary_name(folder, "old", pid=os.getppid()))  # killed between the two renames of a publish
    found = on_two_ranks(tmp_path / "second", _found_current_restoring_slowly, str(recipe), str(runs), torchrun=True)
    assert found == {0: True, 1: True}


def test_a_stage_whose_parent_is_missing_leaves_no_lock_file(tmp_path, monkeypatch):
    recipe = small_recipe(tmp_path)
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(tmp_path / "runs"))
    stage = Stage("up", load_recipe(recipe), ("data",), _build_on_rank_0, (Artifact("bundle", tmp_path / "typo"),))
    with pytest.raises(mf.ArtifactError):
        dist.run_stage(stage)
    assert not stage.work.with_name("up.lock").exists()


def _run_stage_saying_so(recipe_path: str, runs: str) -> bool:
    """`_run_stage`, once this rank has written that it starts it into the runs folder."""
    (Path(runs) / f"rank-{torch_dist.get_rank()}-starts").touch()
    return _run_stage(recipe_path, runs)


def test_ranks_wait_for_a_stage_another_job_holds_past_their_collectives_timeout(tmp_path, monkeypatch):
    recipe = small_recipe(tmp_path)
    runs = tmp_path / "runs"
    monkeypatch.setenv("EDGEDISTILL_RUNS_DIR", str(runs))
    held = threading.Event()

    def another_job():  # holds the stage's lock until both ranks have waited twice their collectives' timeout
        with Stage("up", load_recipe(recipe), ("data",), _build_on_rank_0).lock():
            held.set()
            while len(list(runs.glob("rank-*-starts"))) < 2:
                time.sleep(0.1)
            time.sleep(4)

    threading.Thread(target=another_job, daemon=True).start()
    held.wait()
    assert on_two_ranks(tmp_path, _run_stage_saying_so, str(recipe), str(runs), timeout_s=2) == {0: True, 1: True}


def _said_by_run_stage(recipe_path: str, runs: str) -> str:
    """What `dist.run_stage` of a small stage printed on this rank, with `RANK` set as torchrun sets it."""
    os.environ["RANK"] = str(torch_dist.get_rank())
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        _run_stage(recipe_path, runs)
    return out.getvalue()


@pytest.fixture(scope="module")
def said_up_to_date(tmp_path_factory) -> dict[int, str]:
    """What each of two ranks printed on finding a stage another job built."""
    folder = tmp_path_factory.mktemp("said")
    recipe = folder / "r.yaml"
    recipe.write_text("data: {train: a.tsv, dev: b.tsv, label_names: [n, p]}\nmodel: {init: m}\n")
    (folder / "first").mkdir()
    (folder / "second").mkdir()
    on_two_ranks(folder / "first", _run_stage, str(recipe), str(folder / "runs"))
    return on_two_ranks(folder / "second", _said_by_run_stage, str(recipe), str(folder / "runs"))


def test_rank_0_says_a_stage_is_up_to_date(said_up_to_date):
    assert said_up_to_date[0].startswith("[up] up to date")


def test_the_other_ranks_say_nothing_of_an_up_to_date_stage(said_up_to_date):
    assert said_up_to_date[1] == ""


def _collective_timeout_s() -> float:
    return dist.collective_timeout().total_seconds()


def test_ranks_launched_by_torchrun_join_with_the_collectives_timeout_asked_for(tmp_path):
    assert on_two_ranks(tmp_path, _collective_timeout_s, timeout_s=7, torchrun=True) == {0: 7.0, 1: 7.0}


JOIN_ALONE = """
from edgedistill.distill import dist
try:
    dist.init("cpu", 1)
except dist.CollectiveTimeout as err:
    print(err)
"""


def test_a_rank_whose_others_never_join_names_the_setting_to_raise(tmp_path):
    # rank 0 of two, which never comes: the store's wait for it times out at the start, before any collective
    env = os.environ | {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    result = subprocess.run([PYTHON, "-c", JOIN_ALONE], env=env, capture_output=True, text=True, timeout=120)
    assert "rank 0 waited 1 s (runtime.collective_timeout_s) for the other ranks to join" in result.stdout, (
        result.stderr[-2000:]
    )
