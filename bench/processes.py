"""Subprocesses of a measurement: a server started until it reports SERVING and stopped with SIGTERM, or a
load generator run to its end; their output goes to a log file, whose tail a failure quotes."""

import fcntl
import os
import random
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import grpc
import psutil
from edgedistill.bench import BenchError
from edgedistill.bench.environ import CASCADE_VARIABLES, PORT_VARIABLES, server_environ
from edgedistill.common.cascade import ServedModels, is_cascade
from edgedistill.common.processes import dying_with_this_process, python_module
from edgedistill.common.settings import SettingError, refuse_measured_variables
from edgedistill.serve.client import bearer, health_serving, wait_ready
from edgedistill.serve.settings import Settings, load_settings

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 2000
PICK_FLOOR = 10000  # `free_port` picks at or above it: the ports below hold most fixed services


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
# where this process's next `free_port` looks first, apart from other processes' (whatever seed they gave `random`)
_next_pick = random.SystemRandom().randrange(1 << 16)
# the lock files of the ports this process picked, held open (locked) until it exits: `claim`
CLAIMS = Path(tempfile.gettempdir()) / f"edgedistill-ports-{os.getuid()}"
_claimed: list[int] = []


def ephemeral_low(range_file: Path = EPHEMERAL_RANGE) -> int | None:
    """The lowest port the kernel hands out for port 0 and outgoing connections, None where it does not say."""
    try:
        return int(range_file.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def bindable(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def claim(port: int) -> bool:
    """Whether this process now holds `port` among the user's pickers: an exclusive lock on its file in `CLAIMS`,
    held until the process exits, so that a picker in another process (a test worker beside it, a second benchmark)
    passes the port over while this one's server starts and runs. A folder that cannot be written claims nothing."""
    try:
        CLAIMS.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(CLAIMS / str(port), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _claimed.append(fd)
    return True


def free_port(range_file: Path = EPHEMERAL_RANGE) -> int:
    """A loopback TCP port nothing holds now, for a server started next, taken below the kernel's ephemeral range.

    A port in that range may be taken between this pick and the server's bind, which then fails: any outgoing
    connection may get it as its local port, and holds it for a minute more in TIME_WAIT. Below that range only
    an explicit bind takes a port. Each call in a process looks at the next port, from a random start, so that
    calls in one process do not give one port twice, and `claim`s it, so that calls in other processes do not give
    it meanwhile. Where the kernel does not give its range (not Linux), or nothing below it is free, a port of that
    range, as port 0 picks."""
    global _next_pick
    if (low := ephemeral_low(range_file)) is not None and low > PICK_FLOOR:
        span = low - PICK_FLOOR
        for _ in range(span):
            port = PICK_FLOOR + _next_pick % span
            _next_pick += 1
            if bindable(port) and claim(port):
                return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def left_out_of(command: list[str]) -> tuple[str, ...]:
    """The variables a measured server's `command` runs without: `PORT_VARIABLES`, and `CASCADE_VARIABLES` where
    its `--bundle` (`serve_flags`) is a single bundle."""
    bundle = command[command.index("--bundle") + 1] if "--bundle" in command else None
    single = bundle is not None and not is_cascade(bundle)
    return PORT_VARIABLES + (CASCADE_VARIABLES if single else ())


def measured_settings(flags: list[str]) -> Settings:
    """The settings a measured server given `flags` (`serve_flags`) runs with, in the environment it runs in;
    `BenchError` when those give it TLS, as measurements call over plaintext."""
    settings = load_settings(flags, server_environ(left_out=left_out_of(flags)), flags_taken=False)
    if settings.tls_cert is not None:
        raise BenchError("measurements call the server over plaintext loopback: unset EDGEDISTILL_TLS_CERT and _KEY")
    return settings


_said: set[str] = set()  # the variables `say_left_out` has named in this process


def say_left_out(names: tuple[str, ...]) -> None:
    """Say on stderr, once per process for each of `names`, that the servers measured here run without it, and why:
    a cascade and its last member alone (`bench cascade`) leave out different sets, and each is named once."""
    new = [name for name in names if name not in _said]
    _said.update(new)
    if ports := [name for name in new if name in PORT_VARIABLES]:
        print(
            f"[bench] {', '.join(ports)} left out of the environment of the servers measured here: the measurement "
            "sets their metrics (off, or on a loopback port of its own) and checks their health on the gRPC port; "
            "the server you deploy reads them as set",
            file=sys.stderr,
        )
    if cascade := [name for name in new if name in CASCADE_VARIABLES]:
        print(
            f"[bench] {', '.join(cascade)} left out of the environment of the single bundles measured here, which "
            "take no cascade setting; a cascade runs with it, as the one you deploy does",
            file=sys.stderr,
        )


def serve_flags(bundle: Path, port: int, threads: int, workers: int = 1, metrics_port: int | None = None) -> list[str]:
    """The flags of a measured `python -m serve`: `bundle` on loopback `port` with `threads` intra-op threads (0: the
    runtime's default; none for TensorRT engines alone) and `workers` processes, metrics on `metrics_port` (None:
    off), run in `server_environ`. `BenchError` where the environment sets one of the settings these flags set
    (`common.settings.refuse_measured_variables`)."""
    try:
        refuse_measured_variables()
    except SettingError as err:
        raise BenchError(str(err)) from None
    flags = ["--bundle", str(bundle), "--host", "127.0.0.1", "--port", str(port)]
    flags += ["--metrics-port", "off" if metrics_port is None else str(metrics_port), "--workers", str(workers)]
    # a TensorRT engine runs without ONNX Runtime's threads, and the server refuses THREADS for it
    return flags + (["--threads", str(threads)] if ServedModels.read(bundle).onnx_runtime else [])


def measured_server(bundle: Path, threads: int) -> tuple[list[str], Settings]:
    """The flags of one measured server process on `bundle` (`serve_flags`, on a free port) and the settings they
    give with `EDGEDISTILL_*` variables (`measured_settings`)."""
    # One server process: a driver's connection and the CPU figure sample one process.
    flags = serve_flags(bundle, free_port(), threads, workers=1)
    return flags, measured_settings(flags)


def call_metadata(settings: Settings) -> tuple:
    """The metadata a measurement's calls to a server of `settings` send: its TOKEN as a bearer token, if it has one."""
    return bearer(settings.token.get_secret_value() if settings.token else None)


def served_settings(bundle: Path, threads: int) -> dict:
    """The settings a measured server on `bundle` runs with (`serve_flags`, then `EDGEDISTILL_*` variables) but its
    port, bundle and reload root, tokens masked: hashed by a measurement's stage, so a changed setting measures again."""
    flags = serve_flags(bundle, 0, threads)
    settings = measured_settings(flags)
    return settings.model_dump(mode="json", exclude={"port", "bundle", "reload_root"})  # a SecretStr dumps masked


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def log_tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]


def start(
    command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """`command` in `cwd` (default this process's working directory), its stdout and stderr written to `log`; sent
    SIGTERM when this process dies (a measurement killed, even with kill -9, leaves no server running on). In a
    session of its own: a Ctrl-C at the terminal reaches this process alone, which stops it as a measurement's end
    does, where a server that took the Ctrl-C too would exit under the measurement and fail it (exit 2, not 130)."""
    with open(log, "w") as sink:
        return subprocess.Popen(
            dying_with_this_process(command), env=env, stdout=sink, stderr=sink, cwd=cwd, start_new_session=True
        )


def finish(process: subprocess.Popen, timeout: float) -> int | None:
    """Wait up to `timeout` seconds for `process` to exit; its exit status, or None when it hung and was killed."""
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        return None


def wait_serving(
    address: str,
    process: subprocess.Popen,
    name: str,
    log: Path,
    ready: Callable[[grpc.Channel], bool] = health_serving,
) -> None:
    """Poll `ready` (by default the health service) until it says yes; `BenchError` if the process exits or time
    runs out."""
    if wait_ready(address, START_TIMEOUT_S, ready, running=lambda: process.poll() is None):
        return
    if process.poll() is not None:
        raise BenchError(f"{name} exited with {process.returncode} at start; its log ends:\n{log_tail(log)}")
    raise BenchError(f"{name} did not report SERVING within {START_TIMEOUT_S:.0f} s; its log ends:\n{log_tail(log)}")


@contextmanager
def serving(
    command: list[str],
    port: int,
    log: Path,
    ready: Callable[[grpc.Channel], bool] = health_serving,
    clean_exit: bool = True,
    env: dict[str, str] | None = None,
) -> Iterator[psutil.Process]:
    """`command` (in `env`, default this environment, less the variables it runs without: `left_out_of`) with its
    output in `log`, ready (`ready`) on loopback `port`; stopped with SIGTERM after the block. `BenchError` when it
    exited before that (also where the block failed, as its calls to a dead server do), and with `clean_exit`, when it
    does not exit with status 0."""
    name = command[command.index("-m") + 1] if "-m" in command[1:3] else Path(command[0]).name  # python [-P] -m
    environ = os.environ if env is None else env
    left_out = left_out_of(command)
    if given := tuple(variable for variable in left_out if variable in environ):
        say_left_out(given)
    process = start(command, log, server_environ(environ, left_out))

    def died() -> BenchError:
        return BenchError(
            f"{name} exited with {process.returncode} while in use, before SIGTERM; its log ends:\n{log_tail(log)}"
        )

    try:
        wait_serving(f"127.0.0.1:{port}", process, name, log, ready)
        try:
            yield psutil.Process(process.pid)
        except Exception as err:
            if process.poll() is not None:  # the cause of the block's failure
                raise died() from err
            raise
    finally:
        exited = process.poll()
        process.terminate()
        code = finish(process, STOP_TIMEOUT_S)
    if exited is not None:
        raise died()
    if code is None or (clean_exit and code != 0):
        raise BenchError(f"{name} did not stop cleanly on SIGTERM (exit {code}); its log ends:\n{log_tail(log)}")


def running(
    module: str, args: list[str], port: int, log: Path, env: dict[str, str] | None = None
) -> AbstractContextManager[psutil.Process]:
    """`python -m module args` (in `env`, default this environment), `serving` until the block ends."""
    return serving(python_module(module, *args), port, log, env=env)
