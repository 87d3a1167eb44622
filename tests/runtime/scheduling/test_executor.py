"""Stages on real worker processes: batches, partitions that move, faults (runtime/scheduling/executor.py)."""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import psutil
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.errors import ClamorError, SerializationError, WorkerLostError
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.runtime.stage import DRIVER, StageSpec, TaskSpec
from clamor.runtime.storage.partitions import CHUNK_BYTES


@pytest.fixture(scope="module")
def cluster():
    with Cluster(2, timeout=30, restarts=0) as c:  # losses stay visible
        yield c


def index_of(ctx):
    return ctx.index


def square_index(ctx):
    return ctx.index**2


def worker_stats(cluster):
    return {w["id"]: w for w in cluster.worker_stats()}


# --- running stages ---------------------------------------------------------------


def test_a_stage_returns_one_value_per_task_in_index_order(cluster):
    values = cluster.execute(StageSpec(square_index, [TaskSpec(i) for i in range(500)]))
    assert values == [i * i for i in range(500)]


def test_an_empty_stage_returns_nothing(cluster):
    assert cluster.execute(StageSpec(index_of, [])) == []


def test_tasks_without_reply_return_none(cluster):
    values = cluster.execute(StageSpec(index_of, [TaskSpec(0, reply=False), TaskSpec(1)]))
    assert values == [None, 1]


def test_tasks_spread_over_both_workers(cluster):
    before = {i: w["tasks_run"] for i, w in worker_stats(cluster).items()}
    cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(64)]))
    after = {i: w["tasks_run"] for i, w in worker_stats(cluster).items()}
    assert all(after[i] > before[i] for i in after)
    assert sum(after.values()) - sum(before.values()) == 64


def test_pinned_tasks_run_on_their_worker(cluster):
    values = cluster.execute(
        StageSpec(lambda ctx: psutil.Process().pid, [TaskSpec(i, worker=i % 2) for i in range(6)])
    )
    assert values == [cluster.worker_pid(i % 2) for i in range(6)]


def test_unpicklable_program_names_the_variable_and_sends_nothing(cluster):
    lock = threading.Lock()
    before = cluster.stats()["tasks_run"]

    def uses_lock(ctx):
        with lock:
            return ctx.index

    with pytest.raises(SerializationError, match="variable 'lock' captured by"):
        cluster.execute(StageSpec(uses_lock, [TaskSpec(0)]))
    assert cluster.stats()["tasks_run"] == before


class Flaky(Exception):
    pass


def first_fails_others_sleep(ctx):
    if ctx.index == 0:
        raise Flaky("task 0 failed")
    time.sleep(0.2)
    return ctx.index


def test_a_task_error_cancels_the_stage_and_the_cluster_stays_usable(cluster):
    before = cluster.stats()["tasks_run"]
    start = time.monotonic()
    with pytest.raises(Flaky, match="task 0 failed") as info:
        cluster.execute(StageSpec(first_fails_others_sleep, [TaskSpec(i) for i in range(60)]))
    assert time.monotonic() - start < 3  # not 60 x 0.2 s / 2 workers
    assert "first_fails_others_sleep" in info.value.remote_traceback
    time.sleep(0.5)  # what was already running on the workers ends
    assert cluster.stats()["tasks_run"] - before < 20  # the queued attempts were cancelled
    assert cluster.execute(StageSpec(index_of, [TaskSpec(i) for i in range(4)])) == [0, 1, 2, 3]


# --- partitions ---------------------------------------------------------------------


def keep_array(ctx):
    return np.full(3 * CHUNK_BYTES // 8 + 5, ctx.index, dtype=np.float64)


def sum_inputs(ctx):
    return [float(x.sum()) for x in ctx.inputs()]


def test_partitions_stay_on_workers_and_move_worker_to_worker(cluster):
    keys = [("t", "kept", i) for i in range(2)]
    cluster.execute(
        StageSpec(keep_array, [TaskSpec(i, output=keys[i], reply=False, worker=i) for i in range(2)])
    )
    assert [cluster.holder(k) for k in keys] == [0, 1]
    n = 3 * CHUNK_BYTES // 8 + 5
    # Worker 0 reads its own partition and worker 1's (several chunks over gRPC).
    [sums] = cluster.execute(StageSpec(sum_inputs, [TaskSpec(0, inputs=tuple(keys), worker=0)]))
    assert sums == [0.0, float(n)]
    assert np.array_equal(cluster.fetch(keys[1]), np.full(n, 1.0))
    cluster.drop(keys)
    deadline = time.monotonic() + 5
    while any(w["partitions"] for w in worker_stats(cluster).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [cluster.holder(k) for k in keys] == [None, None]
    assert all(w["partitions"] == 0 for w in worker_stats(cluster).values())


def test_task_indices_must_be_zero_to_n(cluster):
    with pytest.raises(ValueError, match="task indices"):
        cluster.execute(StageSpec(index_of, [TaskSpec(7)]))


def test_a_task_whose_input_is_gone_fails_with_missing_partition(cluster):
    with pytest.raises(ClamorError, match="held by no live worker"):
        cluster.execute(StageSpec(sum_inputs, [TaskSpec(0, inputs=(("t", "never"),))]))


def test_driver_held_partitions_are_fetched_by_workers(cluster):
    data = list(range(300_000))  # ~2.6 MiB pickled: several chunks
    cluster.put(("t", "driver"), data)
    assert cluster.holder(("t", "driver")) == DRIVER
    values = cluster.execute(
        StageSpec(lambda ctx: sum(ctx.input(("t", "driver"))), [TaskSpec(i, inputs=(("t", "driver"),), worker=i) for i in range(2)])
    )
    assert values == [sum(data)] * 2
    cluster.drop([("t", "driver")])


def test_large_results_come_back_in_chunks_and_do_not_stay(cluster):
    [value] = cluster.execute(StageSpec(keep_array, [TaskSpec(0)]))
    assert value.shape == (3 * CHUNK_BYTES // 8 + 5,) and value[0] == 0.0
    deadline = time.monotonic() + 5
    while any(w["partitions"] for w in worker_stats(cluster).values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(w["partitions"] == 0 for w in worker_stats(cluster).values())


# --- observability ------------------------------------------------------------------


def test_stats_follow_the_observability_contract(cluster):
    stats = cluster.stats()
    for key in (
        "page_size", "arena_bytes", "pages_fetched", "bytes_served_by_driver",
        "bytes_served_by_peers", "faults", "invalidations", "version_log_bytes",
        "stages_run", "tasks_run", "tasks_recomputed", "tasks_speculated",
    ):  # fmt: skip
        assert isinstance(stats[key], int), key
    assert stats["stages_run"] > 0 and stats["tasks_run"] > 0
    for worker in stats["workers"]:
        for key in ("id", "pid", "host", "alive", "cached_pages", "rss_bytes"):
            assert key in worker, key


def stopped_samples(pid: int, seconds: float) -> int:
    """How many of 100 samples over ``seconds`` saw the process stopped (SIGSTOP)."""
    stopped = 0
    for _ in range(100):
        stopped += psutil.Process(pid).status() == psutil.STATUS_STOPPED
        time.sleep(seconds / 100)
    return stopped


def test_slow_worker_throttles_the_real_process_and_can_be_undone(cluster):
    pid = cluster.worker_pid(1)
    cluster.slow_worker(1, 10)
    try:
        assert stopped_samples(pid, 1.0) > 50  # stopped ~90 % of the time
        # Still correct, only slower.
        assert cluster.execute(StageSpec(index_of, [TaskSpec(i, worker=1) for i in range(3)])) == [0, 1, 2]
    finally:
        cluster.slow_worker(1, 1)
    time.sleep(0.2)
    assert stopped_samples(pid, 0.5) == 0
    with pytest.raises(ValueError, match="positive"):
        cluster.slow_worker(1, 0)


def test_an_oversized_message_is_refused_and_the_worker_keeps_serving(cluster):
    from clamor.runtime.net import transport
    from clamor.runtime.net.proto import clamor_pb2 as pb
    from clamor.runtime.net.proto import clamor_pb2_grpc as pb_grpc

    address = next(w["address"] for w in cluster.worker_stats() if w["alive"])
    huge = pb.Chunk(data=b"x" * (transport.MAX_MESSAGE_BYTES + 1), total=1, key=pb.PartitionKey(kind="k"))
    with transport.connect(address, cluster._token) as channel, pytest.raises(grpc.RpcError) as info:
        pb_grpc.WorkerStub(channel).PutPartition(iter([huge]), timeout=30)
    assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "message" in info.value.details().lower()
    assert cluster.execute(StageSpec(index_of, [TaskSpec(0)])) == [0]


# --- a worker lost mid-stage (last: it shrinks the module's cluster) --------------------


def sleepy(ctx):
    time.sleep(0.05)
    return ctx.index


def test_a_worker_killed_mid_stage_has_its_tasks_rerun_elsewhere(cluster):
    before = cluster.stats()["tasks_rerun"]
    threading.Timer(0.5, cluster.kill_worker, (0,)).start()
    values = cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(60)]))
    assert values == list(range(60))
    assert cluster.workers == [1]
    assert cluster.stats()["tasks_rerun"] > before


def test_losing_the_last_worker_is_a_clear_error_not_a_hang(cluster):
    threading.Timer(0.5, cluster.kill_worker, (1,)).start()
    start = time.monotonic()
    with pytest.raises(WorkerLostError, match="worker 1"):
        cluster.execute(StageSpec(sleepy, [TaskSpec(i) for i in range(400)]))
    assert time.monotonic() - start < 10
    assert cluster.workers == []


# --- stragglers (a cluster of its own) ---------------------------------------------------


def busy(ctx):
    """About 40 ms of CPU: slowed ten times on a throttled worker."""
    deadline = time.thread_time() + 0.04
    while time.thread_time() < deadline:
        pass
    return ctx.index


@pytest.mark.slow
def test_a_slowed_worker_loses_its_work_only_when_speculation_is_on():
    # Clusters of their own (the module's is down to no workers by now), without an
    # arena: one paging cluster per process, and this needs none.
    for speculation in (True, False):
        with Cluster(3, timeout=30, speculation=speculation, paging=NullDriverPaging()) as c:
            c.slow_worker(2, 10)
            for _ in range(2):
                stage = StageSpec(busy, [TaskSpec(i) for i in range(12)])
                assert c.execute(stage) == list(range(12))
            stats = c.stats()
            # Speculation copies the slow worker's running task and takes back its queue.
            moved = stats["tasks_speculated"] + stats["tasks_replaced"]
            assert (moved > 0) if speculation else (moved == 0)
