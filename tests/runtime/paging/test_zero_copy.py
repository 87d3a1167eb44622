"""Zero copy on the driver's host: workers map the driver's arena pages, they do not copy them.

What a user relies on: every worker on the driver's host reads a table in place (no page
lands in its page cache, so N workers do not hold N copies); a task never sees a driver
write made after its epoch, also while it runs (the driver has the worker unmap the page
before the write lands, and the task reads the sealed version from the version log);
and a worker that is stopped or killed while it maps a page never blocks the driver.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from clamor.runtime.errors import WorkerLostError
from clamor.runtime.paging import arena
from clamor.testing.waiting import wait_for
from clamor.testing.zero_copy import read_twice, start_and_wait_until_mapped

import clamor

pytestmark = pytest.mark.slow

MiB = 1 << 20
PAGE = 64 << 10


@pytest.fixture
def cluster(request):
    options = getattr(request, "param", {})  # e.g. read_sets="exact", by indirect parametrization
    with clamor.Cluster(workers=2, page_size=PAGE, **options) as c:  # transport "auto": zero copy here
        yield c


def pid_of(cluster, worker: int) -> int:
    return next(w["pid"] for w in cluster.worker_stats() if w["id"] == worker)


def page_cache_bytes(pid: int) -> int:
    """What the worker's page-cache memfd holds (its blocks): the memory copies would take."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if os.readlink(path).startswith("/memfd:clamor-page-cache"):
                return os.stat(path).st_blocks * 512
        except OSError:
            continue
    raise AssertionError(f"worker process {pid} has no page cache")


def process_state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def test_every_worker_reads_the_whole_table_in_place(cluster):
    table = clamor.empty(32 * MiB // 8, np.int64)
    table[:] = np.arange(len(table))
    before = {w["id"]: w for w in cluster.worker_stats()}
    sums = cluster.run_stage([(w, lambda t: int(t.sum()), (table,)) for w in cluster.workers])
    assert sums == [int(table.sum())] * len(cluster.workers)
    pages = table.nbytes // PAGE
    around = 2 * (2 * MiB // PAGE)  # fault-around may map the rest of the 2 MiB blocks at either end
    for w in cluster.worker_stats():
        assert w["pages_fetched"] == before[w["id"]]["pages_fetched"] and w["cached_pages"] == 0
        assert pages <= w["pages_mapped"] - before[w["id"]]["pages_mapped"] <= pages + around
        assert page_cache_bytes(w["pid"]) < MiB  # no copy of the 32 MiB table in any worker
    assert cluster.stats()["bytes_mapped"] >= 2 * table.nbytes
    read_sets = cluster.last_read_sets
    assert all(len(r) >= pages for r in read_sets)  # every page read is still recorded


def shmem() -> int:
    with open("/proc/meminfo") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("Shmem:"))


def test_four_workers_reading_a_1gib_table_add_less_than_a_quarter_of_it_to_shared_memory():
    table = clamor.empty((1 << 30) // 8, np.int64)
    table[:] = 1
    with clamor.Cluster(workers=4) as cluster:
        before = shmem()
        sums = cluster.run_stage([(w, lambda t: int(t.sum()), (table,)) for w in cluster.workers])
        grown = shmem() - before
    assert sums == [len(table)] * 4
    assert grown < table.nbytes // 4, f"shared memory grew by {grown >> 20} MiB"  # copying: 4 GiB


def test_a_driver_write_while_a_task_maps_the_page_is_shot_down_first(cluster):
    x = clamor.array(PAGE // 8, np.float64)
    x[5] = 1.0
    shootdowns = cluster.stats()["driver"]["shootdowns"]
    result: list = []
    stage = threading.Thread(target=lambda: result.append(cluster.run(read_twice, x, worker=0)))
    start_and_wait_until_mapped(cluster, x, stage)
    x[5] = 2.0
    stage.join(30)
    assert result == [(1.0, 1.0)]
    assert cluster.stats()["driver"]["shootdowns"] == shootdowns + 1
    assert cluster.run(lambda a: float(a[5]), x, worker=0) == 2.0


def test_a_stopped_worker_is_continued_so_the_write_goes_through(cluster):
    x = clamor.array(PAGE // 8, np.float64)
    x[5] = 1.0
    worker = cluster.workers[1]
    pid = pid_of(cluster, worker)
    result: list = []
    stage = threading.Thread(target=lambda: result.append(cluster.run(read_twice, x, worker=worker)))
    start_and_wait_until_mapped(cluster, x, stage)
    os.kill(pid, signal.SIGSTOP)  # a debugger, or Cluster.slow_worker's throttle
    wait_for(lambda: process_state(pid) == "T", what="the worker is stopped")  # the signal is asynchronous
    try:
        t0 = time.monotonic()
        x[5] = 2.0  # waits for the worker to unmap the page; the driver continues it
        took = time.monotonic() - t0
    finally:
        os.kill(pid, signal.SIGCONT)
    stage.join(30)
    assert result == [(1.0, 1.0)]
    assert took < 5
    assert cluster.stats()["driver"]["stopped_continued"] >= 1


def test_a_killed_worker_never_blocks_a_driver_write(cluster):
    x = clamor.array(PAGE // 8, np.float64)
    x[5] = 1.0
    victim, other = cluster.workers
    errors: list[BaseException] = []

    def run() -> None:
        try:
            cluster.run(read_twice, x, worker=victim)
        except BaseException as exc:  # noqa: BLE001 - checked below
            errors.append(exc)

    stage = threading.Thread(target=run)
    start_and_wait_until_mapped(cluster, x, stage)
    os.kill(pid_of(cluster, victim), signal.SIGKILL)  # it still maps the page
    t0 = time.monotonic()
    x[5] = 2.0
    assert time.monotonic() - t0 < 5
    stage.join(30)
    assert len(errors) == 1 and isinstance(errors[0], WorkerLostError)
    assert cluster.run(lambda a: float(a[5]), x, worker=other) == 2.0


def arena_rss_in_task(a: np.ndarray, touch: list[int]) -> int:
    """Read a[i] for each i in ``touch``, then how much of the arena this worker maps
    (Rss of its mappings of the driver's arena memfd): at task start it maps nothing."""
    for i in touch:
        float(a[i])
    rss, in_arena = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            if "-" in line.split(" ", 1)[0]:  # a mapping's header line
                in_arena = "memfd:clamor-arena" in line
            elif in_arena and line.startswith("Rss:"):
                rss += int(line.split()[1]) * 1024
    return rss


@pytest.mark.parametrize("cluster", [{"read_sets": "exact"}], indirect=True)
def test_a_first_touch_maps_one_os_page_and_a_second_the_whole_page(cluster):
    """With exact read sets (every task starts unmapped), a sparse lookup on the driver's
    host installs one OS page per touched page, not the whole (here 64 KiB) page; a
    second touch of the page, as in a scan, maps it all."""
    os_page = os.sysconf("SC_PAGE_SIZE")
    per = PAGE // 8
    x = clamor.array(8 * per, np.float64)
    x[:] = np.arange(len(x))
    worker = cluster.workers[0]
    before = cluster.worker_stats()[0]["subpage_maps"]

    rss = cluster.run(arena_rss_in_task, x, [2 * per, 0, 3 * per, per], worker=worker)  # no two in a row
    assert rss == 4 * os_page  # one OS page of each of the 4 pages
    assert cluster.worker_stats()[0]["subpage_maps"] - before == 4
    assert sorted(p for p, _ in cluster.last_read_sets[0]) == [
        (arena.arena_offset(x) + i * PAGE) // PAGE for i in range(4)]  # each page recorded once

    rss = cluster.run(arena_rss_in_task, x, [0, per // 2], worker=worker)  # two OS pages of page 0
    assert rss == PAGE  # the second touch mapped the whole page

    rss = cluster.run(arena_rss_in_task, x, [4 * per, 5 * per, 6 * per], worker=worker)
    assert rss == os_page + 2 * PAGE  # a first touch right after the page before: a scan
