"""The driver's log of attempts, stages and events (runtime/observe/telemetry.py), fed by hand.

A worker runs its attempts one at a time in launch order: the head of its queue is
the running one. These tests play the executor's calls and read what the views get.
"""

from __future__ import annotations

import dataclasses
import time

import pytest
from clamor.runtime.observe.telemetry import (
    CANCELLED,
    FAILED,
    LOST,
    OK,
    RUNNING,
    Telemetry,
)


@dataclasses.dataclass
class A:  # the fields of a scheduler Attempt that telemetry reads
    id: int
    stage: int
    index: int
    speculative: bool = False
    rerun: bool = False


def by_attempt(t: Telemetry) -> dict:
    return {r.attempt: r for r in t.tasks()}


def test_the_head_of_a_workers_queue_runs_and_the_rest_wait():
    t = Telemetry()
    t.stage_started(1, "map", 3, epoch=1, recompute=False)
    t.launched(0, [A(1, 1, 0), A(2, 1, 1)], "map", recompute=False)
    t.launched(1, [A(3, 1, 2)], "map", recompute=False)
    tasks = by_attempt(t)
    assert set(tasks) == {1, 3}  # attempt 2 is queued behind 1: not drawn yet
    assert tasks[1].status == tasks[3].status == RUNNING and tasks[1].end is None
    t.finished(1, ok=True, duration=0.0)
    tasks = by_attempt(t)
    assert tasks[1].status == OK and tasks[1].end is not None
    assert tasks[2].status == RUNNING and tasks[2].start >= tasks[1].end  # started when 1 ended


def test_a_finished_attempt_starts_at_its_end_minus_the_measured_duration():
    t = Telemetry()
    t.launched(0, [A(1, 1, 0)], "map", recompute=False)
    time.sleep(0.05)
    t.finished(1, ok=False, duration=0.02)
    (rec,) = t.tasks()
    assert rec.status == FAILED
    assert rec.end - rec.start == pytest.approx(0.02, abs=0.005)


def test_a_lost_worker_loses_its_running_attempt_and_drops_its_queue():
    t = Telemetry()
    t.launched(0, [A(1, 1, 0), A(2, 1, 1)], "map", recompute=False)
    t.worker_lost(0, "pid 42 killed by signal 9")
    (rec,) = t.tasks()
    assert (rec.attempt, rec.status) == (1, LOST)
    (event,) = t.events()
    assert (event.kind, event.worker, event.detail) == ("worker_lost", 0, "pid 42 killed by signal 9")
    t.finished(2, ok=True, duration=0.0)  # a late report of a dropped attempt: ignored
    assert len(t.tasks()) == 1


def test_cancel_drops_a_queued_attempt_and_marks_a_running_one():
    t = Telemetry()
    t.launched(0, [A(1, 1, 0), A(2, 1, 1)], "map", recompute=False)
    t.cancelled([1, 2])
    t.finished(1, ok=True, duration=0.0)  # the running one lost the race: it still reports
    assert [(r.attempt, r.status) for r in t.tasks()] == [(1, CANCELLED)]


def test_a_cancel_that_overtook_its_launch_does_not_leave_a_bar_running_forever():
    t = Telemetry()
    t.launched(0, [A(1, 1, 0)], "map", recompute=False)
    t.cancelled([1])  # head: marked, expected to report ... but the worker never ran it
    t.launched(0, [A(2, 2, 0)], "reduce", recompute=False)
    t.finished(2, ok=True, duration=0.0)
    assert [(r.attempt, r.status) for r in t.tasks()] == [(2, OK)]


def test_kinds_and_speculation_events_are_kept():
    t = Telemetry()
    t.launched(0, [A(1, 1, 0, rerun=True)], "map", recompute=False)
    t.launched(1, [A(2, 1, 0, speculative=True)], "map", recompute=False)
    t.launched(2, [A(3, 2, 0)], "recompute 1 partition(s)", recompute=True)
    tasks = by_attempt(t)
    assert tasks[1].rerun and tasks[2].speculative and tasks[3].recompute
    assert [(e.kind, e.worker) for e in t.events()] == [("speculation", 1)]


def test_stage_end_closes_queued_attempts_and_records_failure():
    t = Telemetry()
    t.stage_started(7, "map", 2, epoch=3, recompute=False)
    assert t.active == 1
    t.launched(0, [A(1, 7, 0), A(2, 7, 1)], "map", recompute=False)
    t.stage_ended(7, ValueError("boom"))
    assert t.active == 0
    (stage,) = t.stages()
    assert (stage.stage, stage.status, stage.epoch) == (7, FAILED, 3) and stage.end is not None
    assert [e.kind for e in t.events()] == ["stage_failed"] and "boom" in t.events()[0].detail
    assert [r.attempt for r in t.tasks()] == [1]  # the running one still runs; 2 never will


def test_logs_are_bounded_and_the_version_moves():
    t = Telemetry(max_tasks=10, max_events=3)
    v = t.version
    for i in range(50):
        t.launched(0, [A(i, 1, i)], "map", recompute=False)
        t.finished(i, ok=True, duration=0.0)
        t.event("note", str(i))
    assert len(t.tasks()) == 10 and [e.detail for e in t.events()] == ["47", "48", "49"]
    assert t.version > v
