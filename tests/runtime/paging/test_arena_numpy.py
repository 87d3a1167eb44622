"""The arena's numpy face: ``clamor.shared()`` (the NEP 49 handler), the array API,
allocation from many threads at once, forked children, and sklearn inside ``shared``.
"""

from __future__ import annotations

import gc
import os
import random
import threading

import numpy as np
import pytest
from arena_checks import check_allocator, pattern, view
from clamor.runtime.paging import arena as A
from clamor.runtime.paging.native import _native
from numpy._core.multiarray import get_handler_name

ffi, lib = _native.ffi, _native.lib


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
