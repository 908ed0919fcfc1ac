"""The server's own process: a stop while the model warms up."""

import signal
import subprocess
import sys

import pytest

from tests.serve import conftest
from tests.serve.conftest import serve_command

EXIT_WAIT_S = 2.0  # an exit "at once", with room for a loaded machine

# `python -m edgedistill.serve` whose warm-up takes 5 s, saying `warming_up` as it begins
SLOW_WARM_UP = """
import json, runpy, sys, time
from edgedistill.serve.host import ModelRuntime

def warm_up(self):
    print(json.dumps({"event": "warming_up"}), file=sys.stderr, flush=True)
    time.sleep(5)
    warmed(self)

warmed, ModelRuntime.warm_up = ModelRuntime.warm_up, warm_up
runpy.run_module("edgedistill.serve", run_name="__main__", alter_sys=True)
"""


@pytest.fixture
def stopped_while_warming_up(spawn, bundle, monkeypatch):
    """A server sent SIGTERM while it warms up its model (for 5 s, `SLOW_WARM_UP`); its exit status, or None when it
    runs on past `EXIT_WAIT_S`."""
    monkeypatch.setattr(
        conftest, "serve_command", lambda *args: [sys.executable, "-c", SLOW_WARM_UP, *serve_command(*args)[3:]]
    )
    server = spawn(bundle)
    server.wait_for("warming_up", timeout=60)
    server.proc.send_signal(signal.SIGTERM)
    try:
        server.status = server.proc.wait(EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        server.status = None
    return server


def test_a_sigterm_while_warming_up_exits_zero_at_once(stopped_while_warming_up):
    assert stopped_while_warming_up.status == 0


def test_a_sigterm_while_warming_up_never_serves(stopped_while_warming_up):
    with pytest.raises(AssertionError, match="no 'serving' log line"):  # read to the end of its log
        stopped_while_warming_up.wait_for("serving")


def test_a_sigterm_while_warming_up_logs_stopped_with_its_signal(stopped_while_warming_up):
    assert stopped_while_warming_up.wait_for("stopped")["reason"] == "signal SIGTERM"
