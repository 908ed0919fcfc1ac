"""deploy/wait_serving.py, the container and wheel tests' wait for SERVING: its exit status."""

import subprocess
import sys

from tests.conftest import ROOT
from tests.serve.conftest import RunningServer, settings_for, write_bundle
from tests.serve.test_client import unused_address

SCRIPT = ROOT / "deploy" / "wait_serving.py"


def wait(*args: str) -> int:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, timeout=60).returncode


def test_a_serving_server_exits_0(tmp_path):
    server = RunningServer(settings_for(write_bundle(tmp_path / "bundle-tiny")))
    try:
        assert wait(server.address, "30") == 0
    finally:
        server.close()


def test_a_server_process_that_is_gone_exits_1_at_once():
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert wait(unused_address(), "600", str(gone.pid)) == 1


def test_nothing_serving_within_the_seconds_exits_1():
    assert wait(unused_address(), "0.5") == 1
