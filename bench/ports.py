"""Ports for the servers a measurement starts: free loopback ports below the kernel's ephemeral range, each claimed
with a lock file so that pickers in other processes (test workers beside it, a second benchmark) pass it over."""

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

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
