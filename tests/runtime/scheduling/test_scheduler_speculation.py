"""The scheduler state machine (runtime/scheduling/scheduler.py), events in and instructions out.

Time: stragglers' speculative copies and slow workers' queues. No process is started:
each test feeds events to a ``SchedulerState`` and reads the instructions it returns, as
the driver loop would.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest
from clamor.runtime.errors import TaskCrashedError, WorkerLostError
from clamor.runtime.scheduling.scheduler import (
    Attempt,
    Cancel,
    Drop,
    Instruction,
    Launch,
    SchedulerState,
    StageDone,
    StageFailed,
)
from clamor.runtime.scheduling.scheduler_policy import (
    SortedSample,
    SpeculationPolicy,
    median,
)
from clamor.runtime.stage import DRIVER, TaskSpec
from scheduler_events import (
    cluster,
    finish,
    indices,
    launched,
    of,
    tasks,
)

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


def test_the_losers_large_reply_is_dropped_where_it_waits():
    state = cluster(0, 1, 2)
    original, _ = straggling(state)
    (copy,) = launched(state.tick(3.0))[1]
    finish(state, copy, now=3.5, duration=0.5)
    reply = ("reply", original.id)  # kept on worker 0 for the driver, which will not read it
    assert finish(state, original, worker=0, now=4.0, kept=(reply,)) == [Drop(0, (reply,))]


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


def test_the_usual_wait_for_a_busy_workers_report_raises_the_threshold():
    # 1 ms tasks, reported two to a message every 50 ms (workers outnumber cores: each
    # is off the CPU for most of the time). A silence of 90 ms is usual noise, not a
    # straggler; one of 2 x the 90th percentile of such waits is.
    state = cluster(0, 1, 2)
    placed = launched(state.stage_submitted(1, tasks(36), now=0.0))
    for batch in range(6):
        now = 0.05 * (batch + 1)
        for worker in (0, 1, 2):
            if worker == 0 and batch == 5:
                continue  # worker 0's last two attempts: its head runs from 0.25
            for attempt in placed[worker][2 * batch : 2 * batch + 2]:
                finish(state, attempt, now=now, duration=0.001)
    assert state.tick(0.34) == []  # running 90 ms: over 2 x median 1 ms and 50 ms
    out = state.tick(0.3501)  # worker 0 is slow: its queued attempt is taken back, the
    # running one copied
    assert of(out, Cancel) == [Cancel(0, (placed[0][11].id,))]
    assert sorted(a.index for attempts in launched(out).values() for a in attempts) == [30, 33]


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


def test_a_stages_sample_of_durations_is_exact_up_to_its_cap_then_bounded_and_close():
    values = [(i * 7919) % 100_000 / 1e5 for i in range(100_000)]  # 0 .. 1, shuffled
    sample = SortedSample()
    for v in values[: SortedSample.CAP]:
        sample.add(v)
    assert list(sample) == sorted(values[: SortedSample.CAP])  # every one, sorted
    for v in values[SortedSample.CAP :]:
        sample.add(v)
    assert SortedSample.CAP // 2 <= len(sample) <= SortedSample.CAP and sample == sorted(sample)
    assert abs(median(sample) - 0.5) < 0.01  # the median of all 100,000 is 0.5
    assert abs(sample[int(0.9 * len(sample))] - 0.9) < 0.01  # and their 90th percentile 0.9


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
    assert state.stage_cancelled(1, RuntimeError(), now=5.0)[1] == Cancel(0, (head.id,), stop=True)
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


def test_a_task_taken_back_from_a_worker_that_dies_is_charged_the_loss():
    """A worker runs an attempt while the next waits, and a Cancel cannot stop a task that
    kills its process: the tasks taken back from a slow worker are charged when it is
    lost, like those it ran. Here task 3 kills workers 0 and 1 and fails its stage there,
    at 2 losses, instead of costing a third worker."""
    state = SchedulerState(max_attempts=2)
    for worker in range(3):
        state.worker_added(worker)
    placed, out = slow_worker_0(state)
    assert indices(launched(out)[1]) == [3, 6]  # taken back from worker 0
    assert of(state.worker_lost(0, WorkerLostError(0, "exit 1")), StageFailed) == []
    (failed,) = of(state.worker_lost(1, WorkerLostError(1, "exit 1")), StageFailed)
    assert isinstance(failed.error, TaskCrashedError)
    assert (failed.error.index, failed.error.losses) == (3, 2)
    assert state.workers == [2]


def test_a_loss_is_charged_once_to_a_task_both_taken_back_from_and_running_on_that_worker():
    state = SchedulerState(max_attempts=3)
    for worker in range(3):
        state.worker_added(worker)
    placed, out = slow_worker_0(state)  # 3 and 6 taken back from worker 0, placed on 1
    assert state.worker_lost(1, WorkerLostError(1, "exit 1")) == []  # 3 and 6: a loss each
    (alone,) = launched(finish(state, placed[0][0], now=3.0, duration=3.0))[0]
    assert alone.index == 3  # worker 0 idle: 3 runs there alone, where it was taken from
    assert of(state.worker_lost(0, WorkerLostError(0, "exit 1")), StageFailed) == []  # 2 losses
    assert state.running(2) and finish(state, placed[2][2]) == []
    (alone,) = launched(finish(state, placed[2][1]))[2]
    (failed,) = of(state.worker_lost(2, WorkerLostError(2, "exit 1")), StageFailed)
    assert (failed.error.index, failed.error.losses) == (3, 3)


def test_a_pending_task_taken_back_from_a_lost_worker_waits_to_run_alone():
    """Charged with that loss, a task taken back and not yet placed is a suspect: it
    waits for an idle worker, not for the first free slot."""
    state = SchedulerState(window=2)
    for worker in range(3):
        state.worker_added(worker)
    placed = launched(state.stage_submitted(1, tasks(9), now=0.0))
    assert indices(placed[0]) == [0, 3]
    (six,) = launched(finish(state, placed[1][0], now=1.0, duration=1.0))[1]
    finish(state, placed[2][0], now=1.0, duration=1.0)
    (eight,) = launched(finish(state, placed[1][1], now=2.0, duration=1.0))[1]
    assert state.tick(2.01) == [Cancel(0, (placed[0][1].id,))]  # 3: pending, workers 1, 2 full
    assert state.worker_lost(0, WorkerLostError(0, "exit 1")) == []
    assert launched(finish(state, six)) == {}  # worker 1 still runs 8: 0 and 3 wait
    (alone,) = launched(finish(state, eight))[1]
    assert alone.index == 0 and state.running(1) == (alone.id,)
    (alone,) = launched(finish(state, alone))[1]
    assert alone.index == 3 and state.running(1) == (alone.id,)


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


