"""One process at a time per artifact: a stage holds an exclusive lock on its name while it checks and builds.

A second process asking for the same stage waits, says whom for, and then finds it up to date (or builds
it if the first one failed), as `make -j` would; stages with other names run side by side. The lock is
`flock(2)` on a file under `runs/<recipe>/.work/`, released by the kernel when its holder dies, so a killed
stage never leaves a lock behind. A runs folder this process cannot write (read-only, another user's) is
locked shared through a lock file already there, or not at all: such a process can only find stages up to date,
and a stage it would build stops at its first write, naming the folder. A lock file this process may not write in a
folder it may (another user's file) is locked exclusively all the same, or refused, naming it, where the file system
(NFS) locks so only a file open for writing.
"""

import errno
import fcntl
import os
import re
import socket
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import IO

from edgedistill.common.processes import alive
from edgedistill.common.settings import SettingError

READ_ONLY = (errno.EROFS, errno.EACCES, errno.EPERM)  # a folder this process may read but not write
# a file system without flock(2): NFSv3 without its lock daemon, Lustre mounted without `-o flock`
CANNOT_LOCK = (errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP)


@contextmanager
def exclusive(path: Path, what: str) -> Iterator[None]:
    """Hold the lock file `path` (made if missing) while the block runs; wait, saying so, while another process
    holds it. `what` names the work in the message."""
    with _open(path) as handle:
        if handle is None:
            yield
            return
        # shared where this process may only read the folder: it waits for a build, not for other readers (and NFS
        # grants an exclusive lock only to a file open for writing); exclusive where it may build, even through a lock
        # file it may only read (another user's), as two such processes would otherwise build the stage at once
        kind = fcntl.LOCK_EX if handle.writable() or os.access(path.parent, os.W_OK) else fcntl.LOCK_SH
        try:
            fcntl.flock(handle, kind | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"[{what}] waiting for {_holder(handle)}, which holds it", flush=True)
            fcntl.flock(handle, kind)
        except OSError as err:  # EBADF: NFS locks a file exclusively only for a process that opened it to write
            if err.errno in CANNOT_LOCK:
                raise SettingError(
                    f"{path.parent}: its file system cannot lock files ({err.strerror}), which keeps two commands from "
                    "building one stage at once: set EDGEDISTILL_RUNS_DIR to a folder on a local disk (or mount NFS "
                    "with its lock daemon, Lustre with -o flock)"
                ) from None
            if err.errno != errno.EBADF:
                raise
            raise PermissionError(
                errno.EACCES,
                "another user's lock file, which this file system locks only for a process that may write it: remove "
                "it (its folder is writable), or let this user write it",
                str(path),
            ) from None
        _write_name(handle, f"pid {os.getpid()} on {socket.gethostname()}")
        try:
            yield
        finally:
            _write_name(handle, "")  # a name left behind would name a finished process to the next waiter
            fcntl.flock(handle, fcntl.LOCK_UN)


def _open(path: Path) -> IO[str] | nullcontext:
    """The lock file, open to write the holder's name; open to read where its folder cannot be written (flock needs
    no write access); `nullcontext()` (no lock) where the file is missing too."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return open(path, "a+", encoding="utf-8")
    except OSError as err:
        if err.errno not in READ_ONLY:
            raise
    try:
        return open(path, encoding="utf-8")
    except FileNotFoundError:
        return nullcontext()


def _holder(handle: IO[str]) -> str:
    """The holder's name as it wrote it in the lock file (`pid N on HOST`), or "another process" where it wrote none
    (a lock file it may only read) or that name is stale: a pid on this host that is this process or no live one."""
    handle.seek(0)
    named = re.fullmatch(r"pid (\d+) on (.+)", handle.read().strip())
    if not named:
        return "another process"
    pid = int(named[1])
    if named[2] == socket.gethostname() and (pid == os.getpid() or not alive(pid)):
        return "another process"
    return named[0]


def _write_name(handle: IO[str], name: str) -> None:
    """Put `name` (this holder's; "" at release) in the lock file, for a waiting process to say; not through a handle
    that may only read, nor on a full device, where the lock holds all the same (unbuffered: a failed write left in a
    buffer would fail again at close)."""
    if not handle.writable():
        return
    try:
        os.ftruncate(handle.fileno(), 0)
        os.write(handle.fileno(), name.encode())
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
