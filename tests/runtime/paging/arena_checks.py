"""Shared by the arena tests (test_arena*.py): the allocator's own consistency check,
and a runner for checks that need a fresh arena (the ``arena`` fixture is in conftest.py)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import numpy as np
from clamor.runtime.paging.native import _native

ffi, lib = _native.ffi, _native.lib


_check_fn = ctypes.CDLL(_native.__file__).clamor_arena_internal_check
_check_fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_check_fn.restype = ctypes.c_int


def check_allocator() -> None:
    """The allocator's own consistency check (free list coalesced, counters exact)."""
    buf = ctypes.create_string_buffer(256)
    assert _check_fn(buf, len(buf)) == 0, buf.value.decode()


def addr(p) -> int:
    return int(ffi.cast("uintptr_t", p))


def offset(p) -> int:
    return addr(p) - addr(lib.clamor_arena_base())


def pattern(n: int, key: int) -> np.ndarray:
    """n bytes that differ from any other key's bytes at almost every position."""
    words = np.arange((n + 3) // 4, dtype=np.uint32) * np.uint32(0x9E3779B1)
    words ^= np.uint32((key * 2654435761 + 12345) % 2**32)
    return words.view(np.uint8)[:n]


def view(p, n: int) -> np.ndarray:
    return np.frombuffer(ffi.buffer(p, n), dtype=np.uint8)


def run_fresh(
    code: str, arena_size: str = "64M", page_size: str = "64K", create: bool = True
) -> str:
    """Run `code` in a new interpreter (with a new arena unless not `create`); return stdout."""
    env = dict(os.environ, CLAMOR_ARENA_SIZE=arena_size, CLAMOR_PAGE_SIZE=page_size)
    prelude = textwrap.dedent(
        """
        import ctypes, numpy as np
        from clamor.runtime.paging import arena as A
        from clamor.runtime.errors import ArenaExhaustedError, ClamorError
        from clamor.runtime.paging.native import _native
        ffi, lib = _native.ffi, _native.lib
        _chk = ctypes.CDLL(_native.__file__).clamor_arena_internal_check
        def check():
            buf = ctypes.create_string_buffer(256)
            assert _chk(buf, 256) == 0, buf.value.decode()
        def off(p):
            return int(ffi.cast("uintptr_t", p)) - int(ffi.cast("uintptr_t", lib.clamor_arena_base()))
        def rss_shmem():
            for line in open("/proc/self/status"):
                if line.startswith("RssShmem:"):
                    return int(line.split()[1]) * 1024
        """
    )
    if create:
        prelude += "A.get_arena()\n"
    r = subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert r.returncode == 0, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    return r.stdout
