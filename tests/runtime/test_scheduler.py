"""The scheduler state machine (runtime/scheduler.py): events in, instructions out.

No process is started: each test feeds events to a ``SchedulerState`` and reads the
instructions it returns, as the driver loop would.
"""

from __future__ import annotations

import random
from collections import deque

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


def finish(state: SchedulerState, attempt: Attempt, worker: int | None = None, **kw):
    """Report ``attempt`` as finished on its worker (value defaults to its index)."""
    worker = worker if worker is not None else worker_of(state, attempt)
    kw.setdefault("value", attempt.index)
    return state.task_finished(worker, TaskResult(attempt.index, worker, attempt.id, **kw))


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
    assert state.snapshot()["stages"][1] == {"total": 100, "pending": 94, "running": 6, "done": 0}


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


def test_losing_a_worker_fails_the_stages_running_on_it():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(4)))
    error = WorkerLostError(0, "exit 1")
    out = state.worker_lost(0, error)
    assert out == [StageFailed(1, error), Cancel(1, tuple(a.id for a in placed[1]))]


def test_nothing_is_sent_to_a_lost_worker():
    state = cluster(0, 1)
    launched(state.stage_submitted(1, tasks(4)))
    out = state.worker_lost(0, WorkerLostError(0, "gone"))
    assert [type(i) for i in out] == [StageFailed, Cancel]
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


def test_losing_a_worker_moves_pending_work_to_the_others():
    state = cluster(0, 1, window=1)
    placed = launched(state.stage_submitted(1, tasks(2)))
    state.stage_submitted(2, tasks(2))  # pending: both workers are full
    error = WorkerLostError(0, "gone")
    out = state.worker_lost(0, error)
    assert out[:2] == [StageFailed(1, error), Cancel(1, (placed[1][0].id,))]
    assert [(a.stage, a.index) for a in launched(out)[1]] == [(2, 0)]


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
        "stages": {1: {"total": 10, "pending": 5, "running": 4, "done": 1}},
        "workers": {0: {"running": 2, "tasks_done": 1}, 1: {"running": 2, "tasks_done": 0}},
        "partitions": 2,
        "partition_bytes": 10,
        "limit": 2,
    }


# --- randomized --------------------------------------------------------------


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_keep_the_invariants(seed):
    """Random stages, finishes, failures, cancels and worker losses through a fake loop."""
    rng = random.Random(seed)
    state = SchedulerState(window=rng.choice([1, 2, 3, 32]))
    queues: dict[int, deque[Attempt]] = {}
    specs: dict[int, list[TaskSpec]] = {}
    launched_indices: dict[int, set[int]] = {}
    ended: dict[int, StageDone | StageFailed] = {}
    held: set = set()  # outputs of finished stages, until their worker is lost
    lost: set = set()
    next_worker, next_stage = 0, 0

    def apply(out: list[Instruction]) -> None:
        for ins in out:
            if isinstance(ins, Launch):
                assert ins.worker in queues, "launch to a lost worker"
                assert 0 < len(state.running(ins.worker)) <= state.limit
                for a in ins.attempts:
                    assert a.index not in launched_indices[a.stage], "launched twice"
                    assert a.spec.worker in (None, ins.worker)
                    assert all(state.holder(k) == h for k, h in a.locations.items())
                    launched_indices[a.stage].add(a.index)
                queues[ins.worker].extend(ins.attempts)
            elif isinstance(ins, Cancel):
                assert ins.worker in queues, "cancel sent to a lost worker"
                ids = set(ins.attempts)
                queues[ins.worker] = deque(a for a in queues[ins.worker] if a.id not in ids)
            elif isinstance(ins, StageDone | StageFailed):
                assert ins.stage in specs and ins.stage not in ended, "a stage ended twice"
                ended[ins.stage] = ins
                if isinstance(ins, StageDone):
                    n = len(specs[ins.stage])
                    assert [r.index for r in ins.results] == list(range(n))
                    assert [r.value for r in ins.results] == [(ins.stage, i) for i in range(n)]
                    held.update(k for r in ins.results for k in r.outputs if k not in lost)
            elif isinstance(ins, PartitionsLost):
                lost.update(ins.keys)
                held.difference_update(ins.keys)
        assert all(state.holder(k) in queues for k in held)
        for worker, queue in queues.items():  # the fake workers and the state agree
            assert tuple(sorted(a.id for a in queue)) == state.running(worker)
        # no worker sits idle while unpinned work is pending
        active = state.snapshot()["stages"]
        if any(len(state.running(w)) < state.limit for w in state.workers):
            for stage in active:
                unplaced = [t for t in specs[stage] if t.index not in launched_indices[stage]]
                assert all(t.worker is not None for t in unplaced)

    for _ in range(rng.randint(1, 3)):
        queues[next_worker] = deque()
        apply(state.worker_added(next_worker))
        next_worker += 1
    for _step in range(3000):
        live = state.workers
        roll = rng.random()
        if next_stage < 8 and roll < 0.08:
            keys = sorted(held)  # inputs from earlier stages' outputs
            n = rng.choice([0, 1, 3, 10, 40])
            stage_specs = []
            for i in range(n):
                inputs = tuple(rng.sample(keys, min(len(keys), rng.randint(0, 2))))
                pin = rng.choice(live) if live and rng.random() < 0.1 else None
                stage_specs.append(TaskSpec(i, inputs=inputs, output=(next_stage, i), worker=pin))
            specs[next_stage] = stage_specs
            launched_indices[next_stage] = set()
            apply(state.stage_submitted(next_stage, stage_specs))
            next_stage += 1
        elif roll < 0.10 and live:
            gone = rng.choice(live)
            del queues[gone]
            apply(state.worker_lost(gone, WorkerLostError(gone, "random")))
        elif roll < 0.12 or not live:
            queues[next_worker] = deque()
            apply(state.worker_added(next_worker))
            next_worker += 1
        elif roll < 0.13 and state.snapshot()["stages"]:
            victim = rng.choice(list(state.snapshot()["stages"]))
            apply(state.stage_cancelled(victim, RuntimeError()))
        else:
            busy = [w for w in live if queues[w]]
            if not busy:
                if next_stage >= 8 and not state.snapshot()["stages"]:
                    break
                continue
            worker = rng.choice(busy)
            attempt = queues[worker].popleft()
            if rng.random() < 0.02:
                apply(state.task_failed(worker, attempt.id, ValueError(attempt.index)))
            else:
                value = (attempt.stage, attempt.index)
                result = TaskResult(attempt.index, worker, attempt.id, value, outputs_of(attempt))
                apply(state.task_finished(worker, result))
    assert next_stage == 8
    assert sorted(ended) == list(range(8)), "every submitted stage ends exactly once"
    assert state.snapshot()["stages"] == {}
    assert all(not state.running(w) for w in state.workers)
