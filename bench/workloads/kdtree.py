#!/usr/bin/env python3
"""k-d tree 10-NN queries in one region: Clamor vs. Redis GEOSEARCH, Dask and Ray, and the limit.

    python bench/run.py kdtree [--quick] [--repeat R] [--cold C] [--passes P] [--only SYSTEMS]
                           [--points N] [--queries Q] [--timeout S] [--wait-idle S] [--network [RATE]]

The paper's geographic workload (issue 8; the paper's evaluation): N points around real
US places (``runtime/geodata.scaled_points``, Morton order: neighbours share pages) in
an unmodified ``sklearn.neighbors.KDTree`` (leaf size 40); Q queries around San
Francisco (a random point of the region plus ~1 km of noise), 10 nearest neighbours
each, cut into ``4 x WORKERS`` tasks (``WORKERS`` = ``peers.WORKERS``, 2 unless
``CLAMOR_BENCH_WORKERS`` says otherwise). Every system knows the same: the tree and its
own chunk of the queries.

Cases (seconds of one pass over all Q queries):

* ``first pass (cold)``: getting the tree to the workers *and* one pass of the queries,
  on every system: Clamor's workers page the tree in during the pass; the peers' put,
  scatter or load is inside the timed section too (its own seconds are reported as
  ``ship_runs``). Building the tree is untimed everywhere (Clamor builds it in the arena,
  the others on the heap). ``--cold`` repetitions per pass, each from a fresh state.
* ``queries (steady)``: the tree already on the workers; after one untimed warm-up pass
  at full size, ``--repeat`` timed passes. Q / median is the throughput.

What each system runs (its documentation's recommended program):

* **clamor**: the tree is built inside ``with clamor.shared():`` so its arrays live in
  the arena; ``cluster.run_stage`` ships it *by reference* (tasks placed round-robin)
  and the workers demand-page only the pages their queries touch. Cold: one ``Cluster``
  (its start-up and an sklearn-importing stage untimed) and a new tree built in the
  arena before each repetition (untimed, as every system's build), at addresses no
  worker has read, while every earlier one is still alive (a freed tree's pages stay
  mapped on the workers, which read a tree built there in place): the workers keep their processes,
  as the peers' workers do across their new puts and scatters. Steady: that cluster and
  the last tree.
* **ray**: ``ray.init(num_cpus=WORKERS, object_store_memory=...)`` sized for 3 copies of
  the tree; ``ray.put(tree)`` once and every task takes the ``ObjectRef`` ("Anti-pattern:
  passing the same large argument by value repeatedly", docs.ray.io
  ray-core/patterns/pass-large-arg-by-value). Cold: a new ``ray.put`` per repetition,
  the last one's release waited for (the object store's used bytes, untimed) before it.
* **dask**: ``LocalCluster(n_workers=WORKERS, threads_per_worker=1)``;
  ``client.scatter(tree, broadcast=True, hash=False)`` once and one ``client.submit``
  per chunk with the future (distributed.dask.org, "Data Locality: Data Scatter").
  Cold: a new scatter per repetition, the last one released and waited for first.
* **redis**: Debian's ``redis-server`` started here on 127.0.0.1 (a free port, a temp
  dir, no persistence); ``GEOADD`` of every point (pipelined), then per query
  ``GEOSEARCH FROMLONLAT lon lat BYRADIUS r km ASC COUNT 10`` with the smallest
  radius that returns 10, found by doubling from 0.25 km; each round is one pipeline
  of the queries still short of 10. Cold: ``FLUSHALL`` (untimed), the load and a pass.
* **limit: sklearn, one process**: the same chunks queried in turn in one plain
  process holding the tree (cold: a freshly unpickled copy, nothing to ship).
* **limit: fork, W processes**: a ``multiprocessing`` fork pool of ``WORKERS``
  processes made after the tree was built (each reads the tree copy-on-write),
  ``pool.map`` over the chunks. Cold: forking the pool plus the pass.

Protocol: each system runs in its own child process (this script with ``--child``),
``--passes`` times in turn (A B C A B C; ``harness.run_all`` merges the passes), so the
steady case has passes x repeat timed passes (full run: 2 x 5) and the cold case
passes x cold. Rows carry every repetition; the report shows the median, the minimum
and a distribution-free 95 % interval of the median (``median_ci``), and every system
as a multiple of the limit. Processes left behind are killed and flagged.

Checks: every pass of Clamor, Dask, Ray and the limits must equal a local sklearn query
exactly. Redis measures great-circle (haversine) distance while the tree is Euclidean
on (lat, lon), so its 10 nearest legitimately differ: its answer is checked against
the exact haversine 10-NN (an sklearn ``BallTree(metric="haversine")``, mean overlap
>= 0.99), and its overlap with the KDTree's answer is reported for context.

``--network [RATE]`` (``network.py``): Clamor, Dask and Ray with their workers on
simulated hosts behind links of RATE (1gbit) and the driver's uplink shaped to RATE
(Clamor pages over TCP; Ray's tree goes to each node's object store, whose size is
Ray's default there); Redis, one server with no workers to place, is left out; the
limits run as on loopback. Writes ``bench/results/kdtree-network.json``.

Goals (issue 8, issue 19) compare Clamor with the fastest peer program of the case;
their explanations are computed from this run's rows or start with "Hypothesis:".

Beside this script: ``kdtree_runner.py`` (the interface every system implements and the
protocol that times it), ``kdtree_redis.py`` (the Redis program) and
``kdtree_report.py`` (the printed table and the goals). The systems whose workers run
this script's task functions stay here: in the child's ``__main__`` the tasks are
pickled by value, so no worker needs ``bench/`` on its path.
"""

from __future__ import annotations

import argparse
import multiprocessing
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import network
from harness.results import save
from peers import WORKERS, DaskSession, RaySession

from workloads.kdtree_redis import R0_KM, RedisRunner
from workloads.kdtree_report import finish, goals, render
from workloads.kdtree_runner import CASES, COLD, LEAF, TASKS, K, Runner, measure

LIMITS = {"limit-sklearn": "limit: sklearn, one process", "limit-fork": f"limit: fork, {WORKERS} processes"}
SYSTEMS = ("clamor", "redis", "dask", "ray", *LIMITS)
NETWORKED = ("clamor", "dask", "ray")  # the systems whose workers go on simulated hosts
REGION = ((37.3, 38.0), (-122.6, -121.8))  # around San Francisco, as notebooks/kdtree.ipynb


def label(system: str) -> str:
    """The row name of a ``--only`` system (``limit-fork`` -> ``limit: fork, 2 processes``)."""
    return LIMITS.get(system, system)


# --- data and tasks, the same in every child ----------------------------------------------


def make_data(n_points: int, n_queries: int) -> tuple[np.ndarray, np.ndarray]:
    """(points, queries), both (n, 2) float64 [lat, lon]; deterministic."""
    from clamor.demo import geodata

    points = geodata.scaled_points(n_points, seed=1)
    rng = np.random.default_rng(7)
    region = points[geodata.in_region(points, REGION)]
    queries = region[rng.integers(0, len(region), n_queries)] + rng.normal(scale=0.01, size=(n_queries, 2))
    return points, np.ascontiguousarray(queries)


def _query(tree: Any, q: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """A task: the 10-NN of ``q`` in ``tree``, and this process's peak RSS (bytes)."""
    import resource as _r

    dist, idx = tree.query(q, k=10)
    return idx, dist, _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * 1024


def _warm() -> int:
    """An untimed task run first on every worker: imports sklearn (same for every system)."""
    import os as _os

    import sklearn.neighbors  # noqa: F401

    return _os.getpid()


_FORK_TREE: Any = None  # the fork limit's tree, inherited by its pool's processes


def _fork_query(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    return _query(_FORK_TREE, q)


def _heap_tree(points: np.ndarray) -> tuple[Any, int, int]:
    """An ordinary (heap) tree, its pickled size and the bytes of its arrays."""
    from sklearn.neighbors import KDTree

    tree = KDTree(points, leaf_size=LEAF)
    return tree, len(pickle.dumps(tree, protocol=5)), sum(a.nbytes for a in tree.get_arrays())


# --- the systems: one Runner each (the interface: kdtree_runner.py; Redis: kdtree_redis.py) --


class ClamorRunner(Runner):
    name = "clamor"

    def __init__(self, points: np.ndarray, queries: np.ndarray, args: argparse.Namespace, net: Any) -> None:
        super().__init__(points, queries)

        import clamor

        self.clamor, self.net, self.cluster, self.points = clamor, net, None, points
        self.tree = self._arena_tree()
        self.old_trees: list[Any] = []  # earlier cold passes' trees, kept alive (fresh)
        self.ref = self.tree.query(queries, k=K)
        self.transport = args.transport if net is None else "tcp"
        self.runs: dict[str, list[int]] = {"pages_fetched_runs": [], "pages_mapped_runs": [], "driver_bytes_runs": [],
                                           "peer_bytes_runs": [], "shm_bytes_runs": []}  # fmt: skip
        self.fields = {"tree_bytes": sum(a.nbytes for a in self.tree.get_arrays()), "transport": self.transport}

    def _arena_tree(self) -> Any:
        from sklearn.neighbors import KDTree

        with self.clamor.shared():  # KDTree keeps a float64 C-contiguous input as is: it must be in the arena too
            return KDTree(self.clamor.asarray(self.points), leaf_size=LEAF)

    def fresh(self) -> None:
        if self.cluster is None:
            options = {"transport": self.transport} if self.net is None else network.cluster_options(self.net)
            self.cluster = self.clamor.Cluster(workers=WORKERS, **options)
            self.fields["page_size"] = self.cluster.page_size
            self.cluster.run_stage([(w, _warm, ()) for w in self.cluster.workers])
        else:  # a new tree at addresses no worker has mapped: every earlier tree lives on
            # (a freed tree's pages stay mapped on the workers, and a tree built there would
            # be read in place at no fault: not a cold pass)
            self.old_trees.append(self.tree)
            self.tree = self._arena_tree()
        self.calls = [(self.cluster.workers[i % WORKERS], _query, (self.tree, c)) for i, c in enumerate(self.chunks)]

    def first(self) -> list:
        return self.cluster.run_stage(self.calls)

    again = first

    def settle(self) -> None:
        if self.cluster is None:
            self.fresh()

    def mark(self) -> None:
        self.s0 = self.cluster.stats()

    def count(self, case: str) -> int:
        s0, s1 = self.s0, self.cluster.stats()
        fetched = s1["pages_fetched"] - s0["pages_fetched"]  # copied into a worker's page cache
        if case == COLD:  # pages_mapped: read in place from the driver's memory (same host, no copy)
            self.runs["pages_fetched_runs"].append(fetched)
            self.runs["pages_mapped_runs"].append(s1.get("pages_mapped", 0) - s0.get("pages_mapped", 0))
            self.runs["driver_bytes_runs"].append(s1["bytes_served_by_driver"] - s0["bytes_served_by_driver"])
            self.runs["peer_bytes_runs"].append(s1["bytes_served_by_peers"] - s0["bytes_served_by_peers"])
            self.runs["shm_bytes_runs"].append(s1["driver"].get("shm_bytes", 0) - s0["driver"].get("shm_bytes", 0))
        return fetched * self.cluster.page_size

    def rss(self, parts: list) -> int:
        workers = max(int(w.get("rss_bytes", 0)) for w in self.cluster.worker_stats())
        return max(super().rss(parts), workers)

    def close(self) -> None:
        self.fields.update(self.runs)
        if self.cluster is not None:
            self.cluster.close()


class RayRunner(Runner):
    name = "ray"

    def __init__(self, points: np.ndarray, queries: np.ndarray, args: argparse.Namespace, net: Any) -> None:
        super().__init__(points, queries)
        self.tree, self.size, tree_bytes = _heap_tree(points)
        self.ref = self.tree.query(queries, k=K)
        store = 3 * self.size + (256 << 20)  # the tree, room for results, a release in flight
        # network mode: the nodes' stores as peers.py starts them (Ray's default size)
        self.session = RaySession(net, object_store_memory=None if net is not None else store)
        ray = self.ray = self.session.ray
        self.remote = ray.remote(num_cpus=1)(_query)
        warm = ray.remote(num_cpus=1)(_warm)
        ray.get([warm.remote() for _ in range(2 * WORKERS)])
        self.handle: Any = None
        self.state: Any = None
        self.base = self.store_used()
        self.fields = {"tree_bytes": tree_bytes, "pickled_bytes": self.size, "release_checked": self.base is not None,
                       "object_store_memory": store if net is None else None}  # fmt: skip

    def store_used(self) -> int | None:
        """Bytes in use in the object store (Ray's own memory summary; None if unreadable)."""
        try:
            from ray._private import internal_api as api

            if self.state is None:
                self.state = api.get_state_from_address(self.ray.get_runtime_context().gcs_address)
            return int(api.get_memory_info_reply(self.state).store_stats.object_store_bytes_used)
        except Exception:  # noqa: BLE001 - a private API: the release then goes unchecked
            return None

    def fresh(self) -> None:
        if self.handle is None:
            return
        self.handle = None  # the last reference: the object store frees the tree
        deadline = time.monotonic() + 30
        while (used := self.store_used()) is not None and self.base is not None and time.monotonic() < deadline:
            if used <= self.base + self.size // 2:
                break
            time.sleep(0.05)
        else:
            if used is not None and self.base is not None:
                self.fields["release_note"] = "a released tree was still in the object store after 30 s"
        self.base = self.store_used()

    def first(self) -> list:
        t0 = time.perf_counter()
        self.handle = self.ray.put(self.tree)
        self.ship.append(time.perf_counter() - t0)
        return self.again()

    def again(self) -> list:
        return self.ray.get([self.remote.remote(self.handle, c) for c in self.chunks])

    def settle(self) -> None:
        if self.handle is None:
            self.handle = self.ray.put(self.tree)

    def count(self, case: str) -> int:
        return self.size * self.session.copies if case == COLD else 0

    def close(self) -> None:
        self.handle = None
        self.session.close()


class DaskRunner(Runner):
    name = "dask"

    def __init__(self, points: np.ndarray, queries: np.ndarray, args: argparse.Namespace, net: Any) -> None:
        super().__init__(points, queries)
        self.tree, self.size, tree_bytes = _heap_tree(points)
        self.ref = self.tree.query(queries, k=K)
        self.session = DaskSession(network=net)
        self.client = self.session.client
        self.client.run(_warm)
        self.handle: Any = None
        self.fields = {"tree_bytes": tree_bytes, "pickled_bytes": self.size}

    def fresh(self) -> None:
        if self.handle is not None:
            self.session.release(self.handle, wait=True)  # until no worker holds it
            self.handle = None

    def first(self) -> list:
        t0 = time.perf_counter()
        self.handle = self.client.scatter(self.tree, broadcast=True, hash=False)
        self.ship.append(time.perf_counter() - t0)
        return self.again()

    def again(self) -> list:
        return self.client.gather([self.client.submit(_query, self.handle, c, pure=False) for c in self.chunks])

    def settle(self) -> None:
        if self.handle is None:
            self.handle = self.client.scatter(self.tree, broadcast=True, hash=False)

    def count(self, case: str) -> int:
        return WORKERS * self.size if case == COLD else 0

    def close(self) -> None:
        self.session.close()


class SklearnLimit(Runner):
    name, limit = LIMITS["limit-sklearn"], True

    def __init__(self, points: np.ndarray, queries: np.ndarray, args: argparse.Namespace, net: Any) -> None:
        super().__init__(points, queries)
        tree, _, tree_bytes = _heap_tree(points)
        self.ref = tree.query(queries, k=K)
        self.blob, self.tree = pickle.dumps(tree, protocol=5), tree
        self.fields = {"tree_bytes": tree_bytes}

    def fresh(self) -> None:
        self.tree = pickle.loads(self.blob)  # a copy no query has touched yet

    def first(self) -> list:
        return [_query(self.tree, c) for c in self.chunks]

    again = first


class ForkLimit(Runner):
    name, limit = LIMITS["limit-fork"], True

    def __init__(self, points: np.ndarray, queries: np.ndarray, args: argparse.Namespace, net: Any) -> None:
        global _FORK_TREE
        super().__init__(points, queries)
        _FORK_TREE, _, tree_bytes = _heap_tree(points)
        self.ref = _FORK_TREE.query(queries, k=K)
        self.pool: Any = None
        self.fields = {"tree_bytes": tree_bytes}

    def fresh(self) -> None:
        self.close()

    def first(self) -> list:
        t0 = time.perf_counter()
        self.pool = multiprocessing.get_context("fork").Pool(WORKERS)
        self.ship.append(time.perf_counter() - t0)
        return self.again()

    def again(self) -> list:
        return self.pool.map(_fork_query, self.chunks, chunksize=1)

    def settle(self) -> None:
        if self.pool is None:
            self.pool = multiprocessing.get_context("fork").Pool(WORKERS)

    def count(self, case: str) -> int:
        return 0

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool.join()
            self.pool = None


RUNNERS = {"clamor": ClamorRunner, "redis": RedisRunner, "dask": DaskRunner, "ray": RayRunner,
           "limit-sklearn": SklearnLimit, "limit-fork": ForkLimit}  # fmt: skip


# --- the child and the parent (the table and the goals: kdtree_report.py) ------------------


def child_main(args: argparse.Namespace) -> None:
    """Measure one system; its rows (or unavailable rows) go to ``--child-out``."""

    def run(system: str, rows: harness.Rows) -> None:
        points, queries = make_data(args.points, args.queries)
        if args.network is None or system not in NETWORKED:
            rows.extend(measure(RUNNERS[system](points, queries, args, None), args))
            return
        with network.simulated_hosts(WORKERS, args.network) as net:
            rows.extend(measure(RUNNERS[system](points, queries, args, net), args))

    harness.child_main(args.child, args.child_out, CASES, run, label=label(args.child))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k points, 5k queries, 1 pass of 2 repetitions")
    ap.add_argument("--repeat", type=int, default=None, help="timed steady passes per system and pass (5; quick 2)")
    ap.add_argument("--cold", type=int, default=None, help="cold first passes per system and pass (as --repeat)")
    ap.add_argument("--passes", type=int, default=None, help="passes over the systems, A B A B (2; quick 1)")
    ap.add_argument("--points", type=int, default=None, help="points in the tree (1,500,000)")
    ap.add_argument("--queries", type=int, default=None, help="queries (50,000)")
    ap.add_argument("--only", default=None,
                    help=f"among {','.join(SYSTEMS)} (all; network mode: all but redis)")
    ap.add_argument("--transport", default="auto", help="Clamor's page transport (auto: shm on this host)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per system and pass")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each system, wait up to SECONDS for the machine to go quiet")  # fmt: skip
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    network.add_network_argument(ap)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    args.repeat = args.repeat or (2 if args.quick else 5)
    args.cold = args.repeat if args.cold is None else args.cold
    args.passes = args.passes or (1 if args.quick else 2)
    args.points = args.points or (200_000 if args.quick else 1_500_000)
    args.queries = args.queries or (5_000 if args.quick else 50_000)
    if args.child:
        child_main(args)
        return
    only = args.only or ",".join(s for s in SYSTEMS if s != "redis" or args.network is None)
    systems = [s.strip() for s in only.split(",") if s.strip()]
    if bad := [s for s in systems if s not in SYSTEMS]:
        ap.error(f"unknown system(s) {', '.join(bad)}")
    if args.network is not None and "redis" in systems:
        ap.error("redis has no workers to place on simulated hosts: leave it out with --network")
    network.require(args.network)
    argv = ["--repeat", str(args.repeat), "--cold", str(args.cold), "--points", str(args.points),
            "--queries", str(args.queries), "--transport", args.transport]  # fmt: skip
    argv += [f"--network={args.network}"] if args.network else []
    try:
        rows = harness.run_all(Path(__file__).resolve(), systems, argv, CASES, args.timeout, args.wait_idle,
                               label=label, passes=args.passes)  # fmt: skip
    finally:
        network.sweep_stale()
    finish(rows, args.queries)
    result: dict[str, Any] = {
        "workload": network.workload("kdtree", args.network),
        "title": network.title("k-d tree 10-NN queries in one region (sklearn KDTree unmodified)",
                               args.network, WORKERS),
        "quick": args.quick,
        "params": {"points": args.points, "queries": args.queries, "repeat": args.repeat, "cold": args.cold,
                   "passes": args.passes, "workers": WORKERS, "tasks": TASKS, "k": K, "leaf_size": LEAF,
                   "region": REGION, "transport": args.transport if args.network is None else "tcp", "redis_first_radius_km": R0_KM,
                   "systems": [label(s) for s in systems], **network.params(args.network, WORKERS),
                   "command": "python bench/run.py kdtree" + "".join(f" {a}" for a in sys.argv[1:])},
        "page_size": next((r.get("page_size") for r in rows if r["system"] == "clamor" and r.get("page_size")), None),
        "rows": rows,
    }
    result["goals"] = goals(result, args.network)
    save(result)
    print(render(result))


if __name__ == "__main__":
    main()
