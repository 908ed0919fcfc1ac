"""The C allocator's arena count: gRPC's threads each take a glibc malloc arena, and memory freed in one is kept
there, so a flood of traffic (endless CONTINUATION frames) raised a bare gRPC server's memory by 130-350 MB with
glibc's default of 8 arenas per core, against 60-100 MB with 2 (the project's server: docs/serving.md)."""

import ctypes
import ctypes.util
import os
import platform
import re

from edgedistill.serve.settings import SettingsError

M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
DEFAULT_ARENAS = 2
GLIBC_ARENA_TUNABLE = "glibc.malloc.arena_max"  # in GLIBC_TUNABLES, `name=value` items separated by colons
# a limit written so that glibc reads it as people do: decimal digits, no leading zero (glibc reads `010` as 8, and
# ignores `08`); other spellings glibc takes (`0x2`, ` 2`) are refused too, as one that reads otherwise would be
GLIBC_ARENA_LIMIT = re.compile(r"[1-9][0-9]*")
SIZE_MAX = 2 ** (8 * ctypes.sizeof(ctypes.c_size_t)) - 1  # above it, glibc refuses the limit


def glibc_limit_set() -> bool:
    """Whether glibc's own settings limit its arenas: MALLOC_ARENA_MAX, or its tunable in GLIBC_TUNABLES.
    `SettingsError` for a value not written as a positive decimal number: glibc ignores an empty, zero or
    non-numeric one, keeping its default of 8 per core, and reads some others otherwise than they look."""
    given = [("MALLOC_ARENA_MAX", os.environ["MALLOC_ARENA_MAX"])] if "MALLOC_ARENA_MAX" in os.environ else []
    for item in os.environ.get("GLIBC_TUNABLES", "").split(":"):
        name, _, value = item.partition("=")
        if name == GLIBC_ARENA_TUNABLE:
            given.append((f"{GLIBC_ARENA_TUNABLE} in GLIBC_TUNABLES", value))
    for where, value in given:
        if not (GLIBC_ARENA_LIMIT.fullmatch(value) and int(value) <= SIZE_MAX):
            raise SettingsError(
                f"{where} is {value!r}: write a positive whole number in decimal (e.g. 4), as glibc ignores an "
                "empty, zero or non-numeric limit and keeps its default of 8 malloc arenas per core, and reads others "
                "otherwise than they look (010 as 8); or unset it for the server's own limit, "
                f"EDGEDISTILL_MALLOC_ARENAS ({DEFAULT_ARENAS} unless set)"
            )
    return bool(given)


def arena_limit(count: int | None) -> int | None:
    """The arena limit that MALLOC_ARENAS=`count` asks of glibc's malloc (None: DEFAULT_ARENAS where the C library is
    glibc and glibc's own settings set no limit, `glibc_limit_set`; 0: glibc's default); None for none. Raises OSError
    for a count where the C library is not glibc, and `SettingsError` for a glibc setting not written as a positive
    decimal number, where `count` is None."""
    if count == 0:
        return None
    if platform.libc_ver()[0] != "glibc":
        if count is None:
            return None
        raise OSError(f"MALLOC_ARENAS={count} needs glibc's malloc; this C library is not glibc (set it to 0)")
    if count is None and glibc_limit_set():
        return None
    return DEFAULT_ARENAS if count is None else count


def limit_arenas(count: int | None) -> int | None:
    """Let glibc's malloc use at most `arena_limit(count)` arenas from now on; the limit set, or None. Must run before
    the threads start that would take arenas of their own."""
    limit = arena_limit(count)
    if limit is None:
        return None
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    if libc.mallopt(M_ARENA_MAX, limit) != 1:
        raise OSError(f"glibc refused mallopt(M_ARENA_MAX, {limit})")
    return limit
