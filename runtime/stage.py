"""What a stage is, shared by the datasets, the scheduler and the workers.

A *stage* is one ``program`` run once per :class:`TaskSpec`, on
workers, between two barriers. The dataset layer (runtime/data/dataset.py) builds
stages; the scheduler state machine (runtime/scheduling/scheduler.py) places their tasks;
the executor (runtime/scheduling/executor.py) runs them on worker processes::

    stage = StageSpec(program, [TaskSpec(0, inputs=(k0,)), TaskSpec(1, inputs=(k1,))])
    values = cluster.execute(stage)       # one value per task, in index order

On the worker, ``program(ctx)`` gets a :class:`TaskContext`: its task's
``index``, its ``inputs`` (partitions fetched from this worker's store, a peer
or the driver, on first use) and ``put`` to keep more partitions here. The
returned value is kept under ``TaskSpec.output`` (if set) and sent back to
the driver (if ``TaskSpec.reply``).

Partitions are named by :data:`PartitionKey`: any small hashable, picklable
tuple, e.g. ``("ds", 7, 3)`` for partition 3 of dataset 7.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, Protocol

#: Names a partition held by a worker (or by the driver, see :data:`DRIVER`).
PartitionKey = Hashable

#: The holder id of partitions kept by the driver (fetched by workers through
#: the Scheduler's ``FetchPartition``), e.g. the data given to ``parallelize``.
DRIVER = -1


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a stage.

    ``index``: its position in the stage (results come back in index order, and
    ``(stage, index)`` is the task's logical id: accumulator updates merge once
    per logical id, whatever the retries). ``inputs``: the partitions it reads,
    which the scheduler locates (and prefers to run the task where they are).
    ``output``: keep the result on the worker under this key. ``reply``: send
    the result to the driver. ``worker``: run on this worker only. ``reads``: arena
    byte ranges ``(offset, nbytes)`` it is known to read (e.g. its slice of an arena
    array); the executor fills ``cached`` from the driver's directory (``(worker,
    bytes of them it caches)``) and the scheduler prefers those workers too.
    ``payload``: the task's own bytes (a :meth:`Cluster.run_stage` call), sent with its
    assignment only, so that a worker receives the calls it runs, not the whole stage's;
    the program reads it as ``ctx.payload``.
    """

    index: int
    inputs: tuple[PartitionKey, ...] = ()
    output: PartitionKey | None = None
    reply: bool = True
    worker: int | None = None
    reads: tuple[tuple[int, int], ...] = ()
    cached: tuple[tuple[int, int], ...] = ()
    payload: bytes = b""

    def __init__(
        self,
        index: int,
        inputs: tuple[PartitionKey, ...] = (),
        output: PartitionKey | None = None,
        reply: bool = True,
        worker: int | None = None,
        reads: tuple[tuple[int, int], ...] = (),
        cached: tuple[tuple[int, int], ...] = (),
        payload: bytes = b"",
    ) -> None:
        # The generated __init__ of a frozen dataclass sets each field through
        # object.__setattr__: 1.8 us a task, a third of a tiny fused task's whole cost.
        self.__dict__.update(index=index, inputs=inputs, output=output, reply=reply, worker=worker,
                             reads=reads, cached=cached, payload=payload)  # fmt: skip


@dataclasses.dataclass
class StageSpec:
    """A stage: ``program(ctx)`` once per task. ``epoch``: replay at an older arena epoch;
    ``recompute``: it rebuilds lost partitions from lineage (the timeline marks it);
    ``keeps_lineage``: its runner records lineage of its outputs after it returns (so
    their epoch stays readable)."""

    program: Callable[[TaskContext], Any]
    tasks: list[TaskSpec]
    epoch: int | None = None
    name: str = ""
    recompute: bool = False
    keeps_lineage: bool = False


class TaskContext:
    """The running task, as its program sees it (on a worker, or in-process for tests).

    ``fetch(key)`` is how the executor gets an input partition; ``store(key,
    value)`` keeps a partition on this worker.
    """

    def __init__(
        self,
        index: int,
        inputs: tuple[PartitionKey, ...],
        fetch: Callable[[PartitionKey], Any],
        store: Callable[[PartitionKey, Any], int],
        payload: bytes = b"",
    ) -> None:
        self.index = index
        #: The task's own bytes (:attr:`TaskSpec.payload`).
        self.payload = payload
        self.input_keys = inputs
        self._fetch = fetch
        self._store = store
        #: Partitions kept by :meth:`put`: ``key -> size in bytes`` (reported to the driver).
        self.outputs: dict[PartitionKey, int] = {}
        #: Accumulator updates: ``accumulator id -> [(index, values), ...]``.
        self.accumulator_updates: dict[int, list[tuple[Any, Any]]] = {}

    def input(self, key: PartitionKey) -> Any:
        """The value of input partition ``key`` (must be one of ``input_keys``)."""
        if key not in self.input_keys:
            raise KeyError(f"partition {key!r} is not an input of this task")
        return self._fetch(key)

    def inputs(self) -> list[Any]:
        """The values of all input partitions, in ``input_keys`` order."""
        return [self._fetch(k) for k in self.input_keys]

    def put(self, key: PartitionKey, value: Any) -> None:
        """Keep ``value`` as partition ``key`` on this worker (e.g. a shuffle bucket)."""
        self.outputs[key] = self._store(key, value)

    def accumulate(self, accumulator_id: int, index: Any, values: Any) -> None:
        """Record an accumulator update; merged in the driver at the stage's barrier."""
        self.accumulator_updates.setdefault(accumulator_id, []).append((index, values))


_current: contextvars.ContextVar[TaskContext | None] = contextvars.ContextVar(
    "clamor_task", default=None
)


def current_task() -> TaskContext | None:
    """The task running in this thread, or ``None`` outside tasks."""
    return _current.get()


def run_program(program: Callable[[TaskContext], Any], ctx: TaskContext) -> Any:
    """Run ``program(ctx)`` with ``ctx`` as the current task."""
    token = _current.set(ctx)
    try:
        return program(ctx)
    finally:
        _current.reset(token)


def run_fused(program: Callable[[TaskContext], Any], ctx: TaskContext, count: int,
              payloads: Sequence[bytes] = ()) -> list[Any]:  # fmt: skip
    """Run ``program`` for ``count`` consecutive tasks from ``ctx.index`` (a fused attempt),
    their values in order. The tasks share ``ctx``, its index (and payload) moving along:
    their outputs and accumulator updates gather in it in task order, as the attempt
    reports them anyway, and a task that raises leaves ``ctx.index`` at its own. A context
    and a context-variable switch a task cost tiny tasks a fifth of their time."""
    token = _current.set(ctx)
    values = []
    try:
        for offset, index in enumerate(range(ctx.index, ctx.index + count)):
            ctx.index = index
            if payloads:
                ctx.payload = payloads[offset]
            values.append(program(ctx))
    finally:
        _current.reset(token)
    return values


class StageRunner(Protocol):
    """What the dataset layer needs from a cluster (``Cluster``; ``InlineRunner`` in tests).

    ``execute`` runs a stage to its barrier and returns the ``reply`` values in task
    index order (``None`` for tasks with ``reply=False``); it merges the tasks'
    accumulator updates once per task index (:func:`clamor.runtime.data.accumulators.merge`)
    and raises the first task error (same exception type, remote traceback attached),
    :class:`~clamor.runtime.errors.WorkerLostError`, or
    :class:`~clamor.runtime.errors.MissingPartitionError` for an input nobody holds.
    """

    def execute(self, stage: StageSpec) -> list[Any]: ...

    def fetch(self, key: PartitionKey) -> Any:
        """The value of a partition, brought to the driver (in chunks)."""
        ...

    def put(self, key: PartitionKey, value: Any) -> None:
        """Keep ``value`` in the driver as partition ``key`` (holder :data:`DRIVER`)."""
        ...

    def drop(self, keys: Iterable[PartitionKey]) -> None:
        """Forget partitions wherever they are held (unknown keys are ignored)."""
        ...

    def holder(self, key: PartitionKey) -> int | None:
        """The worker (or :data:`DRIVER`) holding ``key``; ``None`` if nobody does."""
        ...

    @property
    def workers(self) -> list[int]:
        """Ids of the live workers."""
        ...

    #: The arena epoch the last successful stage read (its own, or the replayed one).
    last_epoch: int
    #: Per task of the last successful stage, in index order: its ``(page, version)`` read set
    #: (a sequence of pairs sorted by page; a ReadSet on a cluster).
    last_read_sets: list[Sequence[tuple[int, int]]]
