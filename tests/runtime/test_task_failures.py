"""One bad task costs one task: a task that kills its worker, Ctrl-C, time limits.

Real worker processes. A task that kills its process is charged for it and fails its
stage with ``TaskCrashedError`` once it has done so three times; the lost workers are
replaced, so the cluster keeps its size. A cancelled stage (Ctrl-C, a ``timeout``, a
failed task) has its running tasks interrupted, and a worker whose task does not stop
within the grace period (a long C call) is killed and replaced: the next action runs
at once.
"""

from __future__ import annotations

import _thread
import os
import signal
import threading
import time

import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.cluster_workers import HEARTBEAT_TIMEOUT
from clamor.runtime.errors import ActionTimeoutError, TaskCrashedError
from clamor.runtime.net.task_stream import LINK_TIMEOUT
from clamor.runtime.paging.paging_api import NullDriverPaging


@pytest.fixture
def cluster():
    with Cluster(3, paging=NullDriverPaging(), timeout=30, speculation=False) as c:
        yield c


def endless() -> None:
    while True:  # Python bytecode: an interrupt stops it
        pass


def pids(cluster: Cluster) -> dict[int, int]:
    return {w: cluster.worker_pid(w) for w in cluster.workers}


def kill_myself_on(bad: int):
    def task(i: int) -> int:
        if i == bad:
            os.kill(os.getpid(), 9)
        return i

    return task


def test_a_task_that_kills_its_worker_fails_its_stage_and_the_cluster_keeps_its_size(cluster):
    with pytest.raises(TaskCrashedError) as failure:
        cluster.range(6, partitions=6).map(kill_myself_on(3)).collect()
    error = failure.value
    assert error.index == 3 and error.losses == 3
    assert "task 3 of stage 'collect: map' was running each time its worker was lost, 3 times" in str(error)
    assert "killed by signal 9 (SIGKILL)" in str(error)
    assert len(cluster.wait_for_workers(timeout=60)) == 3  # three replacements, new ids
    assert set(cluster.workers) & {0, 1, 2} != {0, 1, 2}
    assert cluster.range(6, partitions=6).map(lambda i: i * 2).collect() == [0, 2, 4, 6, 8, 10]


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt during the test, as in a kernel: a process started in
    the background by a non-interactive shell (``nohup``, ``make test &`` in a script)
    starts with SIGINT ignored, and ``interrupt_main`` then does nothing."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_ctrl_c_stops_a_task_in_a_long_c_call_and_the_next_action_runs_at_once(cluster, ctrl_c_raises):
    before = pids(cluster)
    threading.Timer(0.5, _thread.interrupt_main).start()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        cluster.run(time.sleep, 10**6)
    assert time.monotonic() - started < 10  # the grace period, then a kill
    started = time.monotonic()
    assert cluster.run(lambda: 7) == 7
    assert time.monotonic() - started < 5
    assert len(cluster.wait_for_workers(timeout=60)) == 3
    assert pids(cluster) != before  # the sleeping one was killed and replaced
    assert len(set(pids(cluster).values()) & set(before.values())) == 2


def test_a_timeout_interrupts_a_python_loop_and_keeps_its_worker(cluster):
    before = pids(cluster)
    with pytest.raises(ActionTimeoutError, match=r"run did not finish within 0.5 s"):
        cluster.run(endless, timeout=0.5)
    assert pids(cluster) == before  # interrupted, not killed
    assert cluster.counters()["tasks_interrupted"] == 1
    assert cluster.run(lambda: 8) == 8


def test_a_dataset_action_times_out_and_its_stage_stops(cluster):
    def slow(i: int) -> int:
        while True:
            pass

    with pytest.raises(ActionTimeoutError, match=r"count did not finish within 1 s: stage 'count: map \(partials\)' \(0 of 3 tasks done\)"):
        cluster.range(3, partitions=3).map(slow).count(timeout=1)
    assert cluster.range(3, partitions=3).count() == 3


def test_the_clusters_action_timeout_applies_to_every_action():
    with Cluster(1, paging=NullDriverPaging(), timeout=30, action_timeout=0.5) as c:
        with pytest.raises(ActionTimeoutError):
            c.run(endless)
        assert c.run(lambda: 1, timeout=30) == 1
    with pytest.raises(ValueError, match="action_timeout must be a number of seconds > 0"):
        Cluster(1, paging=NullDriverPaging(), action_timeout=0)


def test_a_failed_task_stops_its_stages_other_running_tasks(cluster):
    def task(i: int) -> int:
        if i == 0:
            time.sleep(0.3)
            raise ValueError("bad input")
        while True:  # the others would run forever
            pass

    with pytest.raises(ValueError, match="bad input"):
        cluster.range(3, partitions=3).map(task).collect()
    assert cluster.range(3, partitions=3).count() == 3


@pytest.mark.slow  # 25 s under the GIL
def test_a_task_holding_the_gil_past_every_timeout_finishes_and_every_worker_lives(cluster):
    """A long C call that keeps the GIL (``PyDLL`` keeps it) leaves the worker unable
    to answer the driver's pings or send heartbeats, here for 2.5 times the link's and
    the heartbeats' timeouts; the driver sees its process still running and waits, as
    it does for any busy worker."""
    before = pids(cluster)
    seconds = 2.5 * max(LINK_TIMEOUT, HEARTBEAT_TIMEOUT)

    def hold(i: int) -> int:
        if i == 0:
            import ctypes

            ctypes.PyDLL(None).sleep(int(seconds))
        return i

    started = time.monotonic()
    assert cluster.range(3, partitions=3).map(hold).collect() == [0, 1, 2]
    assert time.monotonic() - started >= int(seconds)
    assert pids(cluster) == before
    assert cluster.counters()["tasks_lost"] == 0
