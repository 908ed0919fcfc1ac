"""The C allocator's arena count: gRPC's threads each take a glibc malloc arena, and memory freed in one is kept
there, so a flood of traffic (endless CONTINUATION frames) raised a server's memory by 130-350 MB with glibc's
default of 8 arenas per core, against 60-100 MB with 2 (see docs/serving.md)."""

import ctypes
import ctypes.util
import platform

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h


def limit_arenas(count: int) -> None:
    """Let glibc's malloc use at most `count` arenas from now on (0: leave glibc's default). Must run before the
    threads start that would take arenas of their own. Raises OSError where the C library is not glibc."""
    if count == 0:
        return
    if platform.libc_ver()[0] != "glibc":
        raise OSError(f"MALLOC_ARENAS={count} needs glibc's malloc; this C library is not glibc (set it to 0)")
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if libc.mallopt(M_ARENA_MAX, count) != 1:
        raise OSError(f"glibc refused mallopt(M_ARENA_MAX, {count})")
