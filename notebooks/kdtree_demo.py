"""Demo: demand-paged k-d tree queries on local workers (the paper's Listing 3, scaled down).

Run with `make demo`. A 2,000,000-point k-d tree over real US places is built
in the notebook's shared arena; the workers query it near San Francisco and
fetch only the pages their queries touch. Then the driver moves a point in
place and the workers query again: exactly the changed page is re-fetched.
Data: GeoNames (CC BY 4.0), see notebooks/data/README.md.
"""

# %%
import time

import numpy as np
from clamor.runtime import geodata
from sklearn.neighbors import KDTree

import clamor

N_POINTS = 2_000_000
N_QUERIES = 2_000

# %% Build the tree in the arena: every numpy allocation inside `shared()` goes there.
t0 = time.perf_counter()
points = geodata.scaled_points(N_POINTS, seed=1)
with clamor.shared():
    tree = KDTree(clamor.asarray(points), leaf_size=40)
tree_bytes = sum(a.nbytes for a in tree.get_arrays())
print(f"k-d tree over {N_POINTS:,} points: {tree_bytes / 2**20:.0f} MiB in the arena "
      f"({time.perf_counter() - t0:.1f} s)")

# %% Queries around San Francisco, split across the workers.
rng = np.random.default_rng(7)
bay = points[geodata.in_region(points, ((37.3, 38.0), (-122.6, -121.8)))]
queries = bay[rng.integers(0, len(bay), N_QUERIES)] + rng.normal(scale=0.01, size=(N_QUERIES, 2))


def nearest(tree, q):
    return tree.query(q, k=10)[1]


with clamor.Cluster(workers=2) as cluster:
    chunks = np.array_split(queries, len(cluster.workers))
    t0 = time.perf_counter()
    first = cluster.run_stage([(w, nearest, (tree, q)) for w, q in zip(cluster.workers, chunks)])
    elapsed = time.perf_counter() - t0
    stats = cluster.stats()
    fetched = stats["pages_fetched"] * stats["page_size"]
    print(f"{N_QUERIES:,} 10-NN queries on {len(cluster.workers)} workers in {elapsed:.2f} s; "
          f"workers fetched {fetched / 2**20:.1f} MiB of the {tree_bytes / 2**20:.0f} MiB tree "
          f"({100 * fetched / tree_bytes:.1f} %)")
    assert np.array_equal(np.vstack(first), tree.query(queries, k=10)[1])

    # %% The driver updates the tree in place (a point moves); workers see it at the next stage.
    data = tree.get_arrays()[0]
    target = first[0][0][0]
    data[target] = data[target] + 0.5  # move one point half a degree away
    before = [w["pages_fetched"] for w in cluster.worker_stats()]
    second = cluster.run_stage([(w, nearest, (tree, q)) for w, q in zip(cluster.workers, chunks)])
    refetched = sum(w["pages_fetched"] - b for w, b in zip(cluster.worker_stats(), before))
    print(f"after moving point {target}: {cluster.stats()['invalidations']} page(s) invalidated, "
          f"{refetched} re-fetched")
    assert target not in np.vstack(second)[0]
    assert np.array_equal(np.vstack(second), tree.query(queries, k=10)[1])
print("demo ok")
