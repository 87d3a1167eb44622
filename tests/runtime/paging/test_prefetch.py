"""``clamor.prefetch(array, index)``: a task that knows its indices brings their pages in
as one pipelined stream (many requests in flight) instead of one round trip per fault.

It returns the same bytes as faulting page by page, at every page size, at the task's
epoch (also after a driver write, and for a replay at an older epoch); the pages count
in the task's read set; on the driver's host it maps them in place; pages another worker
holds stream from that worker, and a peer that dies mid-stream leaves them to the
driver; anywhere else than on a worker it does nothing.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from clamor.runtime.paging import arena
from clamor.runtime.paging.pager import READ_SET_BLOCK

import clamor

pytestmark = pytest.mark.slow

PAGE_SIZES = {"4KiB": 4 << 10, "4MiB": 4 << 20}


@pytest.fixture(scope="module")
def table() -> np.ndarray:
    t = clamor.empty((32 << 20) // 8, np.int64)
    t[:] = np.arange(len(t))
    return t


@pytest.fixture(scope="module")
def indices(table) -> np.ndarray:
    return np.sort(np.random.default_rng(3).integers(0, len(table), 3000))


def pages_of(t: np.ndarray, i, page_size: int) -> set[int]:
    """The arena pages elements ``i`` of ``t`` lie in."""
    return set(((arena.arena_offset(t) + np.asarray(i) * t.itemsize) // page_size).tolist())


def gather(t: np.ndarray, i: np.ndarray) -> int:
    return int(t[i].sum())


def prefetch_then_gather(t: np.ndarray, i: np.ndarray) -> tuple[int, int]:
    n = clamor.prefetch(t, i)
    return gather(t, i), n


@pytest.mark.parametrize("page_size", PAGE_SIZES.values(), ids=PAGE_SIZES.keys())
def test_prefetched_pages_are_the_faulted_ones_over_tcp(table, indices, page_size):
    """Over TCP: the same sum and read set as page faults, with every page prefetched
    and far fewer requests than pages."""
    expected = int(table[indices].sum())
    with clamor.Cluster(workers=2, page_size=page_size, transport="tcp", readahead=False) as cluster:
        faulted = cluster.run(gather, table, indices, worker=0)
        faulted_reads = cluster.last_read_sets[0]
        (got, resident) = cluster.run(prefetch_then_gather, table, indices, worker=1)
        prefetched_reads = cluster.last_read_sets[0]
        w1 = cluster.worker_stats()[1]
    touched = pages_of(table, indices, page_size)
    assert faulted == got == expected
    assert prefetched_reads == faulted_reads  # whole blocks holding the pages read
    assert touched <= {p for p, _ in prefetched_reads} and resident == len(touched)
    assert w1["faults"] == 0 and w1["prefetched_pages"] == len(touched)
    if page_size == 4 << 10:  # 3,000 scattered pages: runs of neighbours share a request
        assert w1["prefetch_requests"] < len(touched)


@pytest.mark.parametrize("transport, page_size", [("tcp", 4 << 10), ("auto", 256 << 10)])
def test_prefetch_reads_the_tasks_epoch(table, transport, page_size):
    """Also on the driver's host, where the rows' OS pages map in place only while the
    driver's bytes are the task's version: a replay at an older epoch gets copies."""
    x = clamor.array(16 * page_size // 8, np.int64)
    x[:] = 1
    rows = np.arange(0, len(x), 512)
    with clamor.Cluster(workers=1, page_size=page_size, transport=transport) as cluster:
        assert cluster.run(prefetch_then_gather, x, rows)[0] == len(rows)
        old = cluster.stats()["epoch"]
        with cluster.keep_versions(old):
            x[:] = 2  # new versions of every page
            assert cluster.run(prefetch_then_gather, x, rows)[0] == 2 * len(rows)
            assert cluster.run(prefetch_then_gather, x, rows, epoch=old)[0] == len(rows)


def test_on_the_drivers_host_prefetch_maps_in_place(table, indices):
    with clamor.Cluster(workers=1, page_size=4 << 10) as cluster:
        got, resident = cluster.run(prefetch_then_gather, table, indices)
        stats = cluster.worker_stats()[0]
    assert got == int(table[indices].sum())
    assert resident == stats["pages_mapped"] == stats["prefetched_pages"] > 0
    assert stats["pages_fetched"] == 0 and stats["faults"] == 0


def present(a: np.ndarray, rows) -> list[bool]:
    """Whether this process's page table maps each row (``/proc/self/pagemap`` bit 63)."""
    os_page = os.sysconf("SC_PAGE_SIZE")
    out = []
    with open("/proc/self/pagemap", "rb") as f:
        for r in rows:
            f.seek(a[r:].__array_interface__["data"][0] // os_page * 8)
            out.append(bool(int.from_bytes(f.read(8), "little") >> 63))
    return out


def test_on_the_drivers_host_prefetch_maps_only_the_rows_os_pages(table, indices):
    """256 KiB pages: a prefetch of scattered rows installs the OS pages they lie on,
    not the 64 of each arena page; the read set is still per arena page."""
    per_os_page = os.sysconf("SC_PAGE_SIZE") // table.itemsize

    def task(t, rows, neighbours):
        resident = clamor.prefetch(t, rows)
        return resident, present(t, rows), present(t, neighbours), gather(t, rows)

    rows = indices[::10]
    neighbours = [r + per_os_page for r in rows if (r + per_os_page) // per_os_page not in set(rows // per_os_page)]
    with clamor.Cluster(workers=1, page_size=256 << 10) as cluster:
        resident, mapped, beside, got = cluster.run(task, table, rows, neighbours[:20])
        reads = cluster.last_read_sets[0]
        stats = cluster.worker_stats()[0]
    pages = np.unique((arena.arena_offset(table) + rows * table.itemsize) // (256 << 10))
    block = READ_SET_BLOCK // (256 << 10)  # a resident read set names whole 2 MiB blocks
    blocks = {int(b) * block + i for b in np.unique(pages // block) for i in range(block)}
    assert got == int(table[rows].sum()) and all(mapped) and not any(beside)
    assert resident == len(pages) and set(reads.pages().tolist()) == blocks and stats["faults"] == 0


def test_a_partition_of_an_arena_array_arrives_as_one_stream(table):
    with clamor.Cluster(workers=2, page_size=64 << 10, transport="tcp", readahead=False) as cluster:
        sums = cluster.parallelize(table, partitions=4).map_partitions(lambda p: [int(p.sum())]).collect()
        stats = cluster.worker_stats()
    assert sum(sums) == int(table.sum())
    assert sum(w["prefetched_pages"] for w in stats) >= table.nbytes // (64 << 10)
    assert sum(w["faults"] for w in stats) <= 8  # the pages were there before the task touched them


def test_prefetch_outside_a_worker_does_nothing(table):
    assert clamor.prefetch(table) == 0
    assert clamor.prefetch(np.arange(10), [1, 2]) == 0


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_page_prefetched_by_one_task_is_recorded_again_by_the_next(transport):
    """Pages are unmapped when a task starts, also those a prefetch mapped beyond any
    fault: otherwise the next task would read one without recording it."""
    x = clamor.array(256 * (4 << 10) // 8, np.int64)
    x[:] = 7
    last = len(x) - 1
    with clamor.Cluster(workers=1, page_size=4 << 10, transport=transport) as cluster:
        assert cluster.run(lambda a, i: clamor.prefetch(a, [i]), x, last) == 1
        assert cluster.run(lambda a, i: int(a[i]), x, last) == 7
        assert pages_of(x, [last], 4 << 10) <= {p for p, _ in cluster.last_read_sets[0]}


def every_other_page(t: np.ndarray, page_size: int, pages: int) -> np.ndarray:
    """One element in each of ``pages`` pages, every other page (lone pages: the driver
    may redirect each one to a worker that holds it)."""
    per = page_size // t.itemsize
    return np.arange(pages) * 2 * per


@pytest.mark.parametrize("page_size", PAGE_SIZES.values(), ids=PAGE_SIZES.keys())
def test_redirected_pages_stream_from_the_peer_that_holds_them(table, page_size):
    rows = every_other_page(table, page_size, 4 if page_size > 1 << 20 else 1000)
    with clamor.Cluster(workers=2, page_size=page_size, transport="tcp", replication=True) as cluster:
        cluster.run(gather, table, rows, worker=0)  # worker 0 holds those pages now
        before = cluster.worker_stats()[1]
        assert cluster.run(prefetch_then_gather, table, rows, worker=1)[0] == gather(table, rows)
        after = cluster.worker_stats()[1]
        assert after["from_peers"] - before["from_peers"] == len(rows)  # all from worker 0
        assert after["faults"] == before["faults"]  # nothing left to fault in
        assert after["prefetch_requests"] - before["prefetch_requests"] == len(rows)  # one GET each


def test_a_peer_dying_mid_stream_leaves_the_rest_to_the_driver(table):
    """Worker 1 streams redirected pages from worker 0, which stops answering with the
    requests in flight and is then killed: worker 1 gets them from the driver instead,
    and the task's result is right."""
    rows = every_other_page(table, 4 << 10, 2000)
    with clamor.Cluster(workers=3, page_size=4 << 10, transport="tcp", replication=True) as cluster:
        cluster.run(gather, table, rows, worker=0)  # worker 0 holds the pages
        cluster.run(prefetch_then_gather, table, rows[:5], worker=1)  # and worker 1 is connected to it
        pid0 = next(w["pid"] for w in cluster.worker_stats() if w["id"] == 0)
        os.kill(pid0, signal.SIGSTOP)  # the requests will be sent, never answered
        result: list = []
        stage = threading.Thread(target=lambda: result.append(
            cluster.run(prefetch_then_gather, table, rows, worker=1)))  # fmt: skip
        stage.start()
        time.sleep(1.0)  # the stream is in flight: worker 1 waits for worker 0's answers
        os.kill(pid0, signal.SIGKILL)
        stage.join(60)
        assert result and result[0][0] == gather(table, rows)
        w1 = next(w for w in cluster.worker_stats() if w["id"] == 1)
        assert w1["peer_fallbacks"] >= len(rows) - 5 - 5  # what worker 0 never sent
        assert 1 in cluster.workers and 0 not in cluster.workers


def gather_in_threads(t: np.ndarray, parts: list[np.ndarray]) -> list[int]:
    """Each thread gathers its own scattered rows (numpy drops the GIL for the fancy
    index, so the threads fault at the same time)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(parts)) as pool:
        return list(pool.map(lambda i: int(np.take(t, i).sum()), parts))


def test_faults_of_several_threads_are_fetched_together():
    """Threads of one task that fault at once are served by one pipelined stream, not
    one round trip after another, and read the same bytes as one thread would."""
    table = clamor.array((32 << 20) // 8, np.int64)
    table[:] = np.arange(len(table))
    rng = np.random.default_rng(5)
    parts = [np.sort(rng.integers(0, len(table), 400)) for _ in range(8)]
    with clamor.Cluster(workers=1, page_size=4 << 10, transport="tcp") as cluster:
        for _ in range(3):  # fresh pages each time: the driver writes them all
            table[:] += 1
            assert cluster.run(gather_in_threads, table, parts) == [gather(table, i) for i in parts]
        w = cluster.worker_stats()[0]
        assert w["pipelined_faults"] > 0, w  # some faults came in together
        assert w["faults"] >= w["pipelined_faults"]


def test_a_second_prefetch_of_rows_mapped_in_place_maps_nothing_again(table, indices):
    """Resident pages stay mapped across tasks: prefetching the same rows again finds
    them mapped and skips them (they are still counted as resident)."""
    rows = indices[::10]
    with clamor.Cluster(workers=1, page_size=256 << 10) as cluster:
        first = cluster.run(prefetch_then_gather, table, rows)
        before = cluster.worker_stats()[0]
        again = cluster.run(prefetch_then_gather, table, rows)
        after = cluster.worker_stats()[0]
    assert first == again and first[0] == gather(table, rows) and first[1] > 0
    assert before["prefetched_pages"] == first[1]
    assert after["prefetched_pages"] == before["prefetched_pages"]
    assert after["faults"] == before["faults"] and after["soft_faults"] == before["soft_faults"]


def test_prefetch_counts_negative_rows_from_the_end_and_refuses_rows_out_of_bounds(table):
    def task(t: np.ndarray) -> list:
        out = [clamor.prefetch(t, [-1]), clamor.prefetch(t, np.array([0, -len(t)]))]
        for bad in ([len(t)], [-len(t) - 1], np.array([2**64 - 1], np.uint64)):
            try:
                clamor.prefetch(t, bad)
                out.append("no error")
            except IndexError as e:
                out.append(str(e))
        return out

    with clamor.Cluster(workers=1, page_size=256 << 10) as cluster:
        got = cluster.run(task, table)
        assert got[:2] == [1, 1]
        assert got[2:] == [f"index out of bounds for an axis of length {len(table)}"] * 3
        assert cluster.run(gather, table, np.array([0, len(table) - 1])) == int(table[[0, -1]].sum())
