"""The driver's arena: the C allocator (through cffi) and its Python face.

The arena is a process-global singleton, so tests that need a known, empty
arena (exact reuse, full coalescing, exhaustion of the whole arena, memory
accounting) run in a fresh interpreter; the others use this process's arena
with whatever geometry it has.
"""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
import random
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest
from clamor.runtime import arena as A
from clamor.runtime.errors import ArenaExhaustedError, ClamorError
from clamor.runtime.native import _native
from numpy._core.multiarray import get_handler_name

ffi, lib = _native.ffi, _native.lib

_check_fn = ctypes.CDLL(_native.__file__).clamor_arena_internal_check
_check_fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
_check_fn.restype = ctypes.c_int


def check_allocator() -> None:
    """The allocator's own consistency check (free list coalesced, counters exact)."""
    buf = ctypes.create_string_buffer(256)
    assert _check_fn(buf, len(buf)) == 0, buf.value.decode()


@pytest.fixture
def arena() -> A.Arena:
    """This process's arena, with unreachable arrays of earlier tests collected
    (so that counters measured by a test move only because of that test)."""
    gc.collect()
    return A.get_arena()


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
        from clamor.runtime import arena as A
        from clamor.runtime.errors import ArenaExhaustedError, ClamorError
        from clamor.runtime.native import _native
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


# ------------------------------------------------------- creation / config --


def test_create_validates_arguments_and_is_a_singleton(arena):
    err = ffi.new("char[256]")
    assert lib.clamor_arena_create(12345, 4096, err, len(err)) == -1
    assert b"multiple of 4096" in ffi.string(err)
    assert lib.clamor_arena_create(1 << 20, 3 * 4096, err, len(err)) == -1
    assert b"power of two" in ffi.string(err)
    assert lib.clamor_arena_create(1 << 20, 16 << 20, err, len(err)) == -1
    assert b"power of two" in ffi.string(err)
    assert lib.clamor_arena_create(1 << 20, 4096, err, len(err)) == -1
    assert ffi.string(err) == b"arena already exists"
    assert lib.clamor_arena_exists() == 1
    assert lib.clamor_arena_size() == arena.size
    assert lib.clamor_arena_fd() == arena.fd >= 0
    # The mapping is aligned to the page size, so offsets and addresses agree.
    assert arena.base % arena.page_size == 0
    assert A.get_arena() is arena


def test_configure_env_defaults_and_conflicts():
    out = run_fresh(
        """
        a = A.get_arena()
        print(a.size, a.page_size, A.arena_stats()["large_align"])
        A.configure()                                   # no-op
        A.configure(arena_size=48 << 20, page_size=65536)  # the same values: fine
        try:
            A.configure(page_size=1 << 20)
        except ClamorError as e:
            print("conflict:", e)
        for bad in (3000, 1 << 24, 65537):
            try:
                A.configure(page_size=bad)
            except ValueError:
                print("bad page size", bad)
        """,
        arena_size="48M",
        page_size="64KiB",
        create=False,
    )
    lines = out.splitlines()
    assert lines[0] == f"{48 << 20} 65536 65536"
    assert lines[1].startswith("conflict:") and "already exists" in lines[1]
    assert lines[2:] == [
        "bad page size 3000",
        f"bad page size {1 << 24}",
        "bad page size 65537",
    ]


def test_configure_before_first_use_wins_over_env():
    out = run_fresh(
        """
        A.configure(arena_size=10 * 8192 + 1, page_size=8192)
        a = A.get_arena()
        print(a.size, a.page_size)
        """,
        arena_size="64M",
        page_size="64K",
        create=False,
    )
    assert out.split() == [str(11 * 8192), "8192"]  # rounded up to whole pages


def test_bad_env_value_is_a_clear_error():
    with pytest.raises(AssertionError, match="CLAMOR_PAGE_SIZE"):
        run_fresh("A.get_arena()", page_size="lots")


# ------------------------------------------------------- allocator (C API) --


def test_contains_and_block_size(arena):
    base = lib.clamor_arena_base()
    assert lib.clamor_arena_contains(base)
    assert lib.clamor_arena_contains(ffi.cast("char *", base) + (arena.size - 1))
    assert not lib.clamor_arena_contains(ffi.cast("char *", base) + arena.size)
    assert not lib.clamor_arena_contains(ffi.cast("char *", base) - 1)
    assert not lib.clamor_arena_contains(ffi.NULL)

    small, large = (
        lib.clamor_arena_alloc(100),
        lib.clamor_arena_alloc(3 * arena.page_size + 5),
    )
    try:
        assert lib.clamor_arena_block_size(small) >= 100
        assert lib.clamor_arena_block_size(large) >= 3 * arena.page_size + 5
        assert lib.clamor_arena_block_size(ffi.cast("char *", large) + 4096) == 0
        assert lib.clamor_arena_block_size(ffi.cast("char *", small) + 16) == 0
    finally:
        lib.clamor_arena_free(small)
        lib.clamor_arena_free(large)
    assert lib.clamor_arena_block_size(small) == 0
    assert lib.clamor_arena_block_size(large) == 0
    check_allocator()


def test_zero_byte_requests_are_unique(arena):
    ps = [lib.clamor_arena_alloc(0) for _ in range(10)]
    try:
        assert all(p != ffi.NULL and lib.clamor_arena_contains(p) for p in ps)
        assert len({addr(p) for p in ps}) == 10
        assert all(lib.clamor_arena_block_size(p) > 0 for p in ps)
    finally:
        for p in ps:
            lib.clamor_arena_free(p)
    check_allocator()


def test_free_and_reallocate_reuses_memory(arena):
    for size in (24, 3000, 40000, 2 * arena.page_size + 123):
        before = A.arena_stats()
        p = lib.clamor_arena_alloc(size)
        assert p != ffi.NULL
        mid = A.arena_stats()
        assert mid["used"] >= before["used"] + size
        assert mid["allocations"] == before["allocations"] + 1
        lib.clamor_arena_free(p)
        assert A.arena_stats()["used"] == before["used"]
        assert A.arena_stats()["allocations"] == before["allocations"]
        q = lib.clamor_arena_alloc(size)
        try:
            # First fit: the freed block is available again, so the new block
            # is there or lower, and no new memory is handed out.
            assert offset(q) <= offset(p)
            assert A.arena_stats()["high_water"] == mid["high_water"]
        finally:
            lib.clamor_arena_free(q)
    check_allocator()


def test_exact_reuse_and_coalescing_in_a_fresh_arena():
    run_fresh(
        """
        size = lib.clamor_arena_size()
        ps = 65536
        # Same size again after a free: the very same block.
        for n in (1, 100, 4000, 30000, 50000, ps, 5 * ps + 1):
            p = lib.clamor_arena_alloc(n); lib.clamor_arena_free(p)
            q = lib.clamor_arena_alloc(n); lib.clamor_arena_free(q)
            assert p == q, n
        # Three neighbours freed in any order coalesce into one extent.
        a, b, c = (lib.clamor_arena_alloc(ps) for _ in range(3))
        assert off(b) == off(a) + ps and off(c) == off(b) + ps
        guard = lib.clamor_arena_alloc(ps)
        lib.clamor_arena_free(b); lib.clamor_arena_free(a); lib.clamor_arena_free(c)
        check()
        d = lib.clamor_arena_alloc(3 * ps)
        assert off(d) == off(a), (off(d), off(a))
        lib.clamor_arena_free(d); lib.clamor_arena_free(guard)
        check()
        s = A.arena_stats()
        assert s["used"] == 0 and s["allocations"] == 0, s
        # Everything free and coalesced: the whole arena is one block.
        whole = lib.clamor_arena_alloc(size)
        assert whole != ffi.NULL and off(whole) == 0
        lib.clamor_arena_free(whole)
        check()
        """
    )


def test_large_blocks_are_page_aligned_small_ones_aligned(arena):
    ps = arena.page_size
    blocks = [
        lib.clamor_arena_alloc(n)
        for n in (100, ps, 7, ps + 1, 5000, 3 * ps - 1, ps * 2)
    ]
    try:
        for p, n in zip(blocks, (100, ps, 7, ps + 1, 5000, 3 * ps - 1, ps * 2)):
            if n >= ps:
                assert offset(p) % ps == 0 and addr(p) % ps == 0, (n, offset(p))
            else:
                assert addr(p) % 16 == 0
                if n >= 64:
                    assert addr(p) % 64 == 0
    finally:
        for p in blocks:
            lib.clamor_arena_free(p)
    with A.shared():
        big = np.ones(ps // 8 + 1)  # just over a page of float64
    assert A.arena_offset(big) % ps == 0
    check_allocator()


def test_random_rounds_never_overlap(arena):
    rng = random.Random(1234)
    ps = arena.page_size
    live: dict[int, tuple[object, int]] = {}
    for key in range(4000):
        if live and (len(live) > 300 or rng.random() < 0.45):
            victim = rng.choice(list(live))
            p, n = live.pop(victim)
            assert np.array_equal(view(p, n), pattern(n, victim)), (
                "block corrupted before free"
            )
            lib.clamor_arena_free(p)
            continue
        r = rng.random()
        if r < 0.45:
            n = rng.randint(0, 2048)
        elif r < 0.7:
            n = rng.randint(2048, 32768)
        elif r < 0.95:
            n = rng.randint(32768, 2 * ps)
        else:
            n = rng.randint(2 * ps, 12 * ps)
        p = lib.clamor_arena_alloc(n)
        assert p != ffi.NULL
        assert lib.clamor_arena_block_size(p) >= max(n, 1)
        if n:
            view(p, n)[:] = pattern(n, key)
        live[key] = (p, n)
    spans = sorted((offset(p), offset(p) + max(n, 1)) for p, n in live.values())
    for (s0, e0), (s1, _) in itertools.pairwise(spans):
        assert e0 <= s1, f"blocks overlap: [{s0}, {e0}) and {s1}"
    for key, (p, n) in live.items():
        assert np.array_equal(view(p, n), pattern(n, key)), (
            f"block {key} ({n} bytes) overwritten"
        )
    check_allocator()
    for p, _ in live.values():
        lib.clamor_arena_free(p)
    check_allocator()


def test_calloc_zeroes_reused_memory(arena):
    for n in (40, 3000, 100_000, 2 * arena.page_size + 8):
        p = lib.clamor_arena_alloc(n)
        view(p, n)[:] = 0xAB
        lib.clamor_arena_free(p)
        q = lib.clamor_arena_calloc(n, 1)
        try:
            assert offset(q) <= offset(
                p
            )  # reused memory (first fit), so zeroing was needed
            assert not view(q, n).any(), f"calloc({n}) returned dirty memory"
        finally:
            lib.clamor_arena_free(q)
    # Same through numpy: np.zeros goes through the handler's calloc.
    with A.shared():
        dirty = np.full(50_000, 7.0)
    where = A.arena_offset(dirty)
    del dirty
    with A.shared():
        z = np.zeros(50_000)
    assert A.arena_offset(z) <= where
    assert not z.any()


def test_calloc_of_fresh_memory_touches_nothing():
    run_fresh(
        """
        n = 256 << 20
        before = rss_shmem()
        p = lib.clamor_arena_calloc(n // 8, 8)
        assert p != ffi.NULL
        with A.shared():
            z = np.zeros(n // 8)
        assert A.in_arena(z)
        grown = rss_shmem() - before
        assert grown < (16 << 20), f"calloc of fresh memory touched {grown} bytes"
        # The measurement works: touching one page in 64 is visible.
        buf = np.frombuffer(ffi.buffer(p, n), dtype=np.uint8)
        buf[:: 64 * 4096] = 1
        assert rss_shmem() - before >= (n // 64) * 3 // 4
        # Reused memory is zeroed.
        lib.clamor_arena_free(p)
        q = lib.clamor_arena_calloc(n, 1)
        assert off(q) == off(p)
        assert not np.frombuffer(ffi.buffer(q, n), dtype=np.uint8)[:: 64 * 4096].any()
        s = A.arena_stats()
        assert s["high_water"] >= 2 * n, s
        """,
        arena_size="1G",
        page_size="256K",
    )


def test_realloc_grows_shrinks_and_keeps_contents(arena):
    ps = arena.page_size
    p, prev = lib.clamor_arena_realloc(ffi.NULL, 100), 100
    view(p, prev)[:] = pattern(prev, prev)
    for n in (1000, 40, 50_000, 3 * ps + 10, ps + 1, 10 * ps, 20):
        q = lib.clamor_arena_realloc(p, n)
        assert q != ffi.NULL and lib.clamor_arena_block_size(q) >= n
        kept = min(n, prev)
        assert np.array_equal(view(q, kept), pattern(prev, prev)[:kept]), (prev, n)
        if n >= ps:
            assert offset(q) % ps == 0
        p, prev = q, n
        view(p, prev)[:] = pattern(prev, prev)
    lib.clamor_arena_free(p)
    check_allocator()
    # A failed realloc leaves the block alone.
    p = lib.clamor_arena_alloc(64)
    view(p, 64)[:] = 9
    assert lib.clamor_arena_realloc(p, arena.size + 4096) == ffi.NULL
    assert (view(p, 64) == 9).all()
    lib.clamor_arena_free(p)
    check_allocator()


def test_foreign_and_double_frees_are_ignored(arena):
    before = A.arena_stats()
    p = lib.clamor_arena_alloc(5 * 4096)
    s = lib.clamor_arena_alloc(48)
    lib.clamor_arena_free(ffi.cast("char *", p) + 4096)  # inside a block
    lib.clamor_arena_free(ffi.cast("char *", s) + 16)  # inside a slab object
    assert A.arena_stats()["allocations"] == before["allocations"] + 2
    lib.clamor_arena_free(p)
    lib.clamor_arena_free(p)
    lib.clamor_arena_free(s)
    lib.clamor_arena_free(s)
    lib.clamor_arena_free(ffi.NULL)
    after = A.arena_stats()
    assert (after["used"], after["allocations"]) == (
        before["used"],
        before["allocations"],
    )
    check_allocator()


# --------------------------------------------------------------- exhaustion --


def test_request_larger_than_the_arena_raises_and_arena_keeps_working(arena):
    huge = arena.size + (1 << 30)
    with pytest.raises(ArenaExhaustedError) as info:
        A.array((huge,), dtype=np.uint8)
    err = info.value
    assert isinstance(err, MemoryError) and isinstance(err, ClamorError)
    assert isinstance(err.__cause__, MemoryError)
    msg = str(err)
    assert A.format_bytes(huge) in msg
    assert f"free of {A.format_bytes(arena.size)}" in msg
    assert err.requested == huge and err.free <= arena.size
    assert A.arena_stats()["last_failed_request"] == huge
    # Still usable.
    a = A.array((1000,), fill=2.5)
    assert A.in_arena(a) and a.sum() == 2500.0
    with A.shared():
        b = np.arange(1000) * 2
    assert A.in_arena(b) and b[-1] == 1998
    check_allocator()


def test_memory_errors_not_from_the_arena_pass_through(arena):
    with pytest.raises(MemoryError) as info, A.shared():
        raise MemoryError("something else")
    assert not isinstance(info.value, ArenaExhaustedError)


def test_exhausting_the_whole_arena():
    run_fresh(
        """
        size = lib.clamor_arena_size()
        blocks = []
        n = 8 << 20
        while n >= 16:                      # fill it, biggest first
            p = lib.clamor_arena_alloc(n)
            if p == ffi.NULL:
                assert A.arena_stats()["last_failed_request"] == n
                n //= 2
            else:
                blocks.append(p)
        check()
        s = A.arena_stats()
        assert s["free"] < 64 * 1024, s
        try:
            A.empty(100_000)
        except ArenaExhaustedError as e:
            msg = str(e)
            assert "cannot allocate 781.2 KiB in the clamor arena" in msg, msg
            assert "free of 64.0 MiB" in msg, msg
        else:
            raise AssertionError("no ArenaExhaustedError")
        # Free a few blocks: the arena works again, and everything comes back.
        for p in blocks[:3]:
            lib.clamor_arena_free(p)
        a = A.empty(100_000)
        a[:] = 1
        assert A.in_arena(a)
        del a
        for p in blocks[3:]:
            lib.clamor_arena_free(p)
        check()
        assert A.arena_stats()["used"] == 0
        assert lib.clamor_arena_alloc(size) != ffi.NULL
        """
    )


# ------------------------------------------------------------ numpy handler --


def test_shared_routes_numpy_allocations(arena):
    assert get_handler_name() == "default_allocator"
    heap = np.arange(100_000.0)
    with A.shared() as got:
        assert got is arena
        assert get_handler_name() == "clamor_arena"
        x = np.arange(100_000.0)
        y = x * 2 + 1  # temporaries and results
        small = np.array([1, 2, 3])
        copied = heap.copy()
    assert get_handler_name() == "default_allocator"
    for a in (x, y, small, copied):
        assert A.in_arena(a) and get_handler_name(a) == "clamor_arena"
    assert not A.in_arena(heap) and get_handler_name(heap) == "default_allocator"
    outside = y + 1
    assert not A.in_arena(outside)
    assert y[10] == 21.0 and copied[5] == 5.0


def test_nested_shared_restores_and_survives_exceptions(arena):
    with A.shared():
        with A.shared():
            inner = np.ones(10_000)
            assert get_handler_name() == "clamor_arena"
        assert get_handler_name() == "clamor_arena"
        middle = np.ones(10_000)
    assert get_handler_name() == "default_allocator"
    with pytest.raises(KeyError), A.shared(), A.shared():
        raise KeyError("x")
    assert get_handler_name() == "default_allocator"
    assert A.in_arena(inner) and A.in_arena(middle)
    assert not A.in_arena(np.ones(10_000))


def test_handler_is_per_thread(arena):
    seen = {}

    def other() -> None:
        seen["name"] = get_handler_name()
        seen["in_arena"] = A.in_arena(np.ones(10_000))

    with A.shared():
        t = threading.Thread(target=other)
        t.start()
        t.join()
    assert seen == {"name": "default_allocator", "in_arena": False}


def test_heap_arrays_freed_and_resized_while_the_handler_is_active(arena):
    before = A.arena_stats()["allocations"]
    heap = [np.random.rand(n) for n in (1, 10, 1000, 200_000)]
    views = [h[::2] for h in heap]
    heap_resizable = np.arange(1000.0)
    with A.shared():
        del heap, views
        gc.collect()
        heap_resizable.resize(
            500_000, refcheck=False
        )  # realloc through the default handler
        assert not A.in_arena(heap_resizable)
        assert heap_resizable[999] == 999.0
        del heap_resizable
        mine = np.arange(1000.0)
    # An arena array reallocated by numpy stays in the arena with its contents.
    mine.resize(300_000, refcheck=False)
    assert A.in_arena(mine) and mine[999] == 999.0
    mine.resize(10, refcheck=False)
    assert A.in_arena(mine) and mine[9] == 9.0
    del mine
    gc.collect()
    assert A.arena_stats()["allocations"] == before
    check_allocator()


def test_arrays_api(arena):
    z = A.array((3, 4), dtype=np.int32)
    assert z.shape == (3, 4) and z.dtype == np.int32 and not z.any() and A.in_arena(z)
    f = A.array(5, fill=1.5)
    assert f.dtype == np.float64 and (f == 1.5).all() and A.in_arena(f)
    assert z.flags.owndata and f.flags.owndata
    e = A.empty((2, 3), dtype=np.complex64)
    assert e.shape == (2, 3) and e.dtype == np.complex64 and A.in_arena(e)

    heap = np.asfortranarray(np.arange(12.0).reshape(3, 4))
    c = A.asarray(heap)
    assert c is not heap and A.in_arena(c) and np.array_equal(c, heap)
    assert c.flags.f_contiguous
    assert A.asarray(c) is c
    assert A.asarray(c, dtype=np.float32).dtype == np.float32
    lst = A.asarray([[1, 2], [3, 4]])
    assert A.in_arena(lst) and lst.dtype.kind == "i"

    like = A.empty_like(heap)
    assert like.shape == heap.shape and like.dtype == heap.dtype and A.in_arena(like)

    assert A.arena_offset(c) == c.__array_interface__["data"][0] - arena.base
    assert 0 <= A.arena_offset(c) < arena.size
    assert A.arena_offset(c[1:]) == A.arena_offset(c) + 8  # views of arena arrays too
    with pytest.raises(ValueError):
        A.arena_offset(heap)
    assert not A.in_arena(heap) and not A.in_arena([1, 2]) and not A.in_arena(object())
    assert A.in_arena(memoryview(c))
    with pytest.raises(TypeError):
        A.array(3, dtype=object)
    with pytest.raises(TypeError):
        A.asarray([object()])


def test_stats_track_usage(arena):
    before = A.arena_stats()
    assert set(before) >= {
        "size",
        "used",
        "free",
        "high_water",
        "allocations",
        "large_align",
        "last_failed_request",
        "page_size",
    }
    assert before["size"] == arena.size and before["large_align"] == arena.page_size
    assert before["used"] + before["free"] == before["size"]
    a = A.empty(3 * arena.page_size)  # 24 pages of float64
    mid = A.arena_stats()
    assert mid["used"] - before["used"] == a.nbytes
    assert mid["allocations"] == before["allocations"] + 1
    assert mid["high_water"] >= A.arena_offset(a) + a.nbytes
    del a
    after = A.arena_stats()
    assert after["used"] == before["used"] and after["high_water"] == mid["high_water"]


def test_format_bytes():
    assert A.format_bytes(512) == "512 B"
    assert A.format_bytes(1536) == "1.5 KiB"
    assert A.format_bytes(1 << 40) == "1.0 TiB"
    assert A.format_bytes(int(31.9 * (1 << 30))) == "31.9 GiB"


# ------------------------------------------------------------- concurrency --


def test_threads_allocating_numpy_arrays_concurrently(arena):
    before = A.arena_stats()["allocations"]
    errors: list[BaseException] = []
    barrier = threading.Barrier(4)

    def work(tid: int) -> None:
        try:
            rng = np.random.default_rng(tid)
            keep: list[tuple[np.ndarray, float]] = []
            barrier.wait()
            for i in range(150):
                n = int(rng.choice([1, 17, 500, 5000, 70_000, 600_000]))
                value = float(tid * 1000 + i)
                with A.shared():
                    a = np.full(n, value)
                    b = a.copy()  # big copies release the GIL
                    assert A.in_arena(a) and A.in_arena(b)
                keep.append((b, value))
                if len(keep) > 20:
                    keep.pop(int(rng.integers(len(keep))))
                del a
                for arr, v in keep[-3:]:
                    assert (arr == v).all()
            for arr, v in keep:
                assert (arr == v).all(), (
                    f"thread {tid}: array overwritten by another thread"
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    gc.collect()
    assert A.arena_stats()["allocations"] == before
    check_allocator()


def test_threads_calling_the_c_allocator_concurrently(arena):
    errors: list[BaseException] = []

    def work(tid: int) -> None:
        try:
            rng = random.Random(tid)
            live = []
            for i in range(1500):
                if live and rng.random() < 0.5:
                    p, n, key = live.pop(rng.randrange(len(live)))
                    assert np.array_equal(view(p, n), pattern(n, key))
                    lib.clamor_arena_free(p)
                else:
                    n = rng.choice([8, 100, 3000, 20_000, 100_000])
                    key = tid * 100_000 + i
                    p = (
                        lib.clamor_arena_calloc(n, 1)
                        if i % 3 == 0
                        else lib.clamor_arena_alloc(n)
                    )
                    assert p != ffi.NULL
                    if i % 3 == 0:
                        assert not view(p, n).any()
                    view(p, n)[:] = pattern(n, key)
                    live.append((p, n, key))
            for p, n, key in live:
                assert np.array_equal(view(p, n), pattern(n, key))
                lib.clamor_arena_free(p)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    before = A.arena_stats()
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    after = A.arena_stats()
    assert (after["used"], after["allocations"]) == (
        before["used"],
        before["allocations"],
    )
    check_allocator()


def test_forked_child_does_not_allocate_from_the_parents_arena(arena):
    keep = A.array(1000, fill=4.0)
    before = A.arena_stats()
    pid = os.fork()
    if pid == 0:  # child: any failure is reported through the exit status
        code = 1
        try:
            if lib.clamor_arena_alloc(100) == ffi.NULL and keep[999] == 4.0:
                with A.shared():
                    x = np.ones(100_000)  # goes to the child's heap
                    x.resize(300_000, refcheck=False)  # the handler's libc realloc path
                code = 0 if (not A.in_arena(x) and x.sum() == 100_000) else 2
                del x
                lib.clamor_arena_free(lib.clamor_arena_base())  # a no-op, no crash
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = A.arena_stats()
    assert (after["used"], after["allocations"]) == (
        before["used"],
        before["allocations"],
    )
    assert keep[0] == 4.0


# ------------------------------------------------------------------ sklearn --


def test_sklearn_kdtree_built_inside_shared_lives_in_the_arena(arena):
    from sklearn.neighbors import KDTree

    rng = np.random.default_rng(0)
    points = rng.random((5000, 3))
    with A.shared():
        data = points.copy()
        tree = KDTree(data, leaf_size=20)
    arrays = tree.get_arrays()
    assert all(A.in_arena(a) for a in arrays), [A.in_arena(a) for a in arrays]
    reference = KDTree(points, leaf_size=20)
    assert not A.in_arena(reference.get_arrays()[0])
    queries = rng.random((50, 3))
    d1, i1 = tree.query(queries, k=5)
    d2, i2 = reference.query(queries, k=5)
    assert np.array_equal(i1, i2) and np.allclose(d1, d2)
