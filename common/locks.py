"""One process at a time per artifact: a stage holds an exclusive lock on its name while it checks and builds.

A second process asking for the same stage waits, says whom for, and then finds it up to date (or builds
it if the first one failed), as `make -j` would; stages with other names run side by side. The lock is
`flock(2)` on a file under `runs/<recipe>/.work/`, released by the kernel when its holder dies, so a killed
stage never leaves a lock behind.
"""

import fcntl
import os
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exclusive(path: Path, what: str) -> Iterator[None]:
    """Hold the lock file `path` (made if missing) while the block runs; wait, saying so, while another process
    holds it. `what` names the work in the message."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+", encoding="utf-8") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            print(f"[{what}] waiting for {holder}, which holds it", flush=True)
            fcntl.flock(handle, fcntl.LOCK_EX)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()} on {socket.gethostname()}\n")
        handle.flush()
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
