"""The scheduler state machine (runtime/scheduler.py): events in, instructions out.

No process is started: each test feeds events to a ``SchedulerState`` and reads the
instructions it returns, as the driver loop would.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable

import pytest
from clamor.runtime.errors import MissingPartitionError, WorkerLostError
from clamor.runtime.scheduler import (
    Attempt,
    Cancel,
    Drop,
    Instruction,
    Launch,
    PartitionsLost,
    SchedulerState,
    StageDone,
    StageFailed,
    TaskResult,
)
from clamor.runtime.scheduler_policy import SpeculationPolicy
from clamor.runtime.stage import DRIVER, TaskSpec

# --- helpers -----------------------------------------------------------------


def cluster(*workers: int, window: int = 32) -> SchedulerState:
    """A state with these live workers."""
    state = SchedulerState(window=window)
    for worker in workers:
        assert state.worker_added(worker) == []
    return state


def tasks(n: int, **fields) -> list[TaskSpec]:
    return [TaskSpec(i, **fields) for i in range(n)]


def of(out: list[Instruction], kind: type) -> list:
    return [i for i in out if isinstance(i, kind)]


def launched(out: list[Instruction]) -> dict[int, list[Attempt]]:
    """``worker -> attempts`` of the Launches in ``out`` (asserting one Launch per worker)."""
    launches = of(out, Launch)
    assert len({la.worker for la in launches}) == len(launches), "one Launch per worker"
    return {la.worker: list(la.attempts) for la in launches}


def indices(attempts: list[Attempt]) -> list[int]:
    return [a.index for a in attempts]


def finish(
    state: SchedulerState,
    attempt: Attempt,
    worker: int | None = None,
    now: float | None = None,
    **kw,
):
    """Report ``attempt`` as finished on its worker (value defaults to its index)."""
    worker = worker if worker is not None else worker_of(state, attempt)
    kw.setdefault("value", attempt.index)
    result = TaskResult(attempt.index, worker, attempt.id, **kw)
    return state.task_finished(worker, result, now=now)


def worker_of(state: SchedulerState, attempt: Attempt) -> int:
    return next(w for w in state.workers if attempt.id in state.running(w))


def drive(state: SchedulerState, out: list[Instruction]) -> dict[int, StageDone | StageFailed]:
    """A fake driver loop: workers finish their attempts in order, round-robin.

    Returns how each stage ended; checks that nothing exceeds the limit.
    """
    queues: dict[int, deque[Attempt]] = {w: deque() for w in state.workers}
    ended: dict[int, StageDone | StageFailed] = {}
    while True:
        for ins in out:
            if isinstance(ins, Launch):
                queues[ins.worker].extend(ins.attempts)
                assert len(state.running(ins.worker)) <= state.limit
            elif isinstance(ins, StageDone | StageFailed):
                assert ins.stage not in ended
                ended[ins.stage] = ins
        out = []
        for worker, queue in queues.items():
            if queue:
                attempt = queue.popleft()
                out += finish(state, attempt, worker, outputs=outputs_of(attempt))
        if not out and not any(queues.values()):
            return ended


def outputs_of(attempt: Attempt) -> dict:
    return {} if attempt.spec.output is None else {attempt.spec.output: 100}


# --- stages and placement ----------------------------------------------------


def test_empty_stage_finishes_at_once():
    state = cluster(0)
    assert state.stage_submitted(1, []) == [StageDone(1, ())]
    assert state.snapshot()["stages"] == {}


def test_empty_stage_finishes_even_without_workers():
    assert SchedulerState().stage_submitted(1, []) == [StageDone(1, ())]


def test_eight_tasks_on_two_workers_split_four_and_four():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(8)))
    assert sorted(placed) == [0, 1]
    assert len(placed[0]) == 4 and len(placed[1]) == 4
    assert sorted(indices(placed[0] + placed[1])) == list(range(8))


def test_a_worker_gets_all_its_attempts_in_one_launch():
    state = cluster(0)
    out = state.stage_submitted(1, tasks(5))
    assert len(out) == 1
    assert indices(launched(out)[0]) == [0, 1, 2, 3, 4]


def test_attempt_ids_count_up_from_one_across_stages():
    state = cluster(0)
    first = launched(state.stage_submitted(1, tasks(3)))[0]
    second = launched(state.stage_submitted(2, tasks(2)))[0]
    assert [a.id for a in first + second] == [1, 2, 3, 4, 5]
    assert [a.stage for a in first + second] == [1, 1, 1, 2, 2]


def test_attempts_carry_their_task_spec():
    state = cluster(0)
    spec = TaskSpec(0, output=("ds", 1, 0), reply=False)
    (attempt,) = launched(state.stage_submitted(1, [spec]))[0]
    assert attempt.spec == spec and attempt.index == 0 and attempt.locations == {}


def test_window_caps_the_attempts_queued_on_a_worker():
    state = cluster(0, 1, window=3)
    placed = launched(state.stage_submitted(1, tasks(100)))
    assert [len(placed[0]), len(placed[1])] == [3, 3]
    assert state.snapshot()["stages"][1] == {
        "total": 100, "pending": 94, "running": 6, "done": 0, "speculative": 0,
    }  # fmt: skip


def test_a_finished_attempt_is_refilled_on_the_same_worker():
    state = cluster(0, 1, window=3)
    placed = launched(state.stage_submitted(1, tasks(100)))
    refill = launched(finish(state, placed[1][0]))
    assert list(refill) == [1]
    assert indices(refill[1]) == [6]


def test_the_limit_is_unfinished_tasks_per_worker_within_the_window():
    state = cluster(0, 1, 2, window=32)
    assert state.limit == 1  # no work: still one each
    state.stage_submitted(1, tasks(10))
    assert state.limit == 4  # ceil(10 / 3)
    state.stage_submitted(2, tasks(1000))
    assert state.limit == 32


def test_no_attempt_is_launched_without_workers():
    state = SchedulerState()
    assert state.stage_submitted(1, tasks(3)) == []
    assert state.snapshot()["stages"][1]["pending"] == 3


def test_a_new_worker_gets_pending_work():
    state = SchedulerState()
    state.stage_submitted(1, tasks(3))
    assert indices(launched(state.worker_added(5))[5]) == [0, 1, 2]


def test_a_worker_joining_mid_stage_takes_a_share_of_what_is_pending():
    state = cluster(0, window=4)
    state.stage_submitted(1, tasks(10))
    assert indices(launched(state.worker_added(1))[1]) == [4, 5, 6, 7]


def test_adding_a_live_worker_twice_is_an_error():
    state = cluster(0)
    with pytest.raises(ValueError):
        state.worker_added(0)
    with pytest.raises(ValueError):
        state.worker_added(DRIVER)


def test_2000_tasks_all_finish():
    state = cluster(0, 1, 2)
    specs = [TaskSpec(i, output=("ds", 1, i)) for i in range(2000)]
    out = state.stage_submitted(1, specs)
    assert [len(a) for a in launched(out).values()] == [32, 32, 32]  # the window
    ended = drive(state, out)
    done = ended[1]
    assert isinstance(done, StageDone)
    assert [r.index for r in done.results] == list(range(2000))
    assert [r.value for r in done.results] == list(range(2000))
    assert state.snapshot()["partitions"] == 2000
    assert {r.worker for r in done.results} == {0, 1, 2}
    assert sum(w["tasks_done"] for w in state.snapshot()["workers"].values()) == 2000


def test_results_come_back_in_index_order_whatever_the_finishing_order():
    state = cluster(0)
    placed = launched(state.stage_submitted(1, tasks(3)))[0]
    assert finish(state, placed[2], value="c") == []
    assert finish(state, placed[0], value="a") == []
    (done,) = finish(state, placed[1], value="b")
    assert [r.value for r in done.results] == ["a", "b", "c"]
    assert [r.index for r in done.results] == [0, 1, 2]


def test_first_result_for_an_index_wins():
    state = cluster(0)
    first, second = launched(state.stage_submitted(1, tasks(2)))[0]
    finish(state, first, value="first")
    assert finish(state, first, worker=0, value="late duplicate") == []
    (done,) = finish(state, second)
    assert done.results[0].value == "first"


def test_results_of_unknown_attempts_are_ignored():
    state = cluster(0)
    state.stage_submitted(1, tasks(1))
    assert state.task_finished(0, TaskResult(0, 0, attempt=999)) == []
    assert state.task_failed(0, 999, RuntimeError("x")) == []
    assert state.snapshot()["stages"][1]["running"] == 1


def test_a_result_reported_by_another_worker_is_ignored():
    state = cluster(0, 1)
    (attempt,) = launched(state.stage_submitted(1, tasks(1)))[0]
    assert state.task_finished(1, TaskResult(0, 1, attempt.id)) == []
    assert isinstance(finish(state, attempt)[0], StageDone)


def test_stages_are_served_in_fifo_order():
    state = cluster(0, window=2)
    placed = launched(state.stage_submitted(1, tasks(3)))[0]
    assert indices(placed) == [0, 1]
    assert state.stage_submitted(2, tasks(3)) == []  # the worker is full
    out = finish(state, placed[0])
    assert [(a.stage, a.index) for a in launched(out)[0]] == [(1, 2)]  # stage 1 first
    out = finish(state, placed[1])
    assert [(a.stage, a.index) for a in launched(out)[0]] == [(2, 0)]


def test_a_later_stage_runs_alongside_an_earlier_one_when_there_is_room():
    state = cluster(0, 1)
    launched(state.stage_submitted(1, tasks(1)))
    placed = launched(state.stage_submitted(2, tasks(2)))
    assert [(a.stage, a.index) for a in placed[1]] == [(2, 0)]
    assert sorted(state.snapshot()["stages"]) == [1, 2]


def test_stages_finish_independently():
    state = cluster(0)
    (a,) = launched(state.stage_submitted(1, tasks(1)))[0]
    (b,) = launched(state.stage_submitted(2, tasks(1)))[0]
    assert finish(state, b) == [StageDone(2, (TaskResult(0, 0, b.id, value=0),))]
    assert of(finish(state, a), StageDone)[0].stage == 1


# --- validation --------------------------------------------------------------


def test_a_duplicate_stage_id_is_an_error():
    state = cluster(0)
    state.stage_submitted(1, tasks(1))
    with pytest.raises(ValueError):
        state.stage_submitted(1, tasks(1))


def test_a_finished_stage_id_cannot_be_reused():
    state = cluster(0)
    state.stage_submitted(1, [])
    with pytest.raises(ValueError):
        state.stage_submitted(1, [])


@pytest.mark.parametrize("bad", [[1, 2], [0, 0], [0, 2], [-1, 0]])
def test_task_indices_must_be_zero_to_n_minus_one(bad):
    state = cluster(0)
    with pytest.raises(ValueError):
        state.stage_submitted(1, [TaskSpec(i) for i in bad])
    assert state.snapshot()["stages"] == {}
    assert isinstance(state.stage_submitted(1, [])[0], StageDone)  # the id was not used


def test_tasks_given_out_of_order_are_sorted_by_index():
    state = cluster(0)
    placed = launched(state.stage_submitted(1, [TaskSpec(1), TaskSpec(0)]))[0]
    assert indices(placed) == [0, 1]


# --- failures and cancellation -----------------------------------------------


def test_a_task_error_fails_its_stage_with_that_error():
    state = cluster(0)
    (attempt,) = launched(state.stage_submitted(1, tasks(1)))[0]
    error = ZeroDivisionError("boom")
    assert state.task_failed(0, attempt.id, error) == [StageFailed(1, error)]
    assert state.snapshot()["stages"] == {}


def test_a_task_error_cancels_the_stages_other_attempts():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(6)))
    bad = placed[0][0]
    out = state.task_failed(0, bad.id, ValueError("bad"))
    assert of(out, StageFailed)[0].stage == 1
    assert of(out, Cancel) == [
        Cancel(0, tuple(a.id for a in placed[0][1:])),
        Cancel(1, tuple(a.id for a in placed[1])),
    ]
    assert state.running(0) == state.running(1) == ()


def test_a_task_error_drops_the_stages_pending_tasks():
    state = cluster(0, window=1)
    (attempt,) = launched(state.stage_submitted(1, tasks(5)))[0]
    out = state.task_failed(0, attempt.id, ValueError())
    assert of(out, Launch) == []
    assert state.snapshot()["stages"] == {}


def test_a_task_error_leaves_other_stages_running():
    state = cluster(0, window=1)
    (a,) = launched(state.stage_submitted(1, tasks(1)))[0]
    state.stage_submitted(2, tasks(1))
    out = state.task_failed(0, a.id, ValueError())
    assert of(out, StageFailed)[0].stage == 1
    assert [(x.stage, x.index) for x in launched(out)[0]] == [(2, 0)]


def test_results_after_a_failure_are_ignored():
    state = cluster(0)
    a, b = launched(state.stage_submitted(1, tasks(2)))[0]
    state.task_failed(0, a.id, ValueError())
    assert finish(state, b, worker=0) == []
    assert state.task_failed(0, b.id, ValueError()) == []


def test_cancelling_a_stage_fails_it_and_cancels_its_attempts():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(2)))
    error = KeyboardInterrupt()
    out = state.stage_cancelled(1, error)
    assert out == [
        StageFailed(1, error),
        Cancel(0, (placed[0][0].id,)),
        Cancel(1, (placed[1][0].id,)),
    ]


def test_cancelling_an_unknown_or_finished_stage_does_nothing():
    state = cluster(0)
    state.stage_submitted(1, [])
    assert state.stage_cancelled(1, RuntimeError()) == []
    assert state.stage_cancelled(99, RuntimeError()) == []


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
    assert out[:2] == [StageFailed(1, out[0].error), Cancel(0, (second.id,))]
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


# --- losing workers ----------------------------------------------------------


def test_losing_a_worker_loses_its_partitions():
    state = cluster(0, 1)
    state.partitions_added(0, {"a": 1, "b": 2})
    state.partitions_added(1, {"c": 1})
    assert state.worker_lost(0, WorkerLostError(0, "SIGKILL")) == [PartitionsLost(("a", "b"))]
    assert state.holder("a") is None and state.holder("c") == 1
    assert state.workers == [1]


def test_a_lost_workers_attempts_run_elsewhere_and_the_stage_completes():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(4)))
    out = state.worker_lost(0, WorkerLostError(0, "exit 1"))
    rerun = launched(out)
    assert list(rerun) == [1] and of(out, StageFailed) == []
    assert indices(placed[0]) == indices(rerun[1]) == [0, 2]  # in index order, new attempts
    assert {a.id for a in rerun[1]}.isdisjoint(a.id for a in placed[0])
    assert state.counters() == {
        "tasks_rerun": 2, "tasks_speculated": 0, "tasks_lost": 2, "tasks_replaced": 0,
    }  # fmt: skip
    for attempt in placed[1]:
        assert finish(state, attempt) == []
    assert finish(state, rerun[1][0]) == []
    (done,) = finish(state, rerun[1][1])
    assert [r.value for r in done.results] == [0, 1, 2, 3]
    assert {r.worker for r in done.results} == {1}


def test_nothing_is_sent_to_a_lost_worker():
    state = cluster(0, 1)
    launched(state.stage_submitted(1, tasks(4)))
    out = state.worker_lost(0, WorkerLostError(0, "gone"))
    assert [type(i) for i in out] == [Launch]
    assert all(getattr(i, "worker", None) != 0 for i in out)
    assert list(launched(state.stage_submitted(2, tasks(4)))) == [1]


def test_losing_a_worker_fails_stages_needing_its_partitions():
    state = cluster(0, 1, 2, window=1)
    state.partitions_added(1, {"only-here": 1})
    launched(state.stage_submitted(1, [TaskSpec(0, worker=1), TaskSpec(1, worker=0)]))
    specs = [TaskSpec(0), TaskSpec(1, inputs=("only-here",)), TaskSpec(2)]
    assert indices(launched(state.stage_submitted(2, specs))[2]) == [0]
    error = WorkerLostError(1, "gone")
    out = state.worker_lost(1, error)
    assert of(out, PartitionsLost) == [PartitionsLost(("only-here",))]
    first, second = of(out, StageFailed)
    assert first == StageFailed(1, error)  # it was running there
    assert second.stage == 2 and second.error.keys == ["only-here"]  # it needed its data


def test_a_rerun_keeps_its_stages_place_in_the_fifo_order():
    state = cluster(0, 1, window=1)
    placed = launched(state.stage_submitted(1, tasks(2)))
    state.stage_submitted(2, tasks(2))  # pending: both workers are full
    assert state.worker_lost(0, WorkerLostError(0, "gone")) == []  # worker 1 is still full
    assert state.counters()["tasks_rerun"] == 0  # counted when relaunched
    out = finish(state, placed[1][0])
    (rerun,) = launched(out)[1]
    assert (rerun.stage, rerun.index) == (1, 0)  # stage 1 first...
    assert state.counters()["tasks_rerun"] == 1
    out = finish(state, rerun)
    assert of(out, StageDone)[0].stage == 1
    assert [(a.stage, a.index) for a in launched(out)[1]] == [(2, 0)]  # ...then stage 2


def test_a_free_worker_takes_a_task_whose_preferred_worker_is_busy():
    state = cluster(0, 1, window=1)
    state.partitions_added(0, {"a": 1})
    state.stage_submitted(1, [TaskSpec(0)])  # runs on 0 (lowest id)
    (b,) = launched(state.stage_submitted(2, [TaskSpec(0), TaskSpec(1, inputs=("a",))]))[1]
    out = finish(state, b)  # worker 1 is free, but task 1 of stage 2 prefers 0 (full)...
    assert [(a.stage, a.index) for a in launched(out)[1]] == [(2, 1)]  # ...so 1 takes it


def test_a_stage_still_finishes_when_a_finished_tasks_output_is_lost():
    state = cluster(0, 1)
    first, second = (a for w, (a,) in launched(state.stage_submitted(1, tasks(2))).items())
    finish(state, first, outputs={"out0": 1})
    assert state.worker_lost(0, WorkerLostError(0, "gone")) == [PartitionsLost(("out0",))]
    (done,) = finish(state, second)  # recomputing "out0" is for issue 4, not this state
    assert isinstance(done, StageDone) and state.holder("out0") is None


def test_losing_the_worker_a_pending_task_is_pinned_to_fails_its_stage():
    state = cluster(0, 1, window=1)
    launched(state.stage_submitted(1, [TaskSpec(0, worker=1), TaskSpec(1, worker=1)]))
    state.stage_submitted(2, [TaskSpec(0, worker=0)])
    error = WorkerLostError(0, "gone")
    assert of(state.worker_lost(0, error), StageFailed) == [StageFailed(2, error)]


def test_losing_an_unknown_or_already_lost_worker_does_nothing():
    state = cluster(0)
    state.partitions_added(0, {"a": 1})
    assert state.worker_lost(5, WorkerLostError(5, "?")) == []
    assert state.worker_lost(0, WorkerLostError(0, "gone")) == [PartitionsLost(("a",))]
    assert state.worker_lost(0, WorkerLostError(0, "gone")) == []


def test_results_from_a_lost_worker_are_ignored():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(2)))
    state.worker_lost(0, WorkerLostError(0, "gone"))
    assert state.task_finished(0, TaskResult(0, 0, placed[0][0].id)) == []


def test_a_lost_worker_can_come_back_as_new():
    state = cluster(0)
    state.worker_lost(0, WorkerLostError(0, "gone"))
    state.stage_submitted(1, tasks(1))
    assert list(launched(state.worker_added(0))) == [0]


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


# --- reruns after a lost worker ----------------------------------------------


def test_a_task_running_on_the_worker_it_is_pinned_to_fails_its_stage_with_it():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, [TaskSpec(0, worker=0), TaskSpec(1)]))
    error = WorkerLostError(0, "gone")
    out = state.worker_lost(0, error)
    assert out == [StageFailed(1, error), Cancel(1, (placed[1][0].id,))]
    assert state.counters()["tasks_rerun"] == 0


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
def test_a_task_lost_max_attempts_times_fails_its_stage(max_attempts):
    state = SchedulerState(max_attempts=max_attempts)
    for worker in range(5):
        state.worker_added(worker)
    (attempt,) = launched(state.stage_submitted(1, tasks(1)))[0]
    error = WorkerLostError(0, "the task kills its worker")
    for lost in range(1, max_attempts):
        out = state.worker_lost(worker_of(state, attempt), error)
        (attempt,) = launched(out)[lost]  # the next live worker
        assert state.counters()["tasks_rerun"] == lost
    assert state.worker_lost(worker_of(state, attempt), error) == [StageFailed(1, error)]
    assert state.counters()["tasks_lost"] == max_attempts
    assert state.snapshot()["stages"] == {}


def test_max_attempts_count_per_task():
    state = SchedulerState(max_attempts=2)
    for worker in range(6):
        state.worker_added(worker)
    launched(state.stage_submitted(1, tasks(3)))  # on workers 0, 1 and 2
    for worker in (0, 1, 2):  # each task lost once: under the limit, rerun on 3, 4, 5
        out = state.worker_lost(worker, WorkerLostError(worker, "gone"))
        assert of(out, StageFailed) == [] and list(launched(out)) == [worker + 3]
    error = WorkerLostError(3, "gone")
    assert state.worker_lost(3, error)[0] == StageFailed(1, error)  # task 0, a second time


def test_losing_every_worker_fails_the_active_stages():
    state = cluster(0, window=1)
    launched(state.stage_submitted(1, tasks(3)))
    state.stage_submitted(2, tasks(1))  # pending only
    error = WorkerLostError(0, "gone")
    assert state.worker_lost(0, error) == [StageFailed(1, error), StageFailed(2, error)]
    assert state.snapshot()["stages"] == {}
    assert state.worker_added(1) == []  # nothing left to run


def test_a_rerun_task_whose_input_was_on_the_lost_worker_fails_with_missing_partition():
    state = cluster(0, 1)
    state.partitions_added(0, {"k": 1})
    launched(state.stage_submitted(1, [TaskSpec(0, inputs=("k",))]))
    (failed,) = of(state.worker_lost(0, WorkerLostError(0, "gone")), StageFailed)
    assert isinstance(failed.error, MissingPartitionError) and failed.error.keys == ["k"]


def test_results_already_received_are_kept_after_a_loss():
    state = cluster(0, 1, window=1)
    placed = launched(state.stage_submitted(1, tasks(3)))
    out = finish(state, placed[0][0], value="kept")  # worker 0 takes task 2
    (third,) = launched(out)[0]
    out = state.worker_lost(0, WorkerLostError(0, "gone")) + finish(state, placed[1][0])
    (rerun,) = launched(out)[1]
    assert rerun.index == third.index == 2
    (done,) = finish(state, rerun)
    assert [r.value for r in done.results] == ["kept", 1, 2]


def test_a_task_error_reading_a_partition_lost_since_becomes_missing_partition():
    state = cluster(0, 1, window=1)
    state.partitions_added(1, {"k": 1})
    launched(state.stage_submitted(1, [TaskSpec(0, worker=1)]))  # keeps worker 1 busy
    (attempt,) = launched(state.stage_submitted(2, [TaskSpec(0, inputs=("k",))]))[0]
    assert attempt.locations == {"k": 1}
    state.worker_lost(1, WorkerLostError(1, "gone"))
    cause = RuntimeError("cannot fetch partition 'k' from worker 1")
    (failed,) = state.task_failed(0, attempt.id, cause)
    assert isinstance(failed.error, MissingPartitionError) and failed.error.keys == ["k"]
    assert failed.error.__cause__ is cause


def test_a_lost_worker_with_nothing_running_changes_no_stage():
    state = cluster(0, 1)
    (attempt,) = launched(state.stage_submitted(1, tasks(1)))[0]
    assert state.worker_lost(1, WorkerLostError(1, "gone")) == []
    assert state.counters() == {
        "tasks_rerun": 0, "tasks_speculated": 0, "tasks_lost": 0, "tasks_replaced": 0,
    }  # fmt: skip
    assert isinstance(finish(state, attempt)[0], StageDone)


# --- time and speculation ----------------------------------------------------


def straggling(state: SchedulerState, n: int = 3) -> tuple[Attempt, list[Attempt]]:
    """``n`` tasks on ``n`` workers launched at 0: all but task 0 finish at 1.0 in 1.0 s.

    Returns task 0's attempt (on worker 0) and the others.
    """
    placed = launched(state.stage_submitted(1, tasks(n), now=0.0))
    assert sorted(placed) == list(range(n)) and all(len(a) == 1 for a in placed.values())
    others = [placed[w][0] for w in range(1, n)]
    for attempt in others:
        assert finish(state, attempt, now=1.0, duration=1.0) == []
    return placed[0][0], others


def test_a_straggler_gets_one_copy_on_an_idle_worker_after_factor_times_median():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    assert state.tick(1.5) == []
    assert state.tick(2.0) == []  # running for 2.0 s: not more than 2 x median 1.0
    out = state.tick(2.01)
    (copy,) = launched(out)[1]  # the lowest idle worker
    assert (copy.stage, copy.index, copy.speculative) == (1, 0, True)
    assert copy.id != original.id and not original.speculative
    assert state.snapshot()["speculative"] == [copy.id]
    assert state.snapshot()["stages"][1]["speculative"] == 1
    assert state.snapshot()["stages"][1]["running"] == 1  # tasks, not attempts
    assert state.counters()["tasks_speculated"] == 1
    assert state.tick(50.0) == []  # one copy per task, ever


def test_the_first_result_wins_and_the_other_attempt_is_cancelled():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    (copy,) = launched(state.tick(3.0))[1]
    out = finish(state, copy, now=3.5, duration=0.5, outputs={"out": 8})
    assert out[:1] == [Cancel(0, (original.id,))]
    (done,) = out[1:]
    assert done.results[0].worker == 1 and done.results[0].attempt == copy.id
    assert state.holder("out") == 1 and state.snapshot()["speculative"] == []
    # the loser's result comes anyway (it was on its way): ignored, its stale output dropped
    assert finish(state, original, worker=0, now=4.0, outputs={"out": 8}) == [Drop(0, ("out",))]


def test_the_original_winning_cancels_the_copy():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    (copy,) = launched(state.tick(3.0))[1]
    out = finish(state, original, now=3.1)
    assert out[0] == Cancel(1, (copy.id,)) and isinstance(out[1], StageDone)
    assert state.running(1) == ()


def test_both_copies_finishing_still_give_one_result_per_index():
    state = cluster(0, 1, 2, 3)
    original, others = straggling(state, n=4)
    out = state.tick(3.0)
    (copy,) = launched(out)[1]
    updates = {7: [(0, "once")]}
    (cancel, done) = finish(state, copy, now=3.2, accumulator_updates=updates)
    assert cancel == Cancel(0, (original.id,))
    assert finish(state, original, worker=0, now=3.3, accumulator_updates=updates) == []
    assert [r.index for r in done.results] == [0, 1, 2, 3]
    assert [r.attempt for r in done.results] == [copy.id] + [a.id for a in others]
    assert sum(bool(r.accumulator_updates) for r in done.results) == 1


def test_no_speculation_without_an_idle_worker():
    state = cluster(0, 1, window=1)
    placed = launched(state.stage_submitted(1, tasks(3), now=0.0))  # one each, one pending
    (second,) = launched(finish(state, placed[1][0], now=1.0, duration=1.0))[1]
    assert state.tick(10.0) == []  # both workers busy with stragglers
    assert state.slow == [0]  # the longest running; never the last worker not slow
    out = state.worker_added(2, now=10.0)
    assert out == []  # nothing pending
    (copy,) = launched(state.tick(10.1))[2]
    assert copy.index == placed[0][0].index  # the longest-running straggler first
    assert second.index == 2 and state.slow == [0, 1]


def test_no_speculation_for_pinned_tasks():
    state = cluster(0, 1, 2)
    specs = [TaskSpec(0, worker=0), TaskSpec(1), TaskSpec(2)]
    placed = launched(state.stage_submitted(1, specs, now=0.0))
    for worker in (1, 2):
        finish(state, placed[worker][0], now=1.0, duration=1.0)
    assert state.tick(100.0) == []


def test_no_speculation_below_speculation_min():
    state = cluster(0, 1, 2)
    placed = launched(state.stage_submitted(1, tasks(3), now=0.0))
    for worker in (1, 2):
        finish(state, placed[worker][0], now=0.001, duration=0.001)
    assert state.tick(0.049) == []  # far beyond 2 x median, but under 0.05 s
    assert indices(launched(state.tick(0.051))[1]) == [0]


def test_no_speculation_when_disabled():
    state = SchedulerState(speculation=False)
    for worker in range(3):
        state.worker_added(worker)
    straggling(state)
    assert state.tick(100.0) == []
    assert state.counters()["tasks_speculated"] == 0


def test_speculation_waits_for_enough_finished_tasks():
    state = SchedulerState(speculation_quantile=0.5)
    for worker in range(5):
        state.worker_added(worker)
    placed = launched(state.stage_submitted(1, tasks(4), now=0.0))  # worker 4 idle
    finish(state, placed[1][0], now=1.0, duration=1.0)
    assert state.tick(10.0) == []  # 1 of 4 finished: under half
    finish(state, placed[2][0], now=1.0, duration=1.0)
    out = launched(state.tick(10.0))
    assert [(w, indices(a)) for w, a in out.items()] == [(1, [0]), (2, [3])]  # oldest first


def test_the_speculation_policy():
    policy = SpeculationPolicy(factor=3.0, minimum=0.5, quantile=0.25)
    assert not policy.ready(total=8, done=1, pending=0)  # a quarter of 8 is 2
    assert policy.ready(total=8, done=2, pending=0)
    assert not policy.ready(total=8, done=7, pending=1)  # pending tasks come first
    assert not policy.ready(total=1, done=0, pending=0)
    assert policy.threshold([0.1, 0.2, 0.3]) == 0.6000000000000001
    assert policy.threshold([0.01]) == 0.5
    assert policy.threshold([1.0, 2.0, 3.0, 10.0]) == 7.5  # median 2.5
    assert not SpeculationPolicy(enabled=False).ready(total=1, done=1, pending=0)
    assert policy.baseline(total=8, done=2) and not policy.baseline(total=8, done=1)
    assert policy.baseline(total=8, done=7)  # pending tasks or not: slow workers are told
    assert not SpeculationPolicy(enabled=False).baseline(total=1, done=1)
    with pytest.raises(ValueError):
        SpeculationPolicy(factor=0)
    with pytest.raises(ValueError):
        SpeculationPolicy(slow_limit=0)


def test_a_failed_copy_does_not_fail_the_stage_while_the_original_runs():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    (copy,) = launched(state.tick(3.0))[1]
    assert state.task_failed(1, copy.id, ValueError("copy"), now=3.1) == []
    assert state.snapshot()["speculative"] == [] and state.running(1) == ()
    assert state.tick(20.0) == []  # no second copy
    assert isinstance(finish(state, original, now=21.0)[0], StageDone)


def test_a_failed_original_does_not_fail_the_stage_while_the_copy_runs():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    (copy,) = launched(state.tick(3.0))[1]
    assert state.task_failed(0, original.id, ValueError("original"), now=3.1) == []
    error = ValueError("copy too")
    assert state.task_failed(1, copy.id, error, now=3.2) == [StageFailed(1, error)]


def test_losing_the_originals_worker_leaves_the_copy_running():
    state = cluster(0, 1, 2)
    straggling(state)
    (copy,) = launched(state.tick(3.0))[1]
    assert state.worker_lost(0, WorkerLostError(0, "gone"), now=3.1) == []
    assert state.counters() == {
        "tasks_rerun": 0, "tasks_speculated": 1, "tasks_lost": 1, "tasks_replaced": 0,
    }  # fmt: skip
    assert isinstance(finish(state, copy, now=3.5)[0], StageDone)


def test_losing_the_copys_worker_leaves_the_original_running():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    launched(state.tick(3.0))
    assert state.worker_lost(1, WorkerLostError(1, "gone"), now=3.1) == []
    assert state.tick(9.0) == []  # worker 2 is idle, but the task had its copy
    assert isinstance(finish(state, original, now=9.5)[0], StageDone)


def test_a_queued_attempt_is_not_slow_until_it_starts():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(4), now=0.0))
    long, queued = placed[0]  # worker 0 runs them in this order
    for attempt in placed[1]:
        finish(state, attempt, now=1.0, duration=1.0)  # worker 1 idle from 1.0
    assert finish(state, long, now=10.0, duration=10.0) == []  # ``queued`` starts at 10.0
    assert state.tick(11.0) == []  # median 1.0: 1.0 s running, launched 11.0 s ago
    assert state.tick(12.0) == []
    (copy,) = launched(state.tick(12.01))[1]
    assert copy.index == queued.index


def test_a_cancelled_head_lets_the_next_attempt_start():
    state = cluster(0, 1, window=2)
    (head,) = launched(state.stage_submitted(1, [TaskSpec(0, worker=0)], now=0.0))[0]
    placed = launched(state.stage_submitted(2, tasks(3), now=0.0))
    assert {w: indices(a) for w, a in placed.items()} == {0: [1], 1: [0, 2]}
    for attempt in placed[1]:
        finish(state, attempt, now=1.0, duration=1.0)  # worker 1 idle from 1.0
    assert state.tick(4.0) == []  # worker 0 still runs stage 1's task (no baseline there)
    assert state.stage_cancelled(1, RuntimeError(), now=5.0)[1] == Cancel(0, (head.id,))
    assert state.tick(7.0) == []  # stage 2's task 1 started at 5.0
    assert indices(launched(state.tick(7.01))[1]) == [1]


def test_an_unknown_start_counts_from_the_next_tick():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(2)))  # no ``now``
    finish(state, placed[1][0], now=5.0, duration=1.0)
    assert state.tick(6.0) == []  # worker 0's task started at 6.0 at the latest
    assert state.tick(8.0) == []
    assert indices(launched(state.tick(8.01))[1]) == [0]


def test_a_copy_is_not_launched_when_an_input_is_gone():
    state = cluster(0, 1, 2)
    state.partitions_added(DRIVER, {"d": 1})
    specs = [TaskSpec(0, inputs=("d",)), TaskSpec(1), TaskSpec(2)]
    placed = launched(state.stage_submitted(1, specs, now=0.0))
    for worker in (1, 2):
        finish(state, placed[worker][0], now=1.0, duration=1.0)
    state.partitions_dropped(["d"])
    assert state.tick(10.0) == []


def test_a_copy_goes_to_the_idle_worker_holding_its_inputs():
    state = cluster(0, 1, 2, 3, window=1)
    state.partitions_added(3, {"big": 100})
    state.partitions_added(2, {"small": 1})
    blocker = launched(state.stage_submitted(1, [TaskSpec(0, worker=3)], now=0.0))[3][0]
    specs = [TaskSpec(0, inputs=("big", "small")), TaskSpec(1), TaskSpec(2)]
    placed = launched(state.stage_submitted(2, specs, now=0.0))
    assert sorted((w, indices(a)) for w, a in placed.items()) == [(0, [0]), (1, [1]), (2, [2])]
    finish(state, placed[1][0], now=1.0, duration=1.0)
    finish(state, placed[2][0], now=1.0, duration=1.0)
    finish(state, blocker, now=1.0, duration=1.0)
    (copy,) = launched(state.tick(3.0))[3]  # idle: 1, 2 and 3; 3 holds the most of its input
    assert copy.locations == {"big": 3, "small": 2}


# --- slow workers --------------------------------------------------------------


def slow_worker_0(state: SchedulerState) -> tuple[dict[int, list[Attempt]], list[Instruction]]:
    """9 tasks on workers 0, 1, 2 (three each) launched at 0; 3 finish in 1.0 s each on
    workers 1 and 2, worker 0 still runs its first at 2.01 (a straggler: 2 x median 1.0).

    Returns the first placement and the instructions of ``tick(2.01)``.
    """
    placed = launched(state.stage_submitted(1, tasks(9), now=0.0))
    assert {w: indices(a) for w, a in placed.items()} == {0: [0, 3, 6], 1: [1, 4, 7], 2: [2, 5, 8]}
    finish(state, placed[1][0], now=1.0, duration=1.0)
    finish(state, placed[2][0], now=1.0, duration=1.0)
    finish(state, placed[1][1], now=2.0, duration=1.0)  # 3 of 9: a baseline
    assert state.tick(2.0) == [] and state.slow == []  # running 2.0 s: not more than 2 x 1.0
    return placed, state.tick(2.01)


def test_the_queue_behind_a_straggler_is_taken_back_and_placed_on_other_workers():
    state = cluster(0, 1, 2)
    placed, out = slow_worker_0(state)
    straggler, *queued = placed[0]
    assert out[0] == Cancel(0, tuple(a.id for a in queued))  # before the Launches
    again = launched(out)
    assert {w: indices(a) for w, a in again.items()} == {1: [3, 6]}  # the most room
    assert not any(a.speculative for a in again[1])
    assert {a.id for a in again[1]}.isdisjoint(a.id for a in queued)  # new attempts
    assert state.running(0) == (straggler.id,)  # the straggler goes on
    assert state.slow == [0] and state.snapshot()["workers"][0]["slow"]
    assert state.counters()["tasks_replaced"] == 2
    assert state.counters()["tasks_rerun"] == state.counters()["tasks_speculated"] == 0
    assert state.snapshot()["stages"][1] == {
        "total": 9, "pending": 0, "running": 6, "done": 3, "speculative": 0,
    }  # fmt: skip
    assert state.tick(2.02) == []  # taken back once


def test_a_slow_worker_holds_one_attempt_at_a_time_until_it_finishes_one_fast():
    state = cluster(0, 1, 2, window=3)
    placed, _ = slow_worker_0(state)
    out = launched(state.stage_submitted(2, tasks(12), now=2.1))
    assert {w: len(a) for w, a in out.items()} == {2: 1}  # worker 0 has its one attempt
    assert state.snapshot()["stages"][2]["pending"] == 11
    (one,) = launched(finish(state, placed[0][0], now=3.0, duration=3.0))[0]  # slow still
    assert state.slow == [0] and state.running(0) == (one.id,)
    refill = launched(finish(state, one, now=3.5, duration=0.5))[0]  # within 2 x median
    assert state.slow == [] and len(refill) == len(state.running(0)) == state.limit == 3


def test_the_limit_shares_the_unfinished_tasks_among_the_workers_not_slow():
    state = cluster(0, 1, 2)
    slow_worker_0(state)
    assert state.limit == 3  # 6 unfinished tasks, 2 workers not slow
    state.stage_submitted(2, tasks(12), now=2.1)
    assert state.limit == 9


def test_the_slow_mark_ends_with_the_stage_that_set_it():
    state = cluster(0, 1, 2)
    straggling(state)
    (copy,) = launched(state.tick(2.01))[1]
    assert state.slow == [0]  # no queue to take back there: only marked
    finish(state, copy, now=2.5, duration=0.5)
    assert state.slow == []
    placed = launched(state.stage_submitted(2, tasks(6), now=3.0))
    assert [len(placed[w]) for w in (0, 1, 2)] == [2, 2, 2]  # its full share again


def test_pinned_attempts_queued_behind_a_straggler_stay():
    state = cluster(0, 1, 2)
    first = launched(state.stage_submitted(1, tasks(6), now=0.0))  # two each
    pinned = [TaskSpec(0, worker=0), TaskSpec(1)]
    second = launched(state.stage_submitted(2, pinned, now=0.0))
    assert [(a.stage, a.index) for a in first[0] + second[0]] == [(1, 0), (1, 3), (2, 0)]
    for worker in (1, 2):
        finish(state, first[worker][0], now=1.0, duration=1.0)
    out = state.tick(2.01)
    assert of(out, Cancel) == [Cancel(0, (first[0][1].id,))]  # not the pinned one
    assert [(a.stage, a.index) for a in launched(out)[2]] == [(1, 3)]
    assert state.running(0) == (first[0][0].id, second[0][0].id)
    assert state.counters()["tasks_replaced"] == 1


def test_an_attempt_whose_input_is_gone_is_not_taken_back():
    state = cluster(0, 1, 2)
    state.partitions_added(DRIVER, {"d": 1})
    specs = [TaskSpec(i, inputs=("d",) if i == 3 else ()) for i in range(9)]
    placed = launched(state.stage_submitted(1, specs, now=0.0))
    for attempt in (placed[1][0], placed[2][0], placed[1][1]):
        finish(state, attempt, now=1.0, duration=1.0)
    state.partitions_dropped(["d"])  # task 3 has its location already; placed again: none
    assert of(state.tick(2.01), Cancel) == [Cancel(0, (placed[0][2].id,))]
    assert state.running(0) == (placed[0][0].id, placed[0][1].id)


def test_no_worker_is_slow_without_speculation():
    state = SchedulerState(speculation=False)
    for worker in range(3):
        state.worker_added(worker)
    placed = launched(state.stage_submitted(1, tasks(9), now=0.0))
    for attempt in placed[1] + placed[2]:
        finish(state, attempt, now=1.0, duration=0.1)
    assert state.tick(100.0) == [] and state.slow == []


def finish_everything(state: SchedulerState, known: Iterable[Attempt], now: float) -> list:
    """Finish every running attempt (those ``known`` and those launched meanwhile), in
    worker order; the instructions returned."""
    attempts = {a.id: a for a in known}
    ended: list[Instruction] = []
    while running := [(w, a) for w in state.workers for a in state.running(w)]:
        worker, attempt_id = running[0]
        out = finish(state, attempts[attempt_id], worker, now=now, duration=0.1)
        attempts.update((a.id, a) for la in of(out, Launch) for a in la.attempts)
        ended += out
    return ended


def test_a_late_result_of_an_attempt_taken_back_counts_if_it_is_the_first():
    state = cluster(0, 1, 2)
    placed, ticked = slow_worker_0(state)
    late = placed[0][1]  # it had started before its Cancel came
    again = launched(ticked)[1]
    assert again[0].index == late.index
    out = finish(state, late, worker=0, now=2.1, duration=0.05, outputs={"o3": 1})
    assert out == [Cancel(1, (again[0].id,))]  # the attempt placed again is not needed
    assert state.holder("o3") == 0 and state.snapshot()["stages"][1]["done"] == 4
    assert finish(state, again[0], worker=1, now=2.2) == []  # too late in turn
    known = [a for attempts in placed.values() for a in attempts] + again
    (done,) = of(finish_everything(state, known, now=3.0), StageDone)
    assert done.results[3].attempt == late.id and done.results[3].worker == 0


def test_a_late_result_of_an_attempt_taken_back_is_ignored_if_not_the_first():
    state = cluster(0, 1, 2)
    placed, out = slow_worker_0(state)
    late, again = placed[0][1], launched(out)[1][0]
    finish(state, again, now=2.1, duration=0.1, outputs={"o3": 1})
    assert finish(state, late, worker=0, now=2.2, outputs={"o3": 1}) == [Drop(0, ("o3",))]
    assert state.holder("o3") == 1 and state.snapshot()["stages"][1]["done"] == 4
    late_failure = placed[0][2]
    assert state.task_failed(0, late_failure.id, ValueError("late"), now=2.3) == []
    assert state.snapshot()["stages"][1]["running"] == 5  # the stage goes on


def test_a_late_result_counts_while_its_task_waits_to_be_placed_again():
    state = SchedulerState(window=2, speculation_quantile=0.0)
    for worker in (0, 1):
        state.worker_added(worker)
    placed = launched(state.stage_submitted(1, tasks(5), now=0.0))
    assert {w: indices(a) for w, a in placed.items()} == {0: [0, 2], 1: [1, 3]}
    (fourth,) = launched(finish(state, placed[1][0], now=1.0, duration=1.0))[1]
    assert state.tick(2.01) == [Cancel(0, (placed[0][1].id,))]  # worker 1 is full (window)
    assert state.snapshot()["stages"][1]["pending"] == 1
    assert finish(state, placed[0][1], 0, now=2.1) == []  # the late result takes its place
    assert state.snapshot()["stages"][1] == {
        "total": 5, "pending": 0, "running": 3, "done": 2, "speculative": 0,
    }  # fmt: skip
    (done,) = of(finish_everything(state, [placed[0][0], placed[1][1], fourth], 3.0), StageDone)
    assert [r.attempt for r in done.results][1:3] == [placed[1][0].id, placed[0][1].id]


def test_copies_go_round_robin_over_the_idle_workers():
    state = cluster(0, 1, 2, 3)
    targets = []
    for stage in (1, 2, 3):
        start = 10.0 * stage
        placed = launched(state.stage_submitted(stage, tasks(4), now=start))
        for worker in (1, 2, 3):
            finish(state, placed[worker][0], now=start + 1.0, duration=1.0)
        (copy,) = of(state.tick(start + 2.01), Launch)  # workers 1, 2 and 3 idle
        targets.append(copy.worker)
        assert of(finish(state, copy.attempts[0], now=start + 2.1), StageDone)
    assert targets == [1, 2, 3]  # not always the lowest id


def test_copies_do_not_go_to_slow_workers():
    state = cluster(0, 1, 2, window=1)
    placed = launched(state.stage_submitted(1, tasks(3), now=0.0))
    finish(state, placed[2][0], now=1.0, duration=1.0)
    (other,) = launched(state.stage_submitted(2, [TaskSpec(0, worker=2)], now=1.0))[2]
    assert state.tick(2.01) == [] and state.slow == [0, 1]  # no idle worker
    assert finish(state, placed[0][0], now=2.5, duration=2.5) == []  # slow still
    assert state.tick(3.6) == []  # worker 0 is idle, but slow (threshold 2 x 1.75)
    finish(state, other, now=3.7)
    (copy,) = launched(state.tick(3.8))[2]
    assert copy.index == placed[1][0].index


# --- randomized --------------------------------------------------------------


class FakeCluster:
    """Fake workers and an oracle for the randomized test: each worker runs its queue in
    order; every instruction is checked against the rules as it is carried out. Some
    cancelled attempts had started before their Cancel arrived: *zombies*, which may
    still report."""

    def __init__(self, state: SchedulerState, rng: random.Random) -> None:
        self.state = state
        self.rng = rng
        self.queues: dict[int, deque[Attempt]] = {}
        self.specs: dict[int, list[TaskSpec]] = {}
        self.done: dict[int, set[int]] = {}  # stage -> finished indices
        self.attempts: dict[tuple[int, int], set[int]] = {}  # (stage, index) -> attempt ids
        self.launches: dict[tuple[int, int], int] = {}  # (stage, index) -> not speculative
        self.losses: dict[tuple[int, int], int] = {}
        self.replaced: dict[tuple[int, int], int] = {}  # taken back from slow workers
        self.requeued: set[tuple[int, int]] = set()  # taken back, not launched again yet
        self.reruns = 0  # launches again after a loss
        self.winners: dict[tuple[int, int], int] = {}  # the attempt whose result counts
        self.zombies: list[tuple[int, Attempt, bool]] = []  # (worker, attempt, taken back)
        self.late_accepted = 0
        self.clock = 0.0
        self.started: dict[int, float] = {}  # worker -> when its head started
        self.trace: list[str] = []  # every instruction, in order
        self.speculated: set[tuple[int, int]] = set()
        self.ended: dict[int, StageDone | StageFailed] = {}
        self.held: set = set()  # outputs of finished stages, until their worker is lost
        self.lost_keys: set = set()
        self.lost_attempts = 0

    def running(self, stage: int, index: int) -> list[tuple[int, Attempt]]:
        queues = self.queues.items()
        return [(w, a) for w, q in queues for a in q if (a.stage, a.index) == (stage, index)]

    def pending(self, stage: int) -> set[int]:
        running = {a.index for q in self.queues.values() for a in q if a.stage == stage}
        return set(range(len(self.specs[stage]))) - self.done[stage] - running

    def apply(self, out: list[Instruction], tick: bool = False) -> None:
        state = self.state
        slow = set(state.slow)
        self.trace += map(repr, out)
        for ins in out:
            if isinstance(ins, Launch):
                assert ins.worker in self.queues, "launch to a lost worker"
                assert 0 < len(state.running(ins.worker)) <= state.limit
                assert ins.worker not in slow or len(state.running(ins.worker)) == 1
                for a in ins.attempts:
                    key = (a.stage, a.index)
                    assert a.stage not in self.ended and a.index not in self.done[a.stage]
                    assert a.spec.worker in (None, ins.worker)
                    assert all(state.holder(k) == h for k, h in a.locations.items())
                    others = self.running(*key)
                    if a.speculative:
                        assert len(ins.attempts) == 1 and not self.queues[ins.worker], "idle"
                        assert len(others) == 1 and others[0][0] != ins.worker
                        assert a.spec.worker is None and key not in self.speculated
                        self.speculated.add(key)
                    else:
                        assert not others, "a second attempt that is no speculative copy"
                        if key in self.requeued:
                            self.requeued.discard(key)
                        elif key in self.launches:
                            self.reruns += 1
                        self.launches[key] = self.launches.get(key, 0) + 1
                        again = self.losses.get(key, 0) + self.replaced.get(key, 0)
                        assert self.launches[key] <= 1 + again
                    self.attempts.setdefault(key, set()).add(a.id)
                if not self.queues[ins.worker]:
                    self.started[ins.worker] = self.clock
                self.queues[ins.worker].extend(ins.attempts)
            elif isinstance(ins, Cancel):
                assert ins.worker in self.queues, "cancel sent to a lost worker"
                ids = set(ins.attempts)
                queue = self.queues[ins.worker]
                cancelled = [a for a in queue if a.id in ids]
                assert len(cancelled) == len(ids), "cancel of an attempt not running there"
                self.queues[ins.worker] = deque(a for a in queue if a.id not in ids)
                if queue[0].id in ids:
                    self.started[ins.worker] = self.clock  # the next one starts
                for a in cancelled:
                    key = (a.stage, a.index)
                    taken_back = (
                        a.stage not in self.ended and a.index not in self.done[a.stage]
                    )  # nothing decided for that task: it is placed again
                    if taken_back:
                        assert tick and a.id != queue[0].id and a.spec.worker is None
                        assert ins.worker in slow, "taken back from a worker not marked slow"
                        if not self.running(*key):
                            self.replaced[key] = self.replaced.get(key, 0) + 1
                            self.requeued.add(key)
                    if self.rng.random() < 0.5:
                        self.zombies.append((ins.worker, a, taken_back))
            elif isinstance(ins, StageDone | StageFailed):
                assert ins.stage in self.specs and ins.stage not in self.ended, "ended twice"
                self.ended[ins.stage] = ins
                if isinstance(ins, StageDone):
                    n = len(self.specs[ins.stage])
                    assert [r.index for r in ins.results] == list(range(n)), "once per index"
                    assert [r.value for r in ins.results] == [(ins.stage, i) for i in range(n)]
                    assert all(r.attempt in self.attempts[ins.stage, r.index] for r in ins.results)
                    winners = [self.winners[ins.stage, i] for i in range(n)]
                    assert [r.attempt for r in ins.results] == winners, "the first result wins"
                    outputs = (k for r in ins.results for k in r.outputs)
                    self.held.update(k for k in outputs if k not in self.lost_keys)
            elif isinstance(ins, PartitionsLost):
                self.lost_keys.update(ins.keys)
                self.held.difference_update(ins.keys)
            elif isinstance(ins, Drop):
                assert ins.worker == DRIVER or ins.worker in self.queues
        self.check()

    def check(self) -> None:
        state = self.state
        assert all(state.holder(k) in self.queues for k in self.held)
        for worker, queue in self.queues.items():  # the fake workers and the state agree
            assert tuple(sorted(a.id for a in queue)) == state.running(worker)
        for key in {(a.stage, a.index) for q in self.queues.values() for a in q}:
            workers = [w for w, _ in self.running(*key)]
            assert len(workers) == len(set(workers)) <= 2, "copies on distinct workers"
        snapshot = state.snapshot()
        copies = {a.id for q in self.queues.values() for a in q if a.speculative}
        assert set(snapshot["speculative"]) == copies
        assert snapshot["tasks_rerun"] == self.reruns
        assert snapshot["tasks_speculated"] == len(self.speculated)
        assert snapshot["tasks_lost"] == self.lost_attempts
        assert snapshot["tasks_replaced"] == sum(self.replaced.values())
        slow = [w for w, s in snapshot["workers"].items() if s["slow"]]
        assert slow == state.slow and (not slow or len(slow) < len(state.workers))
        caps = {w: 1 if w in slow else state.limit for w in state.workers}
        room = any(len(state.running(w)) < caps[w] for w in state.workers)
        for stage, counts in snapshot["stages"].items():
            pending = self.pending(stage)
            assert counts["pending"] == len(pending) and counts["done"] == len(self.done[stage])
            if room:  # no worker sits idle while unpinned work is pending
                assert all(self.specs[stage][i].worker is not None for i in pending)

    def submit(self, stage: int, specs: list[TaskSpec], now: float | None) -> None:
        self.specs[stage] = specs
        self.done[stage] = set()
        self.apply(self.state.stage_submitted(stage, specs, now=now))

    def add(self, worker: int, now: float | None) -> None:
        self.queues[worker] = deque()
        self.apply(self.state.worker_added(worker, now=now))

    def lose(self, gone: int, now: float | None) -> None:
        """Lose a worker; check which stages failed (and why) against the rules."""
        active = list(self.state.snapshot()["stages"])
        before = {stage: self.pending(stage) for stage in active}
        lost = list(self.queues.pop(gone))
        self.zombies = [z for z in self.zombies if z[0] != gone]
        self.lost_attempts += len(lost)
        for a in lost:
            self.losses[a.stage, a.index] = self.losses.get((a.stage, a.index), 0) + 1
        elsewhere = {(a.stage, a.index) for q in self.queues.values() for a in q}
        error = WorkerLostError(gone, "random")
        out = self.state.worker_lost(gone, error, now=now)
        self.apply(out)
        failed = {i.stage: i.error for i in of(out, StageFailed)}
        for stage in active:
            hit = {a.index for a in lost if a.stage == stage}
            again = {i for i in hit if (stage, i) not in elsewhere}
            specs = self.specs[stage]
            inputs = {k for i in before[stage] | again for k in specs[i].inputs}
            if (
                not self.queues
                or any(specs[i].worker == gone for i in hit | before[stage])
                or any(self.losses[stage, i] >= self.state.max_attempts for i in again)
            ):
                assert failed[stage] is error
            elif any(self.state.holder(k) is None for k in inputs):
                assert isinstance(failed[stage], MissingPartitionError)
            else:
                assert stage not in failed

    def run_head(self, worker: int, rng: random.Random, now: float | None) -> None:
        """``worker`` ends the attempt it runs: a result, or (rarely) an error."""
        attempt = self.queues[worker].popleft()
        duration, self.started[worker] = self.clock - self.started[worker], self.clock
        key = (attempt.stage, attempt.index)
        assert attempt.index not in self.done[attempt.stage]
        copy_runs = bool(self.running(*key))
        gone = [k for k in attempt.spec.inputs if self.state.holder(k) is None]
        if rng.random() < (0.5 if gone else 0.2 if copy_runs else 0.005):  # gone: no fetch
            out = self.state.task_failed(worker, attempt.id, ValueError(attempt.index), now=now)
            self.apply(out)
            failed = [i.error for i in of(out, StageFailed) if i.stage == attempt.stage]
            if copy_runs:
                assert not failed, "a task error while another attempt runs"
            else:
                (error,) = failed
                assert type(error) is (MissingPartitionError if gone else ValueError)
        else:
            self.done[attempt.stage].add(attempt.index)
            self.winners[key] = attempt.id
            value = (attempt.stage, attempt.index)
            result = TaskResult(
                attempt.index, worker, attempt.id, value, outputs_of(attempt),
                duration=duration,
            )  # fmt: skip
            self.apply(self.state.task_finished(worker, result, now=now))

    def run_zombie(self, rng: random.Random, now: float | None) -> None:
        """A cancelled attempt that had started reports: its result counts only if it was
        taken back from a slow worker and is the first of its index."""
        pick = -1 if rng.random() < 0.5 else rng.randrange(len(self.zombies))  # latest, or any
        worker, attempt, taken_back = self.zombies.pop(pick)
        key = (attempt.stage, attempt.index)
        if rng.random() < 0.2:
            assert self.state.task_failed(worker, attempt.id, ValueError(), now=now) == []
            return
        first = attempt.stage not in self.ended and attempt.index not in self.done[attempt.stage]
        value = (attempt.stage, attempt.index)
        result = TaskResult(attempt.index, worker, attempt.id, value, outputs_of(attempt))
        if taken_back and first:
            self.done[attempt.stage].add(attempt.index)
            self.winners[key] = attempt.id
            self.requeued.discard(key)
            self.late_accepted += 1
        out = self.state.task_finished(worker, result, now=now)
        if not (taken_back and first):
            assert all(isinstance(i, Drop) for i in out), "a late result that does not count"
        self.apply(out)


def random_run(seed: int) -> FakeCluster:
    """Random stages, results, failures, cancels, worker losses (their tasks rerun) and
    ticks (stragglers get copies), on a clock, through a fake loop."""
    rng = random.Random(seed)
    state = SchedulerState(
        window=rng.choice([1, 2, 3, 32]),
        max_attempts=rng.choice([1, 2, 4, 4]),
        speculation=rng.random() < 0.8,
        speculation_factor=rng.choice([1.0, 2.0]),
        speculation_min=rng.choice([0.0, 0.05]),
    )
    fake = FakeCluster(state, rng)
    clock = 0.0
    next_worker, next_stage = 0, 0
    for _ in range(rng.randint(1, 5)):
        fake.add(next_worker, clock)
        next_worker += 1
    for _step in range(5000):
        clock += rng.expovariate(50)
        fake.clock = clock
        now = None if rng.random() < 0.05 else clock
        live = state.workers
        roll = rng.random()
        if next_stage < 8 and roll < 0.06:
            keys = sorted(fake.held)  # inputs from earlier stages' outputs
            specs = []
            for i in range(rng.choice([0, 1, 3, 10, 40])):
                reads = rng.choice([0, 0, 1, 2])
                inputs = tuple(rng.sample(keys, min(len(keys), reads)))
                pin = rng.choice(live) if live and rng.random() < 0.03 else None
                specs.append(TaskSpec(i, inputs=inputs, output=(next_stage, i), worker=pin))
            fake.submit(next_stage, specs, now)
            next_stage += 1
        elif roll < 0.085 and live:
            fake.lose(rng.choice(live), now)
        elif roll < 0.11 or not live:
            fake.add(next_worker, now)
            next_worker += 1
        elif roll < 0.115 and state.snapshot()["stages"]:
            victim = rng.choice(list(state.snapshot()["stages"]))
            fake.apply(state.stage_cancelled(victim, RuntimeError(), now=now))
        elif roll < 0.265:
            fake.apply(state.tick(clock), tick=True)
        elif roll < 0.4 and fake.zombies:
            fake.run_zombie(rng, now)
        else:
            busy = [w for w in live if fake.queues[w]]
            if busy:  # the lowest ids are slower: stragglers
                fake.run_head(rng.choice(busy + busy[-1:] * 3), rng, now)
            elif next_stage >= 8 and not state.snapshot()["stages"]:
                break
    assert next_stage == 8
    for _drain in range(100_000):  # no more losses: everything must end
        if not state.snapshot()["stages"]:
            break
        clock += 0.01
        fake.clock = clock
        fake.apply(state.tick(clock), tick=True)
        busy = [w for w in state.workers if fake.queues[w]]
        assert busy, "active stages, but nothing runs: a hang"
        fake.run_head(rng.choice(busy), rng, clock)
    assert sorted(fake.ended) == list(range(8)), "every submitted stage ends exactly once"
    assert all(not state.running(w) for w in state.workers)
    return fake


@pytest.mark.parametrize("seed", range(60))
def test_random_runs_keep_the_invariants(seed):
    random_run(seed)


def test_the_same_events_give_the_same_instructions():
    first, second = random_run(40), random_run(40)
    assert first.state.counters()["tasks_replaced"] > 0 and first.trace == second.trace


def test_the_random_runs_rerun_and_speculate():
    """The randomized test is worth something only if its runs rerun, speculate, take
    attempts back from slow workers and accept late results of some of those."""
    fakes = [random_run(seed) for seed in range(60)]
    runs = [fake.state.counters() for fake in fakes]
    for counter in ("tasks_rerun", "tasks_speculated", "tasks_lost", "tasks_replaced"):
        assert sum(c[counter] > 0 for c in runs) >= len(runs) // 6, (counter, runs)
    late = [fake.late_accepted for fake in fakes]  # results of attempts taken back that count
    assert sum(n > 0 for n in late) >= len(late) // 6, late
