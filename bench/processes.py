"""Subprocesses of a measurement, each dying with it and out of a Ctrl-C's reach (`spawn`): a server started until it
reports SERVING and stopped with SIGTERM, or a load generator run to its end; a failure quotes the tail of its log."""

import os
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import grpc
import psutil
from edgedistill.bench import BenchError
from edgedistill.bench.environ import left_out_of, say_left_out, server_environ
from edgedistill.common.processes import READY, dying_with_this_process, python_module
from edgedistill.serve.client import health_serving, wait_ready

START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 30.0
LOG_TAIL_CHARS = 2000


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def log_tail(log: Path) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]


def spawn(command: list[str], hold: bool = False, **popen) -> subprocess.Popen:
    """`command` started by `subprocess.Popen` with `popen` (its output, environment, working directory), sent SIGTERM
    when this process dies (a measurement killed, even with kill -9, leaves nothing running on). In a session of its
    own: a Ctrl-C at the terminal reaches this process alone, which stops it as a measurement's end does, where a server
    that took the Ctrl-C too would exit under the measurement and fail it (exit 2, not 130). `hold`: its launcher waits
    for `release` before it runs `command` (`held`)."""
    return subprocess.Popen(dying_with_this_process(command, held=hold), start_new_session=True, **popen)


def held(command: list[str], **popen) -> subprocess.Popen:
    """`spawn`, held before `command` runs until `release`: returned once its launcher has started, so that `command`
    starts within a millisecond of the release, where a launcher's start takes tens, unevenly. Its stdin and stdout
    are byte pipes; `BenchError` with the launcher's output when it exits instead."""
    process = spawn(command, hold=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE, **popen)
    if (said := process.stdout.readline()) != READY:
        said += process.communicate()[0]
        raise BenchError(f"{command[0]} did not start (exit {process.returncode}): {said.decode(errors='replace')}")
    return process


def release(process: subprocess.Popen) -> None:
    """Start the `command` of a `held` process."""
    process.stdin.write(b"\0")
    process.stdin.flush()


def start(
    command: list[str], log: Path, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.Popen:
    """`command` in `cwd` (default this process's working directory), its stdout and stderr written to `log`, tied to
    this process (`spawn`)."""
    with open(log, "w") as sink:
        return spawn(command, env=env, stdout=sink, stderr=sink, cwd=cwd)


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
    does not exit with status 0. A `BenchError` of the block (calls that failed) is raised with the tail of `log`
    added, which says why: a failed measurement removes its work folder, and the log with it."""
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
            if isinstance(err, BenchError):
                raise BenchError(f"{err}\n{name}'s log ({log.name}) ends:\n{log_tail(log)}") from err
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
