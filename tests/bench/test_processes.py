"""Server and load-generator subprocesses: started until SERVING, stopped with SIGTERM, failures quoting their log."""

import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from edgedistill.bench import BenchError, environ, processes
from edgedistill.bench.peers.model import session_settings
from edgedistill.bench.processes import finish, free_port, measured_server, running, served_settings, start
from edgedistill.serve.settings import SettingsError

from tests.serve.conftest import write_engine
from tests.serve.test_cascade import make_cascade


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


def test_a_picked_port_lies_below_the_kernels_ephemeral_range(tmp_path):
    (tmp_path / "range").write_text("32768\t60999\n")
    assert processes.PICK_FLOOR <= free_port(tmp_path / "range") < 32768


def test_ports_picked_one_after_another_differ():
    assert len({free_port() for _ in range(50)}) == 50


def test_a_port_someone_holds_is_not_picked(tmp_path, monkeypatch):
    (tmp_path / "range").write_text("32768 60999")
    first = free_port(tmp_path / "range")
    monkeypatch.setattr(processes, "_next_pick", first - processes.PICK_FLOOR)  # look at `first` first again
    with socket.socket() as held:
        held.bind(("127.0.0.1", first))
        assert free_port(tmp_path / "range") != first


def locked_elsewhere(claims: Path, port: int) -> bool:
    """Whether `port`'s claim in `claims` is held: a lock of another open file fails, as in another process."""
    with (claims / str(port)).open("a") as other:
        try:
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def test_a_picked_port_stays_claimed_against_other_pickers(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "CLAIMS", tmp_path)
    assert locked_elsewhere(tmp_path, free_port())


def test_a_port_another_picker_claimed_is_not_picked(tmp_path, monkeypatch):
    monkeypatch.setattr(processes, "CLAIMS", tmp_path / "claims")
    (tmp_path / "range").write_text("32768 60999")
    first = free_port(tmp_path / "range")
    monkeypatch.setattr(processes, "_next_pick", first - processes.PICK_FLOOR)  # look at `first` first again
    assert free_port(tmp_path / "range") != first


def test_a_folder_where_claims_cannot_be_written_still_gives_a_port(tmp_path, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setattr(processes, "CLAIMS", tmp_path / "file" / "claims")
    assert processes.PICK_FLOOR <= free_port() < processes.ephemeral_low()


def test_a_kernel_without_an_ephemeral_range_gives_a_port_of_port_0(tmp_path):
    assert free_port(tmp_path / "absent") >= processes.ephemeral_low()


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


def running_on(pid: int) -> bool:
    """Whether `pid` runs (an exited child its new parent has not reaped yet does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


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
    deadline = time.monotonic() + 10
    while running_on(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running_on(child)


INTERRUPTED_WHILE_MEASURING = """
import sys, time
from pathlib import Path
import psutil
from edgedistill.bench.processes import free_port, running
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


def test_a_measured_server_is_one_process_on_loopback(bundle):
    _, settings = measured_server(bundle, 2)
    assert settings.host == "127.0.0.1"
    assert settings.workers == 1
    assert settings.threads == 2


def test_a_measured_server_of_a_tensorrt_engine_is_given_no_threads(tmp_path):
    _, settings = measured_server(write_engine(tmp_path / "engine"), 2)
    assert settings.threads == 0


def test_a_measured_server_given_tls_is_refused_at_once(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TLS_CERT", "cert.pem")
    monkeypatch.setenv("EDGEDISTILL_TLS_KEY", "key.pem")
    with pytest.raises(BenchError, match="measurements call the server over plaintext"):
        measured_server(bundle, 1)


@pytest.mark.parametrize("variable", ["EDGEDISTILL_THREADS", "EDGEDISTILL_WORKERS", "EDGEDISTILL_PORT"])
def test_a_variable_a_measured_servers_flag_would_override_is_refused_naming_it(bundle, monkeypatch, variable):
    monkeypatch.setenv(variable, "4")
    with pytest.raises(BenchError, match=f"{variable} would do nothing: a measurement sets the server's"):
        measured_server(bundle, 1)


def test_a_measured_server_takes_its_port_over_a_kubernetes_service_link_that_sets_the_ports_variable(
    bundle, monkeypatch
):
    monkeypatch.setenv("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051")  # the link of a Service named `edgedistill`
    flags, settings = measured_server(bundle, 1)
    assert settings.port == int(flags[flags.index("--port") + 1])


def test_a_bundles_session_settings_are_read_past_a_kubernetes_service_link_that_sets_the_port(monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_PORT", "tcp://10.0.0.5:50051")  # the benchmark's bare and peer models read these
    assert session_settings(3).threads == 3


# Where an operator exports them for the server they deploy (the Kubernetes manifests' METRICS_HOST)
OPERATORS_METRICS = {"EDGEDISTILL_METRICS_HOST": "0.0.0.0", "EDGEDISTILL_METRICS_PORT": "8002"}


@pytest.fixture
def operators_metrics(monkeypatch):
    """This environment with the operator's metrics variables, whose note is not said yet in this process."""
    for name, value in OPERATORS_METRICS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(processes, "_said", set())


def test_a_measured_server_starts_where_the_operator_exports_metrics_host(bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_METRICS_HOST", "0.0.0.0")  # with the measurement's metrics off: refused by serve
    flags, settings = measured_server(bundle, 1)
    with running("edgedistill.serve", flags, settings.port, tmp_path / "server.log") as process:
        assert process.is_running()


def test_a_measured_server_runs_with_its_metrics_off_where_the_operator_exports_them(bundle, operators_metrics):
    _, settings = measured_server(bundle, 1)
    assert settings.metrics_port is None


def test_a_measured_server_binds_its_metrics_to_loopback_where_the_operator_exports_them(bundle, operators_metrics):
    _, settings = measured_server(bundle, 1)
    assert settings.metrics_host == "127.0.0.1"


def test_the_operators_metrics_variables_change_no_measured_setting(bundle, monkeypatch):
    measured = served_settings(bundle, 1)
    for name, value in OPERATORS_METRICS.items():
        monkeypatch.setenv(name, value)
    assert served_settings(bundle, 1) == measured


def test_the_metrics_variables_left_out_of_the_servers_are_named_once(operators_metrics, tmp_path, capsys):
    for attempt in range(2):
        port = free_port()
        with running("edgedistill.bench.servers", ["--port", str(port)], port, tmp_path / f"echo-{attempt}.log"):
            pass
    err = capsys.readouterr().err
    assert err.count("EDGEDISTILL_METRICS_HOST, EDGEDISTILL_METRICS_PORT left out") == 1


def test_a_variable_left_out_is_named_once_where_another_server_leaves_out_more(operators_metrics, capsys):
    # bench cascade: its last member alone runs without CASCADE_OVERLOAD as well, the cascade with it
    processes.say_left_out(("EDGEDISTILL_METRICS_HOST",))
    processes.say_left_out(("EDGEDISTILL_METRICS_HOST", "EDGEDISTILL_CASCADE_OVERLOAD"))
    assert capsys.readouterr().err.count("EDGEDISTILL_METRICS_HOST") == 1


def test_a_cascades_overload_is_said_to_be_left_out_of_the_single_bundles_alone(operators_metrics, capsys):
    processes.say_left_out(("EDGEDISTILL_CASCADE_OVERLOAD",))
    assert "EDGEDISTILL_CASCADE_OVERLOAD left out of the environment of the single bundles measured here" in (
        capsys.readouterr().err
    )


def test_the_metrics_variables_left_out_are_said_without_the_cascades_reason(operators_metrics, capsys):
    processes.say_left_out(("EDGEDISTILL_METRICS_HOST",))
    assert "cascade" not in capsys.readouterr().err


def test_a_measured_single_bundle_starts_where_the_operator_exports_a_cascades_overload(bundle, monkeypatch, tmp_path):
    monkeypatch.setenv("EDGEDISTILL_CASCADE_OVERLOAD", "refuse")  # refused by serve for a single bundle
    flags, settings = measured_server(bundle, 1)
    with running("edgedistill.serve", flags, settings.port, tmp_path / "server.log") as process:
        assert process.is_running()


def test_a_measured_single_bundle_runs_without_a_cascades_overload(bundle):
    assert environ.CASCADE_VARIABLES[0] in processes.left_out_of(processes.serve_flags(bundle, 0, 1))


def test_a_measured_cascade_runs_with_its_overload_setting(tmp_path):
    flags = processes.serve_flags(make_cascade(tmp_path), 0, 1)
    assert environ.CASCADE_VARIABLES[0] not in processes.left_out_of(flags)


def test_a_measured_server_runs_with_the_operators_other_settings(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_MAX_QUEUED", "64")
    left_out = processes.left_out_of(processes.serve_flags(bundle, 0, 1))
    assert environ.server_environ(left_out=left_out)["EDGEDISTILL_MAX_QUEUED"] == "64"


def test_a_blank_token_for_a_measured_server_is_refused_naming_the_variable_alone(bundle, monkeypatch):
    monkeypatch.setenv("EDGEDISTILL_TOKEN", "")
    with pytest.raises(
        SettingsError,
        match=r"invalid settings: EDGEDISTILL_TOKEN: must not be empty, .*: unset the "
        r"variable to serve without a token$",
    ):
        processes.measured_settings(processes.serve_flags(bundle, 0, 1))


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
