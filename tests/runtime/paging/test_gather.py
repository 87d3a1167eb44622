"""``clamor.gather(array, index)``: a task's scattered rows of an arena array, as a new
array, without bringing in their pages.

It is numpy's ``array[index]`` (negative rows, repeats, an index of any shape, slices,
masks, rows of several columns) at the task's epoch, on every transport. On the driver's
host the rows are copied from the driver's memory, and a row of a page the driver wrote
since the task's epoch is asked of the driver; elsewhere every row is, in one request.
None of their pages is fetched or mapped, and they join the task's read set. With exact
read sets it reads through the arena (test_exact_read_sets.py). Bad indices fail in the task, and the
cluster goes on.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from clamor.runtime.errors import TaskError
from clamor.runtime.paging import arena

import clamor

pytestmark = pytest.mark.slow

PAGE = 4096


@pytest.fixture(scope="module", params=["tcp", "shm"])
def cluster(request):
    with clamor.Cluster(workers=2, page_size=PAGE, transport=request.param) as c:
        yield c


def pages_of(a: np.ndarray, rows: np.ndarray) -> set[int]:
    """The arena pages rows ``rows`` of ``a`` lie in."""
    row = a.strides[0]
    first = arena.arena_offset(a) + np.asarray(rows) * row
    return {int(p) for f in first for p in range(f // PAGE, (f + row - 1) // PAGE + 1)}


def worker_total(cluster, key: str) -> int:
    return sum(w[key] for w in cluster.worker_stats())


@pytest.mark.parametrize(
    "index",
    [
        np.array([5, -1, 7, 5]),  # negative rows count from the end; a row twice
        np.array([[0, 2], [4_095, 6]]),  # an index of any shape
        slice(100, 2_000, 7),
        np.arange(4_096) % 3 == 0,  # a mask
        [1, 2, 3],
    ],
    ids=["ints", "2d-index", "slice", "mask", "list"],
)
def test_gather_is_numpys_indexing(cluster, index):
    a = clamor.asarray(np.arange(4_096, dtype=np.float64) * 0.5)
    got = cluster.run(lambda x, i: clamor.gather(x, i), a, index)
    assert got.dtype == a.dtype and np.array_equal(got, np.asarray(a)[index])


@pytest.mark.parametrize("shape", [(3_000, 5), (100, 4, 300)])
def test_rows_of_several_columns_come_whole_even_across_pages(cluster, shape):
    m = clamor.asarray(np.arange(np.prod(shape), dtype=np.int32).reshape(shape))
    rows = np.array([0, shape[0] - 1, 17, 17, shape[0] // 2])
    got = cluster.run(lambda x, i: clamor.gather(x, i), m, rows)
    assert np.array_equal(got, np.asarray(m)[rows])


def test_the_rows_travel_without_their_pages(cluster):
    w = clamor.asarray(np.arange(1 << 20, dtype=np.float64))  # 8 MiB, 2,048 pages
    ids = np.unique(np.random.default_rng(5).integers(0, len(w), 3_000))
    keys = ("pages_fetched", "pages_mapped", "rows_gathered", "rows_from_driver", "shm_row_bytes")
    before = {key: worker_total(cluster, key) for key in keys}
    served = cluster.paging.stats()["driver"]["rows_served"]
    got = cluster.run(lambda x, i: clamor.gather(x, i), w, ids, worker=0)
    assert np.array_equal(got, ids.astype(np.float64))
    (read_set,) = cluster.last_read_sets
    assert pages_of(w, ids) <= set(read_set.pages().tolist())  # the rows' pages were read
    moved = {key: worker_total(cluster, key) - n for key, n in before.items()}
    assert moved["pages_fetched"] == moved["pages_mapped"] == 0  # not one page of w
    assert moved["rows_gathered"] == len(ids)
    from_driver = 0 if cluster.worker_info(0)["shm"] else len(ids)  # the driver's memory, or the driver
    assert moved["rows_from_driver"] == from_driver
    assert moved["shm_row_bytes"] == 8 * (len(ids) - from_driver)
    assert cluster.paging.stats()["driver"]["rows_served"] - served == from_driver


def test_the_rows_pages_count_in_the_page_heat_map(cluster):
    w = clamor.asarray(np.arange(1 << 18, dtype=np.float64))
    ids = np.array([5, 100_000, (1 << 18) - 1])
    before = cluster.page_stats(w)["requests"].copy()
    cluster.run(lambda x, i: clamor.gather(x, i), w, ids)
    first = cluster.page_stats(w)["first_page"]
    hot = first + np.flatnonzero(cluster.page_stats(w)["requests"] > before)
    assert set(hot.tolist()) == pages_of(w, ids)


def test_rows_are_those_of_the_tasks_epoch(cluster):
    a = clamor.asarray(np.arange(8_192, dtype=np.float64))
    ids = np.array([1, 700, 5_000])
    assert cluster.run(lambda x, i: clamor.gather(x, i), a, ids).tolist() == [1.0, 700.0, 5_000.0]
    old = cluster.last_epoch
    with cluster.keep_versions(old):
        clamor.write(a, ids, 0.0)
        for worker in (0, 1):
            assert cluster.run(lambda x, i: clamor.gather(x, i), a, ids, worker=worker).tolist() == [0.0] * 3
        replay = cluster.run(lambda x, i: clamor.gather(x, i), a, ids, worker=0, epoch=old)
        assert replay.tolist() == [1.0, 700.0, 5_000.0]


def test_a_write_while_the_stage_runs_is_not_seen_by_it(cluster):
    a = clamor.asarray(np.full(4_096, 7.0))

    def gather_late(x, i):
        time.sleep(1.0)
        return clamor.gather(x, i).tolist()

    from_driver = worker_total(cluster, "rows_from_driver")
    running = cluster.submit(gather_late, a, [10, 11], worker=0)
    time.sleep(0.3)  # the stage runs
    a[10] = 8.0
    assert running.result(timeout=30) == [7.0, 7.0]
    assert worker_total(cluster, "rows_from_driver") - from_driver == 2  # their page is no longer the epoch's
    assert cluster.run(lambda x, i: clamor.gather(x, i).tolist(), a, [10, 11], worker=0) == [8.0, 7.0]


def test_a_bad_index_fails_in_the_task_and_the_cluster_goes_on(cluster):
    a = clamor.asarray(np.arange(100, dtype=np.float64))
    for index in (np.array([3, 100]), np.array([-101]), np.array([1.5])):
        with pytest.raises((IndexError, TaskError)):
            cluster.run(lambda x, i: clamor.gather(x, i), a, index)
    assert cluster.run(lambda x: clamor.gather(x, [99, 0]).tolist(), a) == [99.0, 0.0]


def test_outside_a_worker_it_is_a_copy_of_numpys_indexing():
    a = clamor.asarray(np.arange(10, dtype=np.float64))
    got = clamor.gather(a, [3, -1])
    assert got.tolist() == [3.0, 9.0]
    got[0] = -1.0
    assert a[3] == 3.0  # a copy, not a view
    assert clamor.gather(np.arange(5), slice(1, 3)).tolist() == [1, 2]  # an array outside the arena
