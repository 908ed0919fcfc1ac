"""A stage whose runs folder fills up, or cannot be written, stops with one line naming it, not a traceback."""

import subprocess
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, small_tmpfs
from tests.faults.conftest import environment, tiny_recipe

pytestmark = pytest.mark.slow


def last_line(result: subprocess.CompletedProcess) -> str:
    return result.stderr.strip().splitlines()[-1]


def teacher(runs, tmp_path) -> subprocess.CompletedProcess:
    """`edgedistill teacher` of the tiny recipe with its runs folder in `runs`."""
    return subprocess.run(
        [PYTHON, "-m", "edgedistill", "teacher", str(tiny_recipe(tmp_path))],
        cwd=ROOT,
        env=environment(runs),
        capture_output=True,
        text=True,
        timeout=600,
    )


@pytest.fixture(scope="module")
def teacher_on_a_full_device(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The teacher with its runs folder on a 3 MiB file system; that folder."""
    folder = tmp_path_factory.mktemp("full")
    with small_tmpfs(folder / "small") as runs:
        yield teacher(runs, folder), runs


def test_a_full_runs_folder_stops_the_stage_with_one_line(teacher_on_a_full_device):
    result, runs = teacher_on_a_full_device
    assert last_line(result).startswith(f"error: no space left on the device of {runs}")


def test_a_full_runs_folder_prints_no_traceback(teacher_on_a_full_device):
    result, _ = teacher_on_a_full_device
    assert "Traceback" not in result.stderr


@pytest.fixture(scope="module")
def teacher_on_a_read_only_device(tmp_path_factory) -> tuple[subprocess.CompletedProcess, Path]:
    """The teacher with its runs folder on a read-only file system; that folder."""
    folder = tmp_path_factory.mktemp("read-only")
    with small_tmpfs(folder / "small") as runs:
        subprocess.run(["mount", "-o", "remount,ro", str(runs)], check=True)
        yield teacher(runs, folder), runs


def test_a_read_only_runs_folder_stops_the_stage_with_one_line(teacher_on_a_read_only_device):
    result, runs = teacher_on_a_read_only_device
    assert last_line(result).startswith(f"error: Read-only file system: {runs}")


def test_a_read_only_runs_folder_prints_no_traceback(teacher_on_a_read_only_device):
    result, _ = teacher_on_a_read_only_device
    assert "Traceback" not in result.stderr
