"""The paper's programs on a real cluster, each equal to a single-process numpy reference.

Large state (a hash table, a k-d tree, model weights, points) lives in the
arena; tasks reference it and the workers page in what they touch. Where the
driver updates that state between stages, the next stage sees the update.
"""

from __future__ import annotations

import numpy as np
import pytest
from clamor.demo import geodata
from clamor.runtime.data.ops import bounds
from sklearn.neighbors import KDTree

import clamor


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=2) as c:
        yield c


def per_partition(x: np.ndarray, n: int) -> list[np.ndarray]:
    """``x`` cut like ``parallelize(x, partitions=n)`` cuts it."""
    return [x[slice(*bounds(len(x), n, i))] for i in range(n)]


# --- Listing 2: lookups in a big hash table -------------------------------------------------


def test_listing_2_hash_table_lookups_normalised_and_kept_on_the_cluster(cluster):
    rng = np.random.default_rng(2)
    keys = np.unique(rng.integers(0, 1 << 40, 1 << 20))
    table = (clamor.asarray(keys), clamor.asarray(rng.integers(1, 1000, len(keys))))  # 16 MiB

    def lookup(table, ks):
        k, v = table
        return v[np.searchsorted(k, ks)]

    queries = rng.choice(keys, 100_000)
    keys_ds = cluster.parallelize(queries, partitions=8)
    vals = keys_ds.map_partitions(lambda ks: lookup(table, ks))
    total = vals.sum()  # integers: exact whatever the order of the tree aggregation
    normalised = vals.map_partitions(lambda v: v / total).persist()
    assert normalised.count() == len(queries)
    assert set(normalised.locations()) <= set(cluster.workers)  # kept by the workers

    expected_vals = table[1][np.searchsorted(table[0], queries)]
    assert total == expected_vals.sum()
    assert np.array_equal(normalised.collect(), expected_vals / expected_vals.sum())
    fetched = cluster.stats()["pages_read"] * cluster.stats()["page_size"]
    assert fetched < 4 * (keys.nbytes * 2)  # paged in, not broadcast once per task


# --- Listing 3: a k-d tree updated in place between stages ----------------------------------


def test_listing_3_kdtree_queries_before_and_after_an_update(cluster):
    points = geodata.scaled_points(200_000, seed=5)
    with clamor.shared():
        tree = KDTree(clamor.asarray(points), leaf_size=40)
    rng = np.random.default_rng(6)
    queries_np = points[rng.integers(0, len(points), 4000)] + rng.normal(scale=0.01, size=(4000, 2))
    queries = cluster.parallelize(queries_np, partitions=8)

    def nearest(q):
        dist, ind = tree.query(q, k=1)
        return np.column_stack([dist[:, 0], ind[:, 0]])  # rows (distance, index)

    before_ref = nearest(queries_np)
    prefs = queries.map_partitions(nearest).persist()
    assert prefs.count() == len(queries_np)

    # the driver moves the nearest point of the first 500 queries far away, in place
    data = tree.get_arrays()[0]
    moved = np.unique(before_ref[:500, 1].astype(np.intp))
    data[moved] += 0.5
    after_ref = nearest(queries_np)
    assert (after_ref[:, 1] != before_ref[:, 1]).sum() >= 400  # the update matters

    prefs2 = queries.map_partitions(nearest).persist()
    best = prefs.zip(prefs2).map(lambda ab: min(ab, key=lambda row: row[0]))
    expected = np.where((before_ref[:, 0] <= after_ref[:, 0])[:, None], before_ref, after_ref)
    assert np.array_equal(np.array(best.collect()), expected)
    assert np.array_equal(prefs.collect(), before_ref)  # kept from before the update
    assert np.array_equal(prefs2.collect(), after_ref)


# --- k-means with accumulators ---------------------------------------------------------------


def test_kmeans_ten_iterations_with_accumulators(cluster):
    k, n_parts = 8, 8
    points = clamor.asarray(geodata.scaled_points(200_000, seed=7))
    centroids = points[np.random.default_rng(8).choice(len(points), k, replace=False)].copy()
    sums = cluster.accumulator((k, 2))
    counts = cluster.accumulator(k, dtype=np.int64)
    ds = cluster.parallelize(points, partitions=n_parts)  # arena slices: paged in

    def assign(p: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        label = np.argmin(((p[:, None, :] - c[None, :, :]) ** 2).sum(axis=2), axis=1)
        s = np.zeros((k, 2))
        np.add.at(s, label, p)
        return s, np.bincount(label, minlength=k)

    ref = centroids.copy()
    for _ in range(10):
        sums.reset()
        counts.reset()

        def step(p, c=centroids):  # this iteration's centroids, shipped by value
            s, m = assign(p, c)
            sums.add(slice(None), s)
            counts.add(slice(None), m)
            return [len(p)]

        assert ds.map_partitions(step).sum() == len(points)
        centroids = sums.value / np.maximum(counts.value, 1)[:, None]

        # the reference: the same partial sums, added in task order as the barrier merges them
        ref_sums, ref_counts = np.zeros((k, 2)), np.zeros(k, np.int64)
        for part in per_partition(points, n_parts):
            s, m = assign(part, ref)
            ref_sums += s
            ref_counts += m
        ref = ref_sums / np.maximum(ref_counts, 1)[:, None]
        assert np.array_equal(centroids, ref)  # bit for bit: same operations, same order


# --- sparse logistic regression: a parameter server in the arena --------------------------------


def test_sparse_logistic_regression_with_hashed_features(cluster):
    dim, n, nnz, n_parts, lr = 1 << 16, 40_000, 12, 8, 0.5
    rng = np.random.default_rng(9)
    idx = clamor.asarray(rng.integers(0, dim, (n, nnz)))
    val = clamor.asarray(rng.normal(size=(n, nnz)))
    truth = rng.normal(size=dim)
    y = clamor.asarray(((truth[idx] * val).sum(axis=1) > 0).astype(np.float64))
    w = clamor.array(dim, np.float64)  # the weights, in the arena, updated in place
    w[:] = 0.0
    grad = cluster.accumulator(dim)

    def gradient(rows: range, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        i, v, t = idx[rows.start : rows.stop], val[rows.start : rows.stop], y[rows.start : rows.stop]
        p = 1.0 / (1.0 + np.exp(-(w[i] * v).sum(axis=1)))
        return i.ravel(), ((p - t)[:, None] * v).ravel()

    def task(rows):
        grad.add(*gradient(rows, w))
        return [len(rows)]

    examples = cluster.range(n, partitions=n_parts)
    w_ref = np.zeros(dim)
    for _ in range(5):
        grad.reset()
        assert examples.map_partitions(task).sum() == n
        w -= lr / n * grad.value  # between stages: workers re-fetch the written pages

        g_ref = np.zeros(dim)
        for part in range(n_parts):
            np.add.at(g_ref, *gradient(range(*bounds(n, n_parts, part)), w_ref))
        w_ref -= lr / n * g_ref
        # bit for bit: each task's gradient is computed as here, and the barrier applies
        # the tasks' updates with np.add.at in task order, as this loop does
        assert np.array_equal(w, w_ref)
    assert np.count_nonzero(w) > dim // 2
    predicted = (w[np.asarray(idx)] * np.asarray(val)).sum(axis=1) > 0
    assert (predicted == (np.asarray(y) > 0)).mean() > 0.75  # it learns
