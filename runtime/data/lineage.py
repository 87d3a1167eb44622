"""Page-versioned lineage of materialised partitions, and their recovery.

Every task that leaves partitions on a worker (persisted dataset partitions,
shuffle buckets, partial aggregates) is remembered as a :class:`TaskRun`: its
stage program *as pickled when it ran* (so later changes to heap objects do not
leak in), its task index and input keys, the arena epoch it read and its
``(page, version)`` read set. Each partition it made gets a :class:`Record`
(the fused op chain, the dataset and index it belongs to). A run links to the
runs that produced its inputs, so a partition computed after a shuffle whose
buckets are long gone can still be rebuilt.

:func:`recover` recomputes exactly the lost partitions: it walks back to runs
whose inputs are still held, then runs them again, one stage per epoch, with
``StageSpec(epoch=e)``: each task reads the arena *as it was at epoch e*, from
the driver's version log, so a persisted dataset stays the snapshot it was even
after the driver updated the arena in place. Recomputation tasks keep only the
partitions that were lost and discard their accumulator updates (the original
run already counted them).

The version log only needs what live lineage needs: :func:`oldest_needed_epoch`.
After a checkpoint at epoch ``E`` (which preserves the arena as of ``E``),
:func:`truncate_lineage` lets older versions go; a partition computed before
``E`` is then recomputed at ``E``, which is exact unless the driver changed a
page it read between its epoch and ``E``. Recovery compares the read sets and
logs a warning (and counts ``read_set_mismatches``) when a page version differs.

The graph of a dataset (:class:`LineageGraph`, built by
:func:`clamor.runtime.data.plan.lineage_graph`) is what widgets draw.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from clamor.runtime.data.ops import RecomputeTask, Redo
from clamor.runtime.errors import MissingPartitionError, NoWorkersError
from clamor.runtime.paging.read_sets import ReadSet
from clamor.runtime.stage import DRIVER, PartitionKey, StageRunner, StageSpec, TaskSpec

logger = logging.getLogger("clamor.lineage")

#: Partition states in a :class:`LineageGraph`.
HELD, LOST, RECOMPUTED, NOT_COMPUTED = "held", "lost", "recomputed", "not computed"
#: Not kept, of a dataset whose action runs now (:func:`live_graph`).
COMPUTING = "computing"
#: The live graph also shows the datasets of each runner's last actions, this many, of
#: at most ACTION_NODES partitions each (persisted or not: a plain ``collect`` keeps none).
RECENT_ACTIONS, ACTION_NODES = 2, 1000


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
    #: A weak reference to the runner it ran on (epochs are numbered per runner).
    runner: weakref.ref | None = None

    def ran_on(self, runner: StageRunner) -> bool:
        return self.runner is not None and self.runner() is runner


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


_records: dict[PartitionKey, Record] = {}
#: runner -> its last actions, newest last: ``[graph of the action's dataset, running]``.
_actions: weakref.WeakKeyDictionary[Any, deque[list]] = weakref.WeakKeyDictionary()
_floor = 0  # epochs at or below this were checkpointed (truncate_lineage), every runner
_floors: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()  # per runner
_floor_cache: tuple[tuple[int, int], int | None] | None = None  # ((generation, runner), oldest)
_generation = 0


def _changed() -> None:
    global _generation
    _generation += 1


def record(key: PartitionKey, run: TaskRun, ops: Sequence[str], dataset: int | None = None,
           index: int | None = None) -> Record:  # fmt: skip
    """Remember that ``run`` made partition ``key`` (replacing an older record)."""
    rec = Record(key, run, tuple(ops), dataset, index)
    _records[key] = rec
    if key not in run.made:
        run.made.append(key)
    _changed()
    return rec


@contextlib.contextmanager
def acting(runner: StageRunner, graph: Callable[[StageRunner], LineageGraph]) -> Iterator[None]:
    """While an action runs on ``runner``: ``graph(runner)`` is its dataset's lineage, which
    :func:`live_graph` draws, as computing, then as one of the last actions."""
    entry: list = [graph, True]
    recent = _actions.setdefault(runner, deque(maxlen=RECENT_ACTIONS))
    recent.append(entry)
    _changed()
    try:
        yield
    finally:
        entry[1] = False
        _changed()


def generation() -> int:
    """Bumped whenever a record is added or forgotten (views redraw the graph then)."""
    return _generation


def get(key: PartitionKey) -> Record | None:
    """The record of a live partition, or ``None``."""
    return _records.get(key)


def producer(key: PartitionKey) -> TaskRun | None:
    """The run that made live partition ``key``, or ``None`` if it has no lineage."""
    rec = _records.get(key)
    return None if rec is None else rec.run


def forget(keys: Iterable[PartitionKey]) -> None:
    """Forget the records of partitions that are released (runs that later partitions
    were computed from stay reachable from those partitions' records)."""
    for key in keys:
        if _records.pop(key, None) is not None:
            _changed()


def live_keys() -> list[PartitionKey]:
    """The keys of every partition with a live record."""
    return list(_records)


# --- the version floor -------------------------------------------------------------------


def effective_epoch(run: TaskRun) -> int:
    """The epoch a recomputation of ``run`` reads: its own, or the checkpoint's if later."""
    runner = run.runner() if run.runner is not None else None
    own = _floors.get(runner, 0) if runner is not None else 0
    return max(run.epoch, _floor, own)


def oldest_needed_epoch(runner: StageRunner | None = None) -> int | None:
    """The smallest epoch that recomputing a live partition (of ``runner``'s datasets if
    given), or the partitions its lineage goes back to, would read; ``None`` if none.

    The driver may drop a page version ``v`` once a newer version ``v' <= floor``
    exists: every recomputation reads ``latest version <= its epoch``, with its epoch
    at least the floor. Releasing datasets (unpersist, garbage collection) and
    :func:`truncate_lineage` raise it.
    """
    global _floor_cache
    key = id(runner)
    if _floor_cache is not None and _floor_cache[0] == (_generation, key):
        return _floor_cache[1]
    oldest: int | None = None
    seen: set[int] = set()
    stack = [rec.run for rec in list(_records.values())]  # finalizers may forget meanwhile
    while stack:
        run = stack.pop()
        if id(run) in seen:
            continue
        seen.add(id(run))
        if runner is None or run.ran_on(runner):
            epoch = effective_epoch(run)
            oldest = epoch if oldest is None else min(oldest, epoch)
        stack.extend(run.parents.values())
    _floor_cache = ((_generation, key), oldest)
    return oldest


def truncate_lineage(epoch: int, runner: StageRunner | None = None) -> None:
    """After a checkpoint of the arena at ``epoch`` (of ``runner``; of every runner if
    ``None``): partitions computed at or before it no longer need older page versions.

    If lost, they are recomputed at ``epoch``: the same result unless the driver
    changed a page they read in between (recovery then logs a warning and counts a
    ``read_set_mismatch``).
    """
    global _floor
    if runner is None:
        _floor = max(_floor, epoch)
    else:
        _floors[runner] = max(_floors.get(runner, 0), epoch)
    _changed()


def lineage_floor(runner: StageRunner | None = None) -> int:
    """The epoch of the last :func:`truncate_lineage` (0 if none)."""
    return max(_floor, _floors.get(runner, 0) if runner is not None else 0)


# --- counters and events -------------------------------------------------------------------


@dataclasses.dataclass
class Counters:
    tasks_recomputed: int = 0
    partitions_recomputed: int = 0
    recoveries: int = 0
    read_set_mismatches: int = 0


_counters: weakref.WeakKeyDictionary[Any, Counters] = weakref.WeakKeyDictionary()
#: Recent recoveries, newest last, for timelines: plain dicts (see :func:`recover`).
events: deque[dict] = deque(maxlen=256)


def recovery_counters(runner: StageRunner | None = None) -> dict[str, int]:
    """``tasks_recomputed``, ``partitions_recomputed``, ``recoveries`` and
    ``read_set_mismatches`` of ``runner`` (of every runner if ``None``)."""
    chosen = list(_counters.values()) if runner is None else [_counters.get(runner, Counters())]
    total = Counters()
    for c in chosen:
        for field in dataclasses.fields(Counters):
            setattr(total, field.name, getattr(total, field.name) + getattr(c, field.name))
    return dataclasses.asdict(total)


def _count(runner: StageRunner) -> Counters:
    try:
        return _counters.setdefault(runner, Counters())
    except TypeError:  # not weak-referenceable: count it nowhere in particular
        return Counters()


# --- recovery ------------------------------------------------------------------------------


def holder_alive(runner: StageRunner, key: PartitionKey, live: Iterable[int]) -> int | None:
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


def _closure(runner: StageRunner, keys: Iterable[PartitionKey]) -> tuple[list[_Todo], list]:
    """The runs to redo for ``keys`` (and for those of their inputs that are lost too),
    with the keys each must keep; and the lost keys that have no lineage."""
    todo: dict[int, _Todo] = {}
    unknown: list[PartitionKey] = []
    live = set(runner.workers)
    stack: list[tuple[PartitionKey, TaskRun | None]] = [(k, producer(k)) for k in keys]
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
                    stack.append((inp, run.parents.get(inp) or producer(inp)))
        entry.keys.add(key)
    for entry in todo.values():  # what a redone run makes anyway and was lost too: keep it
        by_products = [k for k in entry.run.made if k not in entry.keys and producer(k) is entry.run]
        entry.keys.update(k for k in by_products if holder_alive(runner, k, live) is None)
    return list(todo.values()), unknown


def recover(runner: StageRunner, keys: Iterable[PartitionKey]) -> int:
    """Recompute the lost partitions ``keys`` from their lineage; the number of tasks run.

    Runs whose inputs are held go first, grouped into one stage per epoch
    (``StageSpec(epoch=...)``); intermediate partitions rebuilt only to feed them
    are dropped afterwards. :class:`UnrecoverableError` if some have no lineage;
    a further loss during recovery raises as ``execute`` does (the caller retries).
    """
    keys = list(dict.fromkeys(keys))
    todo, unknown = _closure(runner, keys)
    if unknown:
        raise UnrecoverableError(unknown)
    counters = _count(runner)
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
                by_epoch.setdefault(effective_epoch(t.run), []).append(t)
            for epoch, group in sorted(by_epoch.items()):
                _redo(runner, epoch, group, counters)
                tasks_run += len(group)
                produced += [k for t in group for k in t.keys]
            todo = [t for t in todo if t not in ready]
    finally:  # partitions rebuilt only to feed others (e.g. buckets of a past job)
        extra = [k for k in produced if k not in _records]
        if extra:
            runner.drop(extra)
    counters.recoveries += 1
    events.append({"kind": "recompute", "time": start, "seconds": time.time() - start,
                   "tasks": tasks_run, "partitions": len(produced), "keys": keys[:32]})  # fmt: skip
    return tasks_run


def _redo(runner: StageRunner, epoch: int, group: list[_Todo], counters: Counters) -> None:
    """One recomputation stage: the runs of ``group``, reading the arena at ``epoch``."""
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
            counters.read_set_mismatches += 1
            logger.warning(
                "partition(s) %s recomputed at epoch %d read other page versions than at "
                "epoch %d (pages changed since a checkpoint?): they may differ",
                sorted(t.keys, key=repr)[:3], epoch, t.run.epoch,
            )
        for key in t.keys:
            rec = _records.get(key)
            if rec is not None and rec.run is t.run:
                rec.recomputed = True
    counters.tasks_recomputed += len(group)
    counters.partitions_recomputed += n


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


# --- the graph widgets draw ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LineageNode:
    """One partition of a dataset in a :class:`LineageGraph`.

    ``ops``: the fused steps that compute it from its nearest persisted ancestors,
    shuffles or sources; ``epoch`` / ``read_set``: of the task that computed it
    (persisted partitions only); ``state``: ``"held"``, ``"lost"``, ``"recomputed"``
    or ``"not computed"`` (also every partition of a dataset that is not persisted).
    """

    key: PartitionKey
    dataset: int
    name: str
    index: int
    ops: tuple[str, ...]
    persisted: bool
    state: str
    holder: int | None = None
    epoch: int | None = None
    read_set: Sequence[tuple[int, int]] = ()

    @property
    def id(self) -> str:
        """A short string id, ``"<dataset>:<index>"``."""
        return f"{self.dataset}:{self.index}"

    @property
    def read_set_size(self) -> int:
        return len(self.read_set)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "key": list(self.key), "dataset": self.dataset, "name": self.name,
            "index": self.index, "ops": list(self.ops), "persisted": self.persisted,
            "state": self.state, "holder": self.holder, "epoch": self.epoch,
            "read_set_size": self.read_set_size,
        }  # fmt: skip


@dataclasses.dataclass
class LineageGraph:
    """Partitions of a dataset and of its ancestors up to the sources (``nodes``, in
    dependency order) and ``edges`` ``(parent key, child key)``."""

    nodes: list[LineageNode]
    edges: list[tuple[PartitionKey, PartitionKey]]

    def __post_init__(self) -> None:
        self._by_key = {n.key: n for n in self.nodes}

    def node(self, key: PartitionKey) -> LineageNode:
        return self._by_key[key]

    def parents(self, key: PartitionKey) -> list[PartitionKey]:
        """The keys of the partitions ``key`` is computed from, in edge order."""
        return [p for p, c in self.edges if c == key]

    def states(self) -> dict[str, int]:
        """How many partitions are in each state."""
        counts: dict[str, int] = {}
        for n in self.nodes:
            counts[n.state] = counts.get(n.state, 0) + 1
        return counts

    def to_dict(self) -> dict[str, Any]:
        """Plain data (JSON-ready): ``nodes`` (dicts) and ``edges`` (pairs of node ids)."""
        ids = {n.key: n.id for n in self.nodes}
        return {
            "nodes": [n.to_dict() for n in self.nodes],
            "edges": [[ids[p], ids[c]] for p, c in self.edges],
        }

    def to_networkx(self) -> Any:
        """A ``networkx.DiGraph`` on node ids (``ImportError`` if networkx is missing)."""
        import networkx as nx

        graph = nx.DiGraph()
        for n in self.nodes:
            graph.add_node(n.id, **n.to_dict())
        graph.add_edges_from((self._by_key[p].id, self._by_key[c].id) for p, c in self.edges)
        return graph


# --- building the graph of a dataset -----------------------------------------------------------
# Plan nodes (runtime/data/plan.py) are read by duck typing: ``id``, ``n``, ``name``,
# ``parents()``, and ``sides`` for shuffles.


def _key(node_id: int, i: int) -> tuple:
    return ("ds", node_id, i)


def fused_ops(node: Any, persisted: Mapping[int, Any], top: bool = True) -> tuple[str, ...]:
    """The steps fused into the task computing a partition of ``node``: back to its
    sources and shuffles (included) or persisted ancestors (excluded)."""
    if not top and node.id in persisted:
        return ()
    parents = node.parents()
    if not parents or hasattr(node, "sides"):
        return (node.name,)
    return tuple(op for p in parents for op in fused_ops(p, persisted, False)) + (node.name,)


def ancestry(root: Any) -> list[Any]:
    """``root`` and its ancestors, each once, parents before children."""
    order: list[Any] = []
    seen: set[int] = set()
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
        elif node.id not in seen:
            seen.add(node.id)
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(node.parents()))
    return order


def build_graph(root: Any, runner: StageRunner, persisted: Mapping[int, Any]) -> LineageGraph:
    """The :class:`LineageGraph` of plan node ``root``; ``persisted``: the ids of the
    persisted nodes (their partitions are ``("ds", id, i)``)."""
    nodes: list[LineageNode] = []
    edges: list[tuple[PartitionKey, PartitionKey]] = []
    live = set(runner.workers)
    for node in ancestry(root):
        kept = node.id in persisted
        ops = fused_ops(node, persisted)
        for i in range(node.n):
            key = _key(node.id, i)
            rec = _records.get(key) if kept else None
            if rec is None:
                nodes.append(LineageNode(key, node.id, node.name, i, ops, kept, NOT_COMPUTED))
            else:
                nodes.append(_kept_node(rec, node.id, node.name, i, runner, live))
        edges += _edges(node)
    return LineageGraph(nodes, edges)


def live_graph(runner: StageRunner) -> LineageGraph:
    """The graph of every live dataset partition ``runner`` made (all persisted datasets:
    what the dashboard draws), and of the datasets of its last actions: while one runs
    its partitions not kept are ``"computing"``; once it ended, an action on a dataset
    that keeps nothing stays drawn, ``"not computed"``. Edges link a partition to the dataset partitions its task read,
    through at most one shuffle (its buckets' producers)."""
    live = set(runner.workers)
    recs = [r for r in _records.values() if r.dataset is not None and r.run.ran_on(runner)]
    keys = {r.key for r in recs}
    nodes, edges = [], []
    for rec in sorted(recs, key=lambda r: (r.dataset, r.index)):
        name = rec.ops[-1] if rec.ops else "partition"
        nodes.append(_kept_node(rec, rec.dataset, name, rec.index, runner, live))
        parents: list[PartitionKey] = []
        for key in rec.run.inputs:
            if key in keys:
                parents.append(key)
            elif (run := rec.run.parents.get(key)) is not None:
                parents += [k for k in run.inputs if k in keys]
        edges += [(p, rec.key) for p in dict.fromkeys(parents)]
    for graph, running in _actions.get(runner, ()):
        nodes, edges = _with_action(nodes, edges, graph, runner, running)
    return LineageGraph(nodes, edges)


def _with_action(nodes: list[LineageNode], edges: list, graph: Callable[[StageRunner], LineageGraph],
                 runner: StageRunner, running: bool) -> tuple[list[LineageNode], list]:  # fmt: skip
    """``nodes`` and ``edges`` with those of an action's dataset graph added (its
    partitions not kept are computing while it runs); as they were if it is too large
    or ended on a persisted dataset (its records show it)."""
    try:
        action = graph(runner)
    except Exception:  # e.g. a dataset of a closed runner: not drawn
        logger.debug("the lineage of an action is unavailable", exc_info=True)
        return nodes, edges
    if len(action.nodes) > ACTION_NODES or (not running and action.nodes and action.nodes[-1].persisted):
        return nodes, edges  # too large, or ended on a persisted dataset: its records show it
    known = {n.key for n in nodes}
    added = [dataclasses.replace(n, state=COMPUTING) if running and n.state == NOT_COMPUTED else n
             for n in action.nodes if n.key not in known]  # fmt: skip
    return nodes + added, list(dict.fromkeys(edges + action.edges))


def _kept_node(rec: Record, dataset: int, name: str, index: int, runner: StageRunner,
               live: set[int]) -> LineageNode:  # fmt: skip
    """The node of a persisted partition with a record: held, lost or recomputed."""
    holder = holder_alive(runner, rec.key, live)
    state = LOST if holder is None else RECOMPUTED if rec.recomputed else HELD
    return LineageNode(rec.key, dataset, name, index, rec.ops, True, state, holder,
                       rec.run.epoch, rec.run.read_set)  # fmt: skip


def _edges(node: Any) -> list[tuple[PartitionKey, PartitionKey]]:
    """``(parent partition, partition)`` pairs of ``node``. A shuffle's output partition
    comes from every partition of every side, or, once computed and persisted, from
    those that left it a bucket."""
    parents = list(dict.fromkeys(node.parents()))
    if not hasattr(node, "sides"):
        return [(_key(p.id, i), _key(node.id, i)) for i in range(node.n) for p in parents]
    edges = []
    for j in range(node.n):
        rec = _records.get(_key(node.id, j))
        if rec is not None:
            buckets = [k for k in rec.run.inputs if _is_bucket(k, node.id, j)]
            pairs = list(dict.fromkeys((node.sides[k[3]].id, k[4]) for k in buckets))
        else:
            pairs = [(side.id, i) for side in parents for i in range(side.n)]
        edges += [(_key(nid, i), _key(node.id, j)) for nid, i in pairs]
    return edges


def _is_bucket(key: PartitionKey, node_id: int, j: int) -> bool:
    """Whether ``key`` is a bucket ``("shuffle", job, node_id, side, i, j)`` (runtime/data/plan.py)."""
    return isinstance(key, tuple) and len(key) == 6 and key[0] == "shuffle" and key[2] == node_id and key[5] == j
