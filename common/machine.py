"""What of the machine this process may use: the CPUs of its affinity within its cgroup's CPU quota, and the memory
within its cgroup's limit (a container's, a systemd unit's CPUQuota and MemoryMax), which `os.cpu_count()` and the
runtimes' own defaults do not see; and whether it is the main process of a distributed run (`main_rank`)."""

import os
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")  # where the cgroup file systems are (v2; v1 mounts one folder per controller)
MEMBERSHIP = Path("/proc/self/cgroup")  # this process's cgroup in each hierarchy
MEMINFO = Path("/proc/meminfo")  # the system's memory: its total and what is available (Linux)


def cgroup_folders(controller: str, cgroup: Path = CGROUP, membership: Path = MEMBERSHIP) -> list[Path]:
    """This process's cgroup folder and its ancestors' up to the mount, those that exist, in the v2 hierarchy
    (`controller` "") or in v1's hierarchy of `controller` ("cpu", "memory"). A limit of any of them applies. In a
    container the process's cgroup is the mount itself (a cgroup namespace, or v1's bind mount), elsewhere (a systemd
    unit's CPUQuota and MemoryMax, `systemd-run`, a cgroup made by hand) a folder below it, named in `membership`."""
    mount = cgroup / controller if controller else cgroup
    path = "/"
    try:
        lines = membership.read_text().splitlines()
    except OSError:  # not Linux, or no /proc: the mount alone
        lines = []
    for line in lines:  # "<id>:<controllers>:<path>"; v2's line names no controller
        _, controllers, where = line.split(":", 2)
        if controller in controllers.split(","):
            path = where
            break
    parts = Path(path).parts[1:]
    # outside the cgroup namespace it was started in, a process sees its path as "/../..": the mount alone then
    own = mount if ".." in parts else mount.joinpath(*parts)
    return [folder for folder in (own, *own.parents) if folder.is_relative_to(mount) and folder.is_dir()]


def cpu_quota(cgroup: Path = CGROUP, membership: Path = MEMBERSHIP) -> int | None:
    """Whole CPUs of the smallest quota of this process's cgroup and its ancestors (v2 `cpu.max`, v1
    `cpu.cfs_quota_us` over `cpu.cfs_period_us`), at least one; None without a quota."""
    quotas = []
    for folder in cgroup_folders("", cgroup, membership):
        try:
            quota, period = (folder / "cpu.max").read_text().split()
        except (OSError, ValueError):
            continue
        if quota != "max":
            quotas.append(int(quota) / int(period))
    for folder in cgroup_folders("cpu", cgroup, membership):
        try:
            quota, period = ((folder / name).read_text().strip() for name in ("cpu.cfs_quota_us", "cpu.cfs_period_us"))
        except OSError:
            continue
        if quota != "-1":
            quotas.append(int(quota) / int(period))
    return max(1, int(min(quotas))) if quotas else None


def affinity_cores() -> int:
    """The CPUs of this process's affinity (`taskset`, a container's cpuset); where the system gives no affinity
    (macOS), every CPU."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def usable_cores(cgroup: Path = CGROUP, membership: Path = MEMBERSHIP) -> int:
    """The CPUs this process may run on: its affinity (`affinity_cores`), within its cgroup's CPU quota (a
    container's limit, a systemd unit's CPUQuota)."""
    cores = affinity_cores()
    return min(cores, cpu_quota(cgroup, membership) or cores)


def usable_memory(cgroup: Path = CGROUP, membership: Path = MEMBERSHIP, meminfo: Path = MEMINFO) -> int:
    """Bytes of memory for the workers: the smallest limit of this process's cgroup and its ancestors where one is
    set (a container's, a systemd unit's MemoryMax), else what the system has available; where the system has no
    `meminfo` (macOS, no cgroups either), its physical memory."""
    try:
        with meminfo.open() as lines:
            sizes = {key: int(value.split()[0]) * 1024 for key, value in (line.split(":", 1) for line in lines)}
    except FileNotFoundError:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    limits = []
    for controller, limit_file in (("", "memory.max"), ("memory", "memory.limit_in_bytes")):  # cgroup v2, v1
        for folder in cgroup_folders(controller, cgroup, membership):
            try:
                limit = (folder / limit_file).read_text().strip()
            except OSError:
                continue
            # v1 writes no limit as a number past any machine's memory
            if limit != "max" and int(limit) < sizes["MemTotal"]:
                limits.append(int(limit))
    return min(limits) if limits else sizes["MemAvailable"]


def main_rank() -> bool:
    """Whether this process is rank 0 of a `torchrun` launch (`RANK`, its global rank), or runs alone."""
    return os.environ.get("RANK", "0") == "0"
