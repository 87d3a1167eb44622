"""What a cancelled attempt leaves on its worker: nothing (runtime/worker/tasks.py).

A straggler's attempt that the driver cancelled (a speculative copy won) may still run
to its end: a worker cannot stop Python code at any point. It may end after the stage's
barrier, after the driver has rewritten the pages it reads, so its outputs and its
reply must not enter the worker's store: a later task there reading that partition
would get them instead of the winner's, which the driver's registry names.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable

import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.runtime.stage import StageSpec, TaskSpec
from clamor.runtime.worker.tasks import INLINE_REPLY_BYTES

STRAGGLER_SECONDS = 2.0


@pytest.fixture
def cluster():
    with Cluster(2, timeout=30, paging=NullDriverPaging()) as c:  # no arena: this needs none
        yield c


#: Where the straggling attempt runs: the worker's stream thread, which reads no message
#: (no Cancel) until the attempt ends, or its runner thread, which runs the attempts
#: queued behind another while the stream thread reads on.
THREADS = {"stream": lambda index: index == 0, "runner": lambda index: threading.current_thread().name == "clamor-tasks"}


def straggling(marker: str, late: object, thread: str) -> Callable:
    """A program whose first attempt on ``thread`` (task 0's, on the stream thread)
    straggles, writing its pid and index to ``marker``, then returns ``late``,
    standing for what a task computes from pages the driver rewrote meanwhile; the
    copies that win return "winner"."""
    chosen = THREADS[thread]

    def program(ctx):
        if not chosen(ctx.index) and not os.path.exists(marker + f".{ctx.index}"):
            return f"task {ctx.index}"
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return "winner" if os.path.exists(marker + f".{ctx.index}") else f"task {ctx.index}"
        open(marker + f".{ctx.index}", "w").close()
        os.write(fd, f"{os.getpid()} {ctx.index}".encode())
        os.close(fd)
        time.sleep(STRAGGLER_SECONDS)
        open(marker + ".woke", "w").close()
        return late

    return program


def straggler(cluster: Cluster, marker: str) -> tuple[int, int]:
    """The worker that runs (or ran) the straggling attempt, and its task's index."""
    with open(marker) as f:
        pid, index = map(int, f.read().split())
    return next(w for w in cluster.workers if cluster.worker_pid(w) == pid), index


def after_the_straggler(cluster: Cluster, marker: str) -> tuple[int, int]:
    """:func:`straggler`, once its attempt has ended: it woke, and a task placed on its
    worker after that has run (a worker runs one attempt at a time)."""
    worker, index = straggler(cluster, marker)
    wait_for(lambda: os.path.exists(marker + ".woke"))
    assert cluster.execute(StageSpec(index_of, [TaskSpec(0, worker=worker)])) == [0]
    return worker, index


def partitions_on(cluster: Cluster, worker: int) -> int:
    return next(w["partitions"] for w in cluster.worker_stats() if w["id"] == worker)


def wait_for(condition: Callable[[], bool], seconds: float = 10 * STRAGGLER_SECONDS) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.05)


def index_of(ctx):
    return ctx.index


def read_input(ctx):
    return ctx.inputs()[0]


@pytest.mark.parametrize("thread", THREADS)
def test_a_late_attempts_output_does_not_replace_the_winners_on_its_worker(cluster, tmp_path, thread):
    keys = [("kept", i) for i in range(8)]
    marker = str(tmp_path / "marker")
    cluster.execute(StageSpec(straggling(marker, "late", thread),
                              [TaskSpec(i, output=keys[i], reply=False) for i in range(8)]))  # fmt: skip
    assert cluster.stats()["tasks_speculated"] >= 1  # a copy won: the scene is set
    slow, index = straggler(cluster, marker)
    assert cluster.holder(keys[index]) not in (None, slow)
    # While the straggler still runs, a task there reads that partition: it must get the
    # winner's value, not the one the straggler leaves when it ends (before the driver
    # has heard of it and dropped it).
    pinned = StageSpec(read_input, [TaskSpec(0, inputs=(keys[index],), worker=slow)])
    assert cluster.execute(pinned) == ["winner"]
    assert os.path.exists(marker + ".woke")  # it ran after the straggler
    wait_for(lambda: partitions_on(cluster, slow) == sum(cluster.holder(k) == slow for k in keys))


@pytest.mark.parametrize("thread", THREADS)
def test_a_late_attempts_large_reply_is_not_kept_on_its_worker(cluster, tmp_path, thread):
    marker = str(tmp_path / "marker")
    values = cluster.execute(StageSpec(straggling(marker, b"x" * (INLINE_REPLY_BYTES + 1), thread),
                                       [TaskSpec(i) for i in range(8)]))  # fmt: skip
    slow, index = after_the_straggler(cluster, marker)
    assert values == [f"task {i}" if i != index else "winner" for i in range(8)]
    wait_for(lambda: partitions_on(cluster, slow) == 0)
