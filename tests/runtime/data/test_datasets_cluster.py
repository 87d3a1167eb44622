"""Datasets on a real cluster: worker processes, partitions kept and moved between them.

The same operations as tests/runtime/data/test_dataset_inline.py, now through
``Cluster.execute``: shuffle buckets travel worker to worker, persisted
partitions stay where they were computed, big ``parallelize`` data is fetched
from the driver, arena arrays are paged in.
"""

from __future__ import annotations

import numpy as np
import pytest
from clamor.runtime.stage import DRIVER

import clamor


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=2) as c:
        yield c


def test_narrow_steps_and_actions(cluster):
    ds = cluster.parallelize(list(range(100)), partitions=6)
    chain = ds.map(lambda x: x * 3).filter(lambda x: x % 2 == 0).flat_map(lambda x: (x, x + 1))
    expected = [y for x in range(100) if (3 * x) % 2 == 0 for y in (3 * x, 3 * x + 1)]
    assert chain.collect() == expected
    assert chain.count() == len(expected)
    assert chain.sum() == sum(expected)
    assert chain.reduce(max) == max(expected)
    assert ds.zip(ds.map(str)).take(3) == [(0, "0"), (1, "1"), (2, "2")]


def test_a_2000_task_stage(cluster):
    assert cluster.range(2000, partitions=2000).count() == 2000


def test_a_stage_over_an_empty_dataset(cluster):
    empty = cluster.parallelize([])
    assert empty.collect() == [] and empty.count() == 0 and empty.sum() == 0
    with pytest.raises(ValueError, match="empty dataset"):
        cluster.parallelize([1, 2, 3], partitions=5).filter(lambda x: x > 9).reduce(max)


def test_arrays_arena_arrays_and_big_driver_data(cluster):
    arena = clamor.array((1 << 16, 4), np.float64)  # 2 MiB, paged in by the workers
    arena[:] = np.arange(arena.size).reshape(arena.shape)
    heap = np.random.default_rng(0).integers(0, 1000, (200_000, 2)).astype(np.float64)  # 3 MiB
    for x in (arena, heap):  # integer values: sums are exact in any order
        ds = cluster.parallelize(x, partitions=5)
        assert cluster.holder(("par", ds.id, 0)) == (None if x is arena else DRIVER)
        assert np.array_equal(ds.sum(), x.sum(axis=0))
        assert np.array_equal(ds.map_partitions(lambda p: p * 2).collect(), x * 2)


def test_join_lookup_repartition_move_buckets_between_workers(cluster):
    left = [(f"k{i % 7}", i) for i in range(200)]
    right = [(f"k{k}", k * 10) for k in range(0, 10, 2)]
    joined = cluster.parallelize(left, 5).join(cluster.parallelize(right, 3))
    assert sorted(joined.collect()) == sorted((k, (v, w)) for k, v in left for k2, w in right if k == k2)
    table = cluster.parallelize(right, 3)
    assert dict(table.lookup(["k2", "k3"]).collect()) == {"k2": [20], "k3": []}
    x = np.arange(1000.0)
    assert np.array_equal(np.sort(cluster.parallelize(x, 3).repartition(7).collect()), x)


def test_persisted_partitions_stay_on_the_workers(cluster):
    calls = cluster.accumulator((), dtype=np.int64)

    def square(x):
        calls.add((), 1)
        return x * x

    ds = cluster.range(100, partitions=4).map(square).persist()
    assert ds.sum() == sum(x * x for x in range(100))
    assert set(ds.locations()) <= set(cluster.workers) and None not in ds.locations()
    assert ds.collect() == [x * x for x in range(100)] and int(calls.value) == 100
    ds.unpersist()
    assert all(cluster.holder(("ds", ds.id, i)) is None for i in range(4))


def test_take_does_not_run_the_whole_dataset(cluster):
    partitions_run = cluster.accumulator((), dtype=np.int64)

    def mark(part):
        partitions_run.add((), 1)
        return part

    ds = cluster.range(10_000, partitions=100).map_partitions(mark)
    assert ds.take(5) == [0, 1, 2, 3, 4]
    assert int(partitions_run.value) == 1
    assert ds.filter(lambda x: x >= 500).take(2) == [500, 501]  # 100 per partition: 6th partition
    assert int(partitions_run.value) == 1 + 1 + 4 + 20


def test_accumulators_merge_every_task_once(cluster):
    data = np.random.default_rng(3).integers(0, 50, 100_000)
    hist = cluster.accumulator(50, dtype=np.int64)
    cluster.parallelize(data, partitions=8).map_partitions(lambda p: hist.add(p, 1) or []).count()
    assert np.array_equal(hist.value, np.bincount(data, minlength=50))


def test_text_and_npy_files(cluster, tmp_path):
    lines = [f"line {i} " + "x" * (i % 13) for i in range(1000)]
    (tmp_path / "a.txt").write_text("\n".join(lines[:600]) + "\n")
    (tmp_path / "b.txt").write_text("\n".join(lines[600:]))  # no final newline
    (tmp_path / "empty.txt").write_text("")
    text = cluster.read_text(str(tmp_path / "*.txt"), partitions=7)
    assert text.collect() == lines
    assert cluster.read_text("file://" + str(tmp_path / "a.txt")).count() == 600
    x = np.random.default_rng(4).random((5000, 3)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    rows = cluster.read_npy(str(tmp_path / "x.npy"), partitions=6)
    assert np.array_equal(rows.collect(), x)
    assert np.allclose(rows.sum(), x.sum(axis=0, dtype=np.float64), rtol=1e-5)  # float32 partials
    with pytest.raises(FileNotFoundError, match="missing.npy"):
        cluster.read_npy(str(tmp_path / "missing.npy"))


def test_a_task_error_arrives_as_its_type_and_the_cluster_goes_on(cluster):
    ds = cluster.range(20, partitions=4)
    with pytest.raises(ZeroDivisionError):
        ds.map(lambda x: 1 / (x - 13)).sum()
    with pytest.raises(KeyError, match="nope"):
        cluster.parallelize([(1, 2)], 1).join(ds.map(lambda x: {}["nope"])).collect()
    assert ds.sum() == 190


# Last in the module: it kills one of the module's two workers.
def test_persisted_partitions_lost_with_their_worker_are_recomputed(cluster):
    ds = cluster.range(100, partitions=6).map(lambda x: x * 2).persist()
    assert len(ds.collect()) == 100
    victim = ds.locations()[1]
    cluster.kill_worker(victim)
    assert ds.sum() == 9900
    assert victim not in ds.locations() and None not in ds.locations()
