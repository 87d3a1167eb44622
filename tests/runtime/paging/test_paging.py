"""Demand paging on real worker processes, at every supported page size and transport.

Workers on the driver's host map the pages a task touches from the driver's own
memory, without copying them (`shm`, zero copy; a fault maps the current pages of
its aligned block too); otherwise they copy exactly those pages into their page
cache, from the driver's memfd (`shm-copy`) or over TCP (`tcp`). A task's read set
holds every page it read (and the others its worker keeps resident). The driver's
writes between stages invalidate exactly the written pages, and tasks can read the
arena as of an older epoch from the version log.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from clamor.runtime.errors import ClamorError
from clamor.runtime.paging import arena
from clamor.testing.waiting import wait_for

import clamor

pytestmark = pytest.mark.slow

PAGE_SIZES = {"4KiB": 4 << 10, "256KiB": 256 << 10, "4MiB": 4 << 20}
TRANSPORTS = ("shm", "shm-copy", "tcp")
TABLE_BYTES = 2 << 30


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    """A 2 GiB arena array; only the pages a test fills are ever touched."""
    return clamor.empty(TABLE_BYTES // 8, np.float64)


@pytest.fixture(
    scope="module",
    params=[(ps, t) for ps in PAGE_SIZES.values() for t in TRANSPORTS],
    ids=[f"{name}-{t}" for name in PAGE_SIZES for t in TRANSPORTS],
)
def cluster(request):
    page_size, transport = request.param
    with clamor.Cluster(workers=2, page_size=page_size, transport=transport) as c:
        c.zero_copy = transport == "shm"  # for the tests below
        yield c


def page_of(x: np.ndarray, index: int, page_size: int) -> int:
    """Arena page holding element `index` of the 1-D array `x`."""
    return (arena.arena_offset(x) + index * x.itemsize) // page_size


def fetched(cluster) -> list[int]:
    return [w["bytes_fetched"] for w in cluster.worker_stats()]


def mapped(cluster) -> list[int]:
    return [w["pages_mapped"] for w in cluster.worker_stats()]


def value(i: np.ndarray) -> np.ndarray:
    return (i % 9973).astype(np.float64) * 0.5


def lookups(first_elems: np.ndarray, per_page: int, seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return first_elems[rng.integers(0, len(first_elems), n)] + rng.integers(0, per_page, n)


def sparse_sum(table, first_elems, per_page, seed, n):
    return float(table[lookups(first_elems, per_page, seed, n)].sum())


def test_sparse_lookups_fetch_only_the_pages_touched(cluster, table):
    ps = cluster.page_size
    per_page = ps // 8
    base = -(-arena.arena_offset(table) // ps) * ps - arena.arena_offset(table)  # first whole page
    n_pages = (TABLE_BYTES - base) // ps
    chosen = np.arange(0, n_pages, 100)[: max(1, n_pages // 100)]  # 1 %, never adjacent
    first_elems = base // 8 + chosen * per_page
    for e in first_elems:
        table[e : e + per_page] = value(np.arange(e, e + per_page))

    before, before_mapped = fetched(cluster), mapped(cluster)
    n = 1_000_000
    results = cluster.run_stage(
        [(w, sparse_sum, (table, first_elems, per_page, seed, n)) for w, seed in ((0, 1), (1, 2))]
    )
    for (w, seed), got, read_set in zip(((0, 1), (1, 2)), results, cluster.last_read_sets):
        idx = lookups(first_elems, per_page, seed, n)
        assert got == pytest.approx(float(value(idx).sum()), rel=1e-12)
        touched = set(np.unique((arena.arena_offset(table) + idx * 8) // ps).tolist())
        if cluster.zero_copy:  # each page mapped once (with its block's neighbours), none copied
            assert mapped(cluster)[w] - before_mapped[w] >= len(touched)
            assert fetched(cluster)[w] - before[w] == 0
        else:
            assert fetched(cluster)[w] - before[w] == len(touched) * ps
            assert mapped(cluster)[w] - before_mapped[w] == 0
        assert {p for p, _ in read_set} >= touched  # resident pages: a superset

    stats = cluster.page_stats()
    requested = set(np.flatnonzero(stats["requests"]).tolist())
    assert requested == {page_of(table, e, ps) for e in first_elems}


def test_driver_update_invalidates_exactly_one_page(cluster):
    ps = cluster.page_size
    x = clamor.array(16 * ps // 8, np.float64)
    x[:] = np.arange(len(x), dtype=np.float64)
    total = float(x.sum())
    assert cluster.run(lambda a: float(a.sum()), x, worker=0) == total
    old_epoch = cluster.stats()["epoch"]
    k = len(x) // 2 + 3
    before = cluster.worker_stats()[0]

    with cluster.keep_versions(old_epoch):  # what lineage does for the partitions it may recompute
        x[k] = -1.0
        assert cluster.run(lambda a: float(a.sum()), x, worker=0) == total - k - 1.0
        after = cluster.worker_stats()[0]
        if cluster.zero_copy:  # the page stays mapped in place and shows its new version
            assert dict(cluster.last_read_sets[0])[page_of(x, k, ps)] == cluster.stats()["epoch"]
            assert after["updated_in_place"] - before["updated_in_place"] == 1
            assert after["pages_mapped"] - before["pages_mapped"] == 1
            assert after["invalidations"] - before["invalidations"] == 0
            assert after["pages_fetched"] - before["pages_fetched"] == 0
        else:
            assert after["invalidations"] - before["invalidations"] == 1
            assert after["pages_fetched"] - before["pages_fetched"] == 1
            assert cluster.stats()["invalidations"] >= 1

        # A replay at the old epoch reads the old bytes, from the version log (with
        # zero copy, as a private copy of that one page); the current epoch, the new.
        fetched_before = cluster.worker_stats()[1]["pages_fetched"]
        assert cluster.run(lambda a, i: float(a[i]), x, k, worker=1, epoch=old_epoch) == float(k)
        if cluster.zero_copy:
            assert cluster.worker_stats()[1]["pages_fetched"] - fetched_before == 1
        assert cluster.run(lambda a, i: float(a[i]), x, k, worker=1) == -1.0
        assert cluster.run(lambda a, i: float(a[i]), x, k, worker=1, epoch=old_epoch) == float(k)
        assert cluster.run(lambda a, i: float(a[i]), x, k, worker=1) == -1.0
        # worker 0 kept the page mapped at its new version: a replay there reads the old
        assert cluster.run(lambda a, i: float(a[i]), x, k, worker=0, epoch=old_epoch) == float(k)
        assert cluster.run(lambda a, i: float(a[i]), x, k, worker=0) == -1.0
        page = page_of(x, k, ps)
        old = np.frombuffer(cluster.paging.read_version(page, old_epoch), np.float64)
        start = (page * ps - arena.arena_offset(x)) // 8
        assert old[k - start] == float(k)
        assert cluster.stats()["version_log_bytes"] >= ps

    # Released: the next stage frees the old version, and a replay at that epoch is refused.
    assert cluster.run(lambda a, i: float(a[i]), x, k, worker=1) == -1.0
    assert cluster.stats()["version_log_bytes"] == 0
    with pytest.raises(ClamorError, match="freed"):
        cluster.run(lambda a, i: float(a[i]), x, k, worker=1, epoch=old_epoch)
    assert cluster.workers == [0, 1]  # refused in the driver: no worker was hurt


def test_pages_rewritten_between_stages_show_the_new_bytes_everywhere(cluster):
    """Whether a worker kept a written page mapped in place, had read it as a hole
    (never written: zeros), or as a private copy for a replay, the next stage reads
    what the driver wrote."""
    ps = cluster.page_size
    x = clamor.array(8 * ps // 8, np.float64)  # fresh arena memory: holes in the driver's memfd
    reads = [(None, lambda a: float(a.sum()), (x,), {}) for _ in range(4)]
    assert cluster.run_stage(reads) == [0.0] * 4
    for value in (1.0, 2.0):
        x[:] = value
        assert cluster.run_stage(reads) == [value * len(x)] * 4
    with cluster.keep_versions(cluster.seal_epoch()):
        x[::7] = 3.0
        old = cluster.stats()["epoch"]
        assert cluster.run(lambda a: float(a.sum()), x, worker=0, epoch=old) == 2.0 * len(x)
    expected = float(x.sum())
    assert cluster.run_stage(reads) == [expected] * 4


def test_write_during_a_running_stage_never_changes_what_it_reads(cluster, tmp_path):
    x = clamor.array(cluster.page_size // 8 * 2, np.float64)
    x[5] = 1.0
    has_read = tmp_path / "read"

    def slow_read(a, has_read):
        before = float(a[5])  # mapped (or cached) now: the write below must not show through
        has_read.touch()
        time.sleep(1.0)
        return before, float(a[5])

    shootdowns = cluster.stats()["driver"]["shootdowns"]
    result: list[tuple[float, float]] = []
    stage = threading.Thread(target=lambda: result.append(cluster.run(slow_read, x, has_read, worker=0)))
    stage.start()
    wait_for(has_read.exists)
    x[5] = 2.0  # the stage is running: its page is sealed, this write goes to a new version
    stage.join()
    assert result == [(1.0, 1.0)]
    if cluster.zero_copy:  # worker 0 mapped the driver's page: it was unmapped before the write
        # (and so was it on worker 1, if it maps it still from an array here before)
        assert 1 <= cluster.stats()["driver"]["shootdowns"] - shootdowns <= len(cluster.workers)
    assert cluster.run(lambda a: float(a[5]), x, worker=0) == 2.0


def test_read_sets_cover_every_page_read_cached_ones_too(cluster):
    ps = cluster.page_size
    x = clamor.array(12 * ps // 8, np.float64)
    per = ps // 8

    def touch(a, pages):
        return float(sum(a[p * per] for p in pages))

    cluster.run(touch, x, [1, 5, 9], worker=0)
    first = {p for p, _ in cluster.last_read_sets[0]}
    cluster.run(touch, x, [5], worker=0)  # cached or still mapped now: recorded all the same
    assert {p for p, _ in cluster.last_read_sets[0]} >= {page_of(x, 5 * per, ps)}
    assert first >= {page_of(x, p * per, ps) for p in (1, 5, 9)}


def test_a_system_call_can_read_pages_not_fetched_yet(cluster):
    x = clamor.array(3 * cluster.page_size // 8, np.float64)
    x[:] = np.arange(len(x)) * 3.0

    def send_through_pipe(a):
        r, w = os.pipe()
        data = memoryview(a[len(a) // 3 : len(a) // 3 + 1024]).cast("B")
        written = os.write(w, data)  # the kernel touches pages nobody has fetched
        os.close(w)
        got = os.read(r, written)
        os.close(r)
        return np.frombuffer(got, np.float64).copy()

    got = cluster.run(send_through_pipe, x, worker=1)
    assert np.array_equal(got, x[len(x) // 3 : len(x) // 3 + 1024])
