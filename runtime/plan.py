"""Lazy dataset plans and the stages that compute them (DESIGN 5).

A dataset is a graph of *plan nodes* (:class:`Node`): picklable, holding no
cluster. Nothing runs until an action; then a :class:`Job` compiles the graph
into one picklable *op* per stage (runtime/ops.py: ``compute(ctx, i)`` gives
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
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Self

from clamor.runtime.errors import MissingPartitionError
from clamor.runtime.ops import (
    Aggregate,
    Cached,
    CollectTask,
    CombineTask,
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
from clamor.runtime.stage import (
    PartitionKey,
    StageRunner,
    StageSpec,
    TaskContext,
    TaskSpec,
)

logger = logging.getLogger("clamor.dataset")

#: How many partial results one combine task of a tree aggregation merges (after
#: the first round, which merges everything each worker holds).
FAN_IN = 2

_node_ids = itertools.count(1)
_job_tokens = itertools.count(1)

#: Persisted nodes: node id -> the partitions held by workers as ``("ds", id, i)``.
_persisted: dict[int, set[int]] = {}


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
    """A per-partition step (``fn``: an :class:`~clamor.runtime.ops.EachFn`, ``KeepFn``, ...)."""

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


def lineage(node: Node) -> str:
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


# --- compiling and running ---------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Compiled:
    """A node compiled for one stage: its ``op``, the input keys of partition ``i``,
    and the persisted nodes whose missing partitions the op computes and keeps."""

    op: Op
    inputs: Callable[[int], tuple]
    persists: tuple[int, ...] = ()


def _no_inputs(i: int) -> tuple:
    return ()


def forget_lost(keys: Iterable[PartitionKey]) -> bool:
    """Forget persisted partitions among ``keys`` (their holder is gone); True if any was."""
    forgot = False
    for key in keys:
        if isinstance(key, tuple) and len(key) == 3 and key[0] == "ds" and key[1] in _persisted:
            forgot |= key[2] in _persisted[key[1]]
            _persisted[key[1]].discard(key[2])
    return forgot


class Job:
    """The stages of one action. Use as a context manager: its temporary keys are
    dropped at exit. Shuffle map stages run at most once per job."""

    def __init__(self, runner: StageRunner, action: str) -> None:
        self.runner = runner
        self.action = action
        self.token = next(_job_tokens)
        self.temp: list[PartitionKey] = []
        self._shuffles: dict[int, Compiled] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Drop the job's temporary partitions."""
        keys, self.temp = self.temp, []
        self._drop_quietly(keys)

    # --- compiling ---

    def compile(self, node: Node) -> Compiled:
        """The op computing ``node``'s partitions; runs the shuffle map stages it needs."""
        done = _persisted.get(node.id)
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
            inner.persists + (node.id,),
        )

    def _compile(self, node: Node) -> Compiled:
        if isinstance(node, Source):
            prefix = node.driver_keys
            return Compiled(node.op, _no_inputs if prefix is None else lambda i: (prefix + (i,),))
        if isinstance(node, Narrow):
            parent = self.compile(node.parent)
            op = parent.op
            if isinstance(op, Pipeline):  # fuse into the parent's pipeline
                op = Pipeline(op.parent, op.fns + (node.fn,))
            else:
                op = Pipeline(op, (node.fn,))
            return Compiled(op, parent.inputs, parent.persists)
        if isinstance(node, Zip):
            left, right = self.compile(node.left), self.compile(node.right)
            return Compiled(
                ZipOp(left.op, right.op),
                lambda i: tuple(dict.fromkeys(left.inputs(i) + right.inputs(i))),
                left.persists + right.persists,
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
            done = _persisted.get(node.id)
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
            held = _persisted.get(node.id, set())
            todo = tuple(i for i in range(parts.start, min(parts.stop, node.n)) if i not in held)
            tasks = [TaskSpec(k, compiled.inputs(i), reply=False) for k, i in enumerate(todo)]
            self.run(f"persist {node.name}", CollectTask(compiled.op, todo), tasks, [(compiled.persists, todo)])

    def _shuffle(self, node: Shuffle) -> Compiled:
        """Run the map stage of ``node`` (all sides in one stage); compile its reduce side."""
        self._prepare(node.sides, range(max(side.n for side in node.sides)))
        sides = [self.compile(side) for side in node.sides]
        tag = ("shuffle", self.token, node.id)
        where = [(s, i) for s, side in enumerate(node.sides) for i in range(side.n)]
        tasks = [TaskSpec(k, inputs=sides[s].inputs(i)) for k, (s, i) in enumerate(where)]
        program = ShuffleMapTask(
            tuple(c.op for c in sides), node.splits, tuple(s.n for s in node.sides), node.n, tag
        )
        marks = [(c.persists, range(side.n)) for c, side in zip(sides, node.sides)]
        try:
            kept = self.run(f"shuffle for {node.name}", program, tasks, marks)
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
        return Compiled(ShuffleRead(tag, len(node.sides), node.combine), table.__getitem__)

    # --- running ---

    def run(
        self,
        name: str,
        program: Callable[[TaskContext], Any],
        tasks: list[TaskSpec],
        marks: Sequence[tuple[tuple[int, ...], Sequence[int]]] = (),
    ) -> list[Any]:
        """Run one stage. ``marks``: ``(persisted node ids, partitions)`` the stage computes;
        they count as held once it succeeds, and are dropped if it fails."""
        stage = StageSpec(program, tasks, name=f"{self.action}: {name}")
        try:
            results = self.runner.execute(stage)
        except BaseException:
            self._drop_quietly(
                persist_key(nid, i)
                for ids, parts in marks
                for nid in ids
                for i in parts
                if i not in _persisted.get(nid, ())
            )
            raise
        for ids, parts in marks:
            for nid in ids:
                if nid in _persisted:
                    _persisted[nid].update(parts)
                else:  # unpersisted while the stage ran
                    self._drop_quietly(persist_key(nid, i) for i in parts)
        return results

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
        tasks = [TaskSpec(k, inputs=compiled.inputs(i)) for k, i in enumerate(parts)]
        program = CollectTask(compiled.op, parts, limit)
        return self.run(node.name, program, tasks, [(compiled.persists, parts)])

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
        marks = [(compiled.persists, range(node.n))]
        program = PartialTask(compiled.op, aggregate, range(node.n))
        if node.n == 1:
            value = self.run(f"{node.name} (partial)", program, [TaskSpec(0, compiled.inputs(0))], marks)[0]
            return aggregate.finish(value)
        level = [("agg", self.token, 0, i) for i in range(node.n)]
        self.temp.extend(level)
        tasks = [
            TaskSpec(i, inputs=compiled.inputs(i), output=level[i], reply=False)
            for i in range(node.n)
        ]
        self.run(f"{node.name} (partials)", program, tasks, marks)
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
                values = self.run(f"{node.name} (combine, round {rnd})", combine, tasks)
                if final:
                    return aggregate.finish(values[0])
            groups = [level[k : k + FAN_IN] for k in range(0, len(level), FAN_IN)]
        raise AssertionError("unreachable")

    def _by_holder(self, keys: list[PartitionKey]) -> list[list[PartitionKey]]:
        groups: dict[int | None, list[PartitionKey]] = {}
        for key in keys:
            groups.setdefault(self.runner.holder(key), []).append(key)
        return list(groups.values())


def run_action(runner: StageRunner, action: str, body: Callable[[Job], Any], attempts: int = 3) -> Any:
    """Run ``body`` in a fresh :class:`Job`. If partitions it needs are lost with their
    worker (:class:`MissingPartitionError`: persisted partitions, or the job's own
    buckets and partials), forget them and run it again: they are recomputed."""
    for attempt in range(attempts):
        with Job(runner, action) as job:
            try:
                return body(job)
            except MissingPartitionError as exc:
                ours = forget_lost(exc.keys) or not set(exc.keys).isdisjoint(job.temp)
                if attempt == attempts - 1 or not ours:
                    raise
                logger.warning("%s: recomputing after losing %d partitions", action, len(exc.keys))
    raise AssertionError("unreachable")
