"""Accumulators (Piccolo's accumulator tables): numpy arrays that tasks update sparsely.

In the driver an :class:`Accumulator` owns a numpy array, ``acc.value``. A task
calls ``acc.add(index, values)``: the update is recorded in its
:class:`~clamor.runtime.stage.TaskContext` and shipped with the task's result;
at the stage's barrier the runner calls :func:`merge` once with the updates of
the winning attempt of every task, in task order. That is the only merge path,
so every task counts exactly once whatever the retries and speculative copies,
and the result does not depend on which worker finished first.

An accumulator pickles to a small handle (id, shape, dtype, op), never its value.

Updates made in a transformation count once per action that runs it (an action
that does not read a persisted dataset computes its transformations again, as in
Spark). Recovery does not count twice: a stage rerun because a worker was lost
merged nothing the first time, and the stages that recompute lost partitions from
lineage (runtime/data/lineage.py) discard their tasks' updates, since the original run
already counted them. (Spark, by contrast, re-applies the updates of recomputed
transformations.)
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from clamor.runtime.stage import current_task

logger = logging.getLogger("clamor.accumulators")

#: Named ops and the ufuncs that apply them.
OPS: dict[str, np.ufunc] = {"sum": np.add, "min": np.minimum, "max": np.maximum}

_ids = itertools.count(1)
_registry: weakref.WeakValueDictionary[int, Accumulator] = weakref.WeakValueDictionary()

Updates = dict[int, list[tuple[Any, Any]]]


def _identity(op: str | Callable, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The start value of an accumulator made from a shape: the op's identity (0 otherwise)."""
    if op in ("min", "max"):
        if dtype.kind == "f":
            fill = np.inf if op == "min" else -np.inf
        elif dtype.kind in "iu":
            info = np.iinfo(dtype)
            fill = info.max if op == "min" else info.min
        elif dtype.kind == "b":
            fill = op == "min"
        else:
            raise TypeError(f"a {op} accumulator needs a numeric dtype, got {dtype}")
        return np.full(shape, fill, dtype)
    return np.zeros(shape, dtype)


def _positions(shape: tuple[int, ...], index: Any) -> np.ndarray:
    """Flat (C-order) positions of ``zeros(shape)[index]``, without materialising ``shape``."""
    if not shape:
        return np.asarray(np.broadcast_to(np.intp(0), ())[index])
    strides = np.cumprod((1,) + shape[:0:-1])[::-1]
    grids = np.ogrid[tuple(slice(0, s) for s in shape)]
    total = 0
    for grid, stride in zip(grids, strides):
        total = total + np.broadcast_to(grid, shape)[index] * stride
    return np.asarray(total)


def _apply_callable(
    flat: np.ndarray, positions: np.ndarray, values: np.ndarray, op: Callable
) -> None:
    """``flat[p] = op(flat[p], v)`` for every pair, duplicates included: in rounds of
    distinct positions (the k-th occurrence of each position in round k)."""
    pos = positions.reshape(-1)
    vals = np.broadcast_to(values, positions.shape).reshape(-1)
    if not pos.size:
        return
    order = np.argsort(pos, kind="stable")
    pos, vals = pos[order], vals[order]
    n = np.arange(pos.size)
    starts = np.r_[True, pos[1:] != pos[:-1]]
    rank = n - np.maximum.accumulate(np.where(starts, n, 0))
    for r in range(int(rank.max()) + 1):
        sel = rank == r
        flat[pos[sel]] = op(flat[pos[sel]], vals[sel])


def _copied(index: Any) -> Any:
    if isinstance(index, np.ndarray):
        return index.copy()
    if isinstance(index, tuple):
        return tuple(_copied(i) for i in index)
    return index


class Accumulator:
    """A driver-side numpy array that tasks update with ``add(index, values)``.

    ``shape_or_array``: an int or tuple of ints (a shape; the start value is the op's
    identity: 0 for ``"sum"``, +inf or the largest integer for ``"min"``, -inf or the
    smallest for ``"max"``, 0 for a callable), or an array-like (its copy is the start
    value). ``op``: ``"sum"``, ``"min"``, ``"max"``, or a callable ``op(a, b) -> c`` on
    arrays, elementwise, associative and commutative (a numpy ufunc is applied with
    ``ufunc.at``). ``dtype``: default float64, or the array's.
    """

    id: int
    shape: tuple[int, ...]
    dtype: np.dtype
    op: str | Callable
    _value: np.ndarray | None
    _initial: np.ndarray | None

    def __init__(
        self, shape_or_array: Any, op: str | Callable = "sum", dtype: Any = None
    ) -> None:
        if not (callable(op) or op in OPS):
            raise ValueError(f"op must be one of {sorted(OPS)} or a callable, got {op!r}")
        if isinstance(shape_or_array, int | np.integer) or (
            isinstance(shape_or_array, tuple) and all(isinstance(s, int | np.integer) for s in shape_or_array)
        ):
            shape = (int(shape_or_array),) if np.ndim(shape_or_array) == 0 else tuple(map(int, shape_or_array))
            dtype = np.dtype(np.float64 if dtype is None else dtype)
            initial = None
            value = _identity(op, shape, dtype)
        else:
            initial = np.array(shape_or_array, dtype=dtype, order="C")
            value = initial.copy()
        self._init(next(_ids), value.shape, value.dtype, op, value)
        self._initial = initial
        _registry[self.id] = self

    def _init(self, id: int, shape: tuple, dtype: np.dtype, op: Any, value: np.ndarray | None) -> None:
        self.id, self.shape, self.dtype, self.op, self._value = id, shape, dtype, op, value
        self._initial = None

    @property
    def _ufunc(self) -> np.ufunc | None:
        return OPS.get(self.op) if isinstance(self.op, str) else self.op if isinstance(self.op, np.ufunc) else None

    # --- driver side ---

    @property
    def value(self) -> np.ndarray:
        """The accumulated array itself (not a copy: later stages update it in place)."""
        if self._value is None:
            raise RuntimeError(f"accumulator {self.id} has no value in this process (only the driver has)")
        return self._value

    def reset(self) -> None:
        """Back to the start value."""
        value = self.value
        value[...] = _identity(self.op, self.shape, self.dtype) if self._initial is None else self._initial

    def _apply(self, index: Any, values: Any) -> None:
        ufunc = self._ufunc
        if ufunc is not None:
            # An unpickled array's dtype is an equal copy, not numpy's own instance, and
            # ufunc.at then takes its slow path (15x on a task's 5,000 updates).
            ufunc.at(self.value, index, np.asarray(values, dtype=self.dtype))
        else:
            _apply_callable(self.value.reshape(-1), _positions(self.shape, index), np.asarray(values), self.op)

    # --- in tasks ---

    def add(self, index: Any, values: Any) -> None:
        """Combine ``values`` into ``value[index]`` with the op (numpy indexing: an int, a
        slice, an int array with repeats allowed, a tuple of them; ``values`` broadcast).

        In a task the update is recorded and merged at the barrier. Outside a task (in
        the driver) it applies at once, e.g. to initialise or in tests.
        """
        index, values = self._check(index, values)
        ctx = current_task()
        if ctx is not None:  # copies: the task may reuse its buffers before the update ships
            ctx.accumulate(self.id, _copied(index), values.copy())
        elif self._value is not None:
            self._apply(index, values)
        else:
            raise RuntimeError("Accumulator.add outside a task needs the driver's accumulator")

    def _check(self, index: Any, values: Any) -> tuple[Any, np.ndarray]:
        """Validate in the task (a bad index fails there, not at the barrier); cheap: a
        zero-stride stand-in of the accumulator is indexed, never the real array."""
        if isinstance(index, list):
            index = np.asarray(index)
        values = np.asarray(values)
        if not np.can_cast(values.dtype, self.dtype, "same_kind"):
            raise TypeError(f"cannot add {values.dtype} values to a {self.dtype} accumulator")
        target = np.broadcast_to(np.zeros((), np.uint8), self.shape)[index]
        np.broadcast_to(values, np.shape(target))  # ValueError if the shapes do not fit
        return index, values.astype(self.dtype, copy=False)

    # --- pickling: a handle ---

    def __reduce__(self) -> tuple:
        return _handle, (self.id, self.shape, self.dtype, self.op)

    def __repr__(self) -> str:
        op = self.op if isinstance(self.op, str) else getattr(self.op, "__name__", repr(self.op))
        where = "" if self._value is not None else " handle"
        return f"<Accumulator{where} {self.id} {op} {self.shape} {self.dtype}>"


def _handle(id: int, shape: tuple, dtype: np.dtype, op: Any) -> Accumulator:
    """Unpickle: the driver's own accumulator if this is its process, else a handle."""
    acc = _registry.get(id)
    if acc is not None and acc.shape == shape and acc.dtype == dtype:
        return acc
    handle = Accumulator.__new__(Accumulator)
    handle._init(id, shape, dtype, op, None)
    return handle


def merge(updates_by_task: Iterable[Updates]) -> None:
    """Apply the updates of a stage's tasks, task by task in the order given (runners
    pass the winning attempt of each task index, in index order, once at the barrier).
    Updates for an accumulator that no longer exists are ignored with a warning."""
    for updates in updates_by_task:
        for acc_id, pairs in (updates or {}).items():
            acc = _registry.get(acc_id)
            if acc is None or acc._value is None:
                logger.warning("ignoring %d update(s) of unknown accumulator %d", len(pairs), acc_id)
                continue
            for index, values in pairs:
                acc._apply(index, values)
