"""Atomic writes: a reader sees the old file (or folder) or the whole new one, never a part.

Every write goes to a temporary name beside its target, is flushed to disk (a folder's files, then its folders
from the deepest up), and is renamed over the target, whose folder is flushed then. A folder replaces a folder by exchanging the two names in one
step (Linux's renameat2), where the file system can; elsewhere (NFS) by two renames, with a moment
between them without the target. This module is the only place that publishes a write by renaming it into place.
"""

import ctypes
import errno
import glob
import os
import re
import resource
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from edgedistill.common.processes import alive

FULL_BELOW = 1 << 20  # bytes free: a write that failed this close to the end of its device ran out of room
OUT_OF_ROOM = (errno.ENOSPC, errno.EDQUOT)  # a full device, a full quota


class DiskFull(OSError):
    """A write that failed because its file system is full, whatever words the writer used for it."""


class FileTooLarge(OSError):
    """A write that failed at this process's limit on the size of a file (`ulimit -f`)."""


@contextmanager
def space_checked(tmp: Path, what: str) -> Iterator[None]:
    """Re-raise a write of `tmp` (a file or folder) that failed on a full file system as `DiskFull`, naming its
    folder, or at the file size limit as `FileTooLarge`: a library may say it in its own words (torch: `unexpected
    pos 1226304 vs 1226196`)."""
    folder = tmp.parent
    try:
        yield
    except Exception as err:
        if limit := _over_limit(tmp, err):
            raise FileTooLarge(
                errno.EFBIG,
                f"{what} in {folder} reached this process's limit on the size of a file ({limit} bytes, `ulimit -f`): "
                "raise it",
            ) from err
        if not _full(folder, err):
            raise
        raise DiskFull(
            errno.ENOSPC,
            f"no space left on the device of {folder} (writing {what}): free some, or set EDGEDISTILL_RUNS_DIR to a "
            "folder on a device with room",
        ) from err


def _over_limit(tmp: Path, err: Exception) -> int | None:
    """The file size limit, where the failed write of `tmp` reached it: the writer says so (safetensors removes its
    file), or left a file there as large as the limit (torch, numpy)."""
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit == resource.RLIM_INFINITY:
        return None
    if (isinstance(err, OSError) and err.errno == errno.EFBIG) or os.strerror(errno.EFBIG) in str(err):
        return limit
    files = [tmp] if tmp.is_file() else tmp.rglob("*")
    return limit if any(f.is_file() and f.stat().st_size >= limit for f in files) else None


def _full(folder: Path, err: Exception) -> bool:
    """Whether the failed write ran out of room: its error says so (a device or a quota full), its device has under
    `FULL_BELOW` free, or, where the writer gave no errno (torch), a write of that much into `folder` runs out too
    (a quota leaves the device's free space as it is)."""
    code = err.errno if isinstance(err, OSError) else None
    if code in OUT_OF_ROOM:
        return True
    try:
        stat = os.statvfs(folder)
    except OSError:
        return False
    return stat.f_bavail * stat.f_frsize < FULL_BELOW or (code is None and _room_runs_out(folder))


def _room_runs_out(folder: Path) -> bool:
    """Whether writing and flushing `FULL_BELOW` bytes into `folder` fails for want of room; the file is removed."""
    probe = temporary_name(folder / "space", "probe")
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, bytes(FULL_BELOW))
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as err:
        return err.errno in OUT_OF_ROOM
    finally:
        probe.unlink(missing_ok=True)
    return False


def _fsync(path: Path) -> None:
    """Flush a file's data, or a folder's entries (a rename inside it), to disk. Through a read-only descriptor: a
    file copied from a read-only one is read-only, and only root may open it for writing."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    """Flush a file; or a folder's files, then its folders from the deepest up, itself last."""
    below = [] if path.is_file() else [p for p in path.rglob("*") if p.is_file() or (p.is_dir() and not p.is_symlink())]
    for entry in [*sorted(below, key=lambda p: len(p.parts), reverse=True), path]:
        _fsync(entry)


def temporary_name(path: Path, kind: str = "tmp", pid: int | None = None) -> Path:
    """A hidden name beside `path`, unique to this process (or `pid`), keeping the suffix (`np.save` adds `.npy`
    otherwise)."""
    return path.with_name(f".{path.stem}.{kind}-{os.getpid() if pid is None else pid}{path.suffix}")


def remove_orphans(path: Path, locked: bool = False) -> None:
    """Remove what processes killed while writing `path` left beside it: temporary names of processes that are
    gone (a live process's are its work in progress). An old `path` where `path` is gone is put back instead: its
    process died between the two renames of a replace (`_replace` where no exchange is), and it is the last version
    published. `locked` (the caller holds the lock every publisher of `path` holds, and writes nothing yet): an old
    `path` is put back whatever its pid, and this process's own pid names a process gone (a container's stage runs
    as the same pid each time), as no one else can be half-way through publishing."""
    for kind in ("old", "tmp"):
        pattern = re.compile(re.escape(f".{path.stem}.{kind}-") + r"(\d+)" + re.escape(path.suffix))
        for sibling in path.parent.glob(f".{glob.escape(path.stem)}.{kind}-*"):
            found = pattern.fullmatch(sibling.name)
            if not found or _in_progress(int(found[1]), kind, locked):
                continue
            if kind == "old" and not os.path.lexists(path):
                os.replace(sibling, path)
                _fsync(path.parent)
            else:
                _remove(sibling)


def _in_progress(pid: int, kind: str, locked: bool) -> bool:
    """Whether a temporary name of `kind` (old, tmp) for `pid` may be a live writer's work (`remove_orphans`)."""
    if locked and (kind == "old" or pid == os.getpid()):
        return False
    return alive(pid)


def atomic_write(path: str | Path, data: str | bytes | Callable[[Path], None]) -> Path:
    """Write `path` atomically from text, bytes, or `data(tmp_path)` (e.g. `lambda p: np.save(p, a)`).

    A callable may also make a folder at `tmp_path` (e.g. `save_pretrained`); it replaces the old one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_orphans(path)
    tmp = temporary_name(path)
    _remove(tmp)
    try:
        with space_checked(tmp, path.name):
            if isinstance(data, str):
                tmp.write_text(data, encoding="utf-8")
            elif isinstance(data, bytes):
                tmp.write_bytes(data)
            else:
                data(tmp)
            _fsync_tree(tmp)
        _replace(tmp, path)
    finally:
        _remove(tmp)
    return path


def write_changed(path: str | Path, text: str) -> Path:
    """`atomic_write` of `text`, skipped where `path` holds it already: a summary of stages that are all current
    leaves a read-only runs folder as it is."""
    path = Path(path)
    if not (path.is_file() and path.read_bytes() == text.encode("utf-8")):  # a file not in UTF-8 differs too
        atomic_write(path, text)
    return path


def publish_folder(tmp: str | Path, final: str | Path) -> None:
    """Rename the finished folder `tmp` to `final`, replacing an older `final` (removed afterwards)."""
    tmp, final = Path(tmp), Path(final)
    _fsync_tree(tmp)
    _replace(tmp, final)


_AT_FDCWD, _RENAME_EXCHANGE = -100, 2
_renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)  # glibc 2.28+, musl 1.2.4+


def _exchange(a: Path, b: Path) -> bool:
    """Swap the names `a` and `b` in one step; False where the system or the file system cannot."""
    if _renameat2 is None:
        return False
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(b))


def _replace(tmp: Path, final: Path) -> None:
    if final.is_dir() and not final.is_symlink() and _exchange(tmp, final):
        _remove(tmp)  # the old folder, now under the temporary name
    elif final.is_dir() and not final.is_symlink():
        old = temporary_name(final, "old")
        _remove(old)
        os.replace(final, old)
        os.replace(tmp, final)
        _remove(old)
    else:
        os.replace(tmp, final)
    _fsync(final.parent)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
