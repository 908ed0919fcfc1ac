"""Processes: whether one is still running, children that do not outlive their parent or answer Ctrl-C."""

import ctypes
import os
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1


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


@contextmanager
def children_ignore_interrupts() -> Iterator[None]:
    """Ignore SIGINT while the block starts processes, which then ignore it from their first instruction (Python
    keeps an inherited SIG_IGN): a Ctrl-C at the terminal reaches this process alone, which stops them itself."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
