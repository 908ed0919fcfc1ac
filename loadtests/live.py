"""Locust's live figures while a load test runs: users, requests/s, failures and latency percentiles, read from
the stats history CSV as locust appends to it (it flushes about every 5 s), reported through `common.progress`."""

import contextlib
import csv
import os
import subprocess
import time
from pathlib import Path

from edgedistill.bench.processes import finish
from edgedistill.common import progress

POLL_S = 2.0
TAIL_BYTES = 16384  # the last rows of every request name, with room to spare


def latest(history: Path) -> dict[str, str] | None:
    """The newest complete `Aggregated` row of locust's stats history, or None before there is one."""
    try:
        with open(history, "rb") as handle:
            header = handle.readline()
            start = max(len(header), handle.seek(0, os.SEEK_END) - TAIL_BYTES)
            handle.seek(start)
            lines = handle.read().decode("utf-8", "replace").splitlines()
    except FileNotFoundError:
        return None
    if start > len(header):
        lines = lines[1:]  # read from the middle of a row
    rows = csv.DictReader([header.decode("utf-8", "replace"), *lines])
    complete = [row for row in rows if row["Name"] == "Aggregated" and None not in row.values()]
    return complete[-1] if complete else None


def figures(row: dict[str, str]) -> dict[str, str]:
    """The figures of a stats history row for a progress line; latencies in ms over locust's recent window."""
    return {
        "users": row["User Count"],
        "req_s": f"{float(row['Requests/s']):.1f}",
        "failures": row["Total Failure Count"],
        "p50_ms": row["50%"],
        "p99_ms": row["99%"],
    }


def follow(process: subprocess.Popen, history: Path, seconds: float, timeout: float) -> int | None:
    """Wait for locust like `bench.processes.finish` (its exit status, None when it hung and was killed after
    `timeout` s), reporting its live figures as progress through the `seconds` of its schedule."""
    clock = progress.bar(int(seconds), desc="locust", unit="s")
    started = time.monotonic()
    deadline = started + timeout
    while process.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(subprocess.TimeoutExpired):  # still running: report
            process.wait(POLL_S)
        if (row := latest(history)) is not None:
            clock.set_postfix(**figures(row), refresh=False)
        clock.update(min(int(seconds), int(time.monotonic() - started)) - clock.n)
    clock.close()
    return finish(process, max(0.0, deadline - time.monotonic()))
