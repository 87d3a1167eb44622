"""Feeding events to the scheduler state machine as the driver loop would: shared by
the test_scheduler_* modules (runtime/scheduling/scheduler.py)."""

from __future__ import annotations

from collections import deque

from clamor.runtime.scheduling.scheduler import (
    Attempt,
    Instruction,
    Launch,
    SchedulerState,
    StageDone,
    StageFailed,
    TaskResult,
)
from clamor.runtime.stage import TaskSpec


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


