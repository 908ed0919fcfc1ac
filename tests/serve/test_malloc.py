"""The glibc arena limit: counted in glibc's own malloc_info report, after threads that allocate."""

import os
import platform
import re
import subprocess
import sys

import pytest
from edgedistill.serve.malloc import limit_arenas
from edgedistill.serve.settings import SettingsError

ARENAS_AFTER_THREADS = """
import ctypes, ctypes.util, os, sys, tempfile, threading
from edgedistill.serve.malloc import limit_arenas
limit_arenas(None if sys.argv[1] == "None" else int(sys.argv[1]))
start = threading.Barrier(8)
def churn():
    start.wait()
    for _ in range(200):
        blocks = [bytearray(4096) for _ in range(50)]
threads = [threading.Thread(target=churn) for _ in range(8)]
for thread in threads: thread.start()
for thread in threads: thread.join()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.fopen.restype = ctypes.c_void_p
handle, path = tempfile.mkstemp()
os.close(handle)
stream = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, ctypes.c_void_p(stream))
libc.fclose(ctypes.c_void_p(stream))
print(open(path).read().count("<heap nr="))
os.unlink(path)
"""

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc only")


def arenas_after_threads(limit: int | None, environ: dict[str, str] | None = None) -> int:
    """The arenas glibc's malloc holds after 8 threads allocated at once, with `limit_arenas(limit)` first, in a
    process with `environ` added to this one's."""
    env = os.environ | (environ or {})
    command = [sys.executable, "-c", ARENAS_AFTER_THREADS, str(limit)]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


@glibc_only
def test_threads_take_arenas_of_their_own_without_a_limit():
    assert arenas_after_threads(0) > 2


@glibc_only
def test_threads_share_two_arenas_with_a_limit_of_two():
    assert arenas_after_threads(2) <= 2


@glibc_only
def test_the_default_limit_is_two_arenas_on_glibc():
    code = "from edgedistill.serve.malloc import limit_arenas; print(limit_arenas(None))"  # in a process of its own
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "2"


def test_without_a_setting_another_c_library_keeps_its_allocator(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    assert limit_arenas(None) is None


def test_a_limit_is_refused_where_the_c_library_is_not_glibc(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda: ("musl", "1.2"))
    with pytest.raises(OSError, match="MALLOC_ARENAS=2 needs glibc"):
        limit_arenas(2)


@glibc_only
@pytest.mark.parametrize(
    "glibc_setting",
    [{"MALLOC_ARENA_MAX": "8"}, {"GLIBC_TUNABLES": "glibc.malloc.tcache_count=0:glibc.malloc.arena_max=8"}],
    ids=["MALLOC_ARENA_MAX", "GLIBC_TUNABLES"],
)
def test_without_a_setting_glibcs_own_limit_is_left_as_set(glibc_setting):
    assert arenas_after_threads(None, glibc_setting) > 2


@glibc_only
@pytest.mark.parametrize(
    ("variable", "value", "named"),
    [
        ("MALLOC_ARENA_MAX", "", "MALLOC_ARENA_MAX is ''"),
        ("MALLOC_ARENA_MAX", "0", "MALLOC_ARENA_MAX is '0'"),
        ("MALLOC_ARENA_MAX", "abc", "MALLOC_ARENA_MAX is 'abc'"),
        ("MALLOC_ARENA_MAX", "08", "MALLOC_ARENA_MAX is '08'"),  # octal to glibc, which refuses its 8
        ("MALLOC_ARENA_MAX", "9" * 23, f"MALLOC_ARENA_MAX is '{'9' * 23}'"),  # past size_t: refused by glibc
        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=", "glibc.malloc.arena_max in GLIBC_TUNABLES is ''"),
        ("GLIBC_TUNABLES", "glibc.malloc.arena_max", "glibc.malloc.arena_max in GLIBC_TUNABLES is ''"),
        ("GLIBC_TUNABLES", "glibc.malloc.arena_max=0", "glibc.malloc.arena_max in GLIBC_TUNABLES is '0'"),
    ],
)
def test_without_a_setting_a_glibc_limit_glibc_would_ignore_is_refused_naming_it(monkeypatch, variable, value, named):
    for other in ("MALLOC_ARENA_MAX", "GLIBC_TUNABLES"):
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setenv(variable, value)
    with pytest.raises(SettingsError, match=re.escape(named)):
        limit_arenas(None)


@glibc_only
def test_a_setting_replaces_a_glibc_limit_glibc_would_ignore():
    assert arenas_after_threads(2, {"MALLOC_ARENA_MAX": ""}) <= 2
