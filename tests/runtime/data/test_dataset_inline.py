"""Datasets on the in-process runner: every operation, its edge cases, and the stages it runs.

The InlineRunner pickles each stage's program and every partition, and spreads
tasks over two simulated workers, so what passes here is what the real cluster
is asked to do (tests/runtime/data/test_datasets_cluster.py runs the same on processes).
"""

from __future__ import annotations

import gc
import io
import os
import subprocess
import sys
import threading

import fsspec
import numpy as np
import pytest
from clamor.runtime.data import ops, plan
from clamor.runtime.data.inline import InlineRunner
from clamor.runtime.errors import SerializationError
from clamor.runtime.net import shipping
from clamor.runtime.stage import DRIVER

import clamor


@pytest.fixture
def runner() -> InlineRunner:
    return InlineRunner(workers=2)


def partitions(ds) -> list:
    """Each partition's value, as the tasks see it."""
    return ds.map_partitions(lambda p: [p]).collect()


def tasks_per_stage(runner: InlineRunner) -> list[int]:
    return [len(s.tasks) for s in runner.stages]


def leftovers(runner: InlineRunner) -> set:
    """Keys an action left behind (persisted and parallelize data are meant to stay)."""
    return {k for k in runner.held() if k[0] not in ("ds", "par")}


# --- sources ---------------------------------------------------------------------------


def test_parallelize_a_list_cuts_contiguous_partitions(runner):
    ds = runner.parallelize(list("abcdefg"), partitions=3)
    assert ds.num_partitions == 3
    assert partitions(ds) == [list("ab"), list("cd"), list("efg")]
    assert ds.collect() == list("abcdefg")


def test_default_partitions_are_two_per_worker_but_never_more_than_elements(runner):
    assert runner.parallelize(range(100)).num_partitions == 4
    assert runner.parallelize([1, 2, 3]).num_partitions == 3
    assert runner.parallelize([]).num_partitions == 1
    with pytest.raises(ValueError, match="positive integer"):
        runner.parallelize([1], partitions=0)


def test_parallelize_an_array_gives_array_slices_and_collect_concatenates(runner):
    x = np.arange(30.0).reshape(10, 3)
    ds = runner.parallelize(x, partitions=4)
    parts = partitions(ds)
    assert [type(p) for p in parts] == [np.ndarray] * 4
    assert [len(p) for p in parts] == [2, 3, 2, 3]
    out = ds.collect()
    assert isinstance(out, np.ndarray) and np.array_equal(out, x)


def test_an_arena_array_is_shipped_by_reference_not_by_value(runner):
    x = clamor.array((1 << 17, 2), np.float64)  # 2 MiB
    x[:] = np.arange(x.size).reshape(x.shape)
    ds = runner.parallelize(x, partitions=4)
    assert len(shipping.pack_task(ops.CollectTask(ds._node.op, range(4)))) < 2000
    assert np.array_equal(ds.sum(), x.sum(axis=0))


def test_large_driver_data_goes_to_the_driver_store_and_is_dropped_with_the_dataset(runner):
    x = np.random.default_rng(0).random((300_000,))  # 2.4 MiB, not in the arena
    ds = runner.parallelize(x, partitions=3)
    keys = [("par", ds.id, i) for i in range(3)]
    assert [runner.holder(k) for k in keys] == [DRIVER] * 3
    assert ds.map(lambda v: v * 2).count() == len(x)
    assert len(shipping.dumps(runner.stages[-2].program)) < 2000  # the partials stage
    assert np.array_equal(ds.collect(), x)
    derived = ds.map_partitions(lambda p: p + 1)
    del ds
    gc.collect()
    assert np.array_equal(derived.collect(), x + 1)  # the plan node still needs the data
    del derived
    gc.collect()
    assert not runner.held()


def test_range_partitions_are_range_objects(runner):
    ds = runner.range(10, partitions=3)
    assert partitions(ds) == [range(3), range(3, 6), range(6, 10)]
    assert runner.range(5, 20, 5).collect() == [5, 10, 15]
    assert runner.parallelize(range(7), partitions=2).collect() == list(range(7))
    assert runner.range(1000, partitions=7).sum() == sum(range(1000))


# --- narrow transformations --------------------------------------------------------------


def test_map_filter_flat_map_make_lists(runner):
    ds = runner.parallelize(np.arange(6), partitions=2)
    assert ds.map(lambda x: int(x) * 10).collect() == [0, 10, 20, 30, 40, 50]
    assert ds.filter(lambda x: x % 2).collect() == [1, 3, 5]
    assert ds.flat_map(lambda x: [int(x)] * int(x)).collect() == [1, 2, 2, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 5]
    assert all(isinstance(p, list) for p in partitions(ds.map(lambda x: x)))


def test_map_partitions_keeps_arrays_and_turns_iterators_into_lists(runner):
    ds = runner.parallelize(np.arange(8.0), partitions=2)
    doubled = ds.map_partitions(lambda a: a * 2)
    assert [type(p) for p in partitions(doubled)] == [np.ndarray, np.ndarray]
    assert np.array_equal(doubled.collect(), np.arange(8.0) * 2)
    gen = ds.map_partitions(lambda a: (float(v) + 1 for v in a))
    assert partitions(gen) == [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]


def test_a_chain_of_narrow_steps_is_one_stage_with_one_task_per_partition(runner):
    ds = (
        runner.parallelize(range(100), partitions=5)
        .map(lambda x: x + 1)
        .filter(lambda x: x % 3 == 0)
        .flat_map(lambda x: (x, -x))
        .map_partitions(lambda p: sorted(p))
    )
    expected = [y for x in range(1, 101) if x % 3 == 0 for y in (x, -x)]
    runner.stages.clear()
    assert sorted(ds.collect()) == sorted(expected)
    assert tasks_per_stage(runner) == [5]
    fused = runner.stages[0].program.op
    assert isinstance(fused, ops.Pipeline) and len(fused.fns) == 4


def test_zip_pairs_elements_of_co_partitioned_datasets(runner):
    a = runner.parallelize(range(6), partitions=2)
    b = a.map(lambda x: x * x)
    assert a.zip(b).collect() == [(x, x * x) for x in range(6)]
    arrays = runner.parallelize(np.arange(4), partitions=2)
    assert arrays.zip(arrays).map(lambda p: int(p[0] + p[1])).collect() == [0, 2, 4, 6]
    runner.stages.clear()
    a.zip(b).map(lambda p: p[0] + p[1]).count()
    assert tasks_per_stage(runner)[0] == 2  # zip fuses too


def test_zip_refuses_different_partition_counts_and_lengths(runner):
    a = runner.parallelize(range(6), partitions=2)
    with pytest.raises(ValueError, match="2 and 3"):
        a.zip(runner.parallelize(range(6), partitions=3))
    shorter = a.filter(lambda x: x != 4)
    with pytest.raises(ValueError, match="partition 1 has 3 elements on the left and 2 on the right"):
        a.zip(shorter).collect()
    assert leftovers(runner) == set()


# --- shuffles ------------------------------------------------------------------------------


def reference_join(left, right):
    return sorted((k, (v, w)) for k, v in left for k2, w in right if k == k2)


def test_join_is_an_inner_join_with_every_match(runner):
    left = [(i % 5, i) for i in range(20)] + [("only-left", 0)]
    right = [(k, f"w{k}") for k in range(3)] + [(1, "again"), ("only-right", 1)]
    ds = runner.parallelize(left, partitions=3).join(runner.parallelize(right, partitions=2))
    assert ds.num_partitions == 3
    assert sorted(ds.collect(), key=repr) == sorted(reference_join(left, right), key=repr)
    assert runner.parallelize(left, 3).join(runner.parallelize(right, 2), partitions=7).num_partitions == 7


def test_join_runs_a_map_stage_then_a_reduce_stage_and_cleans_up(runner):
    left = runner.parallelize([(i, i) for i in range(10)], partitions=4)
    right = runner.parallelize([(i, -i) for i in range(0, 10, 2)], partitions=2)
    runner.stages.clear()
    assert sorted(left.join(right).collect()) == [(i, (i, -i)) for i in range(0, 10, 2)]
    assert tasks_per_stage(runner) == [6, 4]  # 4 + 2 map tasks, then 4 reducers
    assert leftovers(runner) == set()


def test_join_buckets_agree_between_processes_whatever_the_hash_seed():
    code = "from clamor.runtime.data.ops import stable_hash; print(stable_hash(('key', 1.0, b'x')))"
    seen = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={**os.environ, "PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        for seed in ("1", "2")
    }
    assert len(seen) == 1
    assert ops.stable_hash(1) == ops.stable_hash(1.0) == ops.stable_hash(np.int64(1)) == ops.stable_hash(True)


def test_join_with_no_common_keys_is_empty(runner):
    a = runner.parallelize([(1, "a")], 1)
    b = runner.parallelize([(2, "b")], 1)
    assert a.join(b).collect() == []
    assert a.join(b).count() == 0


def test_lookup_gives_the_values_of_each_key_and_an_empty_list_when_absent(runner):
    table = runner.parallelize([("a", 1), ("b", 2), ("a", 3), ("c", 4)], partitions=2)
    found = table.lookup(["a", "zzz", "c", "a"]).collect()
    assert sorted(found) == [("a", [1, 3]), ("a", [1, 3]), ("c", [4]), ("zzz", [])]
    keys = runner.parallelize(["b", "c"], partitions=2)
    assert dict(table.lookup(keys).collect()) == {"b": [2], "c": [4]}
    assert table.lookup([]).collect() == []


def test_repartition_gives_each_output_a_slice_of_every_input_partition(runner):
    x = np.arange(40).reshape(20, 2)
    ds = runner.parallelize(x, partitions=3).repartition(5)
    assert ds.num_partitions == 5
    parts = partitions(ds)
    assert all(isinstance(p, np.ndarray) and p.dtype == x.dtype and p.shape[1:] == (2,) for p in parts)
    inputs = np.array_split(x, [6, 13])  # the 3 input partitions: 6, 7 and 7 rows
    for j, part in enumerate(parts):
        expected = [p[len(p) * j // 5 : len(p) * (j + 1) // 5] for p in inputs]
        assert np.array_equal(part, np.concatenate(expected))
    assert sorted(map(tuple, ds.collect())) == sorted(map(tuple, x))
    assert runner.parallelize(range(10), partitions=4).repartition(1).collect() == list(range(10))


def test_repartition_into_more_partitions_than_elements_gives_typed_empty_partitions(runner):
    ds = runner.parallelize(np.arange(3.0), partitions=2).repartition(8)
    parts = partitions(ds)
    assert sum(len(p) for p in parts) == 3 and any(len(p) == 0 for p in parts)
    assert all(isinstance(p, np.ndarray) and p.dtype == np.float64 for p in parts)
    assert np.array_equal(np.sort(ds.collect()), np.arange(3.0))


def test_empty_buckets_are_not_kept(runner):
    ds = runner.parallelize([(1, "x")] * 6, partitions=3).join(runner.parallelize([(1, "y")], 1), partitions=8)
    runner.stages.clear()
    real_put = runner._storer
    kept = []

    def counting(worker):
        store = real_put(worker)

        def put(key, value):
            kept.append(key)
            return store(key, value)

        return put

    runner._storer = counting
    assert ds.count() == 6
    buckets = [k for k in kept if k[0] == "shuffle"]
    # partition 0 of each side keeps all 8 buckets; the other two left partitions keep one each
    assert len(buckets) == 8 + 8 + 2


def test_shuffles_chain(runner):
    pairs = runner.parallelize([(i % 4, i) for i in range(40)], partitions=5)
    names = runner.parallelize([(k, f"n{k}") for k in range(4)], partitions=2)
    joined = pairs.join(names).map(lambda kv: (kv[1][1], kv[1][0]))
    again = joined.join(runner.parallelize([("n1", "one")], 1)).repartition(2)
    assert sorted(again.collect()) == [("n1", (i, "one")) for i in range(1, 40, 4)]
    assert leftovers(runner) == set()


# --- actions ---------------------------------------------------------------------------------


def test_reduce_sum_count(runner):
    ds = runner.parallelize(list(range(1, 11)), partitions=4)
    assert ds.reduce(max) == 10
    assert ds.sum() == 55
    assert ds.count() == 10
    arrays = runner.parallelize(np.arange(12.0).reshape(6, 2), partitions=4)
    assert np.array_equal(arrays.sum(), [30.0, 36.0])
    assert arrays.count() == 6
    assert runner.range(2000, partitions=2000).count() == 2000


def test_aggregation_is_a_tree_over_the_workers(runner):
    runner.stages.clear()
    assert runner.range(80, partitions=8).sum() == sum(range(80))
    partials, per_worker, final = runner.stages
    assert [(t.reply, t.output is not None) for t in partials.tasks] == [(False, True)] * 8
    # one combine task per worker, pinned there, merging the partials that worker computed
    # (the inline runner puts task i on worker i % 2)
    outputs = [t.output for t in partials.tasks]
    assert [(t.worker, t.inputs, t.reply) for t in per_worker.tasks] == [
        (0, tuple(outputs[0::2]), False),
        (1, tuple(outputs[1::2]), False),
    ]
    assert [(t.inputs, t.reply) for t in final.tasks] == [(tuple(t.output for t in per_worker.tasks), True)]
    assert leftovers(runner) == set()


def test_combine_tasks_run_where_their_inputs_are():
    class Recording(InlineRunner):
        def execute(self, stage):
            if "combine" in stage.name:  # inputs' holders, seen as the stage is submitted
                self.holders.append([{self.holder(k) for k in t.inputs} for t in stage.tasks])
                self.pinned.append([t.worker for t in stage.tasks])
            return super().execute(stage)

    rec = Recording(workers=3)
    rec.holders, rec.pinned = [], []
    assert rec.range(90, partitions=9).count() == 90
    # first each worker merges the partials it holds; then pairs, on the first one's worker
    assert rec.holders[0] == [{0}, {1}, {2}] and rec.pinned[0] == [0, 1, 2]
    assert rec.holders[1] == [{0, 1}] and rec.pinned[1] == [0]  # worker 2's carried over
    assert rec.holders[2] == [{0, 2}] and rec.pinned[2] == [0]


def test_pairwise_rounds_with_a_configurable_fan_in(monkeypatch):
    runner = InlineRunner(workers=5)
    runner.stages.clear()
    assert runner.range(50, partitions=10).sum() == sum(range(50))
    assert tasks_per_stage(runner) == [10, 5, 2, 1, 1]  # 5 workers, then pairs: 5 -> 3 -> 2 -> 1
    monkeypatch.setattr(plan, "FAN_IN", 4)
    runner.stages.clear()
    assert runner.range(50, partitions=10).sum() == sum(range(50))
    assert tasks_per_stage(runner) == [10, 5, 1, 1]  # 5 -> (4 merged, 1 carried over) -> 1


def test_one_partition_replies_directly(runner):
    runner.stages.clear()
    assert runner.parallelize([1, 2, 3], partitions=1).sum() == 6
    assert tasks_per_stage(runner) == [1]


def test_empty_datasets_and_empty_partitions(runner):
    empty = runner.parallelize([])
    assert empty.collect() == [] and empty.count() == 0 and empty.sum() == 0
    assert empty.take(3) == []
    with pytest.raises(ValueError, match="empty dataset"):
        empty.reduce(lambda a, b: a + b)
    sparse = runner.parallelize([1, 2], partitions=5)  # three empty partitions
    assert partitions(sparse).count([]) == 3
    assert sparse.reduce(lambda a, b: a * b) == 2
    assert sparse.map(lambda x: x + 1).sum() == 5
    with pytest.raises(ValueError, match="empty dataset"):
        sparse.filter(lambda x: x > 5).reduce(max)
    assert runner.parallelize(np.zeros((0, 3)), partitions=2).sum().shape == (3,)


def test_take_returns_the_first_elements_and_everything_when_too_few(runner):
    ds = runner.parallelize(list(range(10)), partitions=4)
    assert ds.take(3) == [0, 1, 2]
    assert ds.take(100) == list(range(10))
    runner.stages.clear()
    assert ds.take(0) == []
    assert runner.stages == []
    arrays = runner.parallelize(np.arange(10.0), partitions=3)
    assert np.array_equal(arrays.take(4), [0.0, 1.0, 2.0, 3.0])


def test_take_runs_one_partition_then_grows_and_never_the_whole_dataset(runner):
    ds = runner.range(1000, partitions=100)
    runner.stages.clear()
    assert ds.take(5) == [0, 1, 2, 3, 4]
    assert tasks_per_stage(runner) == [1]
    runner.stages.clear()
    rare = ds.filter(lambda x: x >= 200)  # the first 20 partitions hold nothing
    assert rare.take(3) == [200, 201, 202]
    assert tasks_per_stage(runner) == [1, 4, 20]  # ×4 the partitions scanned while nothing is found


def test_take_estimates_how_many_more_partitions_it_needs(runner):
    ds = runner.range(1000, partitions=100).filter(lambda x: x % 10 == 0)  # 1 element per partition
    runner.stages.clear()
    assert ds.take(6) == [0, 10, 20, 30, 40, 50]
    assert sum(tasks_per_stage(runner)) < 12


# --- persistence ------------------------------------------------------------------------


def counter(runner):
    calls = runner.accumulator((), dtype=np.int64)

    def counted(x):
        calls.add((), 1)
        return x * 2

    return calls, counted


def test_persist_computes_once_and_later_actions_read_the_kept_partitions(runner):
    calls, counted = counter(runner)
    ds = runner.parallelize(range(20), partitions=4).map(counted).persist()
    assert ds.locations() == [None] * 4
    assert ds.sum() == 380
    assert int(calls.value) == 20
    assert set(ds.locations()) <= {0, 1} and None not in ds.locations()
    assert ds.count() == 20 and ds.map(lambda x: x + 1).collect() == [2 * x + 1 for x in range(20)]
    assert int(calls.value) == 20  # not recomputed
    assert runner.stages[-1].tasks[0].inputs == (("ds", ds.id, 0),)
    ds.unpersist()
    assert not any(k[0] == "ds" for k in runner.held())
    assert ds.count() == 20 and int(calls.value) == 40


def test_an_intermediate_persisted_dataset_is_kept_by_the_action_that_computes_it(runner):
    calls, counted = counter(runner)
    base = runner.parallelize(range(10), partitions=2).map(counted).persist()
    assert base.map(lambda x: x + 1).filter(lambda x: x > 5).count() == 7
    assert base.collect() == [2 * x for x in range(10)]
    assert int(calls.value) == 10


def test_take_keeps_only_the_partitions_it_computed_and_collect_fills_in_the_rest(runner):
    calls, counted = counter(runner)
    ds = runner.range(100, partitions=10).map(counted).persist()
    assert ds.take(2) == [0, 2]
    assert int(calls.value) == 10 and ds.locations()[1:] == [None] * 9
    assert ds.collect() == [2 * x for x in range(100)]
    assert int(calls.value) == 100


def test_persisted_partitions_are_dropped_when_the_dataset_is_collected(runner):
    ds = runner.range(10, partitions=2).map(lambda x: x).persist()
    ds.count()
    assert {k for k in runner.held() if k[0] == "ds"} == {("ds", ds.id, 0), ("ds", ds.id, 1)}
    del ds
    gc.collect()
    assert not runner.held()


def test_lost_persisted_partitions_are_recomputed(runner):
    calls, counted = counter(runner)
    ds = runner.range(8, partitions=4).map(counted).persist()
    ds.count()
    runner.lose(worker=1)
    assert ds.collect() == [2 * x for x in range(8)]
    assert int(calls.value) == 8  # the two partitions worker 1 held were computed again,
    assert runner.tasks_recomputed == 2  # but recomputation does not count accumulator updates twice


def test_a_persisted_dataset_behind_a_shuffle_is_kept_by_the_map_stage(runner):
    calls, counted = counter(runner)
    pairs = runner.range(12, partitions=3).map(counted).map(lambda x: (x % 3, x)).persist()
    assert pairs.join(pairs).count() == 48
    assert pairs.count() == 12 and int(calls.value) == 12


# --- failures -----------------------------------------------------------------------------


def test_a_task_error_arrives_as_its_type_and_leaves_nothing_behind(runner):
    ds = runner.range(10, partitions=5)
    boom = ds.map(lambda x: 1 // (x - 7))
    with pytest.raises(ZeroDivisionError):
        boom.sum()
    with pytest.raises(ZeroDivisionError):
        runner.parallelize([(1, 0)], 1).join(boom.map(lambda x: (x, x))).collect()
    persisted = boom.persist()
    with pytest.raises(ZeroDivisionError):
        persisted.collect()
    assert runner.held() == set()  # no buckets, partials, nor half of a persisted dataset
    assert ds.sum() == 45


def test_an_unpicklable_closure_fails_at_submission_naming_it(runner):
    lock = threading.Lock()
    with pytest.raises(SerializationError, match="lock"):
        runner.range(4).map(lambda x: (lock, x)).collect()


# --- files (fsspec memory:// here; real files in the cluster tests) ------------------------


@pytest.fixture
def memfs():
    fs = fsspec.filesystem("memory")
    root = f"/clamor-test-{os.getpid()}-{id(fs)}"
    yield fs, root
    if fs.exists(root):
        fs.rm(root, recursive=True)


def write(fs, path: str, data: bytes) -> str:
    with fs.open(path, "wb") as f:
        f.write(data)
    return "memory://" + path


@pytest.mark.parametrize("n", [1, 2, 3, 7, 40])
def test_read_text_gives_every_line_once_in_order(runner, memfs, n):
    fs, root = memfs
    texts = [b"alpha\nbeta\r\n\ngamma delta\n", b"", b"no final newline\nlast", b"x\n" * 5]
    for i, t in enumerate(texts):
        write(fs, f"{root}/part-{i}.txt", t)
    ds = runner.read_text(f"memory://{root}/part-*.txt", partitions=n)
    expected = [line.rstrip("\r") for t in texts for line in t.decode().splitlines()]
    assert ds.num_partitions == n
    assert ds.collect() == expected
    assert ds.count() == len(expected)


def test_read_text_of_a_directory_and_of_an_empty_file(runner, memfs):
    fs, root = memfs
    write(fs, f"{root}/d/a", b"1\n2\n")
    write(fs, f"{root}/d/b", b"3\n")
    assert runner.read_text(f"memory://{root}/d").collect() == ["1", "2", "3"]
    empty = write(fs, f"{root}/empty.txt", b"")
    assert runner.read_text(empty, partitions=3).collect() == []


def test_a_missing_file_fails_at_the_call_before_any_stage(runner, memfs):
    _, root = memfs
    for read in (runner.read_text, runner.read_npy):
        with pytest.raises(FileNotFoundError, match=f"memory://{root}/nope"):
            read(f"memory://{root}/nope*")
    assert runner.stages == []


def npy_bytes(x: np.ndarray, version=None) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, x, version=version)
    return buf.getvalue()


@pytest.mark.parametrize("version", [(1, 0), (2, 0)])
def test_read_npy_reads_row_ranges(runner, memfs, version):
    fs, root = memfs
    x = np.arange(77 * 3, dtype=np.int32).reshape(77, 3)
    url = write(fs, f"{root}/x.npy", npy_bytes(x, version))
    ds = runner.read_npy(url, partitions=5)
    parts = partitions(ds)
    assert [len(p) for p in parts] == [15, 15, 16, 15, 16]
    assert all(p.dtype == np.int32 and p.flags.writeable for p in parts)
    assert np.array_equal(ds.collect(), x)
    assert runner.read_npy(url, partitions=100).count() == 77


def test_read_npy_of_records_and_of_an_empty_array(runner, memfs):
    fs, root = memfs
    rec = np.array([(1, 2.5), (3, 4.5), (5, 6.5)], dtype=[("a", "<i8"), ("b", "<f4")])
    assert np.array_equal(runner.read_npy(write(fs, f"{root}/r.npy", npy_bytes(rec)), 2).collect(), rec)
    empty = runner.read_npy(write(fs, f"{root}/e.npy", npy_bytes(np.zeros((0, 4)))))
    assert empty.collect().shape == (0, 4)


def test_read_npy_refuses_what_it_cannot_read_by_rows(runner, memfs):
    fs, root = memfs
    with pytest.raises(ValueError, match="not a readable .npy"):
        runner.read_npy(write(fs, f"{root}/bad.npy", b"not numpy at all"))
    with pytest.raises(ValueError, match="Fortran"):
        runner.read_npy(write(fs, f"{root}/f.npy", npy_bytes(np.asfortranarray(np.ones((3, 2))))))
    with pytest.raises(ValueError, match="truncated"):
        runner.read_npy(write(fs, f"{root}/t.npy", npy_bytes(np.ones(100))[:-8]))
    with pytest.raises(ValueError, match="objects"):
        runner.read_npy(write(fs, f"{root}/o.npy", npy_bytes(np.array([{}, None], dtype=object))))
