#!/usr/bin/env python3
"""k-d tree 10-NN queries in one region: Clamor vs. Redis GEOSEARCH, Dask and Ray.

    python bench/run.py kdtree [--quick] [--repeat R] [--only clamor,redis,dask,ray]
                           [--points N] [--queries Q] [--timeout S] [--network [RATE]]

The paper's geographic workload (issue 8, DESIGN.md section 9): N points around real
US places (``runtime/geodata.scaled_points``, Morton order: neighbours share pages) in
an unmodified ``sklearn.neighbors.KDTree`` (leaf size 40); Q queries around San
Francisco (a random point of the region plus ~1 km of noise), 10 nearest neighbours
each, cut into 8 tasks over 2 workers.

* **clamor**: the tree is built inside ``with clamor.shared():`` so its arrays live in
  the arena; ``cluster.run_stage`` ships it *by reference* and the workers demand-page
  only the pages their queries touch. A fresh cluster per repetition (start-up not
  timed), so every end-to-end pass starts with empty worker caches.
* **dask**: ``client.scatter(tree, broadcast=True, hash=False)`` then one
  ``client.submit`` per chunk with the future; **ray**: ``ray.put(tree)`` then one
  remote task per chunk. Both ship the whole pickled tree.
* **redis**: Debian's ``redis-server`` started here on 127.0.0.1 (a free port, a temp
  dir, no persistence); ``GEOADD`` of every point (pipelined), then per query
  ``GEOSEARCH FROMLONLAT lon lat BYRADIUS r km ASC COUNT 10`` with the smallest
  radius that returns 10, found by doubling from 0.25 km; each round is one pipeline
  of the queries still short of 10.

Cases (seconds per repetition): ``end to end`` = shipping/loading the tree plus one
pass of the queries (cold workers) -- for Redis the GEOADD load plus the queries;
``queries (warm)`` = a second pass right after (tree already on the workers / in
Redis), whose Q / seconds is the throughput. Each system runs in its own child
process (this script with ``--child``); processes left behind are killed and flagged.

Checks: Clamor's, Dask's and Ray's neighbours must equal a local sklearn query
exactly. Redis measures great-circle (haversine) distance while the tree is Euclidean
on (lat, lon), so its 10 nearest legitimately differ: its answer is checked against
the exact haversine 10-NN (an sklearn ``BallTree(metric="haversine")``, mean overlap
>= 0.99), and its overlap with the KDTree's answer is reported for context.

``--network [RATE]`` (``network.py``): Clamor, Dask and Ray with their 2 workers on 2
simulated hosts behind links of RATE (1gbit) and the driver's uplink shaped to RATE
(Clamor pages over TCP; Ray's tree goes to each node's object store); Redis, one server
with no workers to place, is left out. Writes ``bench/results/kdtree-network.json``.
"""

from __future__ import annotations

import argparse
import os
import pickle
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import network, progress
from harness.results import goal, goal_lines, median, ratio, row, save
from peers import DaskSession, RaySession, find

SYSTEMS = ("clamor", "redis", "dask", "ray")
WORKERS = 2
TASKS = 8
K = 10
REGION = ((37.3, 38.0), (-122.6, -121.8))  # around San Francisco, as notebooks/kdtree.ipynb
R0_KM = 0.25  # the first GEOSEARCH radius; doubled until 10 come back
REDIS_BATCH = 2000  # commands per pipeline round trip
CASES = ("end to end", "queries (warm)")


# --- data, the same in every child ------------------------------------------------------


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


def check_exact(parts: list, ref_idx: np.ndarray, ref_dist: np.ndarray) -> tuple[bool, str]:
    """Do the tasks' answers, concatenated, equal the local sklearn query?"""
    idx = np.concatenate([p[0] for p in parts])
    dist = np.concatenate([p[1] for p in parts])
    if idx.shape != ref_idx.shape:
        return False, f"WRONG: shape {idx.shape}, expected {ref_idx.shape}"
    bad = int((idx != ref_idx).any(axis=1).sum())
    if bad or not np.allclose(dist, ref_dist):
        return False, f"WRONG: {bad} of {len(idx)} queries differ from a local sklearn query"
    return True, ""


def peak_of(parts: list) -> int:
    return max(int(p[2]) for p in parts)


def system_row(system: str, case: str, seconds: list[float], n_queries: int, **kw: Any) -> dict:
    """A result row with the throughput (queries/s at the median) added."""
    med = median(seconds)
    return row(system, case, seconds, queries_per_s=(n_queries / med if med else None), **kw)


# --- the systems ------------------------------------------------------------------------


def run_clamor(args: argparse.Namespace, points: np.ndarray, queries: np.ndarray,
               net: Any = None) -> list[dict]:  # fmt: skip
    from sklearn.neighbors import KDTree

    import clamor

    with clamor.shared():  # KDTree keeps a float64 C-contiguous input as is: it must be in the arena too
        tree = KDTree(clamor.asarray(points), leaf_size=40)
    tree_bytes = sum(a.nbytes for a in tree.get_arrays())
    ref_dist, ref_idx = tree.query(queries, k=K)
    chunks = np.array_split(queries, TASKS)
    e2e, warm, moved, rss, notes = [], [], [], [], []
    detail: dict[str, list] = {"pages_fetched": [], "driver_bytes": [], "peer_bytes": [], "shm_bytes": []}
    ok = True
    page_size = 0
    options: dict[str, Any] = {"transport": args.transport}
    for rep in range(args.repeat):
        if net is not None:  # one worker per simulated host, pages over TCP
            options = network.cluster_options(net)
        with clamor.Cluster(workers=WORKERS, **options) as cluster:
            page_size = cluster.page_size
            cluster.run_stage([(w, _warm, ()) for w in cluster.workers])
            calls = [(i % WORKERS, _query, (tree, c)) for i, c in enumerate(chunks)]
            s0 = cluster.stats()
            t0 = time.perf_counter()
            cold = cluster.run_stage(calls)
            e2e.append(time.perf_counter() - t0)
            s1 = cluster.stats()
            t0 = time.perf_counter()
            hot = cluster.run_stage(calls)
            warm.append(time.perf_counter() - t0)
            for parts in (cold, hot):
                good, why = check_exact(parts, ref_idx, ref_dist)
                ok &= good
                if why and why not in notes:
                    notes.append(why)
            fetched = s1["pages_fetched"] - s0["pages_fetched"]
            detail["pages_fetched"].append(fetched)
            detail["driver_bytes"].append(s1["bytes_served_by_driver"] - s0["bytes_served_by_driver"])
            detail["peer_bytes"].append(s1["bytes_served_by_peers"] - s0["bytes_served_by_peers"])
            detail["shm_bytes"].append(s1["driver"].get("shm_bytes", 0) - s0["driver"].get("shm_bytes", 0))
            moved.append(fetched * page_size)
            workers_rss = max(int(w.get("rss_bytes", 0)) for w in cluster.worker_stats())
            rss.append(max(peak_of(cold), peak_of(hot), workers_rss))
        progress(f"  clamor {rep + 1}/{args.repeat}: end to end {e2e[-1]:.3f} s, warm {warm[-1]:.3f} s, "
                 f"{moved[-1] / 2**20:.1f} of {tree_bytes / 2**20:.1f} MiB paged in")  # fmt: skip
    common = dict(bytes_moved=int(statistics.median(moved)), peak_worker_rss=max(rss),
                  note="; ".join(notes), correct=ok, tree_bytes=tree_bytes, page_size=page_size,
                  transport=options["transport"], fraction_paged=statistics.median(moved) / tree_bytes, **detail)  # fmt: skip
    return [system_row("clamor", CASES[0], e2e, len(queries), **common),
            system_row("clamor", CASES[1], warm, len(queries), **common)]  # fmt: skip


def _peer_rows(system: str, args: argparse.Namespace, queries: np.ndarray, ship, run, cleanup,
               shipped_bytes: int, tree_bytes: int, ref: tuple) -> list[dict]:  # fmt: skip
    """The Dask / Ray measurement: ``ship()`` a fresh copy, ``run(handle)`` the chunks."""
    e2e, warm, rss, notes = [], [], [], []
    ok = True
    for rep in range(args.repeat):
        t0 = time.perf_counter()
        handle = ship()
        cold = run(handle)
        e2e.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        hot = run(handle)
        warm.append(time.perf_counter() - t0)
        cleanup(handle)
        for parts in (cold, hot):
            good, why = check_exact(parts, ref[1], ref[0])
            ok &= good
            if why and why not in notes:
                notes.append(why)
        rss.append(max(peak_of(cold), peak_of(hot)))
        progress(f"  {system} {rep + 1}/{args.repeat}: end to end {e2e[-1]:.3f} s, warm {warm[-1]:.3f} s")
    common = {"bytes_moved": shipped_bytes, "peak_worker_rss": max(rss), "note": "; ".join(notes),
                  "correct": ok, "tree_bytes": tree_bytes}  # fmt: skip
    return [system_row(system, CASES[0], e2e, len(queries), **common),
            system_row(system, CASES[1], warm, len(queries), **common)]  # fmt: skip


def _heap_tree(points: np.ndarray) -> tuple[Any, int, int]:
    """An ordinary (heap) tree, its pickled size and the bytes of its arrays."""
    from sklearn.neighbors import KDTree

    tree = KDTree(points, leaf_size=40)
    size = len(pickle.dumps(tree, protocol=5))
    return tree, size, sum(a.nbytes for a in tree.get_arrays())


def run_dask(args: argparse.Namespace, points: np.ndarray, queries: np.ndarray,
             net: Any = None) -> list[dict]:  # fmt: skip
    tree, size, tree_bytes = _heap_tree(points)
    ref = tree.query(queries, k=K)
    chunks = np.array_split(queries, TASKS)
    with DaskSession(network=net) as session:
        client = session.client
        client.run(_warm)
        return _peer_rows(
            "dask", args, queries,
            ship=lambda: client.scatter(tree, broadcast=True, hash=False),
            run=lambda fut: client.gather([client.submit(_query, fut, c, pure=False) for c in chunks]),
            cleanup=lambda fut: client.cancel(fut),
            shipped_bytes=WORKERS * size, tree_bytes=tree_bytes, ref=ref,
        )  # fmt: skip


def run_ray(args: argparse.Namespace, points: np.ndarray, queries: np.ndarray,
            net: Any = None) -> list[dict]:  # fmt: skip
    tree, size, tree_bytes = _heap_tree(points)
    ref = tree.query(queries, k=K)
    chunks = np.array_split(queries, TASKS)
    with RaySession(network=net) as session:
        ray = session.ray
        remote = ray.remote(num_cpus=1)(_query)
        warm = ray.remote(num_cpus=1)(_warm)
        ray.get([warm.remote() for _ in range(2 * WORKERS)])
        return _peer_rows(
            "ray", args, queries,
            ship=lambda: ray.put(tree),
            run=lambda ref_: ray.get([remote.remote(ref_, c) for c in chunks]),
            cleanup=lambda ref_: None,
            shipped_bytes=size * session.copies, tree_bytes=tree_bytes, ref=ref,
        )  # fmt: skip


# --- Redis ------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: str) -> tuple[subprocess.Popen, int]:
    """A private redis-server on 127.0.0.1 (no persistence); the process and its port."""
    server = shutil.which("redis-server") or "/usr/bin/redis-server"
    port = free_port()
    proc = subprocess.Popen(
        [server, "--port", str(port), "--bind", "127.0.0.1", "--dir", workdir, "--save", "",
         "--appendonly", "no", "--daemonize", "no", "--logfile", os.path.join(workdir, "redis.log")],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return proc, port


def redis_search(r: Any, queries: np.ndarray) -> tuple[list[list[int]], np.ndarray, int]:
    """Per query, the members GEOSEARCH returns at the smallest doubled radius giving 10;
    the radius used per query and the number of GEOSEARCH commands sent."""
    radius = np.full(len(queries), R0_KM)
    found: list[list[int]] = [[] for _ in queries]
    pending = list(range(len(queries)))
    commands = 0
    while pending:
        short = []
        for start in range(0, len(pending), REDIS_BATCH):
            batch = pending[start:start + REDIS_BATCH]
            pipe = r.pipeline(transaction=False)
            for i in batch:
                lat, lon = queries[i]
                pipe.execute_command("GEOSEARCH", "pts", "FROMLONLAT", float(lon), float(lat),
                                     "BYRADIUS", float(radius[i]), "km", "ASC", "COUNT", K)  # fmt: skip
            commands += len(batch)
            for i, members in zip(batch, pipe.execute(), strict=True):
                if len(members) >= K:
                    found[i] = [int(m) for m in members]
                else:
                    radius[i] *= 2
                    short.append(i)
        pending = short
    return found, radius, commands


def haversine_reference(points: np.ndarray, queries: np.ndarray) -> np.ndarray:
    """The exact great-circle 10-NN of each query (indices into ``points``)."""
    from sklearn.neighbors import BallTree

    lo, hi = queries.min(axis=0) - 1.0, queries.max(axis=0) + 1.0  # 1 degree around the region
    near = np.flatnonzero(((points >= lo) & (points <= hi)).all(axis=1))
    tree = BallTree(np.radians(points[near]), metric="haversine")
    return near[tree.query(np.radians(queries), k=K)[1]]


def overlap(a: list[list[int]] | np.ndarray, b: np.ndarray) -> float:
    """Mean fraction of each query's 10 neighbours in ``a`` that are also in ``b``."""
    return float(np.mean([len(set(x) & set(y.tolist())) / K for x, y in zip(a, b, strict=True)]))


def run_redis(args: argparse.Namespace, points: np.ndarray, queries: np.ndarray) -> list[dict]:
    import psutil
    import redis
    from sklearn.neighbors import KDTree

    if not (shutil.which("redis-server") or os.access("/usr/bin/redis-server", os.X_OK)):
        raise RuntimeError("redis-server is not installed (apt-get install redis-server)")
    ref_kd = KDTree(points, leaf_size=40).query(queries, k=K)[1]
    ref_hav = haversine_reference(points, queries)
    lon = np.clip(points[:, 1], -180.0, 180.0)  # GEOADD rejects |lon| > 180 (none near the region)
    members = [str(i) for i in range(len(points))]
    load, e2e, warm, moved, rss, notes = [], [], [], [], [], []
    ok = True
    info: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="clamor-kdtree-redis-") as tmp:
        proc, port = start_redis(tmp)
        try:
            r = redis.Redis(host="127.0.0.1", port=port)
            deadline = time.monotonic() + 30
            while True:
                try:
                    r.ping()
                    break
                except redis.ConnectionError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"redis-server did not start (exit {proc.poll()})") from None
                    time.sleep(0.05)
            for rep in range(args.repeat):
                r.flushall()
                n0 = r.info("stats")
                t0 = time.perf_counter()
                pipe = r.pipeline(transaction=False)
                for s in range(0, len(points), 10_000):
                    flat: list = []
                    for j in range(s, min(s + 10_000, len(points))):
                        flat += (float(lon[j]), float(points[j, 0]), members[j])
                    pipe.execute_command("GEOADD", "pts", *flat)
                    if len(pipe) >= 20:
                        pipe.execute()
                pipe.execute()
                load.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                cold, radius, commands = redis_search(r, queries)
                e2e.append(load[-1] + time.perf_counter() - t0)
                t0 = time.perf_counter()
                found, _, _ = redis_search(r, queries)
                warm.append(time.perf_counter() - t0)
                n1 = r.info("stats")
                moved.append(n1["total_net_input_bytes"] - n0["total_net_input_bytes"]
                             + n1["total_net_output_bytes"] - n0["total_net_output_bytes"])  # fmt: skip
                rss.append(psutil.Process(proc.pid).memory_info().rss)
                if r.zcard("pts") != len(points):
                    ok = False
                    notes.append(f"WRONG: {r.zcard('pts')} members loaded, expected {len(points)}")
                hav = overlap(found, ref_hav)
                if found != cold or hav < 0.99:
                    ok = False
                    msg = f"WRONG: overlap with the exact haversine 10-NN {hav:.3f} (< 0.99)"
                    if msg not in notes:
                        notes.append(msg)
                info = {"overlap_haversine": hav, "overlap_kdtree": overlap(found, ref_kd),
                            "geosearch_per_query": commands / len(queries),
                            "radius_km_median": float(np.median(radius)), "radius_km_max": float(radius.max())}  # fmt: skip
                progress(f"  redis {rep + 1}/{args.repeat}: GEOADD {load[-1]:.2f} s, end to end {e2e[-1]:.2f} s, "
                         f"warm {warm[-1]:.2f} s, {info['geosearch_per_query']:.2f} GEOSEARCH/query, "
                         f"overlap with KDTree {info['overlap_kdtree']:.3f}, with haversine {hav:.3f}")  # fmt: skip
        finally:
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    common = dict(bytes_moved=int(statistics.median(moved)), peak_worker_rss=max(rss), note="; ".join(notes),
                  correct=ok, load_seconds=load, **info)  # fmt: skip
    return [system_row("redis", CASES[0], e2e, len(queries), **common),
            system_row("redis", CASES[1], warm, len(queries), **common)]  # fmt: skip


RUNNERS = {"clamor": run_clamor, "redis": run_redis, "dask": run_dask, "ray": run_ray}


# --- children ---------------------------------------------------------------------------


def child_main(args: argparse.Namespace) -> None:
    """Measure one system; its rows (or unavailable rows) go to ``--child-out``."""

    def measure(system: str, rows: harness.Rows) -> None:
        points, queries = make_data(args.points, args.queries)
        if args.network is None:
            rows.extend(RUNNERS[system](args, points, queries))
            return
        with network.simulated_hosts(WORKERS, args.network) as net:
            rows.extend(RUNNERS[system](args, points, queries, net))

    harness.child_main(args.child, args.child_out, CASES, measure)


# --- the report -------------------------------------------------------------------------


def mib(n: int | None) -> str:
    return "—" if n is None else f"{n / 2**20:.1f}"


def render(result: dict) -> str:
    p = result["params"]
    lines = [
        f"# k-d tree 10-NN queries around San Francisco ({p['points']:,} points, {p['queries']:,} queries)",
        "",
        (f"{WORKERS} workers, {TASKS} tasks, sklearn KDTree (leaf 40), median of {p['repeat']} repetitions "
        f"(min–max). Clamor page size {result.get('page_size') or '?'} B, transport `{p['transport']}`."),
        "",
        "| system | case | seconds (min–max) | queries/s | ÷ Clamor | bytes moved (MiB) | peak worker RSS (MiB) | note |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    for r in result["rows"]:
        s = r["seconds"]
        if not s:
            lines.append(f"| {r['system']} | {r['case']} | — | — | — | — | — | {r['note']} |")
            continue
        q = ratio(result, r["system"], r["case"])
        qps = r.get("queries_per_s")
        lines.append(
            f"| {r['system']} | {r['case']} | {median(s):.3f} ({min(s):.3f}–{max(s):.3f}) | "
            f"{qps:,.0f} | {'—' if q is None else f'{q:.2f}×'} | {mib(r['bytes_moved'])} | "
            f"{mib(r['peak_worker_rss'])} | {r['note']} |"
        )
    for r in result["rows"]:
        if r["system"] == "redis" and r["case"] == CASES[1] and r["seconds"]:
            lines += ["", (f"Redis: GEOADD load {median(r['load_seconds']):.2f} s; "
                      f"{r['geosearch_per_query']:.2f} GEOSEARCH per query (median radius "
                      f"{r['radius_km_median']:.2f} km, max {r['radius_km_max']:.1f} km); neighbour overlap "
                      f"with the KDTree (Euclidean on lat/lon) {r['overlap_kdtree']:.3f}, with the exact "
                      f"haversine 10-NN {r['overlap_haversine']:.3f}.")]  # fmt: skip
        if r["system"] == "clamor" and r["case"] == CASES[0] and r["seconds"]:
            lines += ["", (f"Clamor paged in {100 * r['fraction_paged']:.1f} % of the {mib(r['tree_bytes'])} MiB "
                      "tree (median over repetitions).")]  # fmt: skip
    lines += ["", "## Goals", ""]
    return "\n".join(lines + goal_lines(result["goals"], digits=1)) + "\n"



def goals(result: dict[str, Any], net: str | None) -> list[dict]:
    """The issues' goals against Redis and Ray, from the rows (also for a saved result)."""
    rows = result["rows"]
    wrong = sorted({r["system"] for r in rows if r.get("correct") is False})
    why = f"wrong answers: {', '.join(wrong)}" if wrong else ""
    redis_goal = goal(">= 100x Redis's query throughput (warm)", ratio(result, "redis", CASES[1]),
                      100.0, why)  # fmt: skip
    ray_goal = goal(">= 3x faster than Ray end to end", ratio(result, "ray", CASES[0]), 3.0, why)
    host_goal = goal(">= 1.5x faster than Ray end to end on one host (issue 19)",
                     ratio(result, "ray", CASES[0]), 1.5, why)  # fmt: skip
    out = [ray_goal] if net else [redis_goal, ray_goal, host_goal]
    for g in out:
        g["met"] = g["met"] and not wrong
    if not redis_goal["met"] and not redis_goal["why"] and redis_goal["value"]:
        redis_goal["why"] = (
            "one redis-py client pipelines the GEOSEARCH commands (several per query: the radius "
            "doubles until 10 come back) to one single-threaded redis-server, and both share the "
            "2 cores with nothing else; the paper's 125x is Redis on a cluster against Clamor's "
            "workers across it")
    if not ray_goal["met"] and not ray_goal["why"] and ray_goal["value"] and net is None:
        ray_goal["why"] = (
            "on one host, ray.put stores the tree's arrays once in shared memory and Ray's workers "
            "map them in place (pickle protocol 5), so shipping the whole tree costs one memory "
            "copy; Clamor's advantage, paging in only the part of the tree the region touches, "
            "needs a real link between driver and workers: see kdtree-network")
    ray_e2e, warm = (median(r["seconds"]) for r in (find(rows, "ray", CASES[0]), find(rows, "clamor", CASES[1])))
    if not host_goal["met"] and not host_goal["why"] and ray_e2e and warm:
        host_goal["why"] = (
            f"both systems run the same sklearn queries on 2 workers, and Clamor's warm pass alone "
            f"takes {warm:.3f} s: even with nothing to ship the ratio could reach only "
            f"{ray_e2e / warm:.2f}x at this tree size; with 10x the points (a 375 MiB tree, "
            f"`--points 15000000`) it was 1.94x")
    return out

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="200k points, 5k queries, 2 repetitions")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--points", type=int, default=None, help="points in the tree (1,500,000)")
    ap.add_argument("--queries", type=int, default=None, help="queries (50,000)")
    ap.add_argument("--only", default=None,
                    help=f"among {','.join(SYSTEMS)} (all; network mode: clamor,dask,ray)")
    ap.add_argument("--transport", default="auto", help="Clamor's page transport (auto: shm on this host)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per system")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    network.add_network_argument(ap)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    args.repeat = args.repeat or (2 if args.quick else 5)
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
    argv = ["--repeat", str(args.repeat), "--points", str(args.points), "--queries", str(args.queries),
            "--transport", args.transport]  # fmt: skip
    argv += [f"--network={args.network}"] if args.network else []
    try:
        rows = harness.run_all(Path(__file__).resolve(), systems, argv, CASES, args.timeout)
    finally:
        network.sweep_stale()
    result: dict[str, Any] = {
        "workload": network.workload("kdtree", args.network),
        "title": network.title("k-d tree 10-NN queries in one region (sklearn KDTree unmodified)",
                               args.network, WORKERS),
        "quick": args.quick,
        "params": {"points": args.points, "queries": args.queries, "repeat": args.repeat, "workers": WORKERS,
                   "tasks": TASKS, "k": K, "leaf_size": 40, "region": REGION, "transport": args.transport,
                   "redis_first_radius_km": R0_KM, "systems": systems,
                   **network.params(args.network, WORKERS),
                   "command": "python bench/run.py kdtree" + "".join(f" {a}" for a in sys.argv[1:])},
        "page_size": next((r.get("page_size") for r in rows if r["system"] == "clamor" and r.get("page_size")), None),
        "rows": rows,
    }
    result["goals"] = goals(result, args.network)
    save(result)
    print(render(result))


if __name__ == "__main__":
    main()
