"""Processes: whether one is still running, children that do not outlive their parent or answer Ctrl-C.

`python -P -m edgedistill.common.processes PARENT [--held] COMMAND...` asks to die with process PARENT, then becomes
COMMAND (see `dying_with_this_process`).
"""

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1
HELD = "--held"
READY = b"ready\n"


def alive(pid: int) -> bool:
    """Whether process `pid` exists (another user's included)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def die_with_parent(parent: int, sig: signal.Signals = signal.SIGTERM) -> None:
    """Have the kernel send `sig` to this process when its parent `parent` dies (Linux); exit at once if it
    already has. Without it a child whose parent is killed (SIGTERM from a scheduler, SIGKILL) runs on alone."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig)
    if os.getppid() != parent:
        sys.exit(f"the parent process {parent} is gone")


def shell_status(returncode: int) -> int:
    """A process's exit status as a shell reports it: its own, or 128 + N where signal N killed it (137 for SIGKILL,
    the out-of-memory killer's), where `Popen.returncode` says -N."""
    return returncode if returncode >= 0 else 128 - returncode


def dying_with_this_process(command: list[str], held: bool = False) -> list[str]:
    """`command` tied to this process as by `die_with_parent`, for `subprocess.Popen`: a launcher asks for the
    signal, then execs `command` in its place (same pid; the kernel keeps the request across exec). `held`: the
    launcher then writes `READY` to its stdout and waits for a byte on its stdin before it execs, and exits without
    running `command` when its stdin closes first; so the caller starts `command` when it chooses, to the millisecond,
    after the launcher's own start.

    Instead of a `preexec_fn`, which makes Popen fork and so run the at-fork handlers of the libraries loaded here
    in the child before it execs: gRPC's restart its pollers there, and closing the child's file descriptors then
    aborts it (`Check failed: wakeup_fd_->Wakeup().ok()`) or hangs it, the more often the busier the machine.
    Without one, Popen starts the child with vfork, which runs no handler.
    """
    return python_module(__name__, str(os.getpid()), *([HELD] if held else []), *command)


def python_module(module: str, *args: str, python: str | os.PathLike = sys.executable) -> list[str]:
    """`python -m module args` on `python` (default this interpreter) with `-P`: the working directory stays off
    `sys.path`, where a checkout's top folder `edgedistill/` (the CLI alone) would hide an installed wheel's stages."""
    return [os.fspath(python), "-P", "-m", module, *args]


def _launch(argv: list[str]) -> None:
    parent, *command = argv
    die_with_parent(int(parent))
    if command[:1] == [HELD]:
        command = command[1:]
        os.write(sys.stdout.fileno(), READY)
        if not os.read(sys.stdin.fileno(), 1):
            sys.exit(f"not started: {command[0]} was never released")
    try:
        os.execvp(command[0], command)
    except OSError as err:
        sys.exit(f"cannot run {command[0]}: {err}")


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler's or CI's stop, `kill PID`), raised wherever the process was, as Ctrl-C raises
    `KeyboardInterrupt`: the same clean-ups run, and the same line says how to go on."""


@contextmanager
def terminated_as_interrupted() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` in the main thread; a second one, while the first's clean-ups
    run, is ignored. Not under torchrun, whose agent stops the other ranks with SIGTERM when one fails: a rank waiting
    in a collective would take the exception only after it, and the agent's SIGKILL comes first."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        yield
        return

    def terminated(number, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise Terminated

    previous = signal.signal(signal.SIGTERM, terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def children_ignore_interrupts() -> Iterator[None]:
    """Ignore SIGINT while the block starts processes, which then ignore it from their first instruction (Python
    keeps an inherited SIG_IGN): a Ctrl-C at the terminal reaches this process alone, which stops them itself."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


if __name__ == "__main__":
    _launch(sys.argv[1:])
