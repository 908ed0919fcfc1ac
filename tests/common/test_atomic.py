"""Atomic writes: the target is the old or the whole new content, and no temporary file is left."""

import errno
import os
import resource
import subprocess
from pathlib import Path

import numpy as np
import pytest
from edgedistill.common import atomic
from edgedistill.common import manifest as mf
from edgedistill.common.atomic import atomic_write, publish_folder, write_changed


def test_text_replaces_the_old_file(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write(path, "old")
    atomic_write(path, "new")
    assert path.read_text() == "new"


def test_bytes_are_written_as_they_are(tmp_path):
    assert atomic_write(tmp_path / "b.bin", b"\x00\x01").read_bytes() == b"\x00\x01"


def test_a_writer_keeps_the_suffix_numpy_needs(tmp_path):
    atomic_write(tmp_path / "a.npy", lambda tmp: np.save(tmp, np.arange(3)))
    assert np.load(tmp_path / "a.npy").tolist() == [0, 1, 2]


def test_a_failing_writer_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "a.txt"
    atomic_write(path, "old")

    def fail(tmp):
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError):
        atomic_write(path, fail)
    assert path.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["a.txt"]


def test_a_writer_may_make_a_folder_that_replaces_the_old_one(tmp_path):
    target = tmp_path / "best"
    atomic_write(target, lambda tmp: (tmp.mkdir(), (tmp / "old.bin").write_text("1")))
    atomic_write(target, lambda tmp: (tmp.mkdir(), (tmp / "new.bin").write_text("2")))
    assert [p.name for p in target.iterdir()] == ["new.bin"]


def test_parent_folders_are_made(tmp_path):
    assert atomic_write(tmp_path / "x" / "y" / "a.txt", "hi").read_text() == "hi"


def staged(tmp_path, target: str, name: str):
    """A finished temporary folder beside `target`, holding one file named `name`."""
    tmp = tmp_path / f".{target}.tmp-{name}"
    tmp.mkdir()
    (tmp / name).write_text(name)
    return tmp


def test_publish_folder_replaces_and_removes_the_old_folder(tmp_path):
    final = tmp_path / "stage"
    for name in ("one", "two"):
        publish_folder(staged(tmp_path, "stage", name), final)
    assert [p.name for p in final.iterdir()] == ["two"]
    assert [p.name for p in tmp_path.iterdir()] == ["stage"]


def test_a_folder_replaces_a_folder_in_one_step(tmp_path, monkeypatch):
    final = tmp_path / "best"
    publish_folder(staged(tmp_path, "best", "old"), final)

    def killed(*args):  # a process killed at a rename: between two renames the target would be gone
        raise RuntimeError("killed")

    monkeypatch.setattr(atomic.os, "replace", killed)
    publish_folder(staged(tmp_path, "best", "new"), final)
    assert [p.name for p in final.iterdir()] == ["new"]


def test_where_names_cannot_be_exchanged_a_folder_is_replaced_by_two_renames(tmp_path, monkeypatch):
    monkeypatch.setattr(atomic, "_renameat2", None)
    final = tmp_path / "best"
    for name in ("old", "new"):
        publish_folder(staged(tmp_path, "best", name), final)
    assert [p.name for p in tmp_path.iterdir()] == ["best"]
    assert [p.name for p in final.iterdir()] == ["new"]


@pytest.fixture
def writing_needs_permission(monkeypatch):
    """Opening a read-only file for writing fails, as it does for a user other than root (the tests run as root)."""
    real_open, real_os_open = open, os.open

    def refuse_if_read_only(path):
        if os.path.isfile(path) and not os.stat(path).st_mode & 0o222:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    def opening(file, mode="r", *args, **kwargs):
        if set(mode) & set("wa+"):
            refuse_if_read_only(file)
        return real_open(file, mode, *args, **kwargs)

    def os_opening(path, flags, *args, **kwargs):
        if flags & (os.O_WRONLY | os.O_RDWR):
            refuse_if_read_only(path)
        return real_os_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(atomic, "open", opening, raising=False)
    monkeypatch.setattr(atomic.os, "open", os_opening)


def test_a_folder_holding_a_read_only_file_is_published(tmp_path, writing_needs_permission):
    tmp = tmp_path / "copy"
    tmp.mkdir()
    (tmp / "tokenizer.json").write_text("{}")
    (tmp / "tokenizer.json").chmod(0o444)  # as copy2 leaves the copy of a read-only file
    publish_folder(tmp, tmp_path / "bundle")
    assert (tmp_path / "bundle" / "tokenizer.json").read_text() == "{}"


@pytest.fixture
def flushed(monkeypatch):
    """The paths `os.fsync` flushes, in order (None for a descriptor not opened by `os.open`)."""
    paths, names, real_os_open, real_fsync = [], {}, os.open, os.fsync

    def os_opening(path, flags, *args, **kwargs):
        fd = real_os_open(path, flags, *args, **kwargs)
        names[fd] = Path(path)
        return fd

    def fsync(fd):
        paths.append(names.get(fd))
        real_fsync(fd)

    monkeypatch.setattr(atomic.os, "open", os_opening)
    monkeypatch.setattr(atomic.os, "fsync", fsync)
    return paths


def test_publishing_flushes_files_then_their_folders_deepest_first(tmp_path, flushed):
    tmp = tmp_path / "tmp"
    (tmp / "tokenizer").mkdir(parents=True)
    (tmp / "tokenizer" / "vocab.txt").write_text("[PAD]")
    publish_folder(tmp, tmp_path / "stage")
    assert flushed == [tmp / "tokenizer" / "vocab.txt", tmp / "tokenizer", tmp, tmp_path]


def gone_pid() -> int:
    """The pid of a process that has exited."""
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_a_write_removes_the_temporary_left_by_a_killed_process(tmp_path):
    orphan = atomic.temporary_name(tmp_path / "logits.npy", pid=gone_pid())
    orphan.write_bytes(b"half")
    atomic_write(tmp_path / "logits.npy", b"whole")
    assert not orphan.exists()


def test_a_write_leaves_a_live_processs_temporary_alone(tmp_path):
    working = atomic.temporary_name(tmp_path / "logits.npy", pid=os.getppid())
    working.write_bytes(b"in progress")
    atomic_write(tmp_path / "logits.npy", b"whole")
    assert working.read_bytes() == b"in progress"


@pytest.mark.parametrize("kind", ["tmp", "old"])
def test_publishing_a_stage_removes_the_folders_a_killed_publish_left(tmp_path, kind):
    orphan = atomic.temporary_name(tmp_path / "bundle-x", kind, pid=gone_pid())
    (orphan / "sub").mkdir(parents=True)
    with mf.stage_folder(tmp_path / "bundle-x") as tmp:
        mf.commit(tmp, tmp_path / "bundle-x", mf.Manifest(stage="x", recipe="r", recipe_hash="h", config_hash="c"))
    assert [p.name for p in tmp_path.iterdir()] == ["bundle-x"]


def killed_between_renames(final: Path) -> None:
    """What a publish killed between the renames of a replace leaves: the old folder and the new one, under their
    temporary names, and no `final`."""
    pid = gone_pid()
    for kind in ("old", "tmp"):
        (atomic.temporary_name(final, kind, pid=pid) / kind).mkdir(parents=True)


def test_a_publish_killed_between_its_renames_gets_its_last_version_back(tmp_path):
    killed_between_renames(tmp_path / "bundle-x")
    atomic.remove_orphans(tmp_path / "bundle-x")
    assert [p.name for p in (tmp_path / "bundle-x").iterdir()] == ["old"]


def test_a_publish_killed_between_its_renames_leaves_no_temporary(tmp_path):
    killed_between_renames(tmp_path / "bundle-x")
    atomic.remove_orphans(tmp_path / "bundle-x")
    assert [p.name for p in tmp_path.iterdir()] == ["bundle-x"]


def test_under_the_lock_an_old_version_is_put_back_whatever_its_pid(tmp_path):
    (atomic.temporary_name(tmp_path / "bundle-x", "old", pid=os.getppid()) / "old").mkdir(parents=True)
    atomic.remove_orphans(tmp_path / "bundle-x", locked=True)
    assert [p.name for p in (tmp_path / "bundle-x").iterdir()] == ["old"]


def test_without_the_lock_a_live_processs_old_version_is_let_be(tmp_path):
    old = atomic.temporary_name(tmp_path / "bundle-x", "old", pid=os.getppid())
    old.mkdir()
    atomic.remove_orphans(tmp_path / "bundle-x")
    assert old.is_dir()


def test_under_the_lock_a_temporary_of_this_processs_pid_is_removed(tmp_path):
    earlier = atomic.temporary_name(tmp_path / "bundle-x")  # a restarted container's stage runs as the same pid
    earlier.mkdir()
    atomic.remove_orphans(tmp_path / "bundle-x", locked=True)
    assert not earlier.exists()


def test_under_the_lock_another_live_processs_temporary_is_let_be(tmp_path):
    working = atomic.temporary_name(tmp_path / "bundle-x", pid=os.getppid())
    working.mkdir()
    atomic.remove_orphans(tmp_path / "bundle-x", locked=True)
    assert working.is_dir()


def test_an_old_version_beside_a_published_one_is_removed(tmp_path):
    (tmp_path / "bundle-x" / "new").mkdir(parents=True)
    (atomic.temporary_name(tmp_path / "bundle-x", "old", pid=gone_pid()) / "old").mkdir(parents=True)
    atomic.remove_orphans(tmp_path / "bundle-x")
    assert [p.name for p in tmp_path.iterdir()] == ["bundle-x"]


def _hiding_its_errno(tmp):
    """A writer that, as torch's does, reports a full device in words of its own."""
    try:
        tmp.write_bytes(b"x" * (8 << 20))
    except OSError:
        raise RuntimeError("unexpected pos 1226304 vs 1226196") from None


@pytest.mark.parametrize("data", [b"x" * (8 << 20), _hiding_its_errno], ids=["errno", "own-words"])
def test_a_write_that_fills_the_device_says_so_naming_the_folder(small_fs, data):
    with pytest.raises(atomic.DiskFull, match=f"no space left on the device of {small_fs}"):
        atomic_write(small_fs / "model.bin", data)


def test_a_write_that_fills_the_device_leaves_no_temporary(small_fs):
    with pytest.raises(atomic.DiskFull):
        atomic_write(small_fs / "model.bin", _hiding_its_errno)
    assert list(small_fs.iterdir()) == []


def test_a_stage_folder_that_fills_the_device_says_so(small_fs):
    with (
        pytest.raises(atomic.DiskFull, match=f"no space left on the device of {small_fs}"),
        mf.stage_folder(small_fs / "stage") as tmp,
    ):
        _hiding_its_errno(tmp / "model.bin")


def _quota_full(monkeypatch) -> None:
    """A full disk quota: the device shows room, but flushing a write fails with EDQUOT."""
    plenty = os.statvfs_result((4096, 4096, 1 << 20, 1 << 20, 1 << 20, 1 << 10, 1 << 10, 1 << 10, 0, 255))
    monkeypatch.setattr(os, "statvfs", lambda path: plenty)

    def over_quota(fd):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    monkeypatch.setattr(os, "fsync", over_quota)


def _in_own_words(tmp):
    raise RuntimeError("unexpected pos 1226304 vs 1226196")


def test_a_write_over_a_full_quota_in_the_writers_own_words_says_the_disk_is_full(tmp_path, monkeypatch):
    _quota_full(monkeypatch)
    with pytest.raises(atomic.DiskFull, match=f"no space left on the device of {tmp_path}"):
        atomic_write(tmp_path / "model.bin", _in_own_words)


def test_a_write_over_a_full_quota_leaves_no_temporary_nor_probe(tmp_path, monkeypatch):
    _quota_full(monkeypatch)
    with pytest.raises(atomic.DiskFull):
        atomic_write(tmp_path / "model.bin", _in_own_words)
    assert list(tmp_path.iterdir()) == []


def test_a_write_failing_on_a_full_quota_with_its_errno_says_the_disk_is_full(tmp_path):
    def over_quota(tmp):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))

    with pytest.raises(atomic.DiskFull, match=f"no space left on the device of {tmp_path}"):
        atomic_write(tmp_path / "model.bin", over_quota)


def test_a_writer_failing_in_its_own_words_with_room_left_keeps_its_error(tmp_path):
    with pytest.raises(RuntimeError, match="unexpected pos"):
        atomic_write(tmp_path / "model.bin", _in_own_words)


@pytest.fixture
def file_size_limit():
    """This process limited to files of 64 KiB (`ulimit -f 64`) for the test; Python ignores SIGXFSZ, so a write
    past it fails with EFBIG."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))
    yield 64 << 10
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))


def _removing_its_file(tmp):
    """A writer that, as safetensors does, removes its file and says what failed in words of its own."""
    try:
        tmp.write_bytes(b"x" * (1 << 20))
    except OSError as err:
        tmp.unlink()
        raise RuntimeError(f"Error while serializing: I/O error: {err.strerror} (os error {err.errno})") from None


@pytest.mark.parametrize(
    "data",
    [b"x" * (1 << 20), lambda tmp: np.save(tmp, np.zeros(1 << 17)), _removing_its_file],
    ids=["errno", "numpy", "safetensors"],
)
def test_a_write_past_the_file_size_limit_says_so_naming_the_folder(tmp_path, file_size_limit, data):
    with pytest.raises(atomic.FileTooLarge, match=f"logits.npy in {tmp_path} reached this process's limit"):
        atomic_write(tmp_path / "logits.npy", data)


def test_a_write_past_the_file_size_limit_leaves_no_temporary(tmp_path, file_size_limit):
    with pytest.raises(atomic.FileTooLarge):
        atomic_write(tmp_path / "model.bin", b"x" * (1 << 20))
    assert list(tmp_path.iterdir()) == []


def test_a_text_the_file_holds_already_is_not_written_again(tmp_path):
    summary = atomic_write(tmp_path / "summary.md", "same\n")
    before = summary.stat().st_ino
    write_changed(summary, "same\n")
    assert summary.stat().st_ino == before


def test_a_changed_text_is_written(tmp_path):
    summary = atomic_write(tmp_path / "summary.md", "old\n")
    write_changed(summary, "new\n")
    assert summary.read_text() == "new\n"


def test_a_file_not_in_utf8_is_written_over(tmp_path):
    summary = atomic_write(tmp_path / "summary.md", b"\xff\xfe damaged")
    write_changed(summary, "new\n")
    assert summary.read_text() == "new\n"
