"""What the driver saw happen: task attempts, stages and cluster events.

The executor reports here as it launches attempts and receives their reports;
:class:`Telemetry` keeps bounded logs of them (the newest ``max_tasks`` attempts,
``max_events`` events) that snapshots copy for the views. Times are wall-clock
seconds (``time.time()``). A worker runs its attempts one at a time in launch
order, so the attempt at the head of its queue is the one running; it started
when it got there (its launch, or the end of the one before it). A finished
attempt's start is its end minus the duration the worker measured.

Nothing here imports UI code; nothing here does I/O. Thread-safe.
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from typing import Any

#: Attempt statuses: still running or queued, finished well, raised, lost with its
#: worker, or cancelled (a speculation race lost, or its stage failed).
RUNNING, OK, FAILED, LOST, CANCELLED = "running", "ok", "failed", "lost", "cancelled"


@dataclasses.dataclass(frozen=True)
class TaskRecord:
    """One attempt of task ``index`` of stage ``stage`` on ``worker``.

    ``end`` is ``None`` while it runs. ``speculative``: a copy of a straggler;
    ``rerun``: queued again after a lost worker; ``recompute``: its stage rebuilt
    lost partitions from lineage.
    """

    attempt: int
    stage: int
    name: str
    index: int
    worker: int
    start: float
    end: float | None
    status: str
    speculative: bool = False
    rerun: bool = False
    recompute: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Event:
    """Something the views mark: ``kind`` is ``worker_added``, ``worker_lost``,
    ``stage_failed``, ``speculation`` or ``recompute``."""

    time: float
    kind: str
    detail: str = ""
    worker: int | None = None
    stage: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class _Open:
    """An attempt launched and not reported yet."""

    attempt: int
    stage: int
    name: str
    index: int
    worker: int
    launched: float
    speculative: bool
    rerun: bool
    recompute: bool
    cancelled: bool = False

    def record(self, start: float, end: float | None, status: str) -> TaskRecord:
        return TaskRecord(self.attempt, self.stage, self.name, self.index, self.worker, start,
                          end, status, self.speculative, self.rerun, self.recompute)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class StageRecord:
    """A stage: ``end`` is ``None`` while it runs; ``status`` ``running``/``ok``/``failed``."""

    stage: int
    name: str
    tasks: int
    epoch: int
    start: float
    end: float | None
    status: str
    recompute: bool = False


class Telemetry:
    """Bounded logs of attempts, stages and events, fed by the executor."""

    def __init__(self, max_tasks: int = 5000, max_events: int = 500, max_stages: int = 500) -> None:
        self._lock = threading.Lock()
        self._open: dict[int, _Open] = {}
        self._queues: dict[int, OrderedDict[int, None]] = {}  # worker -> open attempts, in order
        self._idle_since: dict[int, float] = {}  # worker -> end of its last attempt
        self._done: deque[TaskRecord | tuple[_Open, float, float, str]] = deque(maxlen=max_tasks)
        self._events: deque[Event] = deque(maxlen=max_events)
        self._stages: OrderedDict[int, StageRecord] = OrderedDict()
        self._max_stages = max_stages
        #: Bumped on every change: a snapshot with the same ``version`` is the same.
        self.version = 0

    # --- fed by the executor ---

    def stage_started(self, stage: int, name: str, tasks: int, epoch: int, recompute: bool) -> None:
        with self._lock:
            self._stages[stage] = StageRecord(stage, name, tasks, epoch, time.time(), None,
                                              RUNNING, recompute)  # fmt: skip
            while len(self._stages) > self._max_stages:
                self._stages.popitem(last=False)
            self.version += 1

    def stage_ended(self, stage: int, error: BaseException | None = None) -> None:
        """The stage's barrier (or its failure): its queued attempts will not run."""
        now = time.time()
        with self._lock:
            rec = self._stages.get(stage)
            if rec is not None:
                status = OK if error is None else FAILED
                self._stages[stage] = dataclasses.replace(rec, end=now, status=status)
            if error is not None:
                self._events.append(Event(now, "stage_failed", f"{type(error).__name__}: {error}",
                                          stage=stage))  # fmt: skip
            for queue in self._queues.values():
                head = next(iter(queue), None)
                for attempt in [a for a in queue if a != head and self._open[a].stage == stage]:
                    self._close(attempt, None)
            self.version += 1

    def launched(
        self, worker: int, attempts: Iterable[Any], name: str, recompute: bool
    ) -> None:
        """``attempts`` (scheduler ``Attempt``s) were sent to ``worker``."""
        now = time.time()
        with self._lock:
            queue = self._queues.setdefault(worker, OrderedDict())
            if not queue:
                self._idle_since[worker] = now
            for a in attempts:
                self._open[a.id] = _Open(a.id, a.stage, name, a.index, worker, now,
                                         a.speculative, a.rerun, recompute)  # fmt: skip
                queue[a.id] = None
                if a.speculative:
                    self._events.append(Event(now, "speculation", f"copy of task {a.index}",
                                              worker=worker, stage=a.stage))  # fmt: skip
            self.version += 1

    def finished(self, attempt: int, ok: bool, duration: float) -> None:
        """The worker reported ``attempt`` (``duration``: seconds its program ran)."""
        self.finished_many([(attempt, ok, duration)])

    def finished_many(self, reports: Iterable[tuple[int, bool, float]]) -> None:
        """:meth:`finished` for each ``(attempt, ok, duration)`` reported together."""
        now = time.time()
        with self._lock:
            for attempt, ok, duration in reports:
                self._finished(attempt, ok, duration, now)
            self.version += 1

    def _finished(self, attempt: int, ok: bool, duration: float, now: float) -> None:
        entry = self._open.get(attempt)
        if entry is not None:
            queue = self._queues.get(entry.worker)
            if queue and next(iter(queue)) != attempt:
                # Launched before it and still open (the queue is in launch order): one
                # whose Cancel overtook its Launch never ran.
                for a in list(itertools.takewhile(lambda a: a < attempt, queue)):
                    if self._open[a].cancelled:
                        self._close(a, None)
            status = CANCELLED if entry.cancelled else OK if ok else FAILED
            start = max(entry.launched, now - max(0.0, duration))
            self._close(attempt, (entry, start, now, status))  # a TaskRecord when read

    def cancelled(self, attempts: Iterable[int]) -> None:
        """A Cancel went out: a queued attempt never runs; a running one reports as cancelled."""
        with self._lock:
            for attempt in attempts:
                entry = self._open.get(attempt)
                if entry is None:
                    continue
                if next(iter(self._queues[entry.worker])) == attempt:
                    entry.cancelled = True
                else:
                    self._close(attempt, None)
            self.version += 1

    def worker_added(self, worker: int) -> None:
        self.event("worker_added", f"worker {worker} joined", worker=worker)

    def worker_lost(self, worker: int, reason: str) -> None:
        """The worker is gone: its running attempt is lost, its queue dropped."""
        now = time.time()
        with self._lock:
            queue = self._queues.pop(worker, OrderedDict())
            for i, attempt in enumerate(list(queue)):
                entry = self._open[attempt]
                start = max(entry.launched, self._idle_since.get(worker, entry.launched))
                self._close(attempt, (entry, start, now, LOST) if i == 0 else None)
            self._events.append(Event(now, "worker_lost", reason, worker=worker))
            self.version += 1

    def event(self, kind: str, detail: str = "", worker: int | None = None,
              stage: int | None = None, at: float | None = None) -> None:  # fmt: skip
        with self._lock:
            self._events.append(Event(time.time() if at is None else at, kind, detail, worker, stage))
            self.version += 1

    def _close(self, attempt: int, record: tuple[_Open, float, float, str] | None) -> None:
        """``attempt`` is no longer open; ``record``: ``(entry, start, end, status)`` of
        its :class:`TaskRecord` (built when read: most are never read), or ``None``."""
        entry = self._open.pop(attempt)
        queue = self._queues.get(entry.worker)
        if queue is not None:
            was_head = next(iter(queue), None) == attempt
            queue.pop(attempt, None)
            if was_head and record is not None:
                self._idle_since[entry.worker] = record[2]
        if record is not None:
            self._done.append(record)

    # --- read by snapshots ---

    @property
    def active(self) -> int:
        """How many stages are running."""
        with self._lock:
            return sum(1 for s in self._stages.values() if s.status == RUNNING)

    def tasks(self) -> list[TaskRecord]:
        """Finished attempts (oldest first), then the running head of each worker's queue."""
        now = time.time()
        with self._lock:
            out = [r if isinstance(r, TaskRecord) else r[0].record(*r[1:]) for r in self._done]
            self._done.clear()  # built once: kept as records
            self._done.extend(out)
            for worker, queue in self._queues.items():
                head = next(iter(queue), None)
                if head is not None:
                    entry = self._open[head]
                    start = max(entry.launched, self._idle_since.get(worker, entry.launched))
                    out.append(entry.record(min(start, now), None, RUNNING))
        return out

    def events(self) -> list[Event]:
        with self._lock:
            return list(self._events)

    def stages(self) -> list[StageRecord]:
        with self._lock:
            return list(self._stages.values())
