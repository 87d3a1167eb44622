"""Write the demo notebooks of this folder from the cell lists below.

    python notebooks/make_notebooks.py        # rewrites notebooks/*.ipynb (outputs cleared)

Each notebook runs on the "Clamor (Python 3)" kernel (``clamor install-kernel``) in
well under a minute on 2 cores, asserts its own results, and is executed end to end
by tests/kernel/test_notebooks.py. In that kernel ``clamor`` and ``cluster`` are
predefined (the cluster starts on first use), the ``%clamor`` magics are loaded, and
numpy arrays of at least one arena page made by a cell live in the shared arena.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"name": "clamor", "display_name": "Clamor (Python 3)", "language": "python"}

Cell = tuple[str, str]  # ("md" | "code", source)

KDTREE: list[Cell] = [
    ("md", """\
# Geographic k-d tree lookups, updated in place (the paper's Listing 3)

A k-d tree over 1,000,000 points around real US places (GeoNames, CC BY 4.0, see
`data/README.md`) is built in an ordinary cell. In the Clamor kernel, numpy arrays of
at least one arena page that a cell allocates live in the **shared arena**, so the
tree's arrays are there already: tasks ship a *reference* to the tree and each worker
demand-pages only the pages its queries touch (workers on the kernel's host map those
pages in place, without a copy; workers on other hosts copy them). Then the driver
moves one point in place, and the next stage sees just the page that changed."""),
    ("code", """\
import time

import numpy as np
from clamor.demo import geodata
from sklearn.neighbors import KDTree

t0 = time.perf_counter()
points = geodata.scaled_points(1_000_000, seed=1)  # Morton order: neighbours share pages
tree = KDTree(points, leaf_size=40)  # sklearn, unmodified
tree_bytes = sum(a.nbytes for a in tree.get_arrays())
assert all(clamor.in_arena(a) for a in tree.get_arrays())
print(f"k-d tree over {len(points):,} points: {tree_bytes / 2**20:.0f} MiB, all in the arena "
      f"({time.perf_counter() - t0:.1f} s)")"""),
    ("md", """\
2,000 queries near San Francisco. `cluster` is the kernel's default cluster: it has no
worker processes until it is first used."""),
    ("code", """\
rng = np.random.default_rng(7)
bay = points[geodata.in_region(points, ((37.3, 38.0), (-122.6, -121.8)))]
queries = bay[rng.integers(0, len(bay), 2000)] + rng.normal(scale=0.01, size=(2000, 2))
print(f"{len(queries):,} queries around San Francisco")
cluster"""),
    ("md", """\
`%%clamor map_partitions SRC --as q` runs the cell body once per partition of `SRC`
(here the query array, cut in 8), with the partition bound to `q`; the value of the
last expression is the partition's result. `--into nearest` names the new (lazy)
dataset. The body reads `tree`: it travels as a few bytes of arena references."""),
    ("code", """\
%%clamor map_partitions queries --as q --partitions 8 --into nearest
tree.query(q, k=10)[1]"""),
    ("md", """\
**The dashboard** shows the cluster live while the next cells run: the arena's pages
(colour = how often workers read them; hover for the variable, its version and
holders; the buttons switch to driver-served bytes, peer-served bytes or holders),
bytes served by the driver vs by peer workers, per-worker task bars, and the lineage
of `nearest`. `%clamor heatmap tree`, `%clamor timeline` and `%clamor lineage nearest`
show one view each."""),
    ("code", """\
%clamor dashboard nearest"""),
    ("code", """\
t0 = time.perf_counter()
first = nearest.collect()  # runs the stage; the workers start now if they have not yet
elapsed = time.perf_counter() - t0
stats = cluster.stats()
read = stats["pages_read"] * stats["page_size"]
print(f"{len(queries):,} 10-NN queries on {len(cluster.workers)} workers in {elapsed:.2f} s; "
      f"they read {read / 2**20:.1f} MiB of the {tree_bytes / 2**20:.0f} MiB tree "
      f"({100 * read / tree_bytes:.0f} %; {stats['pages_mapped']} pages mapped in place, "
      f"{stats['pages_fetched']} copied)")
assert np.array_equal(first, tree.query(queries, k=10)[1])
assert read < tree_bytes / 2  # demand paging: only what the queries touched"""),
    ("md", """\
**An in-place update.** The driver moves the nearest point of the first query half a
degree away, in the tree's own data array. The arena is immutable *during* a stage;
between stages the driver may write it, and the next stage tells the workers exactly
the written page: one that copied it drops its copy, one that maps it in place keeps
the mapping, which shows the new bytes already. `nearest` is lazy, so collecting it
again runs the queries against the updated tree."""),
    ("code", """\
data = tree.get_arrays()[0]
target = int(first[0, 0])
data[target] += 0.5  # one point moves: one page of the arena changes
before = cluster.stats()
second = nearest.collect()
after = cluster.stats()
invalidated = after["invalidations"] - before["invalidations"]
refetched = after["pages_fetched"] - before["pages_fetched"]
remapped = after["pages_mapped"] - before["pages_mapped"]
print(f"moved point {target}: {invalidated} cached page(s) invalidated, {refetched} page(s) "
      f"copied again ({refetched * after['page_size'] // 1024} KiB moved), {remapped} new page "
      f"version(s) mapped in place")
assert target not in second[0]
assert np.array_equal(second, tree.query(queries, k=10)[1])
assert invalidated <= 1 and refetched <= len(cluster.workers)  # that page, at most once per worker"""),
    ("md", """\
**Queries across the whole country.** 500,000 queries spread over the US, in the same
Morton order as the points, cut into 16 tasks: each task reads its own stretch of the
tree, so the dashboard's heatmap fills in region by region while the stage runs. Each
task returns the mean distance to the 10 nearest neighbours of its queries."""),
    ("code", """\
country = points[rng.integers(0, len(points), 500_000)] + rng.normal(scale=0.05, size=(500_000, 2))
country = country[geodata.morton_order(country)]
before = cluster.stats()
t0 = time.perf_counter()
spread = cluster.parallelize(country, partitions=16).map_partitions(
    lambda q: tree.query(q, k=10)[0].mean(axis=1)).collect()
after = cluster.stats()
read = (after["pages_read"] - before["pages_read"]) * after["page_size"]
print(f"{len(country):,} queries across the US in {time.perf_counter() - t0:.2f} s; the two "
      f"workers read {read / 2**20:.1f} MiB more (together)")
assert np.allclose(spread[:200], tree.query(country[:200], k=10)[0].mean(axis=1))"""),
]

LOGREG: list[Cell] = [
    ("md", """\
# Parameter server: sparse logistic regression

40,000 examples with 12 hashed features each (a 65,536-wide feature space), and the
model's weights `w` in the shared arena. Each stage computes the gradient of the
logistic loss over the examples: every task reads the weights it needs (demand paging)
and adds its partial gradient into an **accumulator** (Piccolo's tables: `add` in
tasks, merged in the driver at the barrier, exactly once per task). Between stages
the driver updates `w` **in place**. Workers on the kernel's host read `w` in place
(zero copy); workers on other hosts re-fetch only the written pages: once their
caches are warm, an iteration moves little more than the two pages of `w` to each."""),
    ("code", """\
import numpy as np

dim, n, nnz, lr = 1 << 16, 40_000, 12, 0.1
rng = np.random.default_rng(9)
idx = rng.integers(0, dim, (n, nnz))  # the hashed feature ids of each example
val = rng.normal(size=(n, nnz))  # their values
truth = rng.normal(size=dim)
y = ((truth[idx] * val).sum(axis=1) > 0).astype(np.float64)  # labels of a hidden model
w = np.zeros(dim)  # the model: 512 KiB
assert all(clamor.in_arena(a) for a in (idx, val, y, w))  # arrays of a cell live in the arena
print(f"{n:,} examples x {nnz} features, {dim:,} weights; "
      f"{(idx.nbytes + val.nbytes + y.nbytes + w.nbytes) / 2**20:.1f} MiB in the arena")"""),
    ("code", """\
grad = cluster.accumulator(dim)  # summed at each stage's barrier
examples = cluster.range(n, partitions=8)  # each partition is a range of example rows"""),
    ("md", """\
One gradient step as a `%%clamor` cell: the body runs for each partition `rows` and
reads `idx`, `val`, `y` and `w` from the arena. The dataset `step` is lazy: every
action on it runs the body again, against the weights as they are then."""),
    ("code", """\
%%clamor map_partitions examples --as rows --into step
i, v, t = idx[rows.start:rows.stop], val[rows.start:rows.stop], y[rows.start:rows.stop]
p = 1.0 / (1.0 + np.exp(-(w[i] * v).sum(axis=1)))
grad.add(i.ravel(), ((p - t)[:, None] * v).ravel())
[len(rows)]"""),
    ("code", """\
def loss(weights):
    z = (weights[idx] * val).sum(axis=1)
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


w_ref = np.zeros(dim)  # the same training in this process, for comparison
print(f"start: loss {loss(w):.4f}")
for it in range(5):
    grad.reset()
    before = cluster.stats()
    assert step.sum() == n  # one stage over all examples
    w -= lr * grad.value  # the driver updates the weights in place
    after = cluster.stats()

    p = 1.0 / (1.0 + np.exp(-(w_ref[idx] * val).sum(axis=1)))
    g_ref = np.zeros(dim)
    np.add.at(g_ref, idx.ravel(), ((p - y)[:, None] * val).ravel())
    w_ref -= lr * g_ref
    assert np.allclose(w, w_ref, rtol=1e-9, atol=1e-12)
    print(f"iteration {it}: loss {loss(w):.4f}; the workers read "
          f"{after['pages_read'] - before['pages_read']} pages")"""),
    ("code", """\
accuracy = float((((w[idx] * val).sum(axis=1) > 0) == (y > 0)).mean())
print(f"training accuracy {accuracy:.1%}, loss {loss(w):.4f}")
assert accuracy > 0.95 and loss(w) < 0.3"""),
]

STREAMING: list[Cell] = [
    ("md", """\
# Streaming updates to a lookup table

A table of 1,048,576 keys and values (16 MiB) lives in the shared arena. A stream of
lookups runs on the workers; between two batches the driver changes **one** value in
place. Only the page holding that value is invalidated, and only that page moves to
the workers that hold it: `cluster.stats()` shows it."""),
    ("code", """\
import numpy as np

rng = np.random.default_rng(3)
keys = np.unique(rng.integers(0, 1 << 40, 1 << 20))  # sorted, unique
values = rng.integers(0, 1000, len(keys))
queries = rng.choice(keys, 20_000)  # small: travels with the tasks by value
assert clamor.in_arena(keys) and clamor.in_arena(values)
print(f"{len(keys):,} keys; table {(keys.nbytes + values.nbytes) / 2**20:.0f} MiB in the arena")"""),
    ("md", """\
The lookup as a `%%clamor` cell, over 4 partitions of the queries. The dataset is
lazy: each action looks the queries up in the table as it is at that moment."""),
    ("code", """\
%%clamor map_partitions queries --as q --partitions 4 --into looked_up
values[np.searchsorted(keys, q)]"""),
    ("code", """\
total = looked_up.sum()  # the first batch: the workers page in what the lookups touch
assert total == values[np.searchsorted(keys, queries)].sum()
stats = cluster.stats()
print(f"first batch: total {total:,}; the workers read {stats['pages_read']} pages "
      f"of {stats['page_size'] // 1024} KiB")"""),
    ("md", """\
The stream: each update changes one key's value in the driver, then the next batch
runs. Workers on the kernel's host map the table in place and see each update with
no copy at all; a worker that copied the page (one on another host) has exactly that
page invalidated and re-fetches only it, whatever the size of the table."""),
    ("code", """\
page_kib = cluster.page_size // 1024
for update in range(5):
    key = rng.choice(queries)
    pos = np.searchsorted(keys, key)
    before = cluster.stats()
    values[pos] += 1000  # one key, updated in place between stages
    total = looked_up.sum()
    after = cluster.stats()
    invalidated = after["invalidations"] - before["invalidations"]
    moved = after["pages_fetched"] - before["pages_fetched"]
    mapped = after["pages_mapped"] - before["pages_mapped"]
    print(f"update {update}: key {key} -> {values[pos]}; total {total:,}; "
          f"{invalidated} cached page(s) invalidated, {moved} page copy(ies) = {moved * page_kib} KiB moved, "
          f"{mapped} new page version(s) mapped in place")
    assert total == values[np.searchsorted(keys, queries)].sum()
    assert invalidated <= 1 and moved <= len(cluster.workers)  # one page, at most once per worker"""),
]

KMEANS: list[Cell] = [
    ("md", """\
# k-means

400,000 points around real US places (in the arena), k = 8, ten iterations. Each
iteration is one stage: tasks assign their points to the nearest centroid and add
per-cluster sums and counts into two accumulators; the driver computes the new
centroids in place, and the next stage uses them."""),
    ("code", """\
import numpy as np
from clamor.demo import geodata

k = 8
points = geodata.scaled_points(400_000, seed=7)
centroids = points[np.random.default_rng(8).choice(len(points), k, replace=False)].copy()
sums = cluster.accumulator((k, 2))
counts = cluster.accumulator(k, dtype=np.int64)
ds = cluster.parallelize(points, partitions=8)  # slices of an arena array: paged in
print(f"{len(points):,} points ({points.nbytes / 2**20:.1f} MiB, in the arena: "
      f"{clamor.in_arena(points)}), {ds.num_partitions} partitions")"""),
    ("md", """\
The assignment step as a `%%clamor` cell over the partitions `p` of `ds`. It reads
`centroids`, a small array that travels with each stage's tasks: updating it in place
in the driver is enough for the next stage to see the new centroids."""),
    ("code", """\
%%clamor map_partitions ds --as p --into assign
label = np.argmin(((p[:, None, :] - centroids[None, :, :]) ** 2).sum(axis=2), axis=1)
s = np.zeros((k, 2))
np.add.at(s, label, p)
sums.add(slice(None), s)
counts.add(slice(None), np.bincount(label, minlength=k))
[len(p)]"""),
    ("code", """\
reference = centroids.copy()  # the same algorithm in this process, for comparison
for it in range(10):
    sums.reset()
    counts.reset()
    assert assign.sum() == len(points)
    centroids[:] = sums.value / np.maximum(counts.value, 1)[:, None]  # in place

    label = np.argmin(((points[:, None, :] - reference[None, :, :]) ** 2).sum(axis=2), axis=1)
    s = np.zeros((k, 2))
    np.add.at(s, label, points)
    reference = s / np.maximum(np.bincount(label, minlength=k), 1)[:, None]
    assert np.allclose(centroids, reference, rtol=1e-10, atol=1e-12)
    inertia = float(((points - centroids[label]) ** 2).sum())
    print(f"iteration {it}: inertia {inertia:,.1f}")"""),
    ("code", """\
stats = cluster.stats()
print(f"{stats['stages_run']} stages, {stats['tasks_run']} tasks; the workers read "
      f"{stats['pages_read']} pages ({stats['pages_read'] * stats['page_size'] / 2**20:.1f} MiB) "
      f"for {points.nbytes / 2**20:.1f} MiB of points")
print(np.round(centroids, 2))"""),
]

RECOVERY: list[Cell] = [
    ("md", """\
# Failure recovery

A walk-through of what happens when a worker dies:

1. **during a stage**: its running and queued tasks are rerun on the other workers
   (`tasks_rerun`), and the stage's result is still right;
2. **after a stage**, holding persisted partitions: the lost partitions are
   recomputed from their **lineage**, at the arena epoch they were computed in, so a
   later in-place update by the driver does not leak into them (`tasks_recomputed`).

We start three workers (`%clamor start -n 3`) so that two survive the first kill."""),
    ("code", """\
%clamor start -n 3"""),
    ("code", """\
import threading
import time

import numpy as np

x = np.arange(2_000_000, dtype=np.float64)  # 16 MiB, in the arena
expected = float((x**2).sum())
%clamor status"""),
    ("md", """\
Twelve slow tasks (a quarter of a second each), so that the kill lands in the middle
of the stage."""),
    ("code", """\
%%clamor map_partitions x --as part --partitions 12 --into squares
time.sleep(0.25)
[float((part**2).sum())]"""),
    ("md", """\
`cluster.kill_worker(w)` SIGKILLs the worker's process. A timer fires it 0.6 s into
the stage."""),
    ("code", """\
victim = cluster.workers[-1]
before = cluster.stats()
timer = threading.Timer(0.6, cluster.kill_worker, (victim,))
timer.start()
t0 = time.perf_counter()
partials = squares.collect()
elapsed = time.perf_counter() - t0
timer.join()
after = cluster.stats()
rerun = after["tasks_rerun"] - before["tasks_rerun"]
print(f"worker {victim} was killed 0.6 s into the stage; the stage finished in {elapsed:.1f} s "
      f"on workers {cluster.workers}, with {rerun} task(s) rerun")
assert victim not in cluster.workers
assert np.isclose(sum(partials), expected, rtol=1e-12)
assert rerun > 0"""),
    ("md", """\
**Lineage.** `doubled` is persisted: its partitions stay on the workers. Then the
driver negates `x` in place (a new arena epoch) and a worker holding some of the
partitions is killed. The sum needs them: they are recomputed from lineage by
replaying their stage at its own epoch, reading the old page versions from the
driver's version log."""),
    ("code", """\
%%clamor map_partitions x --as part --partitions 6 --into doubled
part * 2.0"""),
    ("code", """\
doubled.persist()
assert doubled.count() == len(x)
holders = doubled.locations()
print("partition holders:", holders)
x *= -1.0  # the driver updates x in place: persisted partitions keep the old values
victim = holders[0]"""),
    ("code", """\
%clamor kill {victim}"""),
    ("code", """\
before = cluster.stats()
total = doubled.sum()
after = cluster.stats()
recomputed = after["tasks_recomputed"] - before["tasks_recomputed"]
print(f"sum after losing worker {victim}: {total:,.0f} ({recomputed} partition(s) recomputed "
      f"from lineage at their own epoch); workers left: {cluster.workers}")
assert np.isclose(total, 2 * float(np.arange(len(x), dtype=np.float64).sum()), rtol=1e-12)
assert recomputed > 0"""),
]

NOTEBOOKS: dict[str, list[Cell]] = {
    "kdtree.ipynb": KDTREE,
    "logistic_regression.ipynb": LOGREG,
    "streaming_updates.ipynb": STREAMING,
    "kmeans.ipynb": KMEANS,
    "failure_recovery.ipynb": RECOVERY,
}


def build(cells: list[Cell]) -> nbformat.NotebookNode:
    """A notebook on the Clamor kernel with these cells, outputs empty."""
    nb = new_notebook(
        cells=[new_markdown_cell(src) if kind == "md" else new_code_cell(src) for kind, src in cells],
        metadata={"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}},
    )
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"  # stable ids: regenerating gives the same files
    return nb


def main() -> None:
    for name, cells in NOTEBOOKS.items():
        nb = build(cells)
        nbformat.validate(nb)
        nbformat.write(nb, HERE / name)
        print(f"wrote notebooks/{name} ({len(cells)} cells)")


if __name__ == "__main__":
    main()
