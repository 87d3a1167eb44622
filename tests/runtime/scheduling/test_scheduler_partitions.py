"""The scheduler state machine (runtime/scheduling/scheduler.py), events in and instructions out.

Partitions: the registry, locality, missing inputs, pinned tasks, spilled partitions. No
process is started: each test feeds events to a ``SchedulerState`` and reads the
instructions it returns, as the driver loop would.
"""

from __future__ import annotations

import pytest
from clamor.runtime.errors import MissingPartitionError, WorkerLostError
from clamor.runtime.scheduling.scheduler import (
    Cancel,
    Drop,
    PartitionsLost,
    StageFailed,
)
from clamor.runtime.stage import DRIVER, TaskSpec
from scheduler_events import (
    cluster,
    finish,
    indices,
    launched,
    tasks,
)

# --- the partition registry and locality -------------------------------------


def test_finished_outputs_enter_the_partition_registry():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(2, output=None)))
    finish(state, placed[1][0], outputs={("ds", 1, 0): 10, ("shuffle", 0, 1): 5})
    assert state.holder(("ds", 1, 0)) == 1
    assert state.holder(("shuffle", 0, 1)) == 1
    assert state.holder(("ds", 1, 1)) is None
    assert state.snapshot()["partitions"] == 2
    assert state.snapshot()["partition_bytes"] == 15


def test_partitions_added_by_the_driver_are_held_by_DRIVER():
    state = cluster(0)
    assert state.partitions_added(DRIVER, {"a": 3}) == []
    assert state.holder("a") == DRIVER


def test_partitions_added_for_an_unknown_holder_are_an_error():
    with pytest.raises(ValueError):
        cluster(0).partitions_added(7, {"a": 1})


def test_attempts_carry_the_location_of_their_inputs():
    state = cluster(0, 1)
    state.partitions_added(DRIVER, {"d": 1})
    state.partitions_added(1, {"w": 1})
    (attempt,) = launched(state.stage_submitted(1, [TaskSpec(0, inputs=("d", "w"))]))[1]
    assert attempt.locations == {"d": DRIVER, "w": 1}


def test_tasks_prefer_the_worker_holding_their_inputs():
    state = cluster(0, 1)
    state.partitions_added(1, {("p", 0): 10, ("p", 1): 10})
    state.partitions_added(0, {("p", 2): 10, ("p", 3): 10})
    specs = [TaskSpec(i, inputs=(("p", i),)) for i in range(4)]
    placed = launched(state.stage_submitted(1, specs))
    assert {w: indices(a) for w, a in placed.items()} == {0: [2, 3], 1: [0, 1]}


def test_the_preferred_worker_is_the_one_holding_the_most_input_bytes():
    state = cluster(0, 1)
    state.partitions_added(0, {"small1": 1, "small2": 1})
    state.partitions_added(1, {"big": 100})
    placed = launched(state.stage_submitted(1, [TaskSpec(0, inputs=("small1", "small2", "big"))]))
    assert list(placed) == [1]


def test_driver_held_inputs_do_not_attract_tasks():
    state = cluster(0, 1)
    state.partitions_added(DRIVER, {"huge": 10**9})
    state.partitions_added(1, {"tiny": 1})
    placed = launched(state.stage_submitted(1, [TaskSpec(0, inputs=("huge", "tiny"))]))
    assert list(placed) == [1]


def test_an_idle_worker_takes_tasks_whose_preferred_worker_is_full():
    state = cluster(0, 1)
    state.partitions_added(0, {k: 1 for k in range(4)})
    placed = launched(state.stage_submitted(1, [TaskSpec(i, inputs=(i,)) for i in range(4)]))
    assert {w: indices(a) for w, a in placed.items()} == {0: [0, 1], 1: [2, 3]}


def test_unpreferred_tasks_go_to_the_least_loaded_worker():
    state = cluster(0, 1, window=4)
    state.partitions_added(0, {"x": 1})
    specs = [TaskSpec(0, inputs=("x",))] + [TaskSpec(i) for i in range(1, 4)]
    placed = launched(state.stage_submitted(1, specs))
    assert {w: indices(a) for w, a in placed.items()} == {0: [0, 2], 1: [1, 3]}


def test_pending_tasks_follow_partitions_added_after_submission():
    state = cluster(0, 1, window=1)
    state.partitions_added(DRIVER, {"k": 5})
    launched(state.stage_submitted(1, tasks(2)))  # both workers busy
    state.stage_submitted(2, [TaskSpec(0, inputs=("k",)), TaskSpec(1)])
    assert state.partitions_added(1, {"k": 5}) == [Drop(DRIVER, ("k",))]
    placed = launched(state.stage_cancelled(1, RuntimeError()))
    assert {w: indices(a) for w, a in placed.items()} == {0: [1], 1: [0]}


def test_a_partition_rewritten_elsewhere_drops_the_old_copy():
    state = cluster(0, 1)
    state.partitions_added(0, {"k": 1})
    assert state.partitions_added(DRIVER, {"k": 2}) == [Drop(0, ("k",))]
    assert state.holder("k") == DRIVER
    assert state.partitions_added(DRIVER, {"k": 3}) == []  # same holder: no drop


def test_dropping_partitions_tells_each_holder():
    state = cluster(0, 1)
    state.partitions_added(DRIVER, {"d": 1})
    state.partitions_added(0, {"a": 1, "b": 1})
    state.partitions_added(1, {"c": 1})
    out = state.partitions_dropped(["a", "c", "d", "b", "unknown"])
    assert out == [Drop(DRIVER, ("d",)), Drop(0, ("a", "b")), Drop(1, ("c",))]
    assert [state.holder(k) for k in "abcd"] == [None] * 4
    assert state.partitions_dropped(["a"]) == []


# --- missing inputs and pinned tasks -----------------------------------------


def test_missing_inputs_fail_the_stage_at_submission():
    state = cluster(0)
    state.partitions_added(0, {"here": 1})
    specs = [TaskSpec(0, inputs=("here", "gone")), TaskSpec(1, inputs=("nope",))]
    (failed,) = state.stage_submitted(1, specs)
    assert failed.stage == 1
    assert isinstance(failed.error, MissingPartitionError)
    assert failed.error.keys == ["gone", "nope"]
    assert state.snapshot()["stages"] == {}


def test_inputs_dropped_before_launch_fail_the_stage_at_launch():
    state = cluster(0, window=1)
    state.partitions_added(DRIVER, {"a": 1, "b": 1})
    specs = [TaskSpec(0, inputs=("a",)), TaskSpec(1, inputs=("b",))]
    (first,) = launched(state.stage_submitted(1, specs))[0]
    state.partitions_dropped(["b"])
    out = finish(state, first)
    (failed,) = out
    assert isinstance(failed, StageFailed) and failed.error.keys == ["b"]


def test_slots_freed_by_a_failure_at_launch_go_to_the_next_stage():
    state = cluster(0, window=2)
    state.partitions_added(DRIVER, {"b": 1})
    specs = [TaskSpec(0), TaskSpec(1), TaskSpec(2, inputs=("b",))]
    first, second = launched(state.stage_submitted(1, specs))[0]
    assert state.stage_submitted(2, tasks(1)) == []  # the worker is full
    state.partitions_dropped(["b"])
    out = finish(state, first)  # task 2 of stage 1 cannot launch: stage 1 fails...
    assert out[:2] == [StageFailed(1, out[0].error), Cancel(0, (second.id,), stop=True)]
    assert [(a.stage, a.index) for a in launched(out)[0]] == [(2, 0)]  # ...stage 2 runs


def test_pinned_tasks_run_only_on_their_worker():
    state = cluster(0, 1, 2)
    placed = launched(state.stage_submitted(1, tasks(3, worker=2)))
    assert {w: indices(a) for w, a in placed.items()} == {2: [0]}  # limit: ceil(3 / 3)
    assert indices(launched(finish(state, placed[2][0]))[2]) == [1]


def test_pinned_tasks_go_first_on_their_worker():
    state = cluster(0, window=2)
    specs = [TaskSpec(0), TaskSpec(1), TaskSpec(2, worker=0), TaskSpec(3, worker=0)]
    assert indices(launched(state.stage_submitted(1, specs))[0]) == [2, 3]


def test_a_task_pinned_to_a_dead_worker_fails_the_stage_at_submission():
    state = cluster(0)
    (failed,) = state.stage_submitted(1, [TaskSpec(0), TaskSpec(1, worker=4)])
    assert isinstance(failed.error, WorkerLostError)
    assert failed.error.worker_id == 4 and failed.error.how == "not a live worker"


# --- spilled partitions (memory budgets, R3S) ------------------------------------


def test_a_partition_spilled_to_a_peer_belongs_to_that_peer_and_draws_its_tasks():
    state = cluster(0, 1, 2)
    state.partitions_added(0, {"k": 100})
    assert state.memory_held() == {0: 100, 1: 0, 2: 0}
    state.partitions_moved(0, {"k": (2, "memory", 100)})
    assert state.holder("k") == 2 and state.memory_held() == {0: 0, 1: 0, 2: 100}
    placed = launched(state.stage_submitted(1, [TaskSpec(0, inputs=("k",))]))
    assert list(placed) == [2] and placed[2][0].locations == {"k": 2}


def test_a_partition_spilled_to_disk_stays_with_its_holder_but_weighs_less_for_placement():
    state = cluster(0, 1)
    state.partitions_added(0, {"a": 100})
    state.partitions_added(1, {"b": 80})
    state.partitions_moved(0, {"a": (0, "disk", 100)})
    assert state.placement() == {"a": (0, "disk", 100), "b": (1, "memory", 80)}
    assert state.memory_held() == {0: 0, 1: 80}
    # worker 0 has more bytes, but on disk: worker 1's 80 in memory save more fetching
    placed = launched(state.stage_submitted(1, [TaskSpec(0, inputs=("a", "b"))]))
    assert list(placed) == [1]


def test_moves_of_unknown_keys_are_ignored_and_a_move_to_a_lost_worker_loses_the_partition():
    state = cluster(0, 1)
    state.partitions_added(1, {"j": 5})
    assert state.partitions_moved(0, {"gone": (1, "memory", 1)}) == []
    assert state.placement() == {"j": (1, "memory", 5)}
    state.worker_lost(0, WorkerLostError(0, "gone"))
    assert state.partitions_moved(1, {"j": (0, "memory", 5)}) == [PartitionsLost(("j",))]
    assert state.holder("j") is None


@pytest.mark.parametrize(("queued_at_holder", "moves"), [(2, False), (20, True)])
def test_an_idle_worker_takes_a_task_from_its_inputs_holder_only_when_waiting_costs_more(
    queued_at_holder, moves
):
    """R3S's fetch-cost model: with 2 ms tasks and inputs that take 10 ms to fetch, an idle
    worker takes a task off the holder's queue only if the task would wait longer there."""
    state = cluster(0, 1, window=1)
    n = queued_at_holder + 1
    ten_ms = int(0.010 * state.fetch.rate)  # bytes
    state.partitions_added(0, {f"p{i}": ten_ms for i in range(1, n + 1)})
    specs = [TaskSpec(0)] + [TaskSpec(i, inputs=(f"p{i}",)) for i in range(1, n + 1)]
    placed = launched(state.stage_submitted(1, specs))
    assert {w: indices(a) for w, a in placed.items()} == {0: [1], 1: [0]}  # no baseline yet
    out = finish(state, placed[1][0], duration=0.002)  # a baseline: tasks take 2 ms
    assert (1 in launched(out)) is moves


def test_a_task_goes_to_the_worker_caching_the_arena_pages_it_reads():
    state = cluster(0, 1, 2)
    specs = [TaskSpec(0, cached=((2, 4096), (0, 1024))), TaskSpec(1, cached=((1, 10), (9, 99)))]
    placed = launched(state.stage_submitted(1, specs))  # worker 9 is no live worker
    assert {w: indices(a) for w, a in placed.items()} == {2: [0], 1: [1]}


# --- snapshot ----------------------------------------------------------------


def test_snapshot_counts_stages_workers_and_partitions():
    state = cluster(0, 1, window=2)
    state.partitions_added(DRIVER, {"d": 7})
    placed = launched(state.stage_submitted(1, tasks(10)))
    finish(state, placed[0][0], outputs={"o": 3})
    assert state.snapshot() == {
        "stages": {1: {"total": 10, "pending": 5, "running": 4, "done": 1, "speculative": 0}},
        "workers": {
            0: {"running": 2, "tasks_done": 1, "slow": False, "partition_bytes": 3, "disk_bytes": 0},
            1: {"running": 2, "tasks_done": 0, "slow": False, "partition_bytes": 0, "disk_bytes": 0},
        },
        "partitions": 2,
        "partition_bytes": 10,
        "partitions_on_disk": 0,
        "limit": 2,
        "speculative": [],
        "tasks_rerun": 0,
        "tasks_speculated": 0,
        "tasks_lost": 0,
        "tasks_replaced": 0,
    }


