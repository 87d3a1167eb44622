"""The driver's scheduler: a pure state machine that places the tasks of stages on workers.

Events come in as method calls (``stage_submitted``, ``task_finished``, ``worker_lost``,
...); each returns a list of instructions (``Launch``, ``Cancel``, ``StageDone``, ...)
that the driver loop carries out (gRPC calls, resolving the caller's future). No I/O,
threads or clock here: the same events always give the same instructions, so the policy
is unit-tested without processes (like h11's ``_state.py`` and dask distributed's
``worker_state_machine.py``).

Room for issue 4: speculation and recomputation become more events (e.g. ``tick(now)``)
on the same pieces: ``_launch`` starts one more attempt of a task on a chosen worker,
the first result for an index already wins, ``_enqueue`` puts a task back in its queues.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Iterable, Sequence
from typing import Any

from clamor.runtime.errors import MissingPartitionError, WorkerLostError
from clamor.runtime.stage import DRIVER, PartitionKey, TaskSpec

# --- instructions ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One try at task ``index`` of ``stage`` (``id``: unique for the state's life).

    ``locations``: the holder (worker id or :data:`DRIVER`) of each of ``spec.inputs``.
    """

    id: int
    stage: int
    index: int
    spec: TaskSpec
    locations: dict[PartitionKey, int]


@dataclasses.dataclass(frozen=True)
class Launch:
    """Send these attempts to ``worker`` (it runs them in order, one at a time)."""

    worker: int
    attempts: tuple[Attempt, ...]


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Tell ``worker`` to abandon these attempt ids (their results will be ignored)."""

    worker: int
    attempts: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What a finished attempt reports (``outputs``: partitions left on ``worker``: nbytes)."""

    index: int
    worker: int
    attempt: int
    value: Any = None
    outputs: dict[PartitionKey, int] = dataclasses.field(default_factory=dict)
    accumulator_updates: dict = dataclasses.field(default_factory=dict)
    read_set: tuple = ()
    duration: float = 0.0


@dataclasses.dataclass(frozen=True)
class StageDone:
    """Every task of ``stage`` finished; ``results`` in index order."""

    stage: int
    results: tuple[TaskResult, ...]


@dataclasses.dataclass(frozen=True)
class StageFailed:
    """``stage`` is over with ``error`` (its running attempts are cancelled alongside)."""

    stage: int
    error: BaseException


@dataclasses.dataclass(frozen=True)
class Drop:
    """Tell ``worker`` (or :data:`DRIVER`) to free these partitions."""

    worker: int
    keys: tuple[PartitionKey, ...]


@dataclasses.dataclass(frozen=True)
class PartitionsLost:
    """These partitions are gone with a lost worker (nobody holds them any more)."""

    keys: tuple[PartitionKey, ...]


Instruction = Launch | Cancel | StageDone | StageFailed | Drop | PartitionsLost


# --- internal state ----------------------------------------------------------


@dataclasses.dataclass(eq=False)
class _Worker:
    """A live worker: its running (launched, unfinished) attempt ids."""

    running: set[int] = dataclasses.field(default_factory=set)
    tasks_done: int = 0


@dataclasses.dataclass(eq=False)
class _Stage:
    """An active stage. Pending indices sit in heaps (a popped index no longer pending is
    skipped), so placing one of n tasks costs O(log n), not O(n)."""

    id: int
    specs: tuple[TaskSpec, ...]
    pending: set[int] = dataclasses.field(default_factory=set)
    #: worker -> heap of pending indices pinned to it (``spec.worker``).
    pinned: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    #: worker -> heap of unpinned pending indices whose inputs it holds most of.
    preferred: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    #: heap of every unpinned pending index.
    unpinned: list[int] = dataclasses.field(default_factory=list)
    #: running attempt id -> worker.
    running: dict[int, int] = dataclasses.field(default_factory=dict)
    results: dict[int, TaskResult] = dataclasses.field(default_factory=dict)


def _pop_pending(stage: _Stage, heap: list[int] | None) -> int | None:
    """The lowest index of ``heap`` still pending (removed from the heap), or ``None``."""
    while heap:
        index = heapq.heappop(heap)
        if index in stage.pending:
            return index
    return None


def _group(pairs: Iterable[tuple[int, Any]]) -> dict[int, list[Any]]:
    """``[(worker, item), ...]`` -> ``{worker: [item, ...]}``, workers sorted."""
    groups: dict[int, list[Any]] = {}
    for worker, item in pairs:
        groups.setdefault(worker, []).append(item)
    return dict(sorted(groups.items()))


# --- the state machine -------------------------------------------------------


class SchedulerState:
    """Stages, workers, running attempts and the partition registry of one cluster.

    ``window``: the most attempts queued on one worker at once (the per-worker
    limit is ``ceil(unfinished tasks / live workers)``, clamped to ``1..window``).
    """

    def __init__(self, window: int = 32) -> None:
        if window < 1:
            raise ValueError(f"window must be at least 1, not {window}")
        self.window = window
        self._workers: dict[int, _Worker] = {}
        self._stages: dict[int, _Stage] = {}  # active stages, in submission (FIFO) order
        self._submitted: set[int] = set()  # every stage id ever submitted
        self._partitions: dict[PartitionKey, tuple[int, int]] = {}  # key -> (holder, nbytes)
        self._attempts: dict[int, tuple[int, Attempt]] = {}  # running: id -> (worker, attempt)
        self._next_attempt = 1
        self._batch: dict[int, dict[int, Attempt]] = {}  # attempts placed in this event

    # --- queries ---------------------------------------------------------------

    def holder(self, key: PartitionKey) -> int | None:
        """The live worker (or :data:`DRIVER`) holding ``key``; ``None`` if nobody does."""
        entry = self._partitions.get(key)
        return None if entry is None else entry[0]

    @property
    def workers(self) -> list[int]:
        """Ids of the live workers, sorted."""
        return sorted(self._workers)

    @property
    def limit(self) -> int:
        """How many attempts one worker may run at once now (0 without workers)."""
        if not self._workers:
            return 0
        unfinished = sum(len(s.specs) - len(s.results) for s in self._stages.values())
        per_worker = -(-unfinished // len(self._workers))
        return max(1, min(self.window, per_worker))

    def running(self, worker: int) -> tuple[int, ...]:
        """The ids of the attempts running on ``worker``, sorted (``()`` if not live)."""
        state = self._workers.get(worker)
        return () if state is None else tuple(sorted(state.running))

    def snapshot(self) -> dict[str, Any]:
        """Plain data for progress bars and dashboards (active stages only)."""
        stages = {}
        for st in self._stages.values():
            total, pending, done = len(st.specs), len(st.pending), len(st.results)
            running = total - pending - done
            stages[st.id] = {"total": total, "pending": pending, "running": running, "done": done}
        return {
            "stages": stages,
            "workers": {
                w: {"running": len(s.running), "tasks_done": s.tasks_done}
                for w, s in sorted(self._workers.items())
            },
            "partitions": len(self._partitions),
            "partition_bytes": sum(nbytes for _, nbytes in self._partitions.values()),
            "limit": self.limit,
        }

    # --- events ----------------------------------------------------------------

    def worker_added(self, worker: int) -> list[Instruction]:
        """A new live worker: give it pending work."""
        if worker == DRIVER or worker in self._workers:
            raise ValueError(f"worker {worker} is already known (or is the DRIVER id)")
        self._workers[worker] = _Worker()
        return self._refill([])

    def worker_lost(self, worker: int, error: BaseException) -> list[Instruction]:
        """A worker is gone: lose its partitions, fail the stages that relied on it.

        With ``error`` if one had an attempt running or a pending task pinned there; with
        :class:`MissingPartitionError` if a pending task needs a partition held there.
        """
        if worker not in self._workers:
            return []
        hit = {self._attempts[a][1].stage for a in self.running(worker)}
        for attempt_id in self.running(worker):
            self._forget(worker, attempt_id)  # never cancelled: nothing goes to a lost worker
        del self._workers[worker]
        out: list[Instruction] = []
        lost = [key for key, (holder, _) in self._partitions.items() if holder == worker]
        for key in lost:
            del self._partitions[key]
        if lost:
            out.append(PartitionsLost(tuple(lost)))
        for stage in list(self._stages.values()):
            pending = sorted(stage.pending)
            if stage.id in hit or any(stage.specs[i].worker == worker for i in pending):
                out += self._fail(stage, error)
            elif missing := self._missing(stage, pending):
                out += self._fail(stage, MissingPartitionError(missing))
            # (no task of a surviving stage preferred the lost worker: it read nothing there)
        return self._refill(out)

    def stage_submitted(self, stage: int, tasks: Sequence[TaskSpec]) -> list[Instruction]:
        """Queue a stage's tasks (FIFO after the active stages) and place what fits.

        ``ValueError`` for a stage id seen before or indices other than 0..n-1; a task
        pinned to a dead worker or reading a partition nobody holds: StageFailed at once.
        """
        if stage in self._submitted:
            raise ValueError(f"stage {stage} was already submitted")
        if {t.index for t in tasks} != set(range(len(tasks))):
            raise ValueError(f"stage {stage}: task indices must be 0..{len(tasks) - 1}, once each")
        self._submitted.add(stage)
        specs = tuple(sorted(tasks, key=lambda t: t.index))
        if not specs:
            return [StageDone(stage, ())]
        dead = sorted({t.worker for t in specs if t.worker is not None} - set(self._workers))
        if dead:
            return [StageFailed(stage, WorkerLostError(dead[0], "not a live worker"))]
        state = _Stage(stage, specs)
        if missing := self._missing(state, range(len(specs))):
            return [StageFailed(stage, MissingPartitionError(missing))]
        self._stages[stage] = state
        for index in range(len(specs)):
            self._enqueue(state, index)
        return self._refill([])

    def task_finished(self, worker: int, result: TaskResult) -> list[Instruction]:
        """An attempt succeeded: the first result per index wins, the worker is refilled.

        The winner's ``outputs`` enter the registry. Results of unknown or cancelled
        attempts, or reported by another worker than the attempt's, are ignored.
        """
        attempt = self._forget(worker, result.attempt)
        if attempt is None:
            return []
        stage = self._stages[attempt.stage]
        out: list[Instruction] = []
        if attempt.index not in stage.results:
            stage.results[attempt.index] = result
            self._workers[worker].tasks_done += 1
            out += self._register(worker, result.outputs)
            if len(stage.results) == len(stage.specs):
                del self._stages[stage.id]
                results = tuple(stage.results[i] for i in range(len(stage.specs)))
                out.append(StageDone(stage.id, results))
        return self._refill(out)

    def task_failed(self, worker: int, attempt: int, error: BaseException) -> list[Instruction]:
        """An attempt raised: its stage fails with ``error`` (other stages go on)."""
        failed = self._forget(worker, attempt)
        if failed is None:
            return []
        return self._refill(self._fail(self._stages[failed.stage], error))

    def stage_cancelled(self, stage: int, error: BaseException) -> list[Instruction]:
        """The caller gave up on a stage: it fails with ``error``; ``[]`` if not active."""
        state = self._stages.get(stage)
        return [] if state is None else self._refill(self._fail(state, error))

    def partitions_added(self, holder: int, sizes: dict[PartitionKey, int]) -> list[Instruction]:
        """``holder`` (a live worker or DRIVER) keeps these now; a stale copy elsewhere: Drop."""
        if holder != DRIVER and holder not in self._workers:
            raise ValueError(f"holder {holder} is neither the DRIVER nor a live worker")
        out = self._register(holder, sizes)
        if holder != DRIVER:
            for stage in self._stages.values():
                self._requeue(stage)  # a worker holding inputs attracts their tasks
        return self._refill(out)

    def partitions_dropped(self, keys: Iterable[PartitionKey]) -> list[Instruction]:
        """Forget these partitions: one Drop per holder (unknown keys are ignored).

        A pending task needing one of them fails its stage when it would launch.
        """
        gone = []
        for key in keys:
            entry = self._partitions.pop(key, None)
            if entry is not None:
                gone.append((entry[0], key))
        return [Drop(holder, tuple(ks)) for holder, ks in _group(gone).items()]

    # --- helpers ---------------------------------------------------------------

    def _forget(self, worker: int, attempt_id: int) -> Attempt | None:
        """Stop tracking an attempt running on ``worker``; ``None`` if there is none such."""
        entry = self._attempts.get(attempt_id)
        if entry is None or entry[0] != worker:
            return None
        del self._attempts[attempt_id]
        self._workers[worker].running.discard(attempt_id)
        del self._stages[entry[1].stage].running[attempt_id]
        return entry[1]

    def _missing(self, stage: _Stage, indices: Iterable[int]) -> list[PartitionKey]:
        """The input keys of these tasks that nobody holds, first-seen order, once each."""
        missing: dict[PartitionKey, None] = {}
        for index in indices:
            for key in stage.specs[index].inputs:
                if key not in self._partitions:
                    missing[key] = None
        return list(missing)

    def _preferred(self, spec: TaskSpec) -> int | None:
        """The live worker holding the most bytes of ``spec.inputs`` (lowest id on ties)."""
        held: dict[int, int] = {}
        for key in spec.inputs:
            entry = self._partitions.get(key)
            if entry is not None and entry[0] != DRIVER:
                held[entry[0]] = held.get(entry[0], 0) + entry[1]
        return min(held, key=lambda w: (-held[w], w)) if held else None

    def _enqueue(self, stage: _Stage, index: int) -> None:
        """Make task ``index`` pending, in the queue its pin or preference says."""
        spec = stage.specs[index]
        stage.pending.add(index)
        if spec.worker is not None:
            heapq.heappush(stage.pinned.setdefault(spec.worker, []), index)
            return
        heapq.heappush(stage.unpinned, index)
        preferred = self._preferred(spec)
        if preferred is not None:
            heapq.heappush(stage.preferred.setdefault(preferred, []), index)

    def _requeue(self, stage: _Stage) -> None:
        """Rebuild a stage's queues (after the registry changed under its preferences)."""
        stage.pinned, stage.preferred, stage.unpinned = {}, {}, []
        for index in sorted(stage.pending):
            self._enqueue(stage, index)

    def _register(self, holder: int, sizes: dict[PartitionKey, int]) -> list[Instruction]:
        """Enter partitions held by ``holder``; copies displaced from other holders are dropped."""
        displaced = []
        for key, nbytes in sizes.items():
            old = self._partitions.get(key)
            if old is not None and old[0] != holder:
                displaced.append((old[0], key))
            self._partitions[key] = (holder, nbytes)
        return [Drop(h, tuple(ks)) for h, ks in _group(displaced).items()]

    def _fail(self, stage: _Stage, error: BaseException) -> list[Instruction]:
        """End a stage with ``error``: drop its pending tasks, cancel its running attempts
        (those placed in this same event were never sent: they just leave the batch)."""
        cancels = []
        for attempt_id, worker in sorted(stage.running.items()):
            self._forget(worker, attempt_id)
            if self._batch.get(worker, {}).pop(attempt_id, None) is None:
                cancels.append((worker, attempt_id))
        stage.pending.clear()
        del self._stages[stage.id]
        out: list[Instruction] = [StageFailed(stage.id, error)]
        return out + [Cancel(w, tuple(ids)) for w, ids in _group(cancels).items()]

    def _launch(self, stage: _Stage, index: int, worker: int, out: list[Instruction]) -> bool:
        """Batch an attempt of ``index`` for ``worker`` (``False``: an input is gone, failed)."""
        spec = stage.specs[index]
        if any(key not in self._partitions for key in spec.inputs):
            missing = self._missing(stage, sorted(stage.pending))  # ``index`` included
            out += self._fail(stage, MissingPartitionError(missing))
            return False
        locations = {key: self._partitions[key][0] for key in spec.inputs}
        stage.pending.discard(index)
        attempt = Attempt(self._next_attempt, stage.id, index, spec, locations)
        self._next_attempt += 1
        self._attempts[attempt.id] = (worker, attempt)
        stage.running[attempt.id] = worker
        self._workers[worker].running.add(attempt.id)
        self._batch.setdefault(worker, {})[attempt.id] = attempt
        return True

    def _place_stage(self, stage: _Stage, room: dict[int, int], out: list[Instruction]) -> bool:
        """Give a stage's pending tasks to workers with room; ``False`` if the stage failed.

        Pinned tasks first, then tasks go to their preferred worker, then any other
        unpinned task goes to the worker with the most room left (lowest id on ties).
        """
        for queues in (stage.pinned, stage.preferred):
            for worker, queue in sorted(queues.items()):
                while room.get(worker, 0) > 0:
                    index = _pop_pending(stage, queue)
                    if index is None:
                        break
                    if not self._launch(stage, index, worker, out):
                        return False
                    room[worker] -= 1
        free = [(-r, w) for w, r in room.items() if r > 0]
        heapq.heapify(free)
        while free:
            index = _pop_pending(stage, stage.unpinned)
            if index is None:
                break
            _, worker = heapq.heappop(free)
            if not self._launch(stage, index, worker, out):
                return False
            room[worker] -= 1
            if room[worker] > 0:
                heapq.heappush(free, (-room[worker], worker))
        return True

    def _refill(self, out: list[Instruction]) -> list[Instruction]:
        """Place pending tasks, stage by stage in FIFO order; append one Launch per worker."""
        placing = True
        while placing and self._workers:
            placing = False
            limit = self.limit
            room = {w: limit - len(s.running) for w, s in sorted(self._workers.items())}
            for stage in list(self._stages.values()):
                if not any(r > 0 for r in room.values()):
                    break
                if stage.pending and not self._place_stage(stage, room, out):
                    placing = True  # a stage failed and freed slots: place again
                    break
        for worker, attempts in sorted(self._batch.items()):
            if attempts:
                out.append(Launch(worker, tuple(attempts.values())))
        self._batch = {}
        return out
