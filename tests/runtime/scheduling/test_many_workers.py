"""More workers than the 64 a 64-bit holder set allowed: 72 on one cluster.

All 72 are local processes on however few cores the machine has (the test is
kept light: tiny tasks, a few 4 KiB pages, small memory budgets). Every worker
runs a task of one stage, reads pages its peers serve (TCP, replication: the
driver redirects to holders, ids past 63 included), and close leaves no worker
process behind. Start-up time is printed (pytest -s) for the record.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest
from clamor.runtime.paging import arena
from clamor.testing.waiting import exited, still_running

import clamor

pytestmark = pytest.mark.slow

WORKERS = 72
PAGE = 4096
HOT_PAGES = 4


def read_hot(a: np.ndarray, worker: int) -> tuple[int, int, float]:
    """Touch every page of `a`; say who did it."""
    return worker, os.getpid(), float(a[:: PAGE // 8].sum())


def redirect_failures(cluster: clamor.Cluster) -> dict[str, int]:
    """Redirected requests a peer answered NOT_HELD after its bounded wait, and faults
    that went back to the driver: each one makes the driver drop that peer as a holder
    (driver_pager.c, cl_dir_failed), even if the peer's copy has arrived since."""
    stats = cluster.worker_stats()
    return {k: sum(w[k] for w in stats) for k in ("pending_waits", "pending_timeouts", "peer_fallbacks")}


def test_72_workers_run_a_stage_and_serve_each_other_pages():
    t0 = time.monotonic()
    cluster = clamor.Cluster(workers=WORKERS, transport="tcp", replication=True, page_size=PAGE,
                             worker_memory="64MiB", timeout=120)  # fmt: skip
    started = time.monotonic() - t0
    print(f"\n{WORKERS} workers up in {started:.1f} s on {os.cpu_count()} cores")
    try:
        assert cluster.workers == list(range(WORKERS))
        pids = {w: cluster.worker_pid(w) for w in cluster.workers}
        hot = clamor.array(HOT_PAGES * PAGE // 8, np.float64)
        hot[:: PAGE // 8] = np.arange(1, HOT_PAGES + 1)
        expected = float(np.arange(1, HOT_PAGES + 1).sum())
        first = arena.arena_offset(hot) // PAGE

        # Worker 71 reads the pages first: the stage's other readers can be sent to it.
        assert cluster.run(read_hot, hot, WORKERS - 1, worker=WORKERS - 1)[2] == expected
        before = cluster.stats()
        t1 = time.monotonic()
        results = cluster.run_stage([(w, read_hot, (hot, w)) for w in range(WORKERS)])
        print(f"a stage of {WORKERS} tasks in {time.monotonic() - t1:.2f} s; {redirect_failures(cluster)}")
        assert [(w, pid) for w, pid, _ in results] == list(pids.items())  # each on its own worker
        assert all(total == expected for _, _, total in results)
        assert cluster.workers == list(range(WORKERS))  # every worker alive
        assert not any(exited(pid) for pid in pids.values())

        after = cluster.stats()
        assert after["driver"]["redirects"] > before["driver"]["redirects"]
        assert after["bytes_served_by_peers"] > before["bytes_served_by_peers"]
        # Every worker holds every hot page now (fetched from the driver or a peer; a
        # peer's HAVE may still be on its way).
        deadline = time.monotonic() + 10
        while (counts := cluster.paging.page_holders(first, HOT_PAGES)[0]).min() < WORKERS:
            assert time.monotonic() < deadline, (counts, redirect_failures(cluster))
            time.sleep(0.05)
        counts, ids = cluster.paging.page_holders(first, HOT_PAGES)
        assert ids.tolist() == list(range(WORKERS)) * HOT_PAGES
        assert (cluster.page_stats()["holders"][first : first + HOT_PAGES] == WORKERS).all()
        cached = cluster.paging.cached_bytes(((first * PAGE, HOT_PAGES * PAGE),))
        assert cached == {w: HOT_PAGES * PAGE for w in range(WORKERS)}
    finally:
        t2 = time.monotonic()
        cluster.close()
        print(f"closed in {time.monotonic() - t2:.1f} s")
    assert still_running(pids.values(), 10) == []


def arena_value(a: np.ndarray) -> float:
    return float(a[0])


def test_256_workers_forked_at_once_register_run_and_close():
    """A storm of registrations on 2 cores: every worker gets in, stages are exact, the
    driver's descriptors stay a few per worker, and close leaves nothing behind."""
    n = 256
    t0 = time.monotonic()
    cluster = clamor.Cluster(workers=n, worker_memory="64MiB", timeout=180)
    print(f"\n{n} workers up in {time.monotonic() - t0:.1f} s on {os.cpu_count()} cores")
    try:
        assert cluster.workers == list(range(n))
        pids = [cluster.worker_pid(w) for w in cluster.workers]
        assert len(set(pids)) == n
        assert cluster.run_stage([(None, abs, (-i,)) for i in range(2 * n)]) == list(range(2 * n))
        value = clamor.asarray(np.full(PAGE // 8, 7.0))
        assert cluster.run_stage([(w, arena_value, (value,)) for w in cluster.workers]) == [7.0] * n
        fds = len(os.listdir("/proc/self/fd"))
        assert fds <= 3 * n + 128, f"{fds} descriptors in the driver for {n} workers"
        deadline = time.monotonic() + 10  # idle links keep no writer thread
        while threading.active_count() > 100:
            assert time.monotonic() < deadline, f"{threading.active_count()} driver threads for {n} workers"
            time.sleep(0.2)
    finally:
        cluster.close()
    assert still_running(pids, 20) == []
