"""Server and load-generator subprocesses: started until SERVING, stopped with SIGTERM, failures quoting their log."""

import os
import signal
import subprocess
import sys
import time

import pytest
from edgedistill.bench import BenchError
from edgedistill.bench.environ import measured_server
from edgedistill.bench.ports import free_port
from edgedistill.bench.processes import finish, held, running, start

from tests.conftest import gone


def test_a_server_runs_until_the_block_ends_and_stops_cleanly(tmp_path):
    port = free_port()
    with running("edgedistill.bench.servers", ["--port", str(port)], port, tmp_path / "echo.log") as process:
        assert process.is_running()
    assert not process.is_running()
    assert f"echo server on port {port}" in (tmp_path / "echo.log").read_text()


def test_a_server_that_exits_at_start_is_reported_with_its_log(tmp_path):
    port = free_port()
    failed = pytest.raises(BenchError, match=r"(?s)bench.servers exited with 2 at start; its log ends:.*--port")
    with failed, running("edgedistill.bench.servers", ["--port", "not-a-port"], port, tmp_path / "bad.log"):
        pass


def killed(process) -> None:
    """SIGKILL `process` and wait until it is dead, not reaped: the benchmark's own poll is to find it so."""
    process.kill()
    while os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None:
        time.sleep(0.05)


def test_a_server_that_dies_in_use_is_reported_as_such(tmp_path):
    port = free_port()
    died = pytest.raises(BenchError, match=r"bench.servers exited with -9 while in use, before SIGTERM")
    with died, running("edgedistill.bench.servers", ["--port", str(port)], port, tmp_path / "echo.log") as process:
        killed(process)


def test_a_server_that_dies_in_use_is_reported_as_such_where_the_block_fails_on_its_death(tmp_path):
    port = free_port()
    died = pytest.raises(BenchError, match=r"(?s)bench.servers exited with -9 while in use, before SIGTERM; its log")
    with died, running("edgedistill.bench.servers", ["--port", str(port)], port, tmp_path / "echo.log") as process:
        killed(process)
        raise BenchError("no call succeeded; failures by status: {'UNAVAILABLE': 3}")


def test_a_measurement_that_fails_while_the_server_runs_quotes_its_log(tmp_path):
    port = free_port()
    failed = pytest.raises(
        BenchError, match=rf"(?s)^no call succeeded.*servers's log \(echo.log\) ends:\necho server on port {port}"
    )
    with failed, running("edgedistill.bench.servers", ["--port", str(port)], port, tmp_path / "echo.log"):
        raise BenchError("no call succeeded; failures by status: {'UNAVAILABLE': 3}")


def test_finish_kills_a_process_that_hangs(tmp_path):
    process = start([sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "sleep.log")
    assert finish(process, 0.5) is None
    assert process.poll() is not None


def test_finish_gives_the_exit_status(tmp_path):
    process = start([sys.executable, "-c", "print('done'); raise SystemExit(3)"], tmp_path / "exit.log")
    assert finish(process, 30) == 3
    assert (tmp_path / "exit.log").read_text() == "done\n"


STARTS_A_SLEEPER = """
import sys
from pathlib import Path
from edgedistill.bench.processes import start
child = start([sys.executable, "-c", "import time; time.sleep(120)"], Path(sys.argv[1]))
print(child.pid, flush=True)
sys.stdin.readline()
"""


def test_a_killed_measurement_takes_its_processes_with_it(tmp_path):
    measurement = subprocess.Popen(
        [sys.executable, "-c", STARTS_A_SLEEPER, str(tmp_path / "sleep.log")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    child = int(measurement.stdout.readline())
    measurement.kill()
    measurement.wait()
    assert gone(child)


INTERRUPTED_WHILE_MEASURING = """
import sys, time
from pathlib import Path
import psutil
from edgedistill.bench.ports import free_port
from edgedistill.bench.processes import running
port = free_port()
with running("edgedistill.bench.servers", ["--port", str(port)], port, Path(sys.argv[1])) as server:
    try:
        print("serving", flush=True)
        for _ in range(1200):  # short sleeps: a signal a gRPC thread takes wakes no long one of the main thread
            time.sleep(0.1)
    except KeyboardInterrupt:
        time.sleep(2)  # time enough for a server that took the Ctrl-C too to stop
        live = server.is_running() and server.status() != psutil.STATUS_ZOMBIE  # sleeping or running: not exited
        print("server", "live" if live else "gone", flush=True)
        raise
"""


def test_a_ctrl_c_at_the_terminal_reaches_the_measurement_and_not_its_server(tmp_path):
    measurement = subprocess.Popen(
        [sys.executable, "-c", INTERRUPTED_WHILE_MEASURING, str(tmp_path / "echo.log")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the terminal's foreground process group, which a Ctrl-C signals whole
        # as a terminal's foreground job has it: a test run started in the background (`&` in a script) ignores it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    assert measurement.stdout.readline() == "serving\n"
    os.killpg(measurement.pid, signal.SIGINT)
    out, err = measurement.communicate(timeout=60)
    assert out == "server live\n", err


ABORTS_FORKED_CHILDREN = """
import ctypes, sys
from pathlib import Path
from edgedistill.bench.processes import start
libc = ctypes.CDLL(None)
libc.__register_atfork(None, None, ctypes.cast(libc.abort, ctypes.c_void_p), None)  # abort in every forked child
print(start([sys.executable, "-c", "pass"], Path(sys.argv[1])).wait())
"""


def test_a_child_starts_whatever_the_at_fork_handlers_of_its_parent(tmp_path):
    """gRPC's at-fork handlers can abort a forked child before it execs; `start` runs none of them in the child."""
    parent = subprocess.run(
        [sys.executable, "-c", ABORTS_FORKED_CHILDREN, str(tmp_path / "child.log")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert parent.stdout.strip() == "0", parent.stderr[-2000:]


def test_a_started_child_keeps_the_pid_it_was_started_with(tmp_path):
    """The launcher that ties the child to this process becomes the command: its CPU and memory are sampled by pid."""
    process = start([sys.executable, "-c", "import os; print(os.getpid())"], tmp_path / "pid.log")
    assert finish(process, 30) == 0
    assert (tmp_path / "pid.log").read_text() == f"{process.pid}\n"


def test_a_measured_server_starts_where_the_operator_exports_metrics_host(bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_METRICS_HOST", "0.0.0.0")  # with the measurement's metrics off: refused by serve
    flags, settings = measured_server(bundle, 1)
    with running("edgedistill.serve", flags, settings.port, tmp_path / "server.log") as process:
        assert process.is_running()


def test_a_measured_server_starts_where_the_operator_exports_a_start_timeout(bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_START_TIMEOUT_S", "600")  # a supervisor's: refused by serve for one process
    flags, settings = measured_server(bundle, 1)
    with running("edgedistill.serve", flags, settings.port, tmp_path / "server.log") as process:
        assert process.is_running()


def test_a_measured_single_bundle_starts_where_the_operator_exports_a_cascades_overload(bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_CASCADE_OVERLOAD", "refuse")  # refused by serve for a single bundle
    flags, settings = measured_server(bundle, 1)
    with running("edgedistill.serve", flags, settings.port, tmp_path / "server.log") as process:
        assert process.is_running()


def test_two_measured_servers_start_side_by_side_where_the_operator_exports_a_health_port(
    bundle, monkeypatch, tmp_path
):
    monkeypatch.setenv("EDGEDISTILL_HEALTH_PORT", str(free_port()))  # each server would bind it
    first, second = measured_server(bundle, 1), measured_server(bundle, 1)
    with (
        running("edgedistill.serve", first[0], first[1].port, tmp_path / "first.log"),
        running("edgedistill.serve", second[0], second[1].port, tmp_path / "second.log") as process,
    ):
        assert process.is_running()


def test_a_held_process_whose_launcher_cannot_start_is_a_bench_error():
    broken = dict(os.environ, PYTHONHOME="/nonexistent")  # the launcher's interpreter fails before it says it is ready
    with pytest.raises(BenchError, match="did not start"):
        held([sys.executable, "-c", "pass"], env=broken, stderr=subprocess.STDOUT)
