"""Page-versioned lineage of materialised partitions, and their recovery.

Every task that leaves partitions on a worker (persisted dataset partitions,
shuffle buckets, partial aggregates) is remembered as a :class:`TaskRun`: its
stage program *as pickled when it ran* (so later changes to heap objects do not
leak in), its task index and input keys, the arena epoch it read and its
``(page, version)`` read set. Each partition it made gets a :class:`Record`
(the fused op chain, the dataset and index it belongs to). A run links to the
runs that produced its inputs, so a partition computed after a shuffle whose
buckets are long gone can still be rebuilt.

Each stage runner (a ``Cluster``, an ``InlineRunner``) owns one :class:`LineageStore`,
``runner.lineage``: its records, the persisted datasets' kept partitions, its recent
actions, its checkpoint floor, its recovery counters and events. Epochs are numbered
per runner, so nothing here is shared between runners.

:func:`recover` recomputes exactly the lost partitions: it walks back to runs
whose inputs are still held, then runs them again, one stage per epoch, with
``StageSpec(epoch=e)``: each task reads the arena *as it was at epoch e*, from
the driver's version log, so a persisted dataset stays the snapshot it was even
after the driver updated the arena in place. Recomputation tasks keep only the
partitions that were lost and discard their accumulator updates (the original
run already counted them).

The version log only needs what live lineage needs:
:meth:`LineageStore.oldest_needed_epoch`, which the runner's version keeper
(runtime/paging/versions.py) reads. After a checkpoint at epoch ``E`` (which preserves
the arena as of ``E``), :meth:`LineageStore.truncate` lets older versions go; a
partition computed before ``E`` is then recomputed at ``E``, which is exact unless the
driver changed a page it read between its epoch and ``E``. Recovery compares the read
sets and logs a warning (and counts ``read_set_mismatches``) when a page version differs.

The graph of a dataset, which the widgets draw, is built in ``lineage_graph.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

from clamor.runtime.data.ops import RecomputeTask, Redo
from clamor.runtime.errors import MissingPartitionError, NoWorkersError
from clamor.runtime.paging.read_sets import ReadSet
from clamor.runtime.stage import DRIVER, PartitionKey, StageRunner, StageSpec, TaskSpec

logger = logging.getLogger("clamor.lineage")

#: The live graph also shows the datasets of each runner's last actions, this many.
RECENT_ACTIONS = 2


class UnrecoverableError(MissingPartitionError):
    """Lost partitions that no lineage can rebuild (e.g. data put by the driver)."""


@dataclasses.dataclass(eq=False)
class TaskRun:
    """One task that left partitions on a worker: enough to run it again.

    ``payload``: the stage program as pickled for the original run (shared by the
    stage's tasks); ``index``, ``inputs``, ``output``: its :class:`TaskSpec`;
    ``epoch``: the arena epoch it read; ``read_set``: the ``(page, version)``
    pairs it read (a :class:`~clamor.runtime.paging.read_sets.ReadSet`; empty
    in-process); ``parents``: the runs that produced those of its inputs that have
    lineage; ``recomputed``: how often it ran again.
    """

    stage: str
    payload: bytes
    index: int
    inputs: tuple[PartitionKey, ...]
    output: PartitionKey | None
    epoch: int
    read_set: Sequence[tuple[int, int]]
    parents: dict[PartitionKey, TaskRun]
    recomputed: int = 0
    #: The keys it made (their records may be forgotten since).
    made: list[PartitionKey] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(eq=False)
class Record:
    """A live partition made by ``run``: its fused ``ops``, and for a dataset partition
    its ``dataset`` (plan node id) and ``index``; ``recomputed``: rebuilt after a loss."""

    key: PartitionKey
    run: TaskRun
    ops: tuple[str, ...]
    dataset: int | None = None
    index: int | None = None
    recomputed: bool = False


@dataclasses.dataclass
class Counters:
    """What recovery did on one runner."""

    tasks_recomputed: int = 0
    partitions_recomputed: int = 0
    recoveries: int = 0
    read_set_mismatches: int = 0


class LineageStore:
    """The lineage of one runner's partitions (see the module docstring)."""

    def __init__(self) -> None:
        self._records: dict[PartitionKey, Record] = {}
        #: Persisted plan nodes: node id -> the partitions computed and kept by workers as
        #: ``("ds", id, i)`` (one lost with its worker stays listed: lineage rebuilds it).
        self.persisted: dict[int, set[int]] = {}
        #: The last actions, newest last: ``[graph of the action's dataset, running]``.
        self.actions: deque[list] = deque(maxlen=RECENT_ACTIONS)
        #: Epochs at or below it were checkpointed (:meth:`truncate`).
        self.floor = 0
        self.counters = Counters()
        #: Recent recoveries, newest last, for timelines: plain dicts (see :func:`recover`).
        self.events: deque[dict] = deque(maxlen=256)
        #: Bumped whenever a record is added or forgotten (views redraw the graph then).
        self.generation = 0
        self._oldest: tuple[int, int | None] | None = None  # (generation, oldest needed epoch)

    def _changed(self) -> None:
        self.generation += 1

    def record(self, key: PartitionKey, run: TaskRun, ops: Sequence[str], dataset: int | None = None,
               index: int | None = None) -> Record:  # fmt: skip
        """Remember that ``run`` made partition ``key`` (replacing an older record)."""
        rec = Record(key, run, tuple(ops), dataset, index)
        self._records[key] = rec
        if key not in run.made:
            run.made.append(key)
        self._changed()
        return rec

    def get(self, key: PartitionKey) -> Record | None:
        """The record of a live partition, or ``None``."""
        return self._records.get(key)

    def records(self) -> list[Record]:
        """Every live record (a copy: finalizers may forget some meanwhile)."""
        return list(self._records.values())

    def producer(self, key: PartitionKey) -> TaskRun | None:
        """The run that made live partition ``key``, or ``None`` if it has no lineage."""
        rec = self._records.get(key)
        return None if rec is None else rec.run

    def forget(self, keys: Iterable[PartitionKey]) -> None:
        """Forget the records of partitions that are released (runs that later partitions
        were computed from stay reachable from those partitions' records)."""
        for key in keys:
            if self._records.pop(key, None) is not None:
                self._changed()

    def unpersist(self, node_id: int, keys: Iterable[PartitionKey]) -> None:
        """A persisted node is released: it keeps nothing, and its partitions' records go."""
        self.persisted.pop(node_id, None)
        self.forget(keys)

    @contextlib.contextmanager
    def acting(self, graph: Callable[[Any], Any]) -> Iterator[None]:
        """While an action runs: ``graph(runner)`` is its dataset's lineage graph, which the
        live graph draws, as computing, then as one of the last actions."""
        entry: list = [graph, True]
        self.actions.append(entry)
        self._changed()
        try:
            yield
        finally:
            entry[1] = False
            self._changed()

    # --- the version floor ---

    def effective_epoch(self, run: TaskRun) -> int:
        """The epoch a recomputation of ``run`` reads: its own, or the checkpoint's if later."""
        return max(run.epoch, self.floor)

    def oldest_needed_epoch(self) -> int | None:
        """The smallest epoch that recomputing a live partition, or the partitions its
        lineage goes back to, would read; ``None`` if none.

        The driver may drop a page version ``v`` once a newer version ``v' <= floor``
        exists: every recomputation reads ``latest version <= its epoch``, with its epoch
        at least the floor. Releasing datasets (unpersist, garbage collection) and
        :meth:`truncate` raise it.
        """
        if self._oldest is not None and self._oldest[0] == self.generation:
            return self._oldest[1]
        oldest: int | None = None
        seen: set[int] = set()
        stack = [rec.run for rec in self.records()]
        while stack:
            run = stack.pop()
            if id(run) in seen:
                continue
            seen.add(id(run))
            epoch = self.effective_epoch(run)
            oldest = epoch if oldest is None else min(oldest, epoch)
            stack.extend(run.parents.values())
        self._oldest = (self.generation, oldest)
        return oldest

    def truncate(self, epoch: int) -> None:
        """After a checkpoint of the arena at ``epoch``: partitions computed at or before it
        no longer need older page versions.

        If lost, they are recomputed at ``epoch``: the same result unless the driver
        changed a page they read in between (recovery then logs a warning and counts a
        ``read_set_mismatch``).
        """
        self.floor = max(self.floor, epoch)
        self._changed()

    def recovery_counters(self) -> dict[str, int]:
        """``tasks_recomputed``, ``partitions_recomputed``, ``recoveries`` and
        ``read_set_mismatches``."""
        return dataclasses.asdict(self.counters)


class LineageView(Protocol):
    """What reading a runner's lineage needs: its store, its live workers, who holds a
    partition (a runner, or the cluster's inspector, which the views read)."""

    lineage: LineageStore

    @property
    def workers(self) -> list[int]: ...

    def holder(self, key: PartitionKey) -> int | None: ...


class LineageRunner(StageRunner, Protocol):
    """A stage runner with its lineage (``Cluster``, ``InlineRunner``)."""

    lineage: LineageStore


# --- recovery ------------------------------------------------------------------------------


def holder_alive(runner: LineageView, key: PartitionKey, live: Iterable[int]) -> int | None:
    """The holder of ``key`` if it is the driver or one of the ``live`` workers, else ``None``
    (a runner may still name a worker whose loss it has not processed yet)."""
    holder = runner.holder(key)
    return holder if holder is None or holder == DRIVER or holder in live else None


def missing(runner: StageRunner, keys: Iterable[PartitionKey], live: Iterable[int] | None = None) -> list:
    """Those of ``keys`` that no live worker (nor the driver) holds, once each (``live``:
    the live workers, if just asked)."""
    live = set(runner.workers if live is None else live)
    return [k for k in dict.fromkeys(keys) if holder_alive(runner, k, live) is None]


@dataclasses.dataclass(eq=False)
class _Todo:
    run: TaskRun
    keys: set[PartitionKey]


def _closure(runner: LineageRunner, keys: Iterable[PartitionKey]) -> tuple[list[_Todo], list]:
    """The runs to redo for ``keys`` (and for those of their inputs that are lost too),
    with the keys each must keep; and the lost keys that have no lineage."""
    store = runner.lineage
    todo: dict[int, _Todo] = {}
    unknown: list[PartitionKey] = []
    live = set(runner.workers)
    stack: list[tuple[PartitionKey, TaskRun | None]] = [(k, store.producer(k)) for k in keys]
    while stack:
        key, run = stack.pop()
        if run is None:
            if key not in unknown:
                unknown.append(key)
            continue
        entry = todo.get(id(run))
        if entry is None:
            entry = todo[id(run)] = _Todo(run, set())
            for inp in run.inputs:
                if holder_alive(runner, inp, live) is None:
                    stack.append((inp, run.parents.get(inp) or store.producer(inp)))
        entry.keys.add(key)
    for entry in todo.values():  # what a redone run makes anyway and was lost too: keep it
        by_products = [k for k in entry.run.made if k not in entry.keys and store.producer(k) is entry.run]
        entry.keys.update(k for k in by_products if holder_alive(runner, k, live) is None)
    return list(todo.values()), unknown


def recover(runner: LineageRunner, keys: Iterable[PartitionKey]) -> int:
    """Recompute the lost partitions ``keys`` from their lineage; the number of tasks run.

    Runs whose inputs are held go first, grouped into one stage per epoch
    (``StageSpec(epoch=...)``); intermediate partitions rebuilt only to feed them
    are dropped afterwards. :class:`UnrecoverableError` if some have no lineage;
    a further loss during recovery raises as ``execute`` does (the caller retries).
    """
    store = runner.lineage
    keys = list(dict.fromkeys(keys))
    todo, unknown = _closure(runner, keys)
    if unknown:
        raise UnrecoverableError(unknown)
    produced: list[PartitionKey] = []
    tasks_run = 0
    start = time.time()
    try:
        while todo:
            lost = set(missing(runner, (k for t in todo for k in t.run.inputs)))
            ready = [t for t in todo if lost.isdisjoint(t.run.inputs)]
            if not ready:  # lost again meanwhile: the caller retries
                wanted = {k for t in todo for k in t.keys}
                raise MissingPartitionError(sorted(lost - wanted, key=repr) or sorted(lost, key=repr))
            by_epoch: dict[int, list[_Todo]] = {}
            for t in ready:
                by_epoch.setdefault(store.effective_epoch(t.run), []).append(t)
            for epoch, group in sorted(by_epoch.items()):
                _redo(runner, epoch, group)
                tasks_run += len(group)
                produced += [k for t in group for k in t.keys]
            todo = [t for t in todo if t not in ready]
    finally:  # partitions rebuilt only to feed others (e.g. buckets of a past job)
        extra = [k for k in produced if store.get(k) is None]
        if extra:
            runner.drop(extra)
    store.counters.recoveries += 1
    store.events.append({"kind": "recompute", "time": start, "seconds": time.time() - start,
                         "tasks": tasks_run, "partitions": len(produced), "keys": keys[:32]})  # fmt: skip
    return tasks_run


def _redo(runner: LineageRunner, epoch: int, group: list[_Todo]) -> None:
    """One recomputation stage: the runs of ``group``, reading the arena at ``epoch``."""
    store = runner.lineage
    entries = tuple(Redo(t.run.payload, t.run.index, t.run.output, frozenset(t.keys)) for t in group)
    tasks = [TaskSpec(k, t.run.inputs, reply=False) for k, t in enumerate(group)]
    n = sum(len(t.keys) for t in group)
    logger.warning("recomputing %d lost partition(s) in %d task(s) at epoch %d", n, len(tasks), epoch)
    runner.execute(StageSpec(RecomputeTask(entries), tasks, epoch=epoch, recompute=True,
                             name=f"recompute {n} partition(s) at epoch {epoch}"))  # fmt: skip
    read_sets = runner.last_read_sets
    for k, t in enumerate(group):
        t.run.recomputed += 1
        if k < len(read_sets) and _stale(t.run.read_set, read_sets[k]):
            store.counters.read_set_mismatches += 1
            logger.warning(
                "partition(s) %s recomputed at epoch %d read other page versions than at "
                "epoch %d (pages changed since a checkpoint?): they may differ",
                sorted(t.keys, key=repr)[:3], epoch, t.run.epoch,
            )
        for key in t.keys:
            rec = store.get(key)
            if rec is not None and rec.run is t.run:
                rec.recomputed = True
    store.counters.tasks_recomputed += len(group)
    store.counters.partitions_recomputed += n


def _stale(original: Sequence[tuple[int, int]], again: Sequence[tuple[int, int]]) -> bool:
    """Whether a page read both times was read at different versions."""
    if isinstance(original, ReadSet) and isinstance(again, ReadSet):
        return original.conflicts(again)  # as arrays: no pair per page
    before = dict(original)
    return any(before.get(page, version) != version for page, version in again)


def check_workers(live: Iterable[int], what: str, cause: BaseException | None = None) -> None:
    """:class:`NoWorkersError` (a :class:`WorkerLostError`) naming ``cause`` if no worker
    is ``live`` any more."""
    if not live:
        raise NoWorkersError(what, "" if cause is None else str(cause)) from cause
