"""A child that asked to die with its parent does, however the parent ends."""

import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
from edgedistill.common.processes import READY, dying_with_this_process, python_module

from tests.conftest import gone

PARENT = textwrap.dedent(
    """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", sys.argv[1], str(os.getpid())])
    print(child.pid, flush=True)
    time.sleep(600)
    """
)
CHILD = textwrap.dedent(
    """
    import sys, time
    from edgedistill.common.processes import die_with_parent
    die_with_parent(int(sys.argv[1]))
    print("ready", flush=True)
    time.sleep(600)
    """
)


def child_ends_with_parent(parent: subprocess.Popen, child: int, sig: signal.Signals) -> bool:
    """Send `sig` to `parent`: whether its `child` ends too; neither is left running whatever the answer."""
    try:
        os.kill(parent.pid, sig)
        parent.wait(10)
        return gone(child)
    finally:
        parent.kill()
        if not gone(child, 0):
            os.kill(child, signal.SIGKILL)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_the_child_dies_when_its_parent_is_killed(sig):
    parent = subprocess.Popen([sys.executable, "-c", PARENT, CHILD], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    assert parent.stdout.readline().strip() == "ready"
    assert child_ends_with_parent(parent, child, sig)


def test_a_child_exits_at_once_when_the_named_parent_is_not_its_parent():
    done = subprocess.run([sys.executable, "-c", CHILD, "1"], capture_output=True, text=True, timeout=60)
    assert "is gone" in done.stderr


def test_a_python_module_runs_with_the_working_directory_off_sys_path(tmp_path):
    shadow = tmp_path / "edgedistill"  # as a checkout's top folder, which holds the CLI alone
    shadow.mkdir()
    (shadow / "__init__.py").write_text("raise ImportError('edgedistill imported from the working directory')\n")
    done = subprocess.run(python_module("edgedistill.serve", "--help"), cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr


def held_writer(path) -> subprocess.Popen:
    """A held launcher of a command that creates `path`, ready (it said `READY`)."""
    command = [sys.executable, "-c", f"open({str(path)!r}, 'w').close()"]
    launcher = subprocess.Popen(
        dying_with_this_process(command, held=True),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert launcher.stdout.readline() == READY
    return launcher


def test_a_held_command_has_not_started_when_its_launcher_says_it_is_ready(tmp_path):
    launcher = held_writer(tmp_path / "ran")
    try:
        assert "edgedistill.common.processes" in psutil.Process(launcher.pid).cmdline()
    finally:
        launcher.kill()
        launcher.wait()


def test_a_held_command_runs_once_released(tmp_path):
    launcher = held_writer(tmp_path / "ran")
    launcher.communicate(b"\0", timeout=60)
    assert (tmp_path / "ran").exists()


def test_a_held_command_never_released_does_not_run(tmp_path):
    launcher = held_writer(tmp_path / "ran")
    _, err = launcher.communicate(timeout=60)  # stdin closed with no byte: the caller gave up, or died
    assert (tmp_path / "ran").exists() is False, err


def test_a_held_launcher_whose_stdin_closes_says_its_command_was_never_released(tmp_path):
    launcher = held_writer(tmp_path / "ran")
    _, err = launcher.communicate(timeout=60)
    assert "was never released" in err.decode()
