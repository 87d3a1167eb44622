"""The driver's scheduler: a pure state machine that places the tasks of stages on workers.

Events come in as method calls (``stage_submitted``, ``task_finished``, ``worker_lost``,
``tick``, ...); each returns a list of instructions (``Launch``, ``Cancel``, ``StageDone``,
...) that the driver loop carries out (gRPC calls, resolving the caller's future). No I/O,
threads or clock here: the same events always give the same instructions, so the policy
is unit-tested without processes (like h11's ``_state.py`` and dask distributed's
``worker_state_machine.py``). Time comes in as the events' ``now`` (monotonic seconds).

Fault tolerance:

- A worker runs its attempts one at a time, in launch order: the attempt at the head of
  its queue started when it got there (the event in which the one before it ended, or its
  own launch). An event without ``now`` leaves that start unknown until the next ``tick``,
  which takes its own time (a lower bound of the running time: never speculates early).
- A lost worker's unfinished attempts are queued again for the live workers (unless
  another attempt of the same task still runs). Only the attempt it was running (its
  head) is charged with the loss: a task charged ``max_attempts`` times (one that kills
  its process) fails its stage with :class:`TaskCrashedError` instead of taking more
  workers. The stage fails with the loss's error if a task is pinned there or if no
  worker is left; with :class:`MissingPartitionError` if a pending task needs a partition
  that is gone (the dataset layer recomputes it; the scheduler knows no lineage).
- Stragglers (``tick``): see :class:`~clamor.runtime.scheduling.scheduler_policy.SpeculationPolicy`
  for when a stage can tell them and may speculate. The worker of a straggler is marked
  slow (never the last live worker not marked slow): the attempts queued behind the
  straggler there (not pinned, inputs all held) are cancelled and their tasks pending
  again (``tasks_replaced``) for the workers with room; it holds at most ``slow_limit``
  attempts until it finishes one within the threshold, or the stage that marked it
  ends. Then, the pending tasks placed, a straggler (not pinned, its task not speculated
  before) gets one copy on an idle worker not marked slow (the one holding most of its
  inputs, round-robin on ties); no idle worker, no copy.
- The first result per task index wins (accumulator updates merge exactly once); the
  other attempts of that index are cancelled and their results ignored, but a queued
  attempt taken back from a slow worker that had started before its Cancel arrived
  still counts if it reports the first result of its index. A task error fails the
  stage only if no other attempt of that index still runs.
"""

from __future__ import annotations

import collections
import functools
import heapq
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

from clamor.runtime.errors import (
    MissingPartitionError,
    TaskCrashedError,
    WorkerLostError,
)
from clamor.runtime.scheduling.scheduler_policy import (  # the instructions live there, used from here
    FETCH_RATE,
    Attempt,
    Cancel,
    Drop,
    FetchCost,
    Instruction,
    Launch,
    PartitionsLost,
    Registry,
    SpeculationPolicy,
    StageDone,
    StageFailed,
    StageState,
    TaskEnded,
    TaskResult,
    WorkerState,
    group,
    pick_worker,
    place_stage,
    pop_pending,
)
from clamor.runtime.stage import DRIVER, PartitionKey, TaskSpec

#: Stage keys whose tasks' losses are kept for a rerun of the stage.
CARRIED_KEYS = 64

# --- the state machine -------------------------------------------------------


class SchedulerState:
    """Stages, workers, running attempts and the partition registry of one cluster.

    ``window``: the most attempts queued on one worker at once (the per-worker
    limit is ``ceil(unfinished tasks / live workers not marked slow)``, clamped to
    ``1..window``; a slow worker's is 1).
    ``max_attempts``: how many times a task may be running when its worker is lost
    before its stage fails (Spark's ``task.maxFailures``). ``speculation*``: see :class:`SpeculationPolicy`
    (``speculation_min``: its ``minimum``, seconds). ``fetch_rate``: bytes per second the
    fetch-cost model charges for moving a task's input (:class:`FetchCost`).
    """

    def __init__(
        self,
        window: int = 32,
        *,
        max_attempts: int = 3,
        speculation: bool = True,
        speculation_factor: float = 2.0,
        speculation_min: float = 0.05,
        speculation_quantile: float = 0.25,
        fetch_rate: float = FETCH_RATE,
    ) -> None:
        if window < 1 or max_attempts < 1:
            raise ValueError(f"window, max_attempts must be at least 1: {window}, {max_attempts}")
        self.window = window
        self.fetch = FetchCost(fetch_rate)
        self.max_attempts = max_attempts
        self.policy = SpeculationPolicy(
            speculation, speculation_factor, speculation_min, speculation_quantile
        )
        self._workers: dict[int, WorkerState] = {}
        self._stages: dict[int, StageState] = {}  # active stages, in submission (FIFO) order
        self._submitted: set[int] = set()  # every stage id ever submitted
        self._partitions = Registry()
        self._attempts: dict[int, tuple[int, Attempt]] = {}  # running: id -> (worker, attempt)
        self._speculative: set[int] = set()  # running attempts launched as copies
        #: stage key -> {index: losses} of the stages that failed (a rerun starts from them)
        self._carried: collections.OrderedDict[Hashable, dict[int, int]] = collections.OrderedDict()
        self._replaced: dict[int, tuple[int, Attempt]] = {}  # taken back from slow workers
        self._last_copy: int | None = None  # the worker that got the last copy
        self._next_attempt = 1
        self._batch: dict[int, dict[int, Attempt]] = {}  # attempts placed in this event
        self._now: float | None = None  # the time of the event being handled
        #: attempts relaunched because their worker was lost, speculative copies launched,
        #: attempts lost with their worker, queued attempts taken back from slow workers
        self.tasks_rerun = self.tasks_speculated = self.tasks_lost = self.tasks_replaced = 0

    # --- queries ---------------------------------------------------------------

    def holder(self, key: PartitionKey) -> int | None:
        """The live worker (or :data:`DRIVER`) holding ``key``; ``None`` if nobody does."""
        return self._partitions.holder(key)

    @property
    def workers(self) -> list[int]:
        """Ids of the live workers, sorted."""
        return sorted(self._workers)

    @property
    def slow(self) -> list[int]:
        """Ids of the live workers marked slow, sorted."""
        return sorted(w for w, s in self._workers.items() if s.slow is not None)

    @property
    def limit(self) -> int:
        """How many attempts a worker not marked slow may hold now (0 without workers)."""
        if not self._workers:
            return 0
        unfinished = sum(len(s.specs) - len(s.results) for s in self._stages.values())
        fast = sum(s.slow is None for s in self._workers.values()) or len(self._workers)
        return max(1, min(self.window, -(-unfinished // fast)))

    def running(self, worker: int) -> tuple[int, ...]:
        """The ids of the attempts running on ``worker``, sorted (``()`` if not live)."""
        state = self._workers.get(worker)
        return () if state is None else tuple(sorted(state.running))

    def counters(self) -> dict[str, int]:
        """Fault-tolerance counters since the state was made."""
        return {
            "tasks_rerun": self.tasks_rerun,
            "tasks_speculated": self.tasks_speculated,
            "tasks_lost": self.tasks_lost,
            "tasks_replaced": self.tasks_replaced,
        }

    def snapshot(self) -> dict[str, Any]:
        """Plain data for progress bars and dashboards (active stages only).

        ``speculative``: the ids of the running speculative copies (per stage: how many).
        """
        copies = group((self._attempts[a][1].stage, a) for a in self._speculative)
        in_memory, on_disk = self._partitions.bytes_by_holder(), self._partitions.bytes_by_holder("disk")
        stages = {}
        for st in self._stages.values():
            total, pending, done = len(st.specs), len(st.pending), len(st.results)
            running = total - pending - done
            stages[st.id] = {
                "total": total, "pending": pending, "running": running, "done": done,
                "speculative": len(copies.get(st.id, ())),
            }  # fmt: skip
        return {
            "stages": stages,
            "workers": {
                w: {
                    "running": len(s.running),
                    "tasks_done": s.tasks_done,
                    "slow": s.slow is not None,
                    "partition_bytes": in_memory.get(w, 0),
                    "disk_bytes": on_disk.get(w, 0),
                }
                for w, s in sorted(self._workers.items())
            },
            "partitions": len(self._partitions.entries),
            "partition_bytes": sum(nbytes for _, nbytes in self._partitions.entries.values()),
            "partitions_on_disk": len(self._partitions.tiers),
            "limit": self.limit,
            "speculative": sorted(self._speculative),
            **self.counters(),
        }

    # --- events ----------------------------------------------------------------

    def worker_added(self, worker: int, *, now: float | None = None) -> list[Instruction]:
        """A new live worker: give it pending work."""
        if worker == DRIVER or worker in self._workers:
            raise ValueError(f"worker {worker} is already known (or is the DRIVER id)")
        self._now = now
        self._workers[worker] = WorkerState()
        return self._refill([])

    def worker_lost(
        self, worker: int, error: BaseException, *, now: float | None = None
    ) -> list[Instruction]:
        """A worker is gone: lose its partitions, run its unfinished attempts elsewhere.

        Stages fail with ``error`` if a task is pinned there or no worker is left, with
        :class:`TaskCrashedError` if the attempt it was running (or one taken back from
        it) had its task charged ``max_attempts`` losses; with :class:`MissingPartitionError` if a pending
        task needs a partition held there.
        """
        state = self._workers.get(worker)
        if state is None:
            return []
        self._now = now
        lost = [self._attempts[a][1] for a in list(state.running)]
        for attempt in lost:
            self._forget(worker, attempt.id)  # never cancelled: nothing goes to a lost worker
        del self._workers[worker]
        taken = group((e[1].stage, e[1].index) for e in self._replaced.values() if e[0] == worker)
        self._replaced = {a: e for a, e in self._replaced.items() if e[0] != worker}
        if all(s.slow is not None for s in self._workers.values()):
            for s in self._workers.values():
                s.slow = None  # some worker takes the full limit
        self.tasks_lost += len(lost)
        out: list[Instruction] = []
        if keys := self._partitions.lose(worker):
            out.append(PartitionsLost(tuple(keys)))
        hit = group((a.stage, a.index) for a in lost)
        for stage in list(self._stages.values()):
            out += self._recover(stage, worker, sorted(hit.get(stage.id, ())), error, taken.get(stage.id, ()))
        return self._refill(out)

    def stage_submitted(
        self, stage: int, tasks: Sequence[TaskSpec], *, now: float | None = None, key: Hashable = None,
        streaming: bool = False,
    ) -> list[Instruction]:  # fmt: skip
        """Queue a stage's tasks (FIFO after the active stages) and place what fits.

        ``key``: the program's identity: a stage run again with the same key (after it
        failed) starts from the losses its tasks had (the last :data:`CARRIED_KEYS` keys).
        ``streaming``: each task's end is an instruction of its own (:class:`TaskEnded`),
        and a task's error ends that task, not the stage (futures; the stage is done when
        every task ended).
        ``ValueError`` for a stage id seen before or indices other than 0..n-1; a task
        pinned to a dead worker or reading a partition nobody holds: StageFailed at once.
        """
        if stage in self._submitted:
            raise ValueError(f"stage {stage} was already submitted")
        if {t.index for t in tasks} != set(range(len(tasks))):
            raise ValueError(f"stage {stage}: task indices must be 0..{len(tasks) - 1}, once each")
        self._now = now
        self._submitted.add(stage)
        specs = tuple(sorted(tasks, key=lambda t: t.index))
        if not specs:
            return [StageDone(stage, ())]
        dead = sorted({t.worker for t in specs if t.worker is not None} - set(self._workers))
        if dead:
            return [StageFailed(stage, WorkerLostError(dead[0], "not a live worker"))]
        state = StageState(stage, specs, key=key, streaming=streaming)
        if key is not None:
            state.losses = dict(self._carried.get(key, {}))
        if missing := self._missing(state, range(len(specs))):
            return [StageFailed(stage, MissingPartitionError(missing))]
        self._stages[stage] = state
        for index in range(len(specs)):
            self._enqueue(state, index)
        return self._refill([])

    def task_finished(
        self, worker: int, result: TaskResult, *, now: float | None = None
    ) -> list[Instruction]:
        """An attempt succeeded: the first result per index wins, the worker is refilled.

        The winner's ``outputs`` enter the registry and the other attempts of its index
        are cancelled. Results of unknown or cancelled attempts (but for the first result
        of an attempt taken back from a slow worker), or reported by another worker than
        the attempt's, are ignored (what they left on a live worker is dropped there: their
        ``kept`` reply, and outputs that the registry has elsewhere). A slow worker
        finishing an attempt within the threshold is not slow any more.
        """
        return self.tasks_finished(worker, [result], now=now)

    def tasks_finished(
        self, worker: int, results: Iterable[TaskResult], *, now: float | None = None
    ) -> list[Instruction]:
        """:meth:`task_finished` for each of ``results`` (reported together, in order),
        then one refill: placing costs O(workers), which a message of many tiny tasks'
        results pays once."""
        out: list[Instruction] = []
        counted = [self._finished(worker, result, now, out) for result in results]
        return self._refill(out) if any(counted) else out

    def _finished(self, worker: int, result: TaskResult, now: float | None, out: list[Instruction]) -> bool:
        """One result of :meth:`tasks_finished`, its instructions appended to ``out``;
        False if it is ignored (then nothing is refilled for it)."""
        self._now = now
        state = self._workers.get(worker)
        silence = None  # since the driver last heard from the worker, if this was its head
        if state is not None and state.head == result.attempt and state.since is not None and now is not None:
            silence = now - state.since
        attempt = self._forget(worker, result.attempt) or self._late(worker, result.attempt)
        if attempt is None:
            stale = [k for k in result.outputs if self.holder(k) not in (None, worker)]
            if (stale or result.kept) and worker in self._workers:
                out.append(Drop(worker, (*stale, *result.kept)))
            return False
        stage = self._stages[attempt.stage]
        state = self._workers[worker]
        if silence:  # the first report of a message (the others came with it: 0)
            stage.silences.add(silence)
        marked = None if state.slow is None else self._stages[state.slow]  # see ``_end``
        if marked is not None and result.duration <= self.policy.threshold(marked.durations):
            state.slow = None
        if attempt.index not in stage.results:
            stage.results[attempt.index] = result
            stage.durations.add(result.duration)
            if stage.streaming:
                out.append(TaskEnded(stage.id, attempt.index, result))
            state.tasks_done += 1
            if result.outputs:
                out += self._register(worker, result.outputs)
            if attempt.index in stage.copies:
                out += self._cancel(stage, stage.copies[attempt.index])
            out += self._done_if_complete(stage)
        return True

    def task_failed(
        self, worker: int, attempt: int, error: BaseException, *, now: float | None = None
    ) -> list[Instruction]:
        """An attempt raised: its stage fails with ``error`` (other stages go on).

        Not if another attempt of that index still runs: only this one is dropped. If
        some of the attempt's inputs are held by nobody now, the error becomes a
        :class:`MissingPartitionError` for them (``__cause__``: ``error``).
        """
        self._now = now
        failed = self._forget(worker, attempt)
        if failed is None:
            self._replaced.pop(attempt, None)  # taken back: its task is placed again anyway
            return []
        stage = self._stages[failed.stage]
        if failed.index in stage.copies:
            return self._refill([])
        if stage.streaming:  # that task ends with its error; the others go on
            stage.results[failed.index] = TaskResult(failed.index, worker, attempt)
            return self._refill([TaskEnded(stage.id, failed.index, error=error), *self._done_if_complete(stage)])
        missing = self._partitions.missing(failed.spec.inputs)
        if missing and not isinstance(error, MissingPartitionError):
            missing_error = MissingPartitionError(missing)
            missing_error.__cause__ = error
            error = missing_error
        return self._refill(self._fail(stage, error))

    def stage_cancelled(
        self, stage: int, error: BaseException, *, now: float | None = None
    ) -> list[Instruction]:
        """The caller gave up on a stage: it fails with ``error``; ``[]`` if not active."""
        self._now = now
        state = self._stages.get(stage)
        return [] if state is None else self._refill(self._fail(state, error))

    def task_cancelled(
        self, stage: int, index: int, error: BaseException, *, now: float | None = None
    ) -> list[Instruction]:
        """The caller of a streaming stage gave up on one task (a future cancelled): it
        ends with ``error`` and its running attempts are stopped; the others go on.
        ``[]`` if the stage is not active or not streaming, or the task ended already."""
        self._now = now
        state = self._stages.get(stage)
        if state is None or not state.streaming or index in state.results:
            return []
        state.settle(index)
        cancels = self._cancel(state, list(state.copies.get(index, ())), stop=True)
        state.results[index] = TaskResult(index, DRIVER, 0)
        return self._refill([TaskEnded(stage, index, error=error), *cancels, *self._done_if_complete(state)])

    def partitions_added(
        self, holder: int, sizes: dict[PartitionKey, int], *, now: float | None = None
    ) -> list[Instruction]:
        """``holder`` (a live worker or DRIVER) keeps these now; a stale copy elsewhere: Drop."""
        if holder != DRIVER and holder not in self._workers:
            raise ValueError(f"holder {holder} is neither the DRIVER nor a live worker")
        self._now = now
        out = self._register(holder, sizes)
        if holder != DRIVER:
            for stage in self._stages.values():
                self._requeue(stage)  # a worker holding inputs attracts their tasks
        return self._refill(out)

    def partitions_moved(
        self, reporter: int, moves: dict[PartitionKey, tuple[int, str, int]]
    ) -> list[Instruction]:
        """``reporter`` spilled partitions over its budget (:meth:`Registry.move`); a key
        moved to a worker lost by now is lost with it. Pending tasks are placed again by
        where their inputs are now."""
        lost = self._partitions.move(moves, set(self._workers))
        for stage in self._stages.values():
            self._requeue(stage)
        return self._refill([PartitionsLost(tuple(lost))] if lost else [])

    def memory_held(self) -> dict[int, int]:
        """Live worker -> bytes of the partitions it keeps in memory, as far as reported."""
        used = self._partitions.bytes_by_holder()
        return {w: used.get(w, 0) for w in self._workers}

    def placement(self) -> dict[PartitionKey, tuple[int, str, int]]:
        """Every partition kept: ``key -> (holder, tier, nbytes)``."""
        return self._partitions.placement()

    def partitions_dropped(self, keys: Iterable[PartitionKey]) -> list[Instruction]:
        """Forget these partitions: one Drop per holder (unknown keys are ignored).

        A pending task needing one of them fails its stage when it would launch.
        """
        return [Drop(holder, tuple(ks)) for holder, ks in self._partitions.remove(keys).items()]

    def tick(self, now: float) -> list[Instruction]:
        """Time passes: mark the workers of stragglers slow and place the attempts queued
        behind them again, then launch speculative copies (see the module doc)."""
        self._now = now
        for state in self._workers.values():
            if state.head is not None and state.since is None:
                state.since = now  # started at an event without ``now``: at the latest now
        out = self._replace(now)
        self._place(out)
        self._speculate(now)
        return self._flush(out)

    # --- helpers ---------------------------------------------------------------

    def _forget(self, worker: int, attempt_id: int) -> Attempt | None:
        """Stop tracking an attempt running on ``worker``; ``None`` if there is none such."""
        entry = self._attempts.get(attempt_id)
        if entry is None or entry[0] != worker:
            return None
        attempt = entry[1]
        del self._attempts[attempt_id]
        self._speculative.discard(attempt_id)
        state = self._workers[worker]
        del state.running[attempt_id]
        if state.isolated == attempt_id:
            state.isolated = None
        self._set_head(state)
        stage = self._stages[attempt.stage]
        del stage.running[attempt_id]
        copies = stage.copies[attempt.index]
        copies.remove(attempt_id)
        if not copies:
            del stage.copies[attempt.index]
        return attempt

    def _late(self, worker: int, attempt_id: int) -> Attempt | None:
        """An attempt taken back from ``worker`` reports: it counts if its result is the
        first of its index (the index leaves the pending tasks); else ``None``."""
        entry = self._replaced.get(attempt_id)
        if entry is None or entry[0] != worker:
            return None
        del self._replaced[attempt_id]
        attempt = entry[1]
        stage = self._stages.get(attempt.stage)
        if stage is None or attempt.index in stage.results:
            return None
        stage.settle(attempt.index)
        return attempt

    def _set_head(self, state: WorkerState) -> None:
        """After ``state.running`` changed: a new head started now."""
        head = next(iter(state.running), None)
        if head != state.head:
            state.head, state.since = head, None if head is None else self._now

    def _recover(
        self, stage: StageState, worker: int, lost: list[int], error: BaseException,
        taken: Iterable[int] = (),
    ) -> list[Instruction]:  # fmt: skip
        """``worker`` was lost with attempts of these indices: queue them again, or fail.
        Each counts a loss, and so does each index ``taken`` back from it (pending or
        running elsewhere already; that worker may have started it, as a worker runs an
        attempt while the next waits, and a Cancel does not stop ``os._exit``), once
        however many of its attempts were there: at ``max_attempts`` the stage fails with
        :class:`TaskCrashedError`."""
        for index in (*lost, *(i for i in taken if i not in lost)):  # once a loss
            losses = self._charge(stage, index)
            if index not in stage.copies and losses >= self.max_attempts:
                return self._fail(stage, TaskCrashedError(index, losses, str(error)))
        for index in (i for i in taken if i in stage.pending and i not in stage.suspected):
            self._enqueue(stage, index)  # with a loss now: a suspect (its old queue skips it)
        if not self._workers:
            return self._fail(stage, error)
        pinned = stage.pinned.pop(worker, [])
        stage.preferred.pop(worker, None)
        if any(stage.specs[i].worker == worker for i in lost) or any(
            i in stage.pending for i in pinned
        ):
            return self._fail(stage, error)
        for index in (i for i in lost if i not in stage.copies):  # else another attempt runs
            stage.rerun.add(index)
            self._enqueue(stage, index)
        if missing := self._missing(stage, sorted(stage.pending)):
            return self._fail(stage, MissingPartitionError(missing))
        return []

    def _charge(self, stage: StageState, index: int) -> int:
        """Count a loss against task ``index`` (kept for a rerun of the stage); its losses."""
        losses = stage.losses[index] = stage.losses.get(index, 0) + 1
        if stage.key is not None:
            self._carried.setdefault(stage.key, {})[index] = losses
            self._carried.move_to_end(stage.key)
            while len(self._carried) > CARRIED_KEYS:
                self._carried.popitem(last=False)
        return losses

    def _missing(self, stage: StageState, indices: Iterable[int]) -> list[PartitionKey]:
        """The input keys of these tasks that nobody holds, first-seen order, once each."""
        return self._partitions.missing(k for i in indices for k in stage.specs[i].inputs)

    def _enqueue(self, stage: StageState, index: int) -> None:
        """Make task ``index`` pending, in the queue its pin or preference says."""
        spec = stage.specs[index]
        stage.pending.add(index)
        if spec.worker is not None:
            heapq.heappush(stage.pinned.setdefault(spec.worker, []), index)
            return
        if stage.losses.get(index):
            stage.suspected.add(index)
            heapq.heappush(stage.suspects, index)  # runs alone (see _place_suspects)
            return
        heapq.heappush(stage.unpinned, index)
        held = self._partitions.held(spec.inputs)
        for worker, nbytes in spec.cached:  # its arena pages, cached there (by the directory)
            if worker in self._workers:
                held[worker] = held.get(worker, 0) + nbytes
        if held:
            worker = pick_worker(held, held)
            heapq.heappush(stage.preferred.setdefault(worker, []), index)
            stage.prefers[index] = (worker, held[worker])
            stage.waiting[worker] = stage.waiting.get(worker, 0) + 1

    def _requeue(self, stage: StageState) -> None:
        """Rebuild a stage's queues (after the registry changed under its preferences)."""
        stage.pinned, stage.preferred, stage.unpinned = {}, {}, []
        stage.suspected, stage.suspects = set(), []
        stage.prefers, stage.waiting = {}, {}
        for index in sorted(stage.pending):
            self._enqueue(stage, index)

    def _register(self, holder: int, sizes: dict[PartitionKey, int]) -> list[Instruction]:
        """Enter partitions held by ``holder``; copies displaced from other holders are dropped."""
        return [Drop(h, tuple(ks)) for h, ks in self._partitions.add(holder, sizes).items()]

    def _cancel(self, stage: StageState, attempt_ids: Iterable[int], stop: bool = False) -> list[Instruction]:
        """Stop these running attempts of ``stage``: one Cancel per worker (those placed
        in this same event were never sent: they just leave the batch)."""
        cancels = []
        for attempt_id in sorted(attempt_ids):
            worker = stage.running[attempt_id]
            self._forget(worker, attempt_id)
            if self._batch.get(worker, {}).pop(attempt_id, None) is None:
                cancels.append((worker, attempt_id))
        return [Cancel(w, tuple(ids), stop) for w, ids in group(cancels).items()]

    def _fail(self, stage: StageState, error: BaseException) -> list[Instruction]:
        """End a stage with ``error``: drop its pending tasks, stop its running attempts."""
        cancels = self._cancel(stage, list(stage.running), stop=True)
        stage.pending.clear()
        stage.suspected.clear()
        self._end(stage)
        return [StageFailed(stage.id, error), *cancels]

    def _done_if_complete(self, stage: StageState) -> list[Instruction]:
        """``[StageDone]`` (the stage ended) once every task has its result, else ``[]``."""
        if len(stage.results) < len(stage.specs):
            return []
        self._carried.pop(stage.key, None)  # it works: a rerun starts afresh
        self._end(stage)
        return [StageDone(stage.id, tuple(stage.results[i] for i in range(len(stage.specs))))]

    def _end(self, stage: StageState) -> None:
        """Forget an ended stage, the slow marks it set and the attempts taken back from it."""
        del self._stages[stage.id]
        for state in self._workers.values():
            if state.slow == stage.id:
                state.slow = None
        self._replaced = {a: e for a, e in self._replaced.items() if e[1].stage != stage.id}

    def _start(
        self, stage: StageState, index: int, worker: int, speculative: bool = False,
        rerun: bool = False,
    ) -> Attempt:  # fmt: skip
        """Batch a new attempt of ``index`` for ``worker`` (its inputs are all held)."""
        locations = {k: self._partitions.entries[k][0] for k in stage.specs[index].inputs}
        attempt = Attempt(
            self._next_attempt, stage.id, index, stage.specs[index], locations, speculative, rerun
        )
        self._next_attempt += 1
        self._attempts[attempt.id] = (worker, attempt)
        stage.running[attempt.id] = worker
        stage.copies.setdefault(index, []).append(attempt.id)
        state = self._workers[worker]
        state.running[attempt.id] = None
        self._set_head(state)
        self._batch.setdefault(worker, {})[attempt.id] = attempt
        return attempt

    def _launch(self, stage: StageState, out: list[Instruction], index: int, worker: int) -> bool:
        """Batch pending ``index`` for ``worker`` (``False``: an input is gone, failed)."""
        if any(key not in self._partitions for key in stage.specs[index].inputs):
            missing = self._missing(stage, sorted(stage.pending))  # ``index`` included
            out += self._fail(stage, MissingPartitionError(missing))
            return False
        stage.settle(index)
        rerun = index in stage.rerun
        if rerun:
            stage.rerun.discard(index)
            self.tasks_rerun += 1
        attempt = self._start(stage, index, worker, rerun=rerun)
        if stage.losses.get(index) and stage.specs[index].worker is None:
            self._workers[worker].isolated = attempt.id  # a suspect: nothing goes behind it
        return True

    def _stragglers(self, now: float, pending: bool) -> list[tuple[int, Attempt]]:
        """``(worker, head attempt)`` of the stragglers, longest running first (of stages
        with a baseline; ``pending=False``: of stages ready to speculate)."""
        thresholds = {
            st.id: self.policy.threshold(st.durations, st.silences)
            for st in self._stages.values()
            if self.policy.baseline(len(st.specs), len(st.results)) and (pending or not st.pending)
        }
        if not thresholds:
            return []
        stragglers = []
        for worker, state in self._workers.items():
            if state.head is None or state.since is None:
                continue
            attempt = self._attempts[state.head][1]
            threshold = thresholds.get(attempt.stage)
            if threshold is not None and now - state.since > threshold:
                stragglers.append((state.since, attempt.id, worker, attempt))
        return [(worker, attempt) for _, _, worker, attempt in sorted(stragglers)]

    def _replace(self, now: float) -> list[Instruction]:
        """Mark the workers of stragglers slow (but the last one not slow) and take the
        attempts queued behind the stragglers back: their tasks are pending again."""
        fast = sum(s.slow is None for s in self._workers.values())
        cancels = []
        for worker, head in self._stragglers(now, pending=True):
            state = self._workers[worker]
            if state.slow is not None:
                continue
            if fast <= 1:
                break
            state.slow, fast = head.stage, fast - 1
            for attempt_id in list(state.running)[1:]:
                attempt = self._attempts[attempt_id][1]
                if attempt.spec.worker is not None or attempt.id in self._batch.get(worker, {}):
                    continue  # pinned, or not sent yet
                if any(key not in self._partitions for key in attempt.spec.inputs):
                    continue  # it has what it needs where it is; placed again it would not
                self._forget(worker, attempt_id)
                self._replaced[attempt_id] = (worker, attempt)
                cancels.append((worker, attempt_id))
                stage = self._stages[attempt.stage]
                if attempt.index not in stage.copies:
                    self._enqueue(stage, attempt.index)
                    self.tasks_replaced += 1
        return [Cancel(w, tuple(ids)) for w, ids in group(cancels).items()]

    def _speculate(self, now: float) -> None:
        """Batch one copy of each straggler on an idle worker not marked slow, longest
        running first; idle workers take copies round-robin (when inputs do not decide)."""
        idle = {w for w, s in self._workers.items() if not s.running and s.slow is None}
        if not idle:
            return
        for _, attempt in self._stragglers(now, pending=False):
            stage = self._stages[attempt.stage]
            spec = attempt.spec
            if spec.worker is not None or attempt.index in stage.speculated or stage.losses.get(attempt.index):
                continue  # pinned, copied before, or a suspect (it may kill what it runs on)
            if any(key not in self._partitions for key in spec.inputs):
                continue  # the original has what it needs; a copy would not
            target = pick_worker(idle, self._partitions.held(spec.inputs), self._last_copy)
            idle.discard(target)
            self._last_copy = target
            stage.speculated.add(attempt.index)
            self._speculative.add(self._start(stage, attempt.index, target, True).id)
            self.tasks_speculated += 1
            if not idle:
                return

    def _refill(self, out: list[Instruction]) -> list[Instruction]:
        """Place pending tasks; append one Launch per worker."""
        self._place(out)
        return self._flush(out)

    def _cap(self, state: WorkerState, limit: int) -> int:
        """How many attempts this worker may hold (``limit``: :attr:`limit` now)."""
        return limit if state.slow is None else min(limit, self.policy.slow_limit)

    def _place(self, out: list[Instruction]) -> None:
        """Batch pending tasks for the workers with room, stage by stage in FIFO order."""
        placing = any(stage.pending for stage in self._stages.values())  # else: nothing to do
        while placing and self._workers:
            placing = False
            limit = self.limit
            room = {
                w: 0 if s.isolated is not None else self._cap(s, limit) - len(s.running)
                for w, s in sorted(self._workers.items())
            }
            for stage in list(self._stages.values()):
                if not any(r > 0 for r in room.values()):
                    break
                launch = functools.partial(self._launch, stage, out)
                worth = functools.partial(self._worth_moving, stage)
                if stage.suspects and not self._place_suspects(stage, room, launch):
                    placing = True
                    break
                if stage.pending and not place_stage(stage, room, launch, worth):
                    placing = True  # a stage failed and freed slots: place again
                    break

    def _place_suspects(self, stage: StageState, room: dict[int, int], launch) -> bool:
        """Give the stage's suspects (tasks whose worker was lost while they ran there, or
        may have been) each an idle worker to run on alone: lost again, it alone is charged
        (the first loss cannot tell the attempt a worker ran from those queued behind it,
        or those it finished unreported). ``False`` if a launch failed the stage."""
        idle = [w for w, r in room.items() if r > 0 and not self._workers[w].running]
        for worker in idle:
            index = pop_pending(stage.suspected, stage.suspects)
            if index is None:
                break
            if not launch(index, worker):
                return False
            room[worker] = 0
        return True

    def _worth_moving(self, stage: StageState, index: int, worker: int) -> bool:
        """Whether task ``index`` should run on ``worker`` rather than wait for the worker
        holding its input (:meth:`FetchCost.worth_moving`); yes if that one is lost or slow."""
        holder, nbytes = stage.prefers[index]
        there = self._workers.get(holder)
        if there is None or there.slow is not None:
            return True
        waiting = stage.waiting.get(holder, 0) + len(there.running)
        return self.fetch.worth_moving(stage.durations, waiting, len(self._workers[worker].running), nbytes)

    def _flush(self, out: list[Instruction]) -> list[Instruction]:
        """Append one Launch per worker for the attempts batched in this event."""
        for worker, attempts in sorted(self._batch.items()):
            if attempts:
                out.append(Launch(worker, tuple(attempts.values())))
        self._batch = {}
        return out
