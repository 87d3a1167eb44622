"""Clamor workers started inside a real Dask distributed cluster (runtime/launchers/dask.py).

A ``LocalCluster`` with two worker processes stands in for dask-gateway: the Clamor
workers must run as children of the Dask worker processes, page the driver's arena
on demand, survive a ``kill_worker`` (the work is rerun / recomputed on the other
worker), and leave the Dask cluster healthy and without a Clamor process when closed.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import sys
import threading
import time

import distributed
import numpy as np
import psutil
import pytest
from clamor.runtime.errors import ClamorError, WorkerLostError
from clamor.runtime.launchers.dask import DaskLauncher
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.testing.waiting import wait_for

import clamor

#: ``dashboard_address=None`` still starts the dashboard on :8787; switch it off.
NO_DASHBOARD = {"dashboard_address": ":0", "scheduler_kwargs": {"dashboard": False}}


@pytest.fixture(scope="module", autouse=True)
def _spawnable_main():
    """Dask's nannies start with multiprocessing's spawn, which reads ``__main__.__spec__``;
    IPython shells made by earlier tests in this process leave a ``__main__`` without it."""
    with pytest.MonkeyPatch.context() as mp:
        main = sys.modules["__main__"]
        if not hasattr(main, "__spec__"):
            mp.setattr(main, "__spec__", None, raising=False)
        yield


@pytest.fixture(scope="module")
def dask_client(_spawnable_main):
    with distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        host="127.0.0.1",
        **NO_DASHBOARD,
    ) as dask_cluster, distributed.Client(dask_cluster, set_as_default=False) as client:
        client.wait_for_workers(2, timeout=60)
        yield client


def clamor_workers_under(pids: set[int]) -> list[psutil.Process]:
    """Live ``clamor.runtime.worker.process`` processes descending from ``pids`` (the Dask workers;
    other tests may run Clamor workers of their own on this machine meanwhile)."""
    found = []
    for pid in pids:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in psutil.Process(pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess):
                    if "clamor.runtime.worker.process" in proc.cmdline() and proc.status() != psutil.STATUS_ZOMBIE:
                        found.append(proc)
    return found


def clamor_keys(client) -> list[str]:
    """The launcher's Dask tasks the scheduler still holds or runs."""
    held = [*client.who_has(), *(k for keys in client.processing().values() for k in keys)]
    return [str(k) for k in held if str(k).startswith("clamor-worker-")]


def slice_sums(x: np.ndarray, slices: list[tuple[int, int]]) -> list[float]:
    return [float(x[a:b].sum()) for a, b in slices]


def slow_sum(x: np.ndarray, s: tuple[int, int], started: str) -> float:
    """Sum a slice, slowly, after leaving a marker named after this worker's pid."""
    open(os.path.join(started, str(os.getpid())), "w").close()
    time.sleep(0.3)
    return float(x[s[0] : s[1]].sum())


@pytest.mark.slow
def test_workers_inside_dask_page_the_arena_and_survive_kills(dask_client, tmp_path):
    dask_pids = set(dask_client.run(os.getpid).values())
    assert len(dask_pids) == 2
    assert clamor_workers_under(dask_pids) == []

    launcher = DaskLauncher(dask_client)
    cluster = clamor.Cluster(3, launcher=launcher, log_dir=str(tmp_path), transport="tcp", timeout=60,
                             restarts=0)  # the killed ones stay lost  # fmt: skip
    try:
        assert cluster.workers == [0, 1, 2]
        pids = [cluster.worker_pid(w) for w in cluster.workers]
        assert sorted(p.pid for p in clamor_workers_under(dask_pids)) == sorted(pids)
        # Each Clamor worker is a child of a Dask worker process, round-robin (0 and 2 share one).
        parents = [psutil.Process(cluster.worker_pid(w)).ppid() for w in cluster.workers]
        assert set(parents) == dask_pids and parents[0] == parents[2] != parents[1]
        for w in cluster.workers:
            assert launcher.describe(w).startswith("dask worker tcp://127.0.0.1:")
            assert f"pid {cluster.worker_pid(w)}" in launcher.describe(w)
            assert launcher.exitcode(w) is None
        # The long-running tasks seceded: Dask (one thread per worker) still runs its own work.
        assert dask_client.submit(sum, [1, 2, 3], pure=False).result(timeout=30) == 6

        n = 1 << 20  # 8 MiB of float64 in the arena
        x = clamor.array(n, np.float64)
        x[:] = np.arange(n, dtype=np.float64) % 1000
        bounds = np.linspace(0, n, 25).astype(int)
        slices = [(int(a), int(b)) for a, b in itertools.pairwise(bounds)]
        expect = [float(x[a:b].sum()) for a, b in slices]

        # A demand-paging stage: each worker sums a third of the slices.
        got = cluster.run_stage([(w, slice_sums, (x, slices[8 * w : 8 * w + 8])) for w in (0, 1, 2)])
        assert got[0] + got[1] + got[2] == expect
        stats = cluster.stats()
        assert stats["pages_fetched"] > 0 and stats["bytes_served_by_driver"] > 0
        assert all(w["pages_fetched"] > 0 for w in stats["workers"])

        # A persisted dataset over the arena, then a kill between stages: recomputed elsewhere.
        sums = cluster.parallelize(slices, partitions=12).map(lambda s: float(x[s[0] : s[1]].sum()))
        sums = sums.persist()
        assert sums.collect() == expect
        assert 0 in sums.locations()
        victim_pid = cluster.worker_pid(0)
        cluster.kill_worker(0)
        assert cluster.workers == [1, 2]
        assert not psutil.pid_exists(victim_pid) or psutil.Process(victim_pid).status() == psutil.STATUS_ZOMBIE
        assert launcher.exitcode(0) == -9
        assert "killed by signal 9" in cluster.worker_stats()[0]["lost"]
        with pytest.raises(WorkerLostError):
            cluster.run(float, 1.0, worker=0)
        assert sums.collect() == expect  # the lost partitions, recomputed from lineage
        assert cluster.counters()["tasks_recomputed"] >= 1

        # A kill during a stage: worker 1's running task is rerun on worker 2.
        started = tmp_path / "started"
        started.mkdir()
        job = cluster.parallelize(slices, partitions=12).map(lambda s: slow_sum(x, s, str(started)))
        result: list = []
        runner = threading.Thread(target=lambda: result.append(job.collect()))
        runner.start()
        try:
            wait_for(lambda: (started / str(cluster.worker_pid(1))).exists())
            cluster.kill_worker(1)
        finally:
            runner.join(120)
        assert not runner.is_alive() and result == [expect]
        assert cluster.workers == [2] and launcher.exitcode(1) == -9

        x[:] += 1.0  # the driver writes; the survivor sees the new pages
        plus = [e + (b - a) for e, (a, b) in zip(expect, slices)]
        assert cluster.run(slice_sums, x, slices, worker=2) == plus
    finally:
        cluster.close()

    # Nothing left: no Clamor worker process, no Dask task, and the Dask cluster works.
    wait_for(lambda: not clamor_workers_under(dask_pids), timeout=10)
    assert launcher.exitcode(2) == 0  # the survivor shut down cleanly
    assert set(dask_client.run(os.getpid).values()) == dask_pids  # the same Dask processes
    assert dask_client.submit(sum, [1, 2, 3], pure=False).result(timeout=30) == 6
    wait_for(lambda: not clamor_keys(dask_client), timeout=10)  # the tasks are released
    assert (tmp_path / "worker-2.log").exists()  # this host shares the driver's log_dir


def test_a_worker_that_cannot_start_is_reported_with_its_dask_worker(dask_client):
    launcher = DaskLauncher(dask_client, python="/nonexistent/python")
    with pytest.raises(ClamorError, match=r"worker 0 \(dask worker tcp://.*cannot run /nonexistent/python"):
        clamor.Cluster(1, launcher=launcher, paging=NullDriverPaging(), timeout=30)
    assert launcher.exitcode(0) == 127
    wait_for(lambda: not clamor_keys(dask_client), timeout=10)


def test_unknown_dask_worker_is_a_clear_error(dask_client):
    known = sorted(dask_client.scheduler_info()["workers"])
    with pytest.raises(ValueError, match=r"unknown Dask worker\(s\) tcp://127\.0\.0\.1:1 .*its workers are: ") as info:
        DaskLauncher(dask_client.scheduler.address, workers=["tcp://127.0.0.1:1"])
    assert all(addr in str(info.value) for addr in known)
    launcher = DaskLauncher(dask_client, workers=[known[1]])  # a known one is accepted
    assert launcher._targets == [known[1]]
    launcher.close()


def test_dask_cluster_without_workers_is_a_clear_error():
    with (
        distributed.LocalCluster(n_workers=0, host="127.0.0.1", **NO_DASHBOARD) as empty,
        distributed.Client(empty, set_as_default=False) as client,
        pytest.raises(ValueError, match="has no workers"),
    ):
        DaskLauncher(client)
