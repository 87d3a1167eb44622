"""Fusing tiny tasks (runtime/scheduling/fusion.py): when a stage's tasks run in chunks,
one attempt per chunk, and what the caller sees of it (nothing but the speed)."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.data.accumulators import Accumulator
from clamor.runtime.paging.paging_api import NullDriverPaging
from clamor.runtime.scheduling.fusion import FusionPolicy, chunks, program_key
from clamor.runtime.stage import StageSpec, TaskSpec


def index_of(ctx):
    return ctx.index


def nothing(ctx):
    return None


def stage(program, n: int, **task) -> StageSpec:
    return StageSpec(program, [TaskSpec(i, **task) for i in range(n)])


# --- the policy --------------------------------------------------------------------------


def test_a_programs_first_stage_runs_a_task_an_attempt_and_a_tiny_one_is_fused_after():
    policy = FusionPolicy()
    key = program_key(stage(index_of, 4000))
    assert key is index_of.__code__
    assert policy.chunk(key, 4000, workers=lambda: 2) == 1  # never seen: measured first
    policy.learn(key, [50e-6] * 4000, [1] * 4000)
    assert policy.chunk(key, 4000, workers=lambda: 2) == 64  # at most max_chunk
    assert policy.chunk(key, 400, workers=lambda: 2) == 25  # at least 8 chunks a worker
    assert policy.chunk(key, 20, workers=lambda: 2) == 1  # too few to share
    assert policy.chunk(key, 2, workers=lambda: 1 / 0) == 1  # a small stage: workers not counted
    policy.learn(key, [30e-3] * 62, [64] * 62)  # a chunk of 64 took 30 ms: 0.47 ms a task
    assert policy.chunk(key, 4000, workers=lambda: 2) == 1  # no longer tiny
    assert FusionPolicy(enabled=False).chunk(key, 4000, workers=lambda: 2) == 1


def test_only_plain_tasks_of_a_function_can_be_fused():
    assert program_key(stage(nothing, 10, reply=False)) is nothing.__code__
    assert program_key(stage(lambda ctx: 1, 10)) is not None
    assert program_key(StageSpec(object(), [TaskSpec(0)])) is None  # a callable object: no code
    for task in ({"inputs": (("ds", 1, 0),)}, {"output": ("ds", 2, 0)}, {"worker": 0},
                 {"reads": ((0, 8),)}):  # fmt: skip
        assert program_key(stage(index_of, 10, **task)) is None, task
    mixed = StageSpec(index_of, [TaskSpec(0, reply=True), TaskSpec(1, reply=False)])
    assert program_key(mixed) is None
    for flag in ({"epoch": 3}, {"recompute": True}, {"keeps_lineage": True}):
        assert program_key(StageSpec(index_of, [TaskSpec(0)], **flag)) is None, flag


def test_chunks_cover_every_index_once_in_order():
    assert chunks(10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert [i for first, n in chunks(1000, 64) for i in range(first, first + n)] == list(range(1000))


# --- on a real cluster -------------------------------------------------------------------


def tiny_below(cluster: Cluster, seconds: float = 0.05) -> Cluster:
    """What counts as tiny raised: on a loaded machine a trivial task can take longer than
    the default 200 us, and these tests are about what fusing does, not when it starts."""
    cluster._executor.fusion.tiny = seconds
    return cluster


@pytest.fixture(scope="module")
def cluster():
    # no speculation: on a loaded machine a straggler's copy is one attempt more than
    # these tests count (4,016 for 4,000 tasks, seen once)
    with Cluster(2, timeout=30, speculation=False) as c:
        yield tiny_below(c)


def attempts_sent(cluster) -> int:
    return sum(s["sent_attempts"] for s in cluster.stats()["task_streams"].values())


def test_a_tiny_programs_second_stage_runs_in_chunks_with_the_same_results(cluster):
    first = attempts_sent(cluster)
    assert cluster.execute(stage(index_of, 4000)) == list(range(4000))
    second = attempts_sent(cluster)
    assert second - first == 4000  # measured: a task an attempt
    assert cluster.execute(stage(index_of, 4000)) == list(range(4000))
    assert attempts_sent(cluster) - second == 63  # chunks of 64
    assert cluster.execute(stage(nothing, 4000)) == [None] * 4000
    assert cluster.execute(stage(nothing, 4000)) == [None] * 4000
    assert cluster.execute(stage(index_of, 4000, reply=False)) == [None] * 4000


def payload_of(ctx):
    return ctx.payload


def test_each_task_of_a_chunk_gets_its_own_payload(cluster):
    tasks = [TaskSpec(i, payload=str(i).encode()) for i in range(4000)]
    want = [str(i).encode() for i in range(4000)]
    assert cluster.execute(StageSpec(payload_of, tasks)) == want  # measured
    before = attempts_sent(cluster)
    assert cluster.execute(StageSpec(payload_of, tasks)) == want  # fused
    assert attempts_sent(cluster) - before == 63


def test_a_task_failing_in_a_chunk_fails_the_stage_and_the_cluster_stays_usable(cluster):
    def fails_at_3000(ctx):
        if ctx.index == 3000:
            raise ValueError(f"task {ctx.index} failed")
        return ctx.index

    assert cluster.execute(stage(fails_at_3000, 2000)) == list(range(2000))  # tiny, no 3000
    with pytest.raises(ValueError, match="task 3000 failed"):
        cluster.execute(stage(fails_at_3000, 4000))
    assert cluster.execute(stage(index_of, 8)) == list(range(8))


def test_each_task_of_a_chunk_adds_to_an_accumulator_once(cluster):
    acc = Accumulator(10, op="sum")

    def count(ctx):
        acc.add(ctx.index % 10, 1.0)

    cluster.execute(stage(count, 4000))  # measured
    before = attempts_sent(cluster)
    cluster.execute(stage(count, 4000))  # fused
    assert attempts_sent(cluster) - before == 63
    assert np.array_equal(acc.value, np.full(10, 800.0))


def keeps_its_index(ctx):
    ctx.put(("kept", ctx.index), ctx.index * 10)


def test_each_task_of_a_chunk_keeps_its_partitions_and_sees_itself_as_the_current_task(cluster):
    from clamor.runtime.stage import current_task

    cluster.execute(stage(keeps_its_index, 4000))  # measured
    before = attempts_sent(cluster)
    cluster.execute(stage(keeps_its_index, 4000))  # fused
    assert attempts_sent(cluster) - before == 63
    assert [cluster.fetch(("kept", i)) for i in (0, 63, 64, 3999)] == [0, 630, 640, 39990]
    assert cluster.execute(stage(lambda ctx: current_task().index == ctx.index, 4000)) == [True] * 4000


def test_the_chunks_of_a_killed_worker_run_again_elsewhere(tmp_path):
    slow = str(tmp_path / "slow")

    def sleepy(ctx):
        if os.path.exists(slow):
            time.sleep(0.0005)  # a chunk of 64: 32 ms
        return ctx.index

    with Cluster(2, timeout=30, paging=NullDriverPaging(), restarts=0) as cluster:  # the module's has the arena
        tiny_below(cluster)
        assert cluster.execute(stage(sleepy, 4000)) == list(range(4000))  # tiny
        open(slow, "w").close()
        threading.Timer(0.5, os.kill, (cluster.worker_pid(0), signal.SIGKILL)).start()
        assert cluster.execute(stage(sleepy, 6000)) == list(range(6000))  # ~1.5 s of chunks
        assert cluster.workers == [1]
        assert cluster.counters()["tasks_lost"] > 0 and cluster.counters()["tasks_rerun"] > 0


def test_a_cluster_without_fusion_runs_a_task_an_attempt():
    with Cluster(1, timeout=30, fuse=False, paging=NullDriverPaging()) as cluster:
        for _ in range(2):
            assert cluster.execute(stage(index_of, 2000)) == list(range(2000))
        assert attempts_sent(cluster) == 4000
