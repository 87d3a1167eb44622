"""The scheduler state machine (runtime/scheduling/scheduler.py), events in and instructions out.

Losing workers: their partitions and attempts, reruns, and their limits. No process is
started: each test feeds events to a ``SchedulerState`` and reads the instructions it
returns, as the driver loop would.
"""

from __future__ import annotations

import pytest
from clamor.runtime.errors import (
    MissingPartitionError,
    TaskCrashedError,
    WorkerLostError,
)
from clamor.runtime.scheduling.scheduler import (
    Cancel,
    Launch,
    PartitionsLost,
    SchedulerState,
    StageDone,
    StageFailed,
    TaskResult,
)
from clamor.runtime.stage import TaskSpec
from scheduler_events import (
    cluster,
    finish,
    indices,
    launched,
    of,
    tasks,
    worker_of,
)

# --- losing workers ----------------------------------------------------------


def test_losing_a_worker_loses_its_partitions():
    state = cluster(0, 1)
    state.partitions_added(0, {"a": 1, "b": 2})
    state.partitions_added(1, {"c": 1})
    assert state.worker_lost(0, WorkerLostError(0, "SIGKILL")) == [PartitionsLost(("a", "b"))]
    assert state.holder("a") is None and state.holder("c") == 1
    assert state.workers == [1]


def test_a_lost_workers_attempts_run_elsewhere_alone_and_the_stage_completes():
    """Each lost attempt is a suspect (the worker may have died of it): it waits for an
    idle worker and runs there alone, new attempts in index order."""
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, tasks(4)))
    out = state.worker_lost(0, WorkerLostError(0, "exit 1"))
    assert out == [] and state.snapshot()["stages"][1]["pending"] == 2  # worker 1 is busy
    assert state.counters() == {
        "tasks_rerun": 0, "tasks_speculated": 0, "tasks_lost": 2, "tasks_replaced": 0,
    }  # fmt: skip
    assert finish(state, placed[1][0]) == []
    (first,) = launched(finish(state, placed[1][1]))[1]  # idle now: one suspect
    assert first.index == 0 and first.rerun and first.id not in {a.id for a in placed[0]}
    assert state.stage_submitted(2, tasks(1)) == []  # nothing goes behind a suspect
    (second,) = launched(finish(state, first))[1]
    assert second.index == 2
    (done, launch) = finish(state, second)
    assert [r.value for r in done.results] == [0, 1, 2, 3]
    assert {r.worker for r in done.results} == {1}
    assert launch.worker == 1 and launch.attempts[0].stage == 2
    assert state.counters()["tasks_rerun"] == 2


def test_nothing_is_sent_to_a_lost_worker():
    state = cluster(0, 1)
    launched(state.stage_submitted(1, tasks(4)))
    out = state.worker_lost(0, WorkerLostError(0, "gone")) + state.worker_added(2)
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


# --- reruns after a lost worker ----------------------------------------------


def test_a_task_running_on_the_worker_it_is_pinned_to_fails_its_stage_with_it():
    state = cluster(0, 1)
    placed = launched(state.stage_submitted(1, [TaskSpec(0, worker=0), TaskSpec(1)]))
    error = WorkerLostError(0, "gone")
    out = state.worker_lost(0, error)
    assert out == [StageFailed(1, error), Cancel(1, (placed[1][0].id,), stop=True)]
    assert state.counters()["tasks_rerun"] == 0


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
def test_a_task_running_at_max_attempts_losses_fails_its_stage_with_task_crashed(max_attempts):
    """A task that kills its process costs ``max_attempts`` workers, not every one."""
    state = SchedulerState(max_attempts=max_attempts)
    for worker in range(5):
        state.worker_added(worker)
    (attempt,) = launched(state.stage_submitted(1, tasks(1)))[0]
    error = WorkerLostError(0, "killed by signal 9 (SIGKILL)")
    for lost in range(1, max_attempts):
        out = state.worker_lost(worker_of(state, attempt), error)
        (attempt,) = launched(out)[lost]  # the next live worker
        assert state.counters()["tasks_rerun"] == lost
    (failed,) = state.worker_lost(worker_of(state, attempt), error)
    assert isinstance(failed, StageFailed) and isinstance(failed.error, TaskCrashedError)
    assert (failed.error.index, failed.error.losses) == (0, max_attempts)
    assert str(failed.error) == (f"task 0 was running each time its worker was lost, {max_attempts} "
                                 "times (the limit): the last time worker 0 was lost: killed by "
                                 "signal 9 (SIGKILL)")  # fmt: skip
    assert state.counters()["tasks_lost"] == max_attempts
    assert state.snapshot()["stages"] == {} and len(state.workers) == 5 - max_attempts


def test_max_attempts_count_per_task():
    state = SchedulerState(max_attempts=2)
    for worker in range(6):
        state.worker_added(worker)
    launched(state.stage_submitted(1, tasks(3)))  # on workers 0, 1 and 2
    for worker in (0, 1, 2):  # each task lost once: under the limit, rerun on 3, 4, 5
        out = state.worker_lost(worker, WorkerLostError(worker, "gone"))
        assert of(out, StageFailed) == [] and list(launched(out)) == [worker + 3]
    (failed, *_) = state.worker_lost(3, WorkerLostError(3, "gone"))  # task 0, a second time
    assert isinstance(failed.error, TaskCrashedError) and failed.error.index == 0


def test_a_suspect_runs_alone_so_a_second_loss_is_charged_to_it_only():
    """A lost worker's attempts are all charged (the driver cannot tell the one it ran
    from those queued behind it, or finished unreported); then each runs alone on an
    idle worker, and a loss there is that task's alone."""
    state = SchedulerState(max_attempts=2, window=4)
    for worker in range(4):
        state.worker_added(worker)
    placed = launched(state.stage_submitted(1, tasks(8)))  # two a worker
    assert indices(placed[0]) == [0, 4]
    assert state.worker_lost(0, WorkerLostError(0, "gone")) == []  # 0 and 4: suspects, nobody idle
    finish(state, placed[1][0])
    (alone,) = launched(finish(state, placed[1][1]))[1]  # worker 1 idle: task 0, alone
    assert alone.index == 0 and state.running(1) == (alone.id,)
    (failed,) = of(state.worker_lost(1, WorkerLostError(1, "gone")), StageFailed)
    assert isinstance(failed.error, TaskCrashedError) and failed.error.index == 0
    assert failed.error.losses == 2


def test_a_failed_stage_run_again_keeps_its_tasks_losses():
    """The dataset layer runs a stage again after a loss that failed it (no worker left):
    the same program over the same tasks (its ``key``) starts from the losses it had."""
    state = SchedulerState(max_attempts=2)
    state.worker_added(0)
    launched(state.stage_submitted(1, tasks(1), key="program"))
    (first,) = state.worker_lost(0, WorkerLostError(0, "gone"))
    assert isinstance(first, StageFailed) and not isinstance(first.error, TaskCrashedError)
    state.worker_added(1)  # its replacement
    launched(state.stage_submitted(2, tasks(1), key="program"))
    (second,) = state.worker_lost(1, WorkerLostError(1, "gone"))
    assert isinstance(second.error, TaskCrashedError) and second.error.losses == 2
    state.worker_added(2)
    (done,) = finish(state, launched(state.stage_submitted(3, tasks(1), key="another"))[2][0])
    assert isinstance(done, StageDone)


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


