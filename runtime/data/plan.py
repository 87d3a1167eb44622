"""Lazy dataset plans and the stages that compute them.

A dataset is a graph of *plan nodes* (:class:`Node`): picklable, holding no
cluster. Nothing runs until an action; then a :class:`Job` compiles the graph
into one picklable *op* per stage (runtime/data/ops.py: ``compute(ctx, i)`` gives
partition ``i``) and runs it with a :class:`~clamor.runtime.stage.StageRunner`:

- narrow steps (map, filter, flat_map, map_partitions, zip) fuse into the op,
  so a chain of them is one task per partition;
- a shuffle (join, lookup, repartition) is a boundary: a map stage whose tasks
  ``put`` one bucket per output partition on their worker, then the next
  stage's tasks name those buckets as inputs and the runner moves them;
- a persisted node's partitions are kept on the workers under
  ``("ds", node id, i)`` by the first stage that computes them, and read as
  inputs afterwards.

Keys the job creates for itself (shuffle buckets, reduce partials) are dropped
when the action ends, whether it succeeded or not.

Every partition a stage leaves on a worker gets a lineage record
(runtime/data/lineage.py). Before a stage runs, its inputs that were lost with their
worker are recomputed from lineage, at the epoch they were first computed at;
a stage that fails because a worker was lost runs again (up to
:data:`MAX_ATTEMPTS` times), after the same recovery.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import logging
import math
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self

from clamor.runtime import deadlines
from clamor.runtime.data import lineage, lineage_graph
from clamor.runtime.data.lineage import LineageRunner, TaskRun
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.data.ops import (
    Aggregate,
    Cached,
    CollectTask,
    CombineTask,
    Frozen,
    Op,
    PartialTask,
    Pipeline,
    ShuffleMapTask,
    ShuffleRead,
    Stored,
    ZipOp,
    concat,
    head,
    length,
)
from clamor.runtime.errors import (
    ActionTimeoutError,
    ClamorError,
    MissingPartitionError,
    SerializationError,
    TaskCrashedError,
    TaskError,
    WorkerLostError,
)
from clamor.runtime.net import shipping
from clamor.runtime.stage import (
    PartitionKey,
    StageSpec,
    TaskContext,
    TaskSpec,
)

logger = logging.getLogger("clamor.dataset")

#: How many partial results one combine task of a tree aggregation merges (after
#: the first round, which merges everything each worker holds).
FAN_IN = 2
#: How many times a stage runs before a worker loss during it is given up on.
MAX_ATTEMPTS = 4
#: Seconds a runtime error waits for a worker loss to be noticed (see ``Job._lost``).
LOSS_GRACE = 2.0
#: Seconds a stage that lost every worker waits for their replacements before its rerun.
REPLACEMENT_WAIT = 60.0

_node_ids = itertools.count(1)
_job_tokens = itertools.count(1)


def new_node_id() -> int:
    """A plan node id, unique in this process."""
    return next(_node_ids)


def persist_key(node_id: int, i: int) -> tuple:
    """The partition key of partition ``i`` of a persisted node."""
    return ("ds", node_id, i)


# --- plan nodes (driver side; never hold the runner) -----------------------------------


@dataclasses.dataclass(eq=False, kw_only=True)
class Node:
    """A lazy dataset: ``n`` partitions, computed from its parents."""

    n: int
    name: str
    id: int = dataclasses.field(default_factory=new_node_id)

    def parents(self) -> tuple[Node, ...]:
        return ()


@dataclasses.dataclass(eq=False, kw_only=True)
class Source(Node):
    """Data from outside the graph; ``op`` computes its partitions. ``driver_keys``:
    the partitions are held by the driver as ``driver_keys + (i,)``."""

    op: Op
    driver_keys: tuple | None = None


@dataclasses.dataclass(eq=False, kw_only=True)
class Narrow(Node):
    """A per-partition step (``fn``: an :class:`~clamor.runtime.data.ops.EachFn`, ``KeepFn``, ...)."""

    parent: Node
    fn: Callable[[Any], Any]

    def parents(self) -> tuple[Node, ...]:
        return (self.parent,)


@dataclasses.dataclass(eq=False, kw_only=True)
class Zip(Node):
    left: Node
    right: Node

    def parents(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclasses.dataclass(eq=False, kw_only=True)
class Shuffle(Node):
    """A wide step: each side's partitions split by ``splits[side]`` into ``n`` buckets;
    output partition ``j`` is ``combine([[side 0 buckets j], [side 1 buckets j], ...])``."""

    sides: tuple[Node, ...]
    splits: tuple[Callable[[Any, int], list], ...]
    combine: Callable[[list[list[Any]]], Any]

    def parents(self) -> tuple[Node, ...]:
        return self.sides


def describe(node: Node) -> str:
    """A short description such as ``map <- filter <- parallelize``."""
    names, seen = [], set()
    stack = [node]
    while stack and len(names) < 6:
        current = stack.pop()
        if current.id not in seen:
            seen.add(current.id)
            names.append(current.name)
            stack.extend(reversed(current.parents()))
    return " <- ".join(names) + (" ..." if stack else "")


def graph_of(root: Node, runner: LineageRunner) -> LineageGraph:
    """One :class:`~clamor.runtime.data.lineage_graph.LineageNode` per partition of ``root``
    and of its ancestors up to the sources, and the edges from each partition's parents."""
    return lineage_graph.build_graph(root, runner)


# --- compiling and running ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Made:
    """A partition a task leaves on its worker: ``key``, the fused ``ops`` that made it,
    and for a persisted dataset partition its ``dataset`` (node id) and ``index``."""

    key: PartitionKey
    ops: tuple[str, ...]
    dataset: int | None = None
    index: int | None = None


@dataclasses.dataclass(frozen=True)
class Persisting:
    """A persisted node whose partitions not in ``held`` an op computes (with ``ops``) and keeps."""

    node: int
    held: frozenset[int]
    ops: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A node compiled for one stage: its ``op``, the input keys of partition ``i``, the
    persisted nodes whose missing partitions the op computes and keeps, and the names
    of the steps fused into the op (empty for a persisted node: its partitions are read
    or computed under their own name)."""

    op: Op
    inputs: Callable[[int], tuple]
    persists: tuple[Persisting, ...] = ()
    ops: tuple[str, ...] = ()
    #: The arena ranges partition ``i`` is known to read (``TaskSpec.reads``).
    reads: Callable[[int], tuple] = lambda i: ()

    def task(self, k: int, i: int, **fields: Any) -> TaskSpec:
        """Task ``k`` of a stage computing partition ``i``: its inputs and known reads."""
        return TaskSpec(k, inputs=self.inputs(i), reads=self.reads(i), **fields)

    def persisted(self, i: int) -> list[Made]:
        """The persisted partitions that computing partition ``i`` makes."""
        made = {persist_key(p.node, i): p for p in self.persists if i not in p.held}
        return [Made(key, p.ops, p.node, i) for key, p in made.items()]


def _no_inputs(i: int) -> tuple:
    return ()


def _infrastructure(error: Exception) -> bool:
    """An error of the runtime itself (not the task's own, nor a serialization error)."""
    return isinstance(error, ClamorError) and not isinstance(error, TaskError | SerializationError)


class Job:
    """The stages of one action. Use as a context manager: its temporary keys are
    dropped at exit. Shuffle map stages run at most once per job."""

    def __init__(self, runner: LineageRunner, action: str) -> None:
        self.runner = runner
        self.lineage = runner.lineage
        self.action = action
        self.token = next(_job_tokens)
        self.temp: list[PartitionKey] = []
        self._shuffles: dict[int, Compiled] = {}
        self._min_ref_bytes = int(getattr(runner, "page_size", 0) or 0) or None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the job's temporary partitions (and forget their lineage records)."""
        keys, self.temp = self.temp, []
        self.lineage.forget(keys)
        self._drop_quietly(keys)

    # --- compiling ---

    def compile(self, node: Node) -> Compiled:
        """The op computing ``node``'s partitions; runs the shuffle map stages it needs."""
        done = self.lineage.persisted.get(node.id)
        if done is None:
            return self._compile(node)
        prefix = ("ds", node.id)
        if len(done) >= node.n:
            return Compiled(Stored(prefix), lambda i: (prefix + (i,),))
        inner = self._compile(node)
        held = frozenset(done)
        return Compiled(
            Cached(inner.op, prefix, held),
            lambda i: (prefix + (i,),) if i in held else inner.inputs(i),
            inner.persists + (Persisting(node.id, held, inner.ops),),
            reads=lambda i: () if i in held else inner.reads(i),
        )

    def _compile(self, node: Node) -> Compiled:
        if isinstance(node, Source):
            prefix = node.driver_keys
            inputs = _no_inputs if prefix is None else lambda i: (prefix + (i,),)
            return Compiled(node.op, inputs, ops=(node.name,), reads=getattr(node.op, "reads", _no_inputs))
        if isinstance(node, Narrow):
            parent = self.compile(node.parent)
            op = parent.op
            if isinstance(op, Pipeline):  # fuse into the parent's pipeline
                op = Pipeline(op.parent, op.fns + (node.fn,))
            else:
                op = Pipeline(op, (node.fn,))
            return Compiled(op, parent.inputs, parent.persists, parent.ops + (node.name,), parent.reads)
        if isinstance(node, Zip):
            left, right = self.compile(node.left), self.compile(node.right)
            return Compiled(
                ZipOp(left.op, right.op),
                lambda i: tuple(dict.fromkeys(left.inputs(i) + right.inputs(i))),
                left.persists + right.persists,
                left.ops + right.ops + (node.name,),
                lambda i: left.reads(i) + right.reads(i),
            )
        if isinstance(node, Shuffle):
            if node.id not in self._shuffles:
                self._shuffles[node.id] = self._shuffle(node)
            return self._shuffles[node.id]
        raise TypeError(f"unknown plan node {type(node).__name__}")

    def _shared_persisted(self, roots: Sequence[Node]) -> list[Node]:
        """Persisted nodes that one stage over ``roots`` would compute more than once
        (e.g. ``a.zip(a)``), deepest first. Shuffles are their own stages: not entered."""
        seen: dict[int, int] = {}
        shared: list[Node] = []

        def walk(node: Node) -> None:
            done = self.lineage.persisted.get(node.id)
            if isinstance(node, Shuffle) or (done is not None and len(done) >= node.n):
                return
            seen[node.id] = seen.get(node.id, 0) + 1
            if done is not None and seen[node.id] > 1:
                if seen[node.id] == 2:
                    shared.append(node)
                return
            for parent in node.parents():
                walk(parent)

        for root in roots:
            walk(root)
        return shared

    def _prepare(self, roots: Sequence[Node], parts: range) -> None:
        """Compute and keep, each in a stage of its own, the persisted nodes that the stage
        over ``roots`` would otherwise compute twice (only ``parts`` of them)."""
        for node in self._shared_persisted(roots):
            compiled = self.compile(node)
            held = self.lineage.persisted.get(node.id, set())
            todo = tuple(i for i in range(parts.start, min(parts.stop, node.n)) if i not in held)
            tasks = [compiled.task(k, i, reply=False) for k, i in enumerate(todo)]
            persisted = lambda k, c=compiled, parts=todo: c.persisted(parts[k])
            self.run(f"persist {node.name}", CollectTask(compiled.op, todo), tasks, persisted)

    def _shuffle(self, node: Shuffle) -> Compiled:
        """Run the map stage of ``node`` (all sides in one stage); compile its reduce side."""
        self._prepare(node.sides, range(max(side.n for side in node.sides)))
        sides = [self.compile(side) for side in node.sides]
        tag = ("shuffle", self.token, node.id)
        where = [(s, i) for s, side in enumerate(node.sides) for i in range(side.n)]
        tasks = [sides[s].task(k, i) for k, (s, i) in enumerate(where)]
        program = ShuffleMapTask(
            tuple(c.op for c in sides), node.splits, tuple(s.n for s in node.sides), node.n, tag
        )

        def buckets(k: int, kept: Sequence[int]) -> list[Made]:
            s, i = where[k]
            return [Made(tag + (s, i, j), sides[s].ops + (f"{node.name} map",)) for j in kept]

        try:
            kept = self.run(f"shuffle for {node.name}", program, tasks,
                            lambda k: sides[where[k][0]].persisted(where[k][1]), buckets)  # fmt: skip
        except BaseException:  # successful tasks may have kept buckets: name them all
            self.temp.extend(tag + (s, i, j) for s, i in where for j in range(node.n))
            raise
        inputs: list[list[tuple]] = [[] for _ in range(node.n)]
        for (s, i), js in zip(where, kept):
            for j in js:
                key = tag + (s, i, j)
                self.temp.append(key)
                inputs[j].append(key)
        table = [tuple(keys) for keys in inputs]
        return Compiled(ShuffleRead(tag, len(node.sides), node.combine), table.__getitem__, ops=(node.name,))

    # --- running ---

    def run(
        self,
        name: str,
        program: Callable[[TaskContext], Any],
        tasks: list[TaskSpec],
        persisted: Callable[[int], list[Made]] | None = None,
        kept: Callable[[int, Any], list[Made]] | None = None,
    ) -> list[Any]:
        """Run one stage; its replies in task order.

        ``persisted(k)``: the persisted partitions task ``k`` computes (held once the
        stage succeeds, dropped if it fails); ``kept(k, reply)``: the other partitions it
        leaves on its worker. Both get lineage records: such a stage's program is
        pickled here, once, and kept with them. Lost inputs are recomputed first; a
        stage that fails because a worker was lost runs again.
        """
        made = [persisted(t.index) if persisted else [] for t in tasks]
        payload = None
        if kept is not None or any(made):
            payload = shipping.pack_program(program, self._min_ref_bytes)
            program = Frozen(payload)
        label = f"{self.action}: {name}"
        cause: Exception | None = None
        for attempt in range(1, MAX_ATTEMPTS + 1):
            live = set(self.runner.workers)
            if not live and cause is not None and hasattr(self.runner, "wait_for_workers"):
                live = set(self.runner.wait_for_workers(1, timeout=REPLACEMENT_WAIT))  # lost ones replaced
            lineage.check_workers(live, label, cause)
            try:
                self._recover_inputs(tasks, live)
                results = self.runner.execute(StageSpec(program, tasks, name=label,
                                                        keeps_lineage=payload is not None))
                epoch = self.runner.last_epoch
                read_sets = list(self.runner.last_read_sets)
                break
            except Exception as exc:
                self._drop_unfinished(made)
                if attempt == MAX_ATTEMPTS or not self._lost(exc, live):
                    raise
                cause = exc
                logger.warning("%s: %s; running it again (attempt %d)", label, exc, attempt + 1)
                alive = set(self.runner.workers)  # a task pinned to a lost worker goes anywhere
                tasks = [t if t.worker is None or t.worker in alive else dataclasses.replace(t, worker=None)
                         for t in tasks]  # fmt: skip
            except BaseException:
                self._drop_unfinished(made)
                raise
        if payload is not None:
            self._remember(label, payload, tasks, results, made, kept, epoch, read_sets)
        return results

    def _recover_inputs(self, tasks: list[TaskSpec], live: set[int]) -> None:
        """Recompute, from lineage, the inputs of ``tasks`` that no ``live`` worker holds."""
        lost = lineage.missing(self.runner, (k for t in tasks for k in t.inputs), live)
        if lost:
            lineage.recover(self.runner, lost)

    def _lost(self, error: Exception, live: set[int]) -> bool:
        """Whether ``error`` comes from a worker lost during the stage (worth a rerun).

        A runtime error (e.g. a task could not fetch an input from a peer that just died)
        counts if a worker of ``live`` turns out lost within :data:`LOSS_GRACE` seconds:
        the death of a process may be noticed a moment after its peers see it.
        """
        if isinstance(error, lineage.UnrecoverableError | TaskCrashedError | ActionTimeoutError):
            return False  # a task that kills its workers (the scheduler's limit), or out of time
        if isinstance(error, WorkerLostError | MissingPartitionError):
            return True
        grace = LOSS_GRACE if _infrastructure(error) else 0.0
        deadline = time.monotonic() + grace
        while not live - set(self.runner.workers):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def _drop_unfinished(self, made: list[list[Made]]) -> None:
        """Drop the persisted partitions a failed stage was computing (some tasks may have)."""
        self._drop_quietly(
            m.key for ms in made for m in ms
            if m.dataset is not None and m.index not in self.lineage.persisted.get(m.dataset, ())
        )  # fmt: skip

    def _remember(
        self, label: str, payload: bytes, tasks: list[TaskSpec], results: list[Any],
        made: list[list[Made]], kept: Callable[[int, Any], list[Made]] | None,
        epoch: int, read_sets: list,
    ) -> None:  # fmt: skip
        """Record the lineage of what each task of a finished stage left on its worker."""
        persisted = self.lineage.persisted
        for k, task in enumerate(tasks):
            outputs = made[k] + (kept(k, results[k]) if kept is not None else [])
            if not outputs:
                continue
            parents = {key: run for key in task.inputs if (run := self.lineage.producer(key)) is not None}
            read_set = read_sets[k] if k < len(read_sets) else ()  # a ReadSet: immutable, shared
            run = TaskRun(label, payload, task.index, task.inputs, task.output, epoch, read_set, parents)
            for out in outputs:
                if out.dataset is not None:
                    if out.dataset not in persisted:  # unpersisted while the stage ran
                        self._drop_quietly([out.key])
                        continue
                    persisted[out.dataset].add(out.index)
                self.lineage.record(out.key, run, out.ops, out.dataset, out.index)

    def _drop_quietly(self, keys: Iterable[PartitionKey]) -> None:
        """Drop ``keys``, logging a failure (the action's own outcome matters more)."""
        keys = list(keys)
        if keys:
            try:
                self.runner.drop(keys)
            except Exception:  # e.g. a closed cluster
                logger.warning("could not drop %d partitions", len(keys), exc_info=True)

    def collect(self, node: Node, parts: range | None = None, limit: int | None = None) -> list:
        """Partitions ``parts`` (default: all) of ``node``, brought to the driver."""
        parts = range(node.n) if parts is None else parts
        self._prepare([node], parts)
        compiled = self.compile(node)
        tasks = [compiled.task(k, i) for k, i in enumerate(parts)]
        program = CollectTask(compiled.op, parts, limit)
        return self.run(node.name, program, tasks, lambda k: compiled.persisted(parts[k]))

    def take(self, node: Node, n: int) -> Any:
        """The first ``n`` elements: partition 0 first, then ×4 more partitions per round
        (fewer if the elements found so far suggest so), stopping as soon as ``n`` are found."""
        found: list[Any] = []
        count = scanned = 0
        while count < n and scanned < node.n:
            if scanned == 0:
                grow = 1
            elif count == 0:
                grow = scanned * 4
            else:
                grow = max(1, min(math.ceil(1.5 * n * scanned / count) - scanned, scanned * 4))
            parts = range(scanned, min(node.n, scanned + grow))
            for part in self.collect(node, parts, limit=n - count):
                found.append(part)
                count += length(part)
            scanned = parts.stop
        return head(concat(found), n)

    def aggregate(self, node: Node, aggregate: Aggregate) -> Any:
        """Tree aggregation: partials stay on their workers; one combine task per worker
        merges its partials, then rounds of :data:`FAN_IN` until one task replies the value."""
        self._prepare([node], range(node.n))
        compiled = self.compile(node)
        program = PartialTask(compiled.op, aggregate, range(node.n))
        if node.n == 1:
            tasks = [compiled.task(0, 0)]
            return aggregate.finish(self.run(f"{node.name} (partial)", program, tasks, compiled.persisted)[0])
        level = [("agg", self.token, 0, i) for i in range(node.n)]
        self.temp.extend(level)
        tasks = [compiled.task(i, i, output=level[i], reply=False) for i in range(node.n)]
        partial_ops = compiled.ops + ("partial",)
        self.run(f"{node.name} (partials)", program, tasks, compiled.persisted,
                 lambda k, _: [Made(level[k], partial_ops)])  # fmt: skip
        groups = self._by_holder(level)
        combine = CombineTask(aggregate)
        for rnd in itertools.count(1):
            final = len(groups) == 1
            tasks, level = [], []
            for members in groups:
                if len(members) == 1 and not final:
                    level.append(members[0])  # nothing to merge it with yet
                    continue
                key = None if final else ("agg", self.token, rnd, len(tasks))
                worker = self.runner.holder(members[0])
                tasks.append(
                    TaskSpec(len(tasks), tuple(members), key, reply=final, worker=worker)
                )
                if key is not None:
                    self.temp.append(key)
                    level.append(key)
            if tasks:
                outputs = [t.output for t in tasks]
                made = None if final else (lambda k, _, o=outputs: [Made(o[k], ("combine",))])
                values = self.run(f"{node.name} (combine, round {rnd})", combine, tasks, kept=made)
                if final:
                    return aggregate.finish(values[0])
            groups = [level[k : k + FAN_IN] for k in range(0, len(level), FAN_IN)]
        raise AssertionError("unreachable")

    def _by_holder(self, keys: list[PartitionKey]) -> list[list[PartitionKey]]:
        groups: dict[int | None, list[PartitionKey]] = {}
        for key in keys:
            groups.setdefault(self.runner.holder(key), []).append(key)
        return list(groups.values())


def _graph_while_alive(root: weakref.ref, runner: LineageRunner) -> LineageGraph:
    """The lineage graph of the plan node ``root`` refers to; empty once it is gone."""
    node = root()
    return LineageGraph([], []) if node is None else graph_of(node, runner)


def run_action(runner: LineageRunner, action: str, body: Callable[[Job], Any],
               timeout: float | None, root: Node) -> Any:  # fmt: skip
    """Run ``body`` in a fresh :class:`Job` (its temporary partitions dropped at the end).
    Partitions lost on the way are recomputed by :meth:`Job.run` from lineage. Its stages
    finish within ``timeout`` seconds (default: the runner's ``action_timeout``) or are
    cancelled (runtime/deadlines.py). ``root``: the dataset acted on (the live lineage
    graph shows it while it runs, and after)."""
    seconds = timeout if timeout is not None else getattr(runner, "action_timeout", None)
    graph = functools.partial(_graph_while_alive, weakref.ref(root))  # neither keeps anything alive
    with deadlines.limit(seconds, action), runner.lineage.acting(graph), Job(runner, action) as job:
        return body(job)
