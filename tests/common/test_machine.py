"""What of the machine a process may use: its CPUs within the cgroup's quota, its memory within the cgroup's limit."""

import os

import pytest
from edgedistill.common import machine


def write_cgroup(folder, files: dict[str, str]):
    """A cgroup folder with `files` (path under it: contents), as a container sees its own at /sys/fs/cgroup."""
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text + "\n")
    return folder


@pytest.mark.parametrize(
    "files",
    [{"cpu.max": "150000 100000"}, {"cpu/cpu.cfs_quota_us": "150000", "cpu/cpu.cfs_period_us": "100000"}],
    ids=["cgroup v2", "cgroup v1"],
)
def test_usable_cores_are_within_the_cgroup_cpu_quota(tmp_path, files):
    assert machine.usable_cores(write_cgroup(tmp_path, files)) == 1


@pytest.mark.parametrize(
    "files",
    [{"cpu.max": "max 100000"}, {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, {}],
    ids=["cgroup v2", "cgroup v1", "no cgroup files"],
)
def test_usable_cores_without_a_cpu_quota_are_the_affinity(tmp_path, files):
    assert machine.usable_cores(write_cgroup(tmp_path, files)) == len(os.sched_getaffinity(0))


@pytest.mark.parametrize(
    "files",
    [{"memory.max": str(512 << 20)}, {"memory/memory.limit_in_bytes": str(512 << 20)}],
    ids=["cgroup v2", "cgroup v1"],
)
def test_usable_memory_is_the_cgroup_memory_limit(tmp_path, files):
    assert machine.usable_memory(write_cgroup(tmp_path, files)) == 512 << 20


@pytest.mark.parametrize(
    "files",
    [{"memory.max": "max"}, {"memory/memory.limit_in_bytes": "9223372036854771712"}, {}],
    ids=["cgroup v2", "cgroup v1", "no cgroup files"],
)
def test_usable_memory_without_a_limit_is_at_most_the_machines(tmp_path, files):
    with open("/proc/meminfo") as meminfo:
        total = next(int(line.split()[1]) * 1024 for line in meminfo if line.startswith("MemTotal:"))
    assert machine.usable_memory(write_cgroup(tmp_path, files)) <= total


def test_usable_memory_where_the_system_has_no_meminfo_is_its_physical_memory(tmp_path):
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert machine.usable_memory(write_cgroup(tmp_path, {}), meminfo=tmp_path / "no-meminfo") == physical  # as on macOS


def membership(folder, lines: str):
    """A /proc/self/cgroup of a process in the cgroups `lines` name, as a systemd unit's process sees its own."""
    (folder / "membership").write_text(lines)
    return folder / "membership"


@pytest.mark.parametrize(
    ("lines", "files"),
    [
        ("0::/system.slice/edge.service\n", {"system.slice/edge.service/cpu.max": "100000 100000"}),
        (
            "4:memory:/system.slice/edge.service\n2:cpu,cpuacct:/system.slice/edge.service\n0::/\n",
            {
                "cpu/system.slice/edge.service/cpu.cfs_quota_us": "100000",
                "cpu/system.slice/edge.service/cpu.cfs_period_us": "100000",
            },
        ),
    ],
    ids=["cgroup v2", "cgroup v1"],
)
def test_usable_cores_are_within_the_cpu_quota_of_the_process_own_cgroup_below_the_mount(tmp_path, lines, files):
    cgroup = write_cgroup(tmp_path / "cgroup", files)
    assert machine.usable_cores(cgroup, membership(tmp_path, lines)) == 1


@pytest.mark.parametrize(
    ("lines", "files"),
    [
        (
            "0::/edge.slice/edge.service\n",
            {"edge.slice/memory.max": str(512 << 20), "edge.slice/edge.service/memory.max": "max"},
        ),
        (
            "4:memory:/edge.slice/edge.service\n",
            {
                "memory/edge.slice/memory.limit_in_bytes": str(512 << 20),
                "memory/edge.slice/edge.service/memory.limit_in_bytes": "9223372036854771712",
            },
        ),
    ],
    ids=["cgroup v2", "cgroup v1"],
)
def test_usable_memory_is_the_limit_of_an_ancestor_of_the_process_cgroup(tmp_path, lines, files):
    cgroup = write_cgroup(tmp_path / "cgroup", files)
    assert machine.usable_memory(cgroup, membership(tmp_path, lines)) == 512 << 20


def test_a_container_whose_own_cgroup_is_the_mount_reads_its_limit_there(tmp_path):
    """Docker on cgroup v1 bind-mounts the container's cgroup at /sys/fs/cgroup/memory; /proc/self/cgroup still
    names the host's path, which does not exist inside."""
    cgroup = write_cgroup(tmp_path / "cgroup", {"memory/memory.limit_in_bytes": str(512 << 20)})
    assert machine.usable_memory(cgroup, membership(tmp_path, "4:memory:/docker/0123abcd\n")) == 512 << 20


def test_usable_cores_where_the_system_gives_no_affinity_are_every_cpu(tmp_path, monkeypatch):
    monkeypatch.delattr(machine.os, "sched_getaffinity")  # as on macOS
    monkeypatch.setattr(machine.os, "cpu_count", lambda: 8)
    assert machine.usable_cores(write_cgroup(tmp_path, {})) == 8


@pytest.mark.parametrize(("rank", "main"), [("0", True), ("1", False)])
def test_only_rank_0_of_a_torchrun_launch_is_the_main_process(monkeypatch, rank, main):
    monkeypatch.setenv("RANK", rank)
    assert machine.main_rank() is main


def test_a_process_run_alone_is_the_main_process(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert machine.main_rank()
