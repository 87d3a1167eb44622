#!/usr/bin/env python3
"""Dense k-means on 2 workers: Clamor vs. MPI (mpi4py + OpenMPI), Dask and Spark.

    python bench/run.py kmeans [--quick] [--repeat R] [--only clamor,mpi,dask,spark]

N points x 16 dims float64 (N = 2,000,000, 244 MiB; ``--quick``: 400,000) around k = 16
Gaussian centres, seeded; the same k initial centroids (seeded picks) for everybody; a
fixed number of Lloyd iterations (R: 10, quick 5). Every system runs the same numpy
kernel (:func:`assign`: squared distances by a matrix product, argmin, per-cluster sums
and counts by ``bincount``) on the same P = 8 partitions (MPI: one contiguous half per
rank), and the new centroids are sums / counts:

* **clamor**: the points in the arena (``clamor.asarray``), ``cluster.parallelize(points,
  partitions=P)`` (arena slices, demand-paged once, then cached), one action per
  iteration whose tasks add into two accumulators; the centroids travel with the tasks.
* **mpi**: ``mpirun -n 2 --allow-run-as-root --oversubscribe`` this script; each rank
  generates its half, then per iteration ``Allreduce`` of sums and counts.
* **dask**: the partitions scattered to the workers once, then per iteration
  ``client.map(assign, parts, c=centroids)`` and ``client.gather``.
* **spark**: ``local[2]``, ``sc.parallelize(parts, P).cache()``, per iteration a
  broadcast of the centroids and ``rdd.map(...).reduce(...)``.

Reported: seconds per iteration (median, min-max; the first iteration includes Clamor's
paging the points in), bytes moved per iteration, peak worker RSS. Every system's final
centroids must match a reference computed in this process (rtol 1e-6), else the row is
marked wrong. Uses the child-process helpers of ``logreg.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import harness
import numpy as np
from harness import progress
from harness.results import goal, ratio, row, save, unavailable

from workloads.logreg import RssSampler

WORKERS = 2
SYSTEMS = ("clamor", "mpi", "dask", "spark")
BLOCK = 1 << 16  # rows generated per seeded block (any slice can be generated alone)
CASE = "per iteration"


def make_points(lo: int, hi: int, p: dict) -> np.ndarray:
    """Rows [lo, hi) of the data set: block b of BLOCK rows comes from rng([seed, b])."""
    k, d = p["k"], p["dims"]
    centres = np.random.default_rng([p["seed"], 10**9]).uniform(-10, 10, (k, d))
    out = []
    for b in range(lo // BLOCK, (hi - 1) // BLOCK + 1):
        rng = np.random.default_rng([p["seed"], b])
        n = min(BLOCK, p["points"] - b * BLOCK)
        x = centres[rng.integers(0, k, n)] + rng.normal(0, 2.0, (n, d))
        s, e = max(lo - b * BLOCK, 0), min(hi - b * BLOCK, n)
        out.append(x[s:e])
    return np.concatenate(out) if out else np.empty((0, d))


def initial_centroids(p: dict) -> np.ndarray:
    picks = np.random.default_rng([p["seed"], 7]).choice(p["points"], p["k"], replace=False)
    return np.stack([make_points(int(i), int(i) + 1, p)[0] for i in picks])


def bounds(p: dict, parts: int) -> list[tuple[int, int]]:
    e = np.linspace(0, p["points"], parts + 1).astype(int)
    return [(int(e[j]), int(e[j + 1])) for j in range(parts)]


def assign(x: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-cluster sums (k x d) and counts (k) of the points ``x`` nearest each centroid."""
    k = len(c)
    d2 = (c * c).sum(axis=1)[None, :] - 2.0 * (x @ c.T)  # + |x|^2, the same for every c
    label = np.argmin(d2, axis=1)
    sums = np.stack([np.bincount(label, weights=x[:, j], minlength=k) for j in range(x.shape[1])], axis=1)
    return sums, np.bincount(label, minlength=k).astype(np.int64)


def new_centroids(sums: np.ndarray, counts: np.ndarray, old: np.ndarray) -> np.ndarray:
    """sums / counts; an empty cluster keeps its centroid."""
    out = old.copy()
    nz = counts > 0
    out[nz] = sums[nz] / counts[nz][:, None]
    return out


def reference(p: dict) -> np.ndarray:
    """The final centroids, computed here partition by partition (as the systems do)."""
    parts = [make_points(lo, hi, p) for lo, hi in bounds(p, p["partitions"])]
    c = initial_centroids(p)
    for _ in range(p["iterations"]):
        res = [assign(x, c) for x in parts]
        c = new_centroids(sum(r[0] for r in res), sum(r[1] for r in res), c)
    return c


def result_row(system: str, seconds: list[float], c: np.ndarray, moved: list[int], rss: int,
               note: str = "", **extra: object) -> dict:
    return row(system, CASE, seconds, bytes_moved=int(np.median(moved)) if moved else None,
               peak_worker_rss=rss, note=note, centroids=c.tolist(), bytes_per_iteration=moved,
               **extra)


def lloyd(p: dict, step, label: str, after=None) -> tuple[list[float], np.ndarray]:
    """Run the iterations: ``step(c)`` returns (sums, counts) over all the points;
    ``after()`` runs after each (untimed)."""
    c, seconds = initial_centroids(p), []
    for it in range(p["iterations"]):
        t0 = time.perf_counter()
        sums, counts = step(c)
        c = new_centroids(sums, counts, c)
        seconds.append(time.perf_counter() - t0)
        if int(counts.sum()) != p["points"]:
            raise RuntimeError(f"{label}: iteration {it + 1} counted {int(counts.sum())} points")
        if after is not None:
            after()
        progress(f"  {label} iteration {it + 1}: {seconds[-1]:.3f} s")
    return seconds, c


# --- the systems -------------------------------------------------------------------------------


def run_clamor(p: dict) -> list[dict]:
    import clamor

    points = clamor.asarray(make_points(0, p["points"], p))
    sampler = RssSampler()
    cluster = clamor.Cluster(workers=WORKERS)
    try:
        sampler.pids = [s["pid"] for s in cluster.worker_stats()]
        k, d = p["k"], p["dims"]
        sums, counts = cluster.accumulator((k, d)), cluster.accumulator(k, dtype=np.int64)
        ds = cluster.parallelize(points, partitions=p["partitions"])
        moved: list[int] = []

        def fetched() -> int:
            return sum(s.get("bytes_fetched", 0) for s in cluster.worker_stats())

        def step(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            sums.reset()
            counts.reset()

            def task(part: np.ndarray) -> np.ndarray:  # c travels by value with the task
                s, m = assign(part, c)
                sums.add(slice(None), s)
                counts.add(slice(None), m)
                return np.array([len(part)])

            ds.map_partitions(task).collect()
            return sums.value.copy(), counts.value.copy()

        before = [fetched()]

        def count_bytes() -> None:
            now = fetched()
            moved.append(now - before[0])
            before[0] = now

        seconds, c = lloyd(p, step, "clamor", after=count_bytes)
        return [result_row("clamor", seconds, c, moved, sampler.stop(), page_size=cluster.page_size,
                           note="bytes: pages the workers fetched (iteration 1 pages the points in)")]
    finally:
        sampler.stop()
        cluster.close()


def mpi_main(p: dict, out: Path) -> None:
    """One MPI rank (under mpirun): its half of the points, Allreduce per iteration."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = bounds(p, size)[rank]
    x = make_points(lo, hi, p)
    k, d = p["k"], p["dims"]
    sums, counts = np.empty((k, d)), np.empty(k, np.int64)

    def step(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        s, m = assign(x, c)
        comm.Allreduce(s, sums, op=MPI.SUM)
        comm.Allreduce(m, counts, op=MPI.SUM)
        return sums, counts

    comm.Barrier()
    seconds, c = lloyd(p, step, f"mpi rank {rank}")
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, root=0)
    if rank == 0:
        moved = (sums.nbytes + counts.nbytes) * 2 * size  # each rank's sends of the two Allreduces
        out.write_text(json.dumps([result_row(
            "mpi", seconds, c, [moved] * len(seconds), max(rss),
            note=f"{size} ranks; bytes: the Allreduce payloads; RSS: ru_maxrss of the ranks")]))


def run_mpi(p: dict) -> list[dict]:
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        return [unavailable("mpi", CASE, f"mpi4py not installed ({exc})")]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"clamor-kmeans-mpi-{os.getpid()}.json"
    cmd = ["mpirun", "-n", str(WORKERS), "--allow-run-as-root", "--oversubscribe",
           *harness.workload_command(__file__), "--mpi-rank", "--child-out", str(out),
           "--params", json.dumps(p)]
    try:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, timeout=600, check=False)
    except FileNotFoundError as exc:
        return [unavailable("mpi", CASE, f"mpirun not found ({exc}); apt-get install openmpi-bin")]
    try:
        if proc.returncode != 0 or not out.exists():
            return [unavailable("mpi", CASE, f"failed: mpirun exited with status {proc.returncode}")]
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


def run_dask(p: dict) -> list[dict]:
    try:
        from dask.distributed import Client, LocalCluster, wait
    except ImportError as exc:
        return [unavailable("dask", CASE, f"not installed ({exc})")]
    sampler = RssSampler()
    cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                           dashboard_address=None, memory_limit=0)
    client = Client(cluster)
    try:
        client.wait_for_workers(WORKERS, timeout=120)
        sampler.pids = list(client.run(os.getpid).values())
        parts = client.scatter([make_points(lo, hi, p) for lo, hi in bounds(p, p["partitions"])],
                               hash=False)
        wait(parts)

        def step(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            res = client.gather(client.map(assign, parts, c=c, pure=False))
            return sum(r[0] for r in res), sum(r[1] for r in res)

        seconds, c = lloyd(p, step, "dask")
        moved = _payload(p)
        return [result_row("dask", seconds, c, [moved] * len(seconds), sampler.stop(),
                           note="bytes: centroids to and sums/counts from each task")]
    finally:
        sampler.stop()
        client.close()
        cluster.close()


def _payload(p: dict) -> int:
    """Bytes a task-based peer moves per iteration: centroids out, sums and counts back."""
    k, d = p["k"], p["dims"]
    return p["partitions"] * (k * d * 8 + k * d * 8 + k * 8)


def _spark_assign(it, c):
    """A Spark partition (an iterator of point blocks) -> one (sums, counts) pair."""
    total = None
    for x in it:
        s, m = assign(x, c)
        total = (s, m) if total is None else (total[0] + s, total[1] + m)
    return [] if total is None else [total]


def run_spark(p: dict) -> list[dict]:
    try:
        from pyspark.sql import SparkSession
    except Exception as exc:  # noqa: BLE001 - a broken install raises more than ImportError
        return [unavailable("spark", CASE, f"pyspark does not import ({type(exc).__name__}: {exc})")]
    import psutil

    sampler = RssSampler()
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark binds the host's external address
    try:
        spark = (SparkSession.builder.master(f"local[{WORKERS}]").appName("clamor-kmeans")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.ui.enabled", "false").config("spark.driver.memory", "4g")
                 .config("spark.python.worker.reuse", "true")
                 .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    except Exception as exc:  # noqa: BLE001 - e.g. no Java
        return [unavailable("spark", CASE, f"could not start ({type(exc).__name__}: {exc})")]
    try:
        sc = spark.sparkContext
        sc.setLogLevel("ERROR")
        sampler.pids = [q.pid for q in psutil.Process().children() if "java" in q.name()]
        blocks = [make_points(lo, hi, p) for lo, hi in bounds(p, p["partitions"])]
        rdd = sc.parallelize(blocks, p["partitions"]).cache()
        rdd.count()
        del blocks

        def step(c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
            bc = sc.broadcast(c)
            out = rdd.mapPartitions(lambda it: _spark_assign(it, bc.value)).reduce(
                lambda a, b: (a[0] + b[0], a[1] + b[1]))
            bc.unpersist()
            return out

        seconds, c = lloyd(p, step, "spark")
        return [result_row("spark", seconds, c, [_payload(p)] * len(seconds), sampler.stop(),
                           note=f"local[{WORKERS}] (one JVM executor, Python workers); RSS: the JVM "
                                "with its Python workers; bytes: broadcast centroids, sums/counts back")]
    finally:
        sampler.stop()
        spark.stop()


RUNNERS = {"clamor": run_clamor, "mpi": run_mpi, "dask": run_dask, "spark": run_spark}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="400,000 points, 5 iterations")
    ap.add_argument("--repeat", type=int, default=None, help="iterations (10; quick 5)")
    ap.add_argument("--only", default=",".join(SYSTEMS))
    ap.add_argument("--points", type=int, default=None)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per system")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--mpi-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mpi_rank:
        mpi_main(json.loads(args.params), args.child_out)
        return
    if args.child:
        params = json.loads(args.params)
        harness.child_main(args.child, args.child_out, params["cases"],
                           lambda system, rows: rows.extend(RUNNERS[system](params)))
        return
    p = {"points": args.points or (400_000 if args.quick else 2_000_000), "dims": 16, "k": 16,
         "iterations": args.repeat or (5 if args.quick else 10), "partitions": 8, "seed": 11,
         "workers": WORKERS, "quick": args.quick, "cases": [CASE]}
    systems = [s for s in args.only.split(",") if s]
    ref = reference(p)
    rows = harness.run_all(Path(__file__).resolve(), systems, ["--params", json.dumps(p)], p["cases"],
                           args.timeout)
    for r in rows:
        if r["seconds"] and "centroids" in r:
            ok = bool(np.allclose(r["centroids"], ref, rtol=1e-6, atol=1e-9))
            r["correct"] = ok
            if not ok:
                err = float(np.abs(np.array(r["centroids"]) - ref).max())
                r["note"] = (r["note"] + "; " if r["note"] else "") + f"WRONG: centroids differ by {err:.3g}"
    result = {"workload": "kmeans", "quick": args.quick, "rows": rows, "page_size": None,
              "title": "Dense k-means: Clamor vs. MPI, Dask and Spark",
              "params": {**{k: v for k, v in p.items() if k != "cases"},
                         "points_bytes": p["points"] * p["dims"] * 8,
                         "timed": "per iteration: the assignment stage/step, the merge of sums "
                                  "and counts and the new centroids"}}
    ps = next((r.get("page_size") for r in rows if r["system"] == "clamor"), None)
    result["page_size"] = ps
    want = {"mpi": (1 / 1.5, "within 1.5x of MPI (mpi/clamor >= 0.67)"),
            "dask": (1.0, "faster than Dask"), "spark": (1.0, "faster than Spark")}
    result["goals"] = []
    for peer in systems:
        if peer in want:
            r = ratio(result, peer, CASE)
            target, text = want[peer]
            why = "not measured" if r is None else "" if r >= target else "see the per-iteration times"
            result["goals"].append(goal(text, r, target, why))
    path = save(result)
    print("| system | median s/iteration | min–max | peer/clamor | bytes/iteration | peak worker RSS MiB | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        s = r["seconds"]
        ra = ratio(result, r["system"], CASE)
        print(f"| {r['system']} | {np.median(s):.4f} | {min(s):.4f}–{max(s):.4f} | "
              f"{'' if ra is None else f'{ra:.2f}'} | {r['bytes_moved']} | "
              f"{(r['peak_worker_rss'] or 0) / 2**20:.0f} | {r['note']} |" if s else
              f"| {r['system']} | — | — | — | — | — | {r['note']} |")
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
