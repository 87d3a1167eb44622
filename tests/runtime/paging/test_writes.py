"""``clamor.write``: the driver's scattered writes to an arena array, without a write
trap per page, read like any other write by the stages after it.

``clamor.write(a, index, values)`` is ``a[index] = values`` (numpy's broadcasting,
casting, negative indices, masks, repeated rows), copied in through an untracked mapping
after the pages it covers were marked written. So a later stage reads the new values on
every transport (mapped in place, or a copy invalidated), a replay of an older epoch
still reads the old ones, and an index numpy would refuse is refused before anything is
written.
"""

from __future__ import annotations

import resource
import time

import numpy as np
import pytest

import clamor

pytestmark = pytest.mark.slow

PAGE = 4096


@pytest.fixture(scope="module", params=["shm", "tcp"])
def cluster(request):
    with clamor.Cluster(workers=2, page_size=PAGE, transport=request.param) as c:
        yield c


def read(cluster, a, rows, worker):
    return cluster.run(lambda x, i: x[i].copy(), a, rows, worker=worker)


def direct_writes(cluster) -> int:
    return cluster.paging.stats()["driver"]["direct_writes"]


def test_scattered_rows_written_between_stages_are_what_every_later_stage_reads(cluster):
    w = clamor.empty(1 << 20)
    w[:] = 0.0
    reference = np.zeros(len(w))
    ids = np.unique(np.random.default_rng(3).integers(0, len(w), 5_000))
    for worker in (0, 1):
        assert not read(cluster, w, ids, worker).any()  # both hold the pages now
    before = direct_writes(cluster)
    for step in range(3):
        clamor.write(w, ids, w[ids] - 0.5)
        reference[ids] -= 0.5
        for worker in (0, 1):
            assert np.array_equal(read(cluster, w, ids, worker), reference[ids])
    assert direct_writes(cluster) - before == 3 * len(ids)  # every row without a trap
    assert np.array_equal(np.asarray(w), reference)


@pytest.mark.parametrize(
    ("index", "values"),
    [
        (np.array([5, -1, 7]), np.array([1.5, 2.5, 3.5])),  # negative rows count from the end
        (np.array([[0, 2], [4, 6]]), 9),  # an index of any shape; a scalar broadcasts
        (slice(100, 2_000, 7), -3.0),
        (np.arange(4_096) % 3 == 0, np.arange(1366, dtype=np.int64)),  # a mask; ints cast to float
        (np.array([8, 8, 8]), np.array([1.0, 2.0, 3.0])),  # a repeated row ends with its last value
        (3, 4.25),
    ],
)
def test_write_is_numpys_assignment(cluster, index, values):
    a = clamor.asarray(np.arange(4_096, dtype=np.float64))
    expected = np.arange(4_096, dtype=np.float64)
    expected[index] = values
    clamor.write(a, index, values)
    assert np.array_equal(np.asarray(a), expected)
    assert np.array_equal(cluster.run(lambda x: x.copy(), a, worker=1), expected)


@pytest.mark.parametrize("shape", [(512, 16), (64, 4, 8)])
def test_rows_of_a_2d_or_3d_array_are_written_whole(cluster, shape):
    m = clamor.asarray(np.zeros(shape, np.int32))
    rows = np.array([0, 10, shape[0] - 1])
    before = direct_writes(cluster)
    clamor.write(m, rows, np.arange(shape[-1], dtype=np.int32))
    expected = np.zeros(shape, np.int32)
    expected[rows] = np.arange(shape[-1])
    assert np.array_equal(cluster.run(lambda x: x.copy(), m, worker=0), expected)
    assert direct_writes(cluster) - before == len(rows)


def test_rows_that_are_not_one_run_of_bytes_are_written_the_ordinary_way(cluster):
    m = clamor.asarray(np.zeros((64, 8)))
    before = direct_writes(cluster)
    clamor.write(m[:, ::2], [1, 2], 5.0)  # every other column: a row is four pieces
    expected = np.zeros((64, 8))
    expected[[1, 2], ::2] = 5.0
    assert np.array_equal(cluster.run(lambda x: x.copy(), m, worker=1), expected)
    assert direct_writes(cluster) == before


def test_a_replay_of_an_epoch_before_the_write_reads_the_old_values(cluster):
    a = clamor.asarray(np.arange(8_192, dtype=np.float64))
    ids = np.array([1, 700, 5_000])
    assert read(cluster, a, ids, 0).tolist() == [1.0, 700.0, 5_000.0]
    old = cluster.last_epoch
    with cluster.keep_versions(old):
        clamor.write(a, ids, 0.0)
        assert read(cluster, a, ids, 0).tolist() == [0.0, 0.0, 0.0]
        assert cluster.run(lambda x, i: x[i].copy(), a, ids, worker=0, epoch=old).tolist() == [1.0, 700.0, 5_000.0]


def test_a_bad_index_is_refused_and_nothing_is_written(cluster):
    a = clamor.asarray(np.arange(100, dtype=np.float64))
    with pytest.raises(IndexError, match="out of bounds"):
        clamor.write(a, np.array([3, 100]), 0.0)
    with pytest.raises(IndexError, match="out of bounds"):
        clamor.write(a, np.array([-101]), 0.0)
    with pytest.raises(ValueError, match="broadcast"):
        clamor.write(a, np.array([1, 2]), np.zeros(3))
    assert np.array_equal(np.asarray(a), np.arange(100))
    assert cluster.run(lambda x: float(x.sum()), a) == float(np.arange(100).sum())


def test_a_write_while_a_stage_runs_goes_the_trapped_way_and_the_stage_reads_its_epoch(cluster):
    a = clamor.asarray(np.full(4_096, 7.0))

    def slow_read(x, i):
        time.sleep(1.0)
        return float(x[i])

    assert cluster.run(slow_read, a, 10, worker=0) == 7.0  # its pages resident on worker 0
    before = direct_writes(cluster)
    running = cluster.submit(slow_read, a, 10, worker=0)
    time.sleep(0.3)  # the stage runs
    clamor.write(a, [10], 8.0)
    assert running.result(timeout=30) == 7.0  # the stage's epoch: the bytes before the write
    assert direct_writes(cluster) == before  # not the untracked way: its readers were shot down
    assert cluster.run(lambda x, i: float(x[i]), a, 10, worker=0) == 8.0


def test_outside_the_arena_it_is_plain_assignment():
    plain = np.zeros(10)
    clamor.write(plain, [1, 2], 5.0)
    assert plain.tolist() == [0, 5, 5, 0, 0, 0, 0, 0, 0, 0]


def test_the_regions_a_write_reached_are_mapped_ahead_and_later_writes_there_do_not_fault(cluster):
    """``clamor.write`` writes through a mapping of its own, where each page's first write
    would fault (the view mapped it, that mapping did not). The regions a write reaches
    are mapped ahead on a thread of the driver: soon, writes to pages never written
    there before take no page fault."""
    w = clamor.empty(16 << 20)  # 128 MiB: 64 regions of 2 MiB, 32,768 pages
    w[:] = 1.0  # the arena holds every page now
    mapped = cluster.paging.stats()["driver"]["bytes_mapped_ahead"]
    rng = np.random.default_rng(5)
    faults: list[int] = []
    while len(faults) < 20:  # without mapping ahead: hundreds of writes before it stops faulting
        ids = np.unique(rng.integers(0, len(w), 400))  # about 400 pages not written yet
        values = np.full(len(ids), 3.0)
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        clamor.write(w, ids, values)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        assert np.array_equal(np.asarray(w)[ids], values)
        if faults[-1] < 20:
            break
        time.sleep(0.05)
    assert faults[0] > 200 and faults[-1] < 20, faults  # one a page at first, then none
    assert cluster.paging.stats()["driver"]["bytes_mapped_ahead"] - mapped >= w.nbytes // 2
