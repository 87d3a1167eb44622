"""Pieces of the scheduler state machine (runtime/scheduling/scheduler.py), pure like it.

The instructions it returns and the results it takes (import them from
:mod:`clamor.runtime.scheduling.scheduler`), its records of workers and stages, the partition
registry (who holds what) and the speculation policy (when a stage has a
baseline, what running time makes an attempt a straggler, what a slow worker may
hold). No I/O and no clock here either.
"""

from __future__ import annotations

import bisect
import dataclasses
import heapq
import math
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from clamor.runtime.stage import DRIVER, PartitionKey, TaskSpec

# --- instructions (imported from clamor.runtime.scheduling.scheduler by its users) ---------


@dataclasses.dataclass(frozen=True)
class Attempt:
    """One try at task ``index`` of ``stage`` (``id``: unique for the state's life).

    ``locations``: the holder (worker id or :data:`DRIVER`) of each of ``spec.inputs``.
    ``speculative``: a copy of a straggling attempt still running elsewhere;
    ``rerun``: queued again because an earlier attempt was lost with its worker.
    """

    id: int
    stage: int
    index: int
    spec: TaskSpec
    locations: dict[PartitionKey, int]
    speculative: bool = False
    rerun: bool = False


@dataclasses.dataclass(frozen=True)
class Launch:
    """Send these attempts to ``worker`` (it runs them in order, one at a time)."""

    worker: int
    attempts: tuple[Attempt, ...]


@dataclasses.dataclass(frozen=True)
class Cancel:
    """Tell ``worker`` to abandon these attempt ids (their results will be ignored, but
    the first result of a task whose queued attempt was taken back from a slow worker).

    ``stop``: their stage is over (failed or cancelled): the one running is interrupted,
    and the worker is killed if it does not stop (it would hold up the next stage)."""

    worker: int
    attempts: tuple[int, ...]
    stop: bool = False


@dataclasses.dataclass(frozen=True)
class TaskResult:
    """What a finished attempt reports (``outputs``: partitions left on ``worker``: nbytes;
    ``kept``: what ``worker`` keeps only for the driver to read, e.g. a large reply)."""

    index: int
    worker: int
    attempt: int
    value: Any = None
    outputs: dict[PartitionKey, int] = dataclasses.field(default_factory=dict)
    accumulator_updates: dict = dataclasses.field(default_factory=dict)
    read_set: Sequence[tuple[int, int]] = ()  # a ReadSet (runtime/paging/read_sets.py)
    resident: bool = False  # read_set: the worker's resident pages, versions not read yet
    duration: float = 0.0
    kept: tuple[PartitionKey, ...] = ()


@dataclasses.dataclass(frozen=True)
class StageDone:
    """Every task of ``stage`` finished; ``results`` in index order."""

    stage: int
    results: tuple[TaskResult, ...]


@dataclasses.dataclass(frozen=True)
class TaskEnded:
    """A task of a *streaming* stage ended (its first result, or its error): the stage's
    caller may use it before the stage is done (futures)."""

    stage: int
    index: int
    result: TaskResult | None = None
    error: BaseException | None = None


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


Instruction = Launch | Cancel | TaskEnded | StageDone | StageFailed | Drop | PartitionsLost


# --- the policy and helpers ---------------------------------------------------

#: R3S's fetch-cost model (local memory << peer memory < disk), as what running a task
#: where its input already is saves, per byte: in the holder's memory, the whole fetch;
#: on the holder's disk, only the network hop, since the disk read is paid either way
#: (and costs more than a peer's memory).
LOCAL_WEIGHT = {"memory": 1.0, "disk": 0.5}
#: Bytes per second a partition moves from worker to worker, end to end (the bulk
#: channel, runtime/storage/bulk.py, on one host; gRPC streams in TLS clusters are slower):
#: what the model charges a task run away from its input.
FETCH_RATE = 600e6
#: The least a task is assumed to take in the fetch-cost model (a stage's median may be
#: ~0 for trivial tasks, which would make any fetch look too dear).
MIN_TASK_SECONDS = 1e-3
#: How many pending tasks one placement passes over looking for one worth moving.
MAX_SKIPS = 256


@dataclasses.dataclass(frozen=True)
class SpeculationPolicy:
    """When a running attempt is a straggler, and what is done about it.

    A stage has a *baseline* once at least ``quantile`` of its tasks (and at least
    one) have finished: their median duration is then a fair one (with a single
    result, one lucky fast task would make every other one look slow). It is *ready*
    (to speculate) once it also has no pending task. An attempt is a straggler once
    it has been running for longer than ``max(minimum, factor * median)``.

    A straggler's worker is *slow*: the attempts queued behind the straggler are
    placed again elsewhere and the worker holds at most ``slow_limit`` attempts until
    it finishes one within the threshold (or the stage that found it slow ends).

    The running time is the driver's view: since it last heard from the worker. So the
    threshold is also at least ``factor`` times the stage's usual *silence* (the
    ``silence_quantile`` of the waits between a busy worker's reports, once there are
    ``silence_samples``: a high quantile of fewer is about their maximum, which may be a
    straggler's own). Where workers outnumber cores, the OS leaves each one unscheduled
    for tens of ms, and every worker would look like a straggler of 1 ms tasks (copies
    of empty tasks would be launched for nothing).
    """

    enabled: bool = True
    factor: float = 2.0
    minimum: float = 0.05
    quantile: float = 0.25
    slow_limit: int = 1
    silence_quantile: float = 0.9
    silence_samples: int = 10

    def __post_init__(self) -> None:
        if (
            self.factor <= 0 or self.minimum < 0 or not 0 <= self.quantile <= 1
            or self.slow_limit < 1
        ):  # fmt: skip
            raise ValueError(
                f"speculation needs factor > 0, minimum >= 0, 0 <= quantile <= 1 and "
                f"slow_limit >= 1, not {self.factor}, {self.minimum}, {self.quantile}, "
                f"{self.slow_limit}"
            )

    def baseline(self, total: int, done: int) -> bool:
        """Whether a stage with these task counts can tell stragglers (and slow workers)."""
        return self.enabled and done >= max(1, math.ceil(self.quantile * total))

    def ready(self, total: int, done: int, pending: int) -> bool:
        """Whether a stage with these task counts may speculate."""
        return not pending and self.baseline(total, done)

    def threshold(self, durations: list[float], silences: list[float] = ()) -> float:
        """The running time (seconds) beyond which an attempt is a straggler (both lists
        sorted, ``durations`` not empty)."""
        usual = median(durations)
        if len(silences) >= self.silence_samples:
            usual = max(usual, silences[min(len(silences) - 1, int(self.silence_quantile * len(silences)))])
        return max(self.minimum, self.factor * usual)


@dataclasses.dataclass(frozen=True)
class FetchCost:
    """R3S's fetch-cost model for placement: moving a task away from the worker holding its
    input costs fetching ``nbytes`` at ``rate`` bytes per second.

    Before a stage has a baseline (no durations), tasks move freely (balance, as if all
    cost the same). Then a task moves while its wait at the holder (``waiting`` tasks
    there, queued and running, at the stage's median duration) exceeds running here
    (behind ``running_here`` attempts) plus the fetch."""

    rate: float = FETCH_RATE
    min_task: float = MIN_TASK_SECONDS

    def worth_moving(self, durations: list[float], waiting: int, running_here: int, nbytes: float) -> bool:
        if not durations:
            return True
        task = max(self.min_task, median(durations))
        return waiting * task > (running_here + 1) * task + nbytes / self.rate


class SortedSample(list):
    """A sorted sample of a stage's values (durations, silences) for their median and
    quantiles. Every value is kept up to :attr:`CAP`; past it, every other one kept is
    dropped and from then on only every other new one is taken (every 4th after the
    next halving, ...). So adding stays O(CAP) instead of O(results), which bisect.insort
    into all the results would cost. Deterministic, as the scheduler must be."""

    CAP = 4096

    def __init__(self) -> None:
        super().__init__()
        self._stride = 1
        self._seen = 0

    def add(self, value: float) -> None:
        self._seen += 1
        if self._seen % self._stride:
            return
        bisect.insort(self, value)
        if len(self) > self.CAP:
            del self[::2]
            self._stride *= 2


def median(values: list[float]) -> float:
    """The median of a non-empty, sorted list."""
    n = len(values)
    mid = n // 2
    return values[mid] if n % 2 else (values[mid - 1] + values[mid]) / 2


def pick_worker(candidates: Collection[int], held: dict[int, float], after: int | None = None) -> int:
    """The candidate holding the most input bytes (``held``); on ties the lowest id, or
    with ``after``, round-robin: the lowest id above ``after``, else the lowest."""
    if after is None:
        return min(candidates, key=lambda w: (-held.get(w, 0), w))
    return min(candidates, key=lambda w: (-held.get(w, 0), w <= after, w))


def pop_pending(pending: Collection[int], heap: list[int] | None, skip: Collection[int] = ()) -> int | None:
    """The lowest index of ``heap`` still in ``pending`` and not in ``skip`` (removed from
    the heap), or ``None``."""
    while heap:
        index = heapq.heappop(heap)
        if index in pending and index not in skip:
            return index
    return None


def place_stage(
    stage: StageState,
    room: dict[int, int],
    launch: Callable[[int, int], bool],
    worth_moving: Callable[[int, int], bool] | None = None,
) -> bool:
    """Give a stage's pending tasks to workers with room (``room[worker]`` is taken down):
    ``launch(index, worker)`` each; ``False`` if one said the stage failed (no more then).

    Pinned tasks first, then tasks go to their preferred worker, then any other
    unpinned task goes to the worker with the most room left (lowest id on ties),
    but a task preferring another worker only if ``worth_moving(index, worker)``
    (R3S's fetch cost against its wait there; at most :data:`MAX_SKIPS` passed over).
    """
    for queues in (stage.pinned, stage.preferred):
        for worker, queue in sorted(queues.items()):
            while room.get(worker, 0) > 0:
                index = pop_pending(stage.pending, queue, stage.suspected)
                if index is None:
                    break
                if not launch(index, worker):
                    return False
                room[worker] -= 1
    free = [(-r, w) for w, r in room.items() if r > 0]
    heapq.heapify(free)
    skipped: list[int] = []
    try:
        while free:
            _, worker = heapq.heappop(free)
            index = None
            while len(skipped) < MAX_SKIPS:
                index = pop_pending(stage.pending, stage.unpinned, stage.suspected)
                holder = stage.prefers.get(index, (worker,))[0] if index is not None else worker
                if holder == worker or worth_moving is None or worth_moving(index, worker):
                    break
                skipped.append(index)
                index = None
            if index is None:
                continue  # nothing worth moving here: it waits for the next event
            if not launch(index, worker):
                return False
            room[worker] -= 1
            if room[worker] > 0:
                heapq.heappush(free, (-room[worker], worker))
        return True
    finally:
        for index in skipped:
            heapq.heappush(stage.unpinned, index)


def group(pairs: Iterable[tuple[int, Any]]) -> dict[int, list[Any]]:
    """``[(worker, item), ...]`` -> ``{worker: [item, ...]}``, workers sorted."""
    groups: dict[int, list[Any]] = {}
    for worker, item in pairs:
        groups.setdefault(worker, []).append(item)
    return dict(sorted(groups.items()))


class Registry:
    """The partitions kept by live workers and the driver: ``key -> (holder, nbytes)``."""

    def __init__(self) -> None:
        self.entries: dict[PartitionKey, tuple[int, int]] = {}
        #: Keys kept outside their holder's memory: ``key -> tier`` (absent: memory).
        self.tiers: dict[PartitionKey, str] = {}

    def __contains__(self, key: PartitionKey) -> bool:
        return key in self.entries

    def holder(self, key: PartitionKey) -> int | None:
        """The holder of ``key``; ``None`` if nobody holds it."""
        entry = self.entries.get(key)
        return None if entry is None else entry[0]

    def missing(self, keys: Iterable[PartitionKey]) -> list[PartitionKey]:
        """The keys nobody holds, first-seen order, once each."""
        return list(dict.fromkeys(k for k in keys if k not in self.entries))

    def held(self, keys: Iterable[PartitionKey]) -> dict[int, float]:
        """Worker -> what running there saves in fetching these partitions (the DRIVER is
        no worker): their bytes, weighted by :data:`LOCAL_WEIGHT` of the tier they are in."""
        held: dict[int, float] = {}
        for key in keys:
            entry = self.entries.get(key)
            if entry is not None and entry[0] != DRIVER:
                weight = LOCAL_WEIGHT[self.tiers.get(key, "memory")]
                held[entry[0]] = held.get(entry[0], 0) + entry[1] * weight
        return held

    def bytes_by_holder(self, tier: str = "memory") -> dict[int, int]:
        """Worker -> bytes of the partitions it keeps in ``tier`` (``"memory"`` or ``"disk"``)."""
        used: dict[int, int] = {}
        for key, (holder, nbytes) in self.entries.items():
            if holder != DRIVER and self.tiers.get(key, "memory") == tier:
                used[holder] = used.get(holder, 0) + nbytes
        return used

    def placement(self) -> dict[PartitionKey, tuple[int, str, int]]:
        """``key -> (holder, tier, nbytes)``; tier ``"memory"`` or ``"disk"``."""
        return {k: (h, self.tiers.get(k, "memory"), n) for k, (h, n) in self.entries.items()}

    def move(self, moves: dict[PartitionKey, tuple[int, str, int]], live: Collection[int]) -> list[PartitionKey]:
        """Spills: ``key -> (holder, tier, nbytes)``, to a peer (``holder`` that worker, tier
        ``"memory"``) or to the holder's own disk (``"disk"``). Keys no longer here (dropped
        meanwhile) are ignored; keys moved to a worker not ``live`` are forgotten and
        returned (lost)."""
        lost = []
        for key, (holder, tier, nbytes) in moves.items():
            if key not in self.entries:
                continue
            if holder not in live:
                self.remove([key])
                lost.append(key)
                continue
            self.entries[key] = (holder, nbytes)
            if tier == "memory":
                self.tiers.pop(key, None)
            else:
                self.tiers[key] = tier
        return lost

    def add(self, holder: int, sizes: dict[PartitionKey, int]) -> dict[int, list[PartitionKey]]:
        """Enter partitions kept by ``holder``; the copies displaced from other holders."""
        displaced = []
        for key, nbytes in sizes.items():
            old = self.entries.get(key)
            if old is not None and old[0] != holder:
                displaced.append((old[0], key))
            self.entries[key] = (holder, nbytes)
            self.tiers.pop(key, None)
        return group(displaced)

    def remove(self, keys: Iterable[PartitionKey]) -> dict[int, list[PartitionKey]]:
        """Forget these keys (unknown ones are ignored): ``holder -> keys`` forgotten."""
        keys = list(keys)
        for key in keys:
            self.tiers.pop(key, None)
        entries = ((self.entries.pop(key, None), key) for key in keys)
        return group((entry[0], key) for entry, key in entries if entry is not None)

    def lose(self, worker: int) -> list[PartitionKey]:
        """Forget every partition ``worker`` held; those keys."""
        keys = [key for key, (holder, _) in self.entries.items() if holder == worker]
        for key in keys:
            del self.entries[key]
            self.tiers.pop(key, None)
        return keys


# --- the state's records -----------------------------------------------------


@dataclasses.dataclass(eq=False)
class WorkerState:
    """A live worker: its running (launched, unfinished) attempt ids, in launch order.

    It runs them one at a time in that order: ``head`` (the first) since ``since``
    (``None``: not known yet). ``slow``: the id of the stage whose straggler marked
    the worker slow (``None``: not slow).
    """

    running: dict[int, None] = dataclasses.field(default_factory=dict)
    head: int | None = None
    since: float | None = None
    tasks_done: int = 0
    slow: int | None = None
    #: the attempt of a suspect task it runs alone (nothing is queued behind it)
    isolated: int | None = None


@dataclasses.dataclass(eq=False)
class StageState:
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
    #: unpinned pending index -> (the worker it prefers, its input bytes held there).
    prefers: dict[int, tuple[int, float]] = dataclasses.field(default_factory=dict)
    #: worker -> how many pending indices prefer it (their wait there).
    waiting: dict[int, int] = dataclasses.field(default_factory=dict)

    def settle(self, index: int) -> None:
        """``index`` leaves the pending tasks: it no longer waits for its preferred worker."""
        self.pending.discard(index)
        self.suspected.discard(index)
        preferred = self.prefers.pop(index, None)
        if preferred is not None:
            self.waiting[preferred[0]] -= 1
    #: running attempt id -> worker.
    running: dict[int, int] = dataclasses.field(default_factory=dict)
    #: index -> its running attempt ids (two while a speculative copy runs).
    copies: dict[int, list[int]] = dataclasses.field(default_factory=dict)
    results: dict[int, TaskResult] = dataclasses.field(default_factory=dict)
    #: the results' durations, a sorted sample (the speculation baseline).
    durations: SortedSample = dataclasses.field(default_factory=SortedSample)
    #: how long the driver waited for each report of a busy worker, a sorted sample (ditto).
    silences: SortedSample = dataclasses.field(default_factory=SortedSample)
    #: indices that got their one speculative copy.
    speculated: set[int] = dataclasses.field(default_factory=set)
    #: index -> how many times its worker was lost while it ran there (or may have: see
    #: ``SchedulerState.worker_lost``); carried over from earlier stages of the same ``key``.
    losses: dict[int, int] = dataclasses.field(default_factory=dict)
    #: the pending indices with losses (suspects), and a heap of them: each runs alone on
    #: an idle worker (a heap of the other queues may hold one of them still: skipped).
    suspected: set[int] = dataclasses.field(default_factory=set)
    suspects: list[int] = dataclasses.field(default_factory=list)
    #: the program's identity across stages (a rerun of a failed stage has the same).
    key: Any = None
    #: each task's end is told (TaskEnded), and a task's error ends that task alone
    streaming: bool = False
    #: pending indices queued again after a loss (counted in ``tasks_rerun`` at launch).
    rerun: set[int] = dataclasses.field(default_factory=set)
