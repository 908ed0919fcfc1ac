"""A child that asked to die with its parent does, however the parent ends."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest
from edgedistill.common.processes import python_module

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


def gone(pid: int, within_s: float = 10.0) -> bool:
    """Whether process `pid` has ended (or is a zombie) within `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)


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
