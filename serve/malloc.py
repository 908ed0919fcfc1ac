"""The C allocator's arena count: gRPC's threads each take a glibc malloc arena, and memory freed in one is kept
there, so a flood of traffic (endless CONTINUATION frames) raised a bare gRPC server's memory by 130-350 MB with
glibc's default of 8 arenas per core, against 60-100 MB with 2 (the project's server: docs/serving.md)."""

import ctypes
import ctypes.util
import os
import platform

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
DEFAULT_ARENAS = 2
GLIBC_ARENA_TUNABLE = "glibc.malloc.arena_max"  # in GLIBC_TUNABLES, `name=value` items separated by colons


def glibc_limit_set() -> bool:
    """Whether glibc's own settings limit its arenas: MALLOC_ARENA_MAX, or its tunable in GLIBC_TUNABLES."""
    tunables = os.environ.get("GLIBC_TUNABLES", "").split(":")
    return "MALLOC_ARENA_MAX" in os.environ or any(item.partition("=")[0] == GLIBC_ARENA_TUNABLE for item in tunables)


def limit_arenas(count: int | None) -> int | None:
    """Let glibc's malloc use at most `count` arenas from now on (None: DEFAULT_ARENAS where the C library is glibc
    and glibc's own settings set no limit, `glibc_limit_set`; 0: glibc's default); the limit set, or None. Must run
    before the threads start that would take arenas of their own. Raises OSError for a count where the C library is
    not glibc."""
    if count == 0 or (count is None and glibc_limit_set()):
        return None
    if platform.libc_ver()[0] != "glibc":
        if count is None:
            return None
        raise OSError(f"MALLOC_ARENAS={count} needs glibc's malloc; this C library is not glibc (set it to 0)")
    count = DEFAULT_ARENAS if count is None else count
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if libc.mallopt(M_ARENA_MAX, count) != 1:
        raise OSError(f"glibc refused mallopt(M_ARENA_MAX, {count})")
    return count
