"""The task side of datasets: what a stage's tasks run on the workers.

Everything here is picklable and importable by workers. An *op* computes one
partition inside a task (``op.compute(ctx, i)``); the plan (runtime/data/plan.py)
fuses a chain of narrow steps into one op, and wraps it in one *stage program*
per stage (``program(ctx)``): collect a partition, compute a partial aggregate,
combine partials, or split a partition into shuffle buckets.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import numbers
import operator
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Protocol

import numpy as np
from clamor.runtime.net import shipping
from clamor.runtime.stage import PartitionKey, TaskContext, run_program

# --- partition values -------------------------------------------------------------


def bounds(length: int, parts: int, i: int) -> tuple[int, int]:
    """``[start, stop)`` of the ``i``-th of ``parts`` contiguous slices of ``length`` items."""
    return length * i // parts, length * (i + 1) // parts


def items(part: Any) -> list:
    """The elements of a partition as a list (an array's rows)."""
    if isinstance(part, list):
        return part
    if isinstance(part, Iterable) and not isinstance(part, str | bytes):
        return list(part)
    raise TypeError(
        f"a partition must be a sequence or an array, got {type(part).__name__} "
        "(map_partitions must return one)"
    )


def length(part: Any) -> int:
    """The number of elements of a partition."""
    return len(part) if hasattr(part, "__len__") and not isinstance(part, str | bytes) else len(items(part))


def head(part: Any, limit: int) -> Any:
    """The first ``limit`` elements of a partition, keeping its type where it can be sliced."""
    if isinstance(part, np.ndarray | list | tuple | range):
        return part[:limit]
    return list(itertools.islice(items(part), limit))


def concat(parts: Sequence[Any]) -> Any:
    """Partitions joined in order: one array if all are arrays, else a list."""
    if parts and all(isinstance(p, np.ndarray) for p in parts):
        return np.concatenate(parts)
    return [x for p in parts for x in items(p)]


# --- deterministic hashing (``hash`` of a str is salted per process) ----------------


def stable_hash(key: Any) -> int:
    """A hash that every process agrees on, equal for keys that compare equal.

    Numbers hash by value (``1 == 1.0 == True``), strings and bytes by CRC-32,
    tuples and frozensets by their items; other objects by the CRC-32 of their
    ``repr``, which must therefore be deterministic for them to be join keys.
    """
    if key is None:
        return 0
    if isinstance(key, numbers.Integral):
        return int(key) & 0xFFFFFFFF
    if isinstance(key, numbers.Real):
        x = float(key)
        return int(x) & 0xFFFFFFFF if x.is_integer() else zlib.crc32(struct.pack("<d", x))
    if isinstance(key, str):
        return zlib.crc32(key.encode("utf-8", "surrogatepass"))
    if isinstance(key, bytes | bytearray):
        return zlib.crc32(key)
    if isinstance(key, tuple):
        h = 0x345678
        for k in key:
            h = zlib.crc32(struct.pack("<I", stable_hash(k)), h)
        return h
    if isinstance(key, frozenset):
        return functools.reduce(operator.xor, map(stable_hash, key), 0x9E3779B9)
    return zlib.crc32(repr(key).encode("utf-8", "surrogatepass"))


# --- ops: what a task runs (picklable, computed on workers) --------------------------


class Op(Protocol):
    """Computes one partition inside a task."""

    def compute(self, ctx: TaskContext, i: int) -> Any: ...


@dataclasses.dataclass(frozen=True)
class EachFn:
    """``map``: ``f`` on every element."""

    f: Callable[[Any], Any]

    def __call__(self, part: Any) -> list:
        return [self.f(x) for x in items(part)]


@dataclasses.dataclass(frozen=True)
class KeepFn:
    """``filter``: the elements for which ``f`` is true."""

    f: Callable[[Any], Any]

    def __call__(self, part: Any) -> list:
        return [x for x in items(part) if self.f(x)]


@dataclasses.dataclass(frozen=True)
class FlatFn:
    """``flat_map``: the elements of ``f(x)`` for every element ``x``."""

    f: Callable[[Any], Iterable]

    def __call__(self, part: Any) -> list:
        return [y for x in items(part) for y in self.f(x)]


@dataclasses.dataclass(frozen=True)
class WholeFn:
    """``map_partitions``: ``f`` on the whole partition (an iterator it returns becomes a list)."""

    f: Callable[[Any], Any]

    def __call__(self, part: Any) -> Any:
        result = self.f(part)
        return list(result) if isinstance(result, Iterator) else result


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """Fused narrow steps: ``fns`` applied in order to the parent's partition."""

    parent: Op
    fns: tuple[Callable[[Any], Any], ...]

    def compute(self, ctx: TaskContext, i: int) -> Any:
        part = self.parent.compute(ctx, i)
        for fn in self.fns:
            part = fn(part)
        return part


@dataclasses.dataclass(frozen=True)
class ZipOp:
    """Element-wise pairs of two co-partitioned partitions."""

    left: Op
    right: Op

    def compute(self, ctx: TaskContext, i: int) -> list:
        a, b = items(self.left.compute(ctx, i)), items(self.right.compute(ctx, i))
        if len(a) != len(b):
            raise ValueError(
                f"zip: partition {i} has {len(a)} elements on the left and {len(b)} on the right"
            )
        return list(zip(a, b))


@dataclasses.dataclass(frozen=True)
class Stored:
    """A partition kept on a worker (a persisted dataset), read as a task input."""

    prefix: tuple

    def compute(self, ctx: TaskContext, i: int) -> Any:
        return ctx.input(self.prefix + (i,))


@dataclasses.dataclass(frozen=True)
class Cached:
    """A persisted node: read partition ``i`` if it is held (``done``), else compute and keep it."""

    parent: Op
    prefix: tuple
    done: frozenset[int]

    def compute(self, ctx: TaskContext, i: int) -> Any:
        key = self.prefix + (i,)
        if i in self.done:
            return ctx.input(key)
        value = self.parent.compute(ctx, i)
        ctx.put(key, value)
        return value


@dataclasses.dataclass(frozen=True)
class ShuffleRead:
    """The reduce side of a shuffle: ``combine`` of the buckets named ``tag + (side, i, j)``."""

    tag: tuple
    sides: int
    combine: Callable[[list[list[Any]]], Any]

    def compute(self, ctx: TaskContext, j: int) -> Any:
        groups: list[list[Any]] = [[] for _ in range(self.sides)]
        n = len(self.tag)
        for key in ctx.input_keys:
            if isinstance(key, tuple) and key[:n] == self.tag and key[-1] == j:
                groups[key[n]].append(ctx.input(key))
        return self.combine(groups)


# --- shuffles: how map partitions split, how reducers combine -------------------------


@dataclasses.dataclass(frozen=True)
class HashSplit:
    """Bucket elements by :func:`stable_hash` of the element (``by_first``: of its first item)."""

    by_first: bool

    def __call__(self, part: Any, n: int) -> list[list]:
        buckets: list[list] = [[] for _ in range(n)]
        for x in items(part):
            buckets[stable_hash(x[0] if self.by_first else x) % n].append(x)
        return buckets


@dataclasses.dataclass(frozen=True)
class ContiguousSplit:
    """``n`` contiguous slices of the partition (arrays stay arrays)."""

    def __call__(self, part: Any, n: int) -> list:
        if not isinstance(part, np.ndarray | list | tuple | range):
            part = items(part)
        size = len(part)
        return [part[slice(*bounds(size, n, j))] for j in range(n)]


def join_buckets(groups: list[list[Any]]) -> list:
    """Inner join of ``(k, v)`` buckets (side 0) with ``(k, w)`` buckets (side 1)."""
    right: dict[Any, list] = {}
    for bucket in groups[1]:
        for k, w in bucket:
            right.setdefault(k, []).append(w)
    return [(k, (v, w)) for bucket in groups[0] for k, v in bucket for w in right.get(k, ())]


def lookup_buckets(groups: list[list[Any]]) -> list:
    """``(key, [values...])`` for every key of side 0, from the ``(k, v)`` pairs of side 1."""
    found: dict[Any, list] = {}
    for bucket in groups[1]:
        for k, v in bucket:
            found.setdefault(k, []).append(v)
    return [(k, list(found.get(k, ()))) for bucket in groups[0] for k in bucket]


def concat_buckets(groups: list[list[Any]]) -> Any:
    """Repartition: the slices of every map partition, in map order."""
    return concat(groups[0])


# --- aggregations ----------------------------------------------------------------------


class _Empty:
    """The partial result of an empty partition (one instance, kept across pickling)."""

    def __reduce__(self) -> str:
        return "EMPTY"

    def __repr__(self) -> str:
        return "EMPTY"


EMPTY = _Empty()


@dataclasses.dataclass(frozen=True)
class Aggregate:
    """``reduce(f)``, ``sum`` or ``count``: a partial per partition, then pairwise combination.

    ``f`` must be associative and commutative (partials combine in tree order).
    """

    kind: str  # "reduce" | "sum" | "count"
    f: Callable[[Any, Any], Any] | None = None

    def _op(self) -> Callable[[Any, Any], Any]:
        return self.f if self.kind == "reduce" else operator.add

    def partial(self, part: Any) -> Any:
        if self.kind == "count":
            return length(part)
        if self.kind == "sum" and isinstance(part, np.ndarray):
            return part.sum(axis=0)
        elements = items(part)
        return functools.reduce(self._op(), elements) if elements else EMPTY

    def combine(self, values: Iterable[Any]) -> Any:
        present = [v for v in values if v is not EMPTY]
        return functools.reduce(self._op(), present) if present else EMPTY

    def finish(self, value: Any) -> Any:
        if value is not EMPTY:
            return value
        if self.kind == "reduce":
            raise ValueError("reduce() of an empty dataset with no initial value")
        return 0


# --- stage programs (one picklable object per stage, run as ``program(ctx)``) --------


@dataclasses.dataclass(frozen=True)
class CollectTask:
    """Task ``k`` returns partition ``parts[k]`` (its first ``limit`` elements if set)."""

    op: Op
    parts: Sequence[int]
    limit: int | None = None

    def __call__(self, ctx: TaskContext) -> Any:
        part = self.op.compute(ctx, self.parts[ctx.index])
        return part if self.limit is None else head(part, self.limit)


@dataclasses.dataclass(frozen=True)
class PartialTask:
    """Task ``k`` returns the partial aggregate of partition ``parts[k]``."""

    op: Op
    aggregate: Aggregate
    parts: range

    def __call__(self, ctx: TaskContext) -> Any:
        return self.aggregate.partial(self.op.compute(ctx, self.parts[ctx.index]))


@dataclasses.dataclass(frozen=True)
class CombineTask:
    """Combines the partials named by the task's inputs."""

    aggregate: Aggregate

    def __call__(self, ctx: TaskContext) -> Any:
        return self.aggregate.combine(ctx.inputs())


@dataclasses.dataclass(frozen=True)
class ShuffleMapTask:
    """Task ``k`` splits partition ``i`` of side ``s`` (sides' tasks follow each other) and
    keeps bucket ``j`` as ``tag + (s, i, j)``; returns the ``j`` it kept.

    Empty buckets are skipped, except those of each side's partition 0, so that every
    reducer sees at least one bucket per side (and, e.g., an empty array of the right dtype).
    """

    ops: tuple[Op, ...]
    splits: tuple[Callable[[Any, int], list], ...]
    sizes: tuple[int, ...]
    n: int
    tag: tuple

    def __call__(self, ctx: TaskContext) -> tuple[int, ...]:
        side, i = 0, ctx.index
        while i >= self.sizes[side]:
            i -= self.sizes[side]
            side += 1
        buckets = self.splits[side](self.ops[side].compute(ctx, i), self.n)
        kept = tuple(j for j, b in enumerate(buckets) if i == 0 or length(b))
        for j in kept:
            ctx.put(self.tag + (side, i, j), buckets[j])
        return kept


# --- lineage: programs pickled once, and run again to rebuild lost partitions ---------


class Frozen:
    """A stage program pickled once in the driver: lineage keeps these exact bytes to run
    a task again later, unaffected by changes the notebook made to its objects since.

    Unpickled on first use in each process (inside the task: arena references are
    rebuilt at the task's epoch).
    """

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self._program: Callable[[TaskContext], Any] | None = None

    def __reduce__(self) -> tuple:
        return Frozen, (self.payload,)

    def __call__(self, ctx: TaskContext) -> Any:
        if self._program is None:
            self._program = shipping.loads(self.payload)
        return self._program(ctx)


@dataclasses.dataclass(frozen=True)
class Redo:
    """Run task ``index`` of the pickled stage program ``payload`` again; keep only ``keep``
    of the partitions it makes (``output``: where its value was kept, if anywhere)."""

    payload: bytes
    index: int
    output: PartitionKey | None
    keep: frozenset


class RecomputeTask:
    """Task ``k`` redoes ``entries[k]`` with the original task's index and inputs.

    The original program runs in a nested :class:`TaskContext`: ``put`` keeps only the
    lost partitions, and its accumulator updates are discarded (the original run
    already counted them). Replies nothing.
    """

    def __init__(self, entries: Sequence[Redo]) -> None:
        self.entries = tuple(entries)
        self._programs: dict[int, Callable[[TaskContext], Any]] = {}

    def __reduce__(self) -> tuple:
        return RecomputeTask, (self.entries,)

    def __call__(self, ctx: TaskContext) -> None:
        entry = self.entries[ctx.index]
        program = self._programs.get(id(entry.payload))
        if program is None:
            program = self._programs[id(entry.payload)] = shipping.loads(entry.payload)

        def store(key: PartitionKey, value: Any) -> int:
            if key not in entry.keep:
                return 0
            ctx.put(key, value)
            return ctx.outputs[key]

        inner = TaskContext(entry.index, ctx.input_keys, ctx.input, store)
        value = run_program(program, inner)
        if entry.output is not None and entry.output in entry.keep:
            ctx.put(entry.output, value)
