"""Futures: cluster.submit / map / executor() behave as concurrent.futures' do.

Real worker processes. Calls submitted together run as one streaming stage, so each
future resolves when its task ends, and a task's error fails its future alone.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import threading
import time

import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import ClamorError, SerializationError
from clamor.runtime.futures import ClusterFuture
from clamor.runtime.paging.paging_api import NullDriverPaging


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2, paging=NullDriverPaging(), timeout=30, speculation=False) as c:
        yield c


def test_submit_returns_at_once_and_the_calls_run_in_parallel(cluster):
    started = time.monotonic()
    futures = [cluster.submit(time.sleep, 0.5) for _ in range(4)]
    assert time.monotonic() - started < 0.3 and all(isinstance(f, ClusterFuture) for f in futures)
    done, pending = cf.wait(futures, timeout=30)
    assert not pending and all(f.result() is None for f in done)
    assert time.monotonic() - started < 1.9  # 4 x 0.5 s on 2 workers, not 2 s in a row


def test_each_future_has_its_own_result_or_error(cluster):
    futures = cluster.map(lambda x: 10 // x, [5, 0, 2])
    assert futures[0].result(30) == 2 and futures[2].result(30) == 5
    assert isinstance(futures[1].exception(30), ZeroDivisionError)
    with pytest.raises(ZeroDivisionError):
        futures[1].result()
    assert sorted(f.result() for f in cf.as_completed([futures[0], futures[2]], timeout=30)) == [2, 5]


def test_a_future_resolves_when_its_task_ends_not_when_its_batch_does(cluster):
    slow = cluster.submit(time.sleep, 2.0)
    quick = cluster.submit(lambda: "quick")
    assert quick.result(timeout=1.8) == "quick" and not slow.done()
    slow.result(30)


def test_callbacks_await_and_the_executor(cluster):
    seen = threading.Event()
    cluster.submit(lambda: 1).add_done_callback(lambda f: f.result() == 1 and seen.set())
    assert seen.wait(30)

    async def twice() -> list[int]:
        return [await cluster.submit(lambda: 21 * 2), await cluster.submit(pow, 2, 5)]

    assert asyncio.run(twice()) == [42, 32]
    with cluster.executor() as executor:
        assert list(executor.map(str, range(4))) == ["0", "1", "2", "3"]
        assert executor.submit(sum, [1, 2, 3]).result(30) == 6
    with pytest.raises(RuntimeError, match="after shutdown"):
        executor.submit(sum, [1])
    assert not cluster.closed  # the executor's shutdown leaves the cluster open


def _until_running(future: ClusterFuture) -> None:
    deadline = time.monotonic() + 10
    while not future.running() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert future.running()


def test_a_call_not_started_is_cancelled_before_it_runs(cluster):
    running = cluster.submit(time.sleep, 1.0)
    _until_running(running)
    waiting = cluster.submit(lambda: "never")  # the next stage's: not started yet
    assert waiting.cancel() and waiting.cancelled()
    assert running.result(30) is None
    assert cluster.submit(lambda: "after").result(30) == "after"


def test_a_running_call_is_cancelled_and_stopped_on_its_worker_the_others_run_on(cluster):
    pids = {cluster.run(__import__("os").getpid, worker=w) for w in cluster.workers}
    endless = cluster.submit(lambda: [time.sleep(0.01) for _ in iter(int, 1)])  # Python: interruptible
    neighbour = cluster.submit(time.sleep, 1.0)  # the same stage
    _until_running(endless)
    seen = threading.Event()
    endless.add_done_callback(lambda f: f.cancelled() and seen.set())
    started = time.monotonic()
    assert endless.cancel() and endless.cancelled() and seen.is_set()
    with pytest.raises(cf.CancelledError):
        endless.result(0)
    assert not endless.cancel() or endless.cancelled()  # asked again: still cancelled
    assert neighbour.result(30) is None
    # the interrupted worker is free again at once (not killed: the same processes)
    assert cluster.submit(lambda: "after").result(30) == "after"
    assert time.monotonic() - started < 10
    assert {cluster.run(__import__("os").getpid, worker=w) for w in cluster.workers} == pids
    done = cluster.submit(lambda: 1)
    assert done.result(30) == 1 and not done.cancel()  # an ended call cannot be cancelled


def test_what_cannot_be_shipped_fails_at_submit():
    lock = threading.Lock()
    with Cluster(1, paging=NullDriverPaging(), timeout=30) as c:
        with pytest.raises(SerializationError):
            c.submit(lambda: lock.locked())
        waiting = [c.submit(time.sleep, 5.0), c.submit(time.sleep, 5.0)]
    for future in waiting:  # closed under them: they fail, none hangs
        assert isinstance(future.exception(30), ClamorError)
    with pytest.raises(ClamorError, match="closed"):
        c.submit(abs, -1)
