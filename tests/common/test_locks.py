"""One process at a time per stage: a second one waits for the first, says whom for, then finds it built."""

import errno
import os
import socket
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
from edgedistill.common import locks
from edgedistill.common.settings import SettingError

from tests.conftest import ROOT

HOLD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from edgedistill.common import locks
    with locks.exclusive(Path(sys.argv[1]), "teacher"):
        print("held", flush=True)
        sys.stdin.readline()  # until the test lets go
    """
)


def held_by_a_child(lock):
    """A process holding `lock` until a line is written to its stdin."""
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "held\n"
    return child


def waited_for(lock, child) -> bool:
    """Whether taking `lock`, held by `child`, waited until the child let it go, and then got it."""
    entered = threading.Event()

    def take():
        with locks.exclusive(lock, "teacher"):
            entered.set()

    waiter = threading.Thread(target=take)
    waiter.start()
    try:
        waited = not entered.wait(1.0)
    finally:
        child.communicate("go\n", timeout=30)
    waiter.join(30)
    return waited and entered.is_set()


def test_a_second_process_waits_for_the_holder_and_names_it(tmp_path, capsys):
    lock = tmp_path / ".work" / "teacher.lock"
    child = held_by_a_child(lock)
    assert waited_for(lock, child)
    assert f"[teacher] waiting for pid {child.pid} on" in capsys.readouterr().out


def test_a_holder_that_lets_go_leaves_no_name_in_the_lock_file(tmp_path):
    lock = tmp_path / "teacher.lock"
    with locks.exclusive(lock, "teacher"):
        pass
    assert lock.read_text() == ""


READ_ONLY_HOLD = textwrap.dedent(
    """
    import fcntl, sys
    with open(sys.argv[1]) as handle:  # as another user's process holds this user's lock file: it writes no name
        fcntl.flock(handle, fcntl.LOCK_EX)
        print("held", flush=True)
        sys.stdin.readline()  # until the test lets go
    """
)


def a_dead_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen([sys.executable, "-c", ""])
    child.wait()
    return child.pid


@pytest.mark.parametrize("stale", ["this process", "a dead process"])
def test_a_stale_name_in_the_lock_file_is_not_said_to_hold_it(tmp_path, capsys, stale):
    lock = tmp_path / "teacher.lock"
    pid = os.getpid() if stale == "this process" else a_dead_pid()
    lock.write_text(f"pid {pid} on {socket.gethostname()}")
    child = subprocess.Popen(
        [sys.executable, "-c", READ_ONLY_HOLD, str(lock)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout.readline() == "held\n"
    waited_for(lock, child)
    assert "[teacher] waiting for another process, which holds it" in capsys.readouterr().out


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    lock = tmp_path / "teacher.lock"
    child = held_by_a_child(lock)
    child.kill()
    child.wait()
    entered = threading.Event()

    def take():
        with locks.exclusive(lock, "teacher"):
            entered.set()

    threading.Thread(target=take, daemon=True).start()
    assert entered.wait(10)


BUILD = textwrap.dedent(
    """
    import sys, time
    from edgedistill.common.recipe import load_recipe
    from edgedistill.common.stage import Built, Stage

    def build(inputs):
        print("building", flush=True)
        time.sleep(1.5)
        return Built(lambda folder: (folder / "a.txt").write_text("x"), line="built", size_of="a.txt")

    Stage("slow", load_recipe(sys.argv[1]), ("data",), build).run()
    """
)


def test_two_processes_running_one_stage_build_it_once(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: locked\ndata: {train: a.tsv, dev: b.tsv, label_names: [n, p]}\nmodel: {init: m}\n")
    env = {"EDGEDISTILL_RUNS_DIR": str(tmp_path / "runs"), "PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1"}
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", BUILD, str(recipe)], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    outs = [run.communicate(timeout=120)[0] for run in runs]
    assert [run.returncode for run in runs] == [0, 0]
    assert sum(out.count("building") for out in outs) == 1
    assert sum("[slow] up to date" in out for out in outs) == 1


def unwritable_lock_files(folder, monkeypatch, code=errno.EACCES):
    """Opening a file under `folder` to write raises `code`, as another user's 0644 lock file does (EACCES)."""
    opened = open

    def refuse(path, mode="r", *args, **kwargs):
        if str(path).startswith(str(folder)) and mode != "r":
            raise OSError(code, os.strerror(code), str(path))
        return opened(path, mode, *args, **kwargs)

    monkeypatch.setattr("builtins.open", refuse)


def read_only(folder, monkeypatch):
    """`folder` as on a read-only file system: making or opening a file there to write raises EROFS, and the folder
    is not writable to `os.access`."""
    unwritable_lock_files(folder, monkeypatch, errno.EROFS)
    access = os.access

    def no_folder(path, *args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(Path, "mkdir", no_folder)
    monkeypatch.setattr(os, "access", lambda path, mode: not str(path).startswith(str(folder)) and access(path, mode))


def test_a_read_only_runs_folder_without_a_lock_file_is_entered(tmp_path, monkeypatch):
    read_only(tmp_path, monkeypatch)
    with locks.exclusive(tmp_path / ".work" / "teacher.lock", "teacher"):
        entered = True
    assert entered


def test_a_read_only_runs_folder_is_locked_through_its_lock_file(tmp_path, monkeypatch, capsys):
    lock = tmp_path / ".work" / "teacher.lock"
    child = held_by_a_child(lock)
    read_only(tmp_path, monkeypatch)
    assert waited_for(lock, child)


def taken_meanwhile(lock, wait_s: float) -> tuple[bool, threading.Event]:
    """Hold `lock` while a thread takes it too: whether the thread had it within `wait_s`, and the event it sets
    once it has it."""
    entered = threading.Event()

    def take():
        with locks.exclusive(lock, "teacher"):
            entered.set()

    with locks.exclusive(lock, "teacher"):
        threading.Thread(target=take, daemon=True).start()
        return entered.wait(wait_s), entered


def test_readers_of_a_read_only_runs_folder_do_not_wait_for_each_other(tmp_path, monkeypatch):
    lock = tmp_path / "teacher.lock"
    lock.touch()
    read_only(tmp_path, monkeypatch)
    assert taken_meanwhile(lock, 5)[0]


def test_a_lock_file_of_another_user_in_a_writable_folder_makes_a_second_taker_wait(tmp_path, monkeypatch):
    lock = tmp_path / "teacher.lock"
    lock.touch()
    unwritable_lock_files(tmp_path, monkeypatch)
    assert not taken_meanwhile(lock, 1.0)[0]


def test_a_second_taker_of_a_lock_file_of_another_user_has_it_once_it_is_let_go(tmp_path, monkeypatch):
    lock = tmp_path / "teacher.lock"
    lock.touch()
    unwritable_lock_files(tmp_path, monkeypatch)
    assert taken_meanwhile(lock, 1.0)[1].wait(10)


def test_a_lock_file_of_another_user_on_nfs_is_refused_naming_it(tmp_path, monkeypatch):
    lock = tmp_path / "teacher.lock"
    lock.touch()
    unwritable_lock_files(tmp_path, monkeypatch)

    def nfs(handle, operation):  # an exclusive lock of a file open to read: EBADF on NFS
        raise OSError(errno.EBADF, os.strerror(errno.EBADF))

    monkeypatch.setattr(locks.fcntl, "flock", nfs)
    with (
        pytest.raises(PermissionError, match=r"another user's lock file, .*: remove it") as refused,
        locks.exclusive(lock, "teacher"),
    ):
        pass
    assert refused.value.filename == str(lock)


@pytest.mark.parametrize("code", [errno.ENOLCK, errno.ENOSYS, errno.EOPNOTSUPP])
def test_a_file_system_that_cannot_lock_is_refused_naming_the_runs_folder_setting(tmp_path, monkeypatch, code):
    def unlockable(handle, operation):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(locks.fcntl, "flock", unlockable)
    with (
        pytest.raises(SettingError, match=rf"^{tmp_path}: its file system cannot lock files .* EDGEDISTILL_RUNS_DIR"),
        locks.exclusive(tmp_path / "teacher.lock", "teacher"),
    ):
        pass


def test_a_full_device_still_grants_the_lock(small_fs):
    with open(small_fs / "filler", "wb", buffering=0) as filler:  # every block of the device taken
        try:
            while True:
                filler.write(b"x" * 65536)
        except OSError:
            pass
    with locks.exclusive(small_fs / "teacher.lock", "teacher"):
        entered = True
    assert entered
