"""The driver's arena: the C allocator (through cffi) and its Python face.

The arena is a process-global singleton, so tests that need a known, empty
arena (exact reuse, full coalescing, exhaustion of the whole arena, memory
accounting) run in a fresh interpreter; the others use this process's arena
with whatever geometry it has.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest
from arena_checks import addr, check_allocator, offset, pattern, run_fresh, view
from clamor.runtime.errors import ArenaExhaustedError, ClamorError
from clamor.runtime.paging import arena as A
from clamor.runtime.paging.native import _native

ffi, lib = _native.ffi, _native.lib


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
