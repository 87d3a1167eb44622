"""The scheduler state machine (runtime/scheduling/scheduler.py), events in and instructions out.

Stages: placement, order, validation, failures and cancellation. No process is started:
each test feeds events to a ``SchedulerState`` and reads the instructions it returns, as
the driver loop would.
"""

from __future__ import annotations

import pytest
from clamor.runtime.scheduling.scheduler import (
    Cancel,
    Launch,
    SchedulerState,
    StageDone,
    StageFailed,
    TaskResult,
)
from clamor.runtime.stage import DRIVER, TaskSpec
from scheduler_events import (
    cluster,
    drive,
    finish,
    indices,
    launched,
    of,
    tasks,
)

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


def test_results_reported_together_are_refilled_in_one_launch():
    state = cluster(0, 1, window=3)
    placed = launched(state.stage_submitted(1, tasks(100)))
    results = [TaskResult(a.index, 1, a.id, value=a.index) for a in placed[1][:2]]
    out = state.tasks_finished(1, results)
    assert [(la.worker, indices(la.attempts)) for la in of(out, Launch)] == [(1, [6, 7])]


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
        Cancel(0, tuple(a.id for a in placed[0][1:]), stop=True),
        Cancel(1, tuple(a.id for a in placed[1]), stop=True),
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
        Cancel(0, (placed[0][0].id,), stop=True),
        Cancel(1, (placed[1][0].id,), stop=True),
    ]


def test_cancelling_an_unknown_or_finished_stage_does_nothing():
    state = cluster(0)
    state.stage_submitted(1, [])
    assert state.stage_cancelled(1, RuntimeError()) == []
    assert state.stage_cancelled(99, RuntimeError()) == []




def test_a_streaming_stage_tells_each_tasks_end_and_a_task_error_ends_that_task_alone():
    """Futures run as a streaming stage: each first result, and each error, is an
    instruction of its own; the stage is done when every task ended."""
    from clamor.runtime.scheduling.scheduler import TaskEnded

    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(3), streaming=True))
    first = placed[0][0]
    out = finish(state, first)
    assert of(out, TaskEnded) == [TaskEnded(1, first.index, out[0].result)] and out[0].result.attempt == first.id
    error = ValueError("bad")
    out = state.task_failed(1, placed[1][0].id, error)
    assert of(out, TaskEnded) == [TaskEnded(1, placed[1][0].index, error=error)]
    assert of(out, StageFailed) == [] and state.snapshot()["stages"][1]["done"] == 2
    (ended, done) = finish(state, placed[0][1])
    assert isinstance(ended, TaskEnded) and isinstance(done, StageDone)
    assert [r.index for r in done.results] == [0, 1, 2]


def test_a_cancelled_task_of_a_streaming_stage_ends_alone_and_its_attempt_is_stopped():
    """A future cancelled while it runs: its task ends with the caller's error, its
    attempt gets a stopping Cancel, the other tasks run on; a pending one never launches."""
    from clamor.runtime.scheduling.scheduler import TaskEnded

    state = SchedulerState(window=1)
    state.worker_added(0)
    placed = launched(state.stage_submitted(1, tasks(3), streaming=True))
    (running,) = placed[0]
    error = RuntimeError("cancelled")
    out = state.task_cancelled(1, running.index, error)
    assert of(out, TaskEnded) == [TaskEnded(1, running.index, error=error)]
    assert of(out, Cancel) == [Cancel(0, (running.id,), True)]
    (nxt,) = launched(out)[0]  # the worker is free for the next task
    assert nxt.index != running.index
    pending = ({0, 1, 2} - {running.index, nxt.index}).pop()
    assert of(state.task_cancelled(1, pending, error), TaskEnded) == [TaskEnded(1, pending, error=error)]
    assert state.task_cancelled(1, pending, error) == []  # ended already
    assert state.task_finished(0, TaskResult(running.index, 0, running.id)) == []  # late: ignored
    (ended, done) = finish(state, nxt)
    assert isinstance(ended, TaskEnded) and isinstance(done, StageDone)
    assert state.task_cancelled(1, nxt.index, error) == []  # the stage is over
