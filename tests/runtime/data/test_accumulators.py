"""Accumulators: sparse updates from tasks, merged once per task at the barrier."""

from __future__ import annotations

import gc
import logging
import pickle

import numpy as np
import pytest
from clamor.runtime.data import accumulators
from clamor.runtime.data.accumulators import Accumulator, merge
from clamor.runtime.data.inline import InlineRunner
from clamor.runtime.net import shipping
from clamor.runtime.stage import StageSpec, TaskContext, TaskSpec, run_program


def in_task(fn, index: int = 0) -> dict:
    """Run ``fn()`` as if in task ``index``; return the accumulator updates it recorded."""
    ctx = TaskContext(index, (), lambda k: None, lambda k, v: 0)
    run_program(lambda _: fn(), ctx)
    return ctx.accumulator_updates


def test_start_values_follow_the_op():
    assert np.array_equal(Accumulator(3).value, [0.0, 0.0, 0.0])
    assert Accumulator((2, 2)).value.shape == (2, 2)
    assert np.all(Accumulator(2, op="min").value == np.inf)
    assert np.all(Accumulator(2, op="max", dtype=np.int32).value == np.iinfo(np.int32).min)
    given = np.array([1, 2, 3])
    acc = Accumulator(given)
    assert acc.dtype == given.dtype and np.array_equal(acc.value, given)
    acc.add(0, 5)
    assert given[0] == 1  # the given array is copied
    with pytest.raises(ValueError, match="op must be"):
        Accumulator(3, op="mean")


def test_updates_in_a_task_are_recorded_not_applied_until_merge():
    acc = Accumulator(5)
    updates = in_task(lambda: (acc.add(1, 2.0), acc.add([1, 3], [1.0, 1.0])))
    assert np.all(acc.value == 0)
    assert list(updates) == [acc.id]
    merge([updates])
    assert np.array_equal(acc.value, [0, 3, 0, 1, 0])


def test_repeated_indices_are_all_combined_like_ufunc_at():
    rng = np.random.default_rng(1)
    idx = rng.integers(0, 20, 500)
    vals = rng.normal(size=500)
    for op, ufunc in [("sum", np.add), ("min", np.minimum), ("max", np.maximum)]:
        acc = Accumulator(20, op=op)
        merge([in_task(lambda acc=acc: acc.add(idx, vals))])
        expected = Accumulator(20, op=op).value.copy()
        ufunc.at(expected, idx, vals)
        assert np.array_equal(acc.value, expected), op


def test_a_callable_op_sees_every_duplicate():
    def mul(a, b):
        return a * b

    acc = Accumulator(np.ones(4, dtype=np.int64), op=mul)
    merge([in_task(lambda: acc.add([1, 1, 1, 3, 0], [2, 3, 5, 7, 11]))])
    assert np.array_equal(acc.value, [11, 30, 1, 7])
    gcd = Accumulator(np.array([0, 0, 0]), op=np.gcd)  # a ufunc: applied with ufunc.at
    gcd.add([0, 0, 2], [12, 18, 5])
    assert np.array_equal(gcd.value, [6, 0, 5])


def test_multi_dimensional_indices_and_broadcast_values():
    def plus(a, b):
        return a + b

    for op in ("sum", plus):
        acc = Accumulator((3, 4), op=op)
        acc.add((np.array([0, 2, 0]), np.array([1, 3, 1])), 1.0)
        acc.add(1, np.arange(4.0))
        acc.add((slice(None), 0), 10.0)
        expected = np.zeros((3, 4))
        np.add.at(expected, (np.array([0, 2, 0]), np.array([1, 3, 1])), 1.0)
        expected[1] += np.arange(4.0)
        expected[:, 0] += 10
        assert np.array_equal(acc.value, expected), op


def test_a_scalar_accumulator_counts():
    acc = Accumulator((), dtype=np.int64)
    merge([in_task(lambda: [acc.add((), 1) for _ in range(3)]), in_task(lambda: acc.add((), 4))])
    assert int(acc.value) == 7


def test_bad_updates_fail_in_the_task_not_at_the_barrier():
    acc = Accumulator((10, 2))
    with pytest.raises(IndexError):
        in_task(lambda: acc.add(np.array([3, 10]), 1.0))
    with pytest.raises(ValueError):
        in_task(lambda: acc.add(slice(0, 3), np.ones(3)))  # (3, 2) target
    with pytest.raises(TypeError, match="float64 values to a int64"):
        Accumulator(3, dtype=np.int64).add(0, 1.5)


def test_merge_applies_tasks_in_the_order_given_once_each():
    acc = Accumulator(np.zeros(1), op=lambda a, b: a * 10 + b)  # order-sensitive on purpose
    first = in_task(lambda: acc.add(0, 1.0), index=0)
    second = in_task(lambda: acc.add(0, 2.0), index=1)
    merge([first, second])
    assert acc.value[0] == 12.0


def test_an_accumulator_pickles_to_a_small_handle():
    acc = Accumulator(1_000_000)
    data = shipping.dumps(acc)
    assert len(data) < 500
    assert pickle.loads(data) is acc  # in the driver's own process: the accumulator itself
    handle = accumulators._handle(10**9, (4,), np.dtype(np.float64), "sum")
    assert "handle" in repr(handle)
    with pytest.raises(RuntimeError, match="only the driver"):
        _ = handle.value
    with pytest.raises(RuntimeError, match="outside a task"):
        handle.add(0, 1.0)
    assert in_task(lambda: handle.add(0, 1.0)) == {10**9: [(0, np.float64(1.0))]}


def test_updates_of_a_collected_accumulator_are_ignored_with_a_warning(caplog):
    def updates_of_a_temporary_accumulator() -> dict:
        acc = Accumulator(2)
        return in_task(lambda: acc.add(0, 1.0))

    updates = updates_of_a_temporary_accumulator()
    gc.collect()
    with caplog.at_level(logging.WARNING, logger="clamor.accumulators"):
        merge([updates])
    assert "unknown accumulator" in caplog.text


def test_reset_restores_the_start_value():
    acc = Accumulator(np.array([5.0, 5.0]), op="min")
    acc.add(0, 1.0)
    acc.reset()
    assert np.array_equal(acc.value, [5.0, 5.0])
    from_shape = Accumulator(2, op="max")
    from_shape.add(1, 3.0)
    from_shape.reset()
    assert np.all(from_shape.value == -np.inf)


# --- through a runner ------------------------------------------------------------------


def test_tasks_of_a_stage_accumulate_exactly_once():
    runner = InlineRunner()
    hist = runner.accumulator(10, dtype=np.int64)
    data = np.random.default_rng(2).integers(0, 10, 1000)
    runner.parallelize(data, partitions=7).map_partitions(lambda p: hist.add(p, 1) or [p]).count()
    assert np.array_equal(hist.value, np.bincount(data, minlength=10))


def test_a_failed_stage_merges_nothing():
    runner = InlineRunner()
    acc = runner.accumulator(1)

    def touch(ctx):
        acc.add(0, 1.0)
        if ctx.index == 2:
            raise KeyError("task 2 fails")

    with pytest.raises(KeyError):
        runner.execute(StageSpec(touch, [TaskSpec(i) for i in range(4)]))
    assert acc.value[0] == 0.0
    runner.execute(StageSpec(lambda ctx: acc.add(0, 1.0), [TaskSpec(i) for i in range(4)]))
    assert acc.value[0] == 4.0


def test_an_update_is_a_snapshot_of_the_task_buffers():
    acc = Accumulator(3)
    index, values = np.array([0, 1]), np.ones(2)

    def reuse_buffers():
        acc.add(index, values)
        index[:] = 2
        values[:] = 10.0
        acc.add(index, values)

    merge([in_task(reuse_buffers)])
    assert np.array_equal(acc.value, [1.0, 1.0, 20.0])
