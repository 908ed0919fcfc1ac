"""A stage whose runs folder fills up, or cannot be written, stops with one line naming it, not a traceback."""

import subprocess

import pytest

from tests.conftest import PYTHON, ROOT
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


@pytest.fixture
def teacher_on_a_full_device(small_fs, tmp_path) -> subprocess.CompletedProcess:
    """The teacher with its runs folder on a 3 MiB file system."""
    return teacher(small_fs, tmp_path)


def test_a_full_runs_folder_stops_the_stage_with_one_line(teacher_on_a_full_device, small_fs):
    assert (
        teacher_on_a_full_device.stderr.strip()
        .splitlines()[-1]
        .startswith(f"error: no space left on the device of {small_fs}")
    )


def test_a_full_runs_folder_prints_no_traceback(teacher_on_a_full_device):
    assert "Traceback" not in teacher_on_a_full_device.stderr


@pytest.fixture
def teacher_on_a_read_only_device(small_fs, tmp_path) -> subprocess.CompletedProcess:
    """The teacher with its runs folder on a read-only file system."""
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    return teacher(small_fs, tmp_path)


def test_a_read_only_runs_folder_stops_the_stage_with_one_line(teacher_on_a_read_only_device, small_fs):
    assert last_line(teacher_on_a_read_only_device).startswith(f"error: Read-only file system: {small_fs}")


def test_a_read_only_runs_folder_prints_no_traceback(teacher_on_a_read_only_device):
    assert "Traceback" not in teacher_on_a_read_only_device.stderr
