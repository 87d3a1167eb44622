#!/usr/bin/env python3
"""Dense k-means (Lloyd iterations): Clamor against MPI (mpi4py + OpenMPI), Dask and
Spark, and the machine's limits.

    python bench/run.py kmeans [--quick] [--repeat R] [--passes P] [--points N]
                           [--only clamor,mpi,dask,spark,shm,numpy]

N points x 16 dims float64 (N = 2,000,000, 244 MiB; ``--quick``: 400,000) around k = 16
Gaussian centres, seeded; the same k initial centroids (seeded picks) for every system.
Every system runs the same numpy kernel (:func:`assign`: squared distances by a matrix
product, argmin, per-cluster sums and counts by ``bincount``) on the same P = 8
partitions (MPI: one contiguous part per rank), and the new centroids are sums / counts.
Every task knows the same: its partition and the current centroids (16 x 16, shipped
by value with the task on every system).

Systems, each in its own child process (``peers.WORKERS`` workers: 2):

* **clamor**: ``clamor.asarray(points)`` (a copy into the arena), ``cluster.parallelize(
  points, partitions=P)`` (arena slices: the workers demand-page their partition once,
  then keep it), one action an iteration whose tasks add into two accumulators.
* **mpi**: ``mpirun -n W --allow-run-as-root --oversubscribe`` this script; each rank
  generates its own part (untimed: an MPI program reads its slice itself, nothing is
  shipped), then per iteration ``Allreduce`` of the sums and counts.
* **dask**: ``client.scatter(parts)`` once (Dask's docs, "Data Locality": scatter data
  once, pass the futures), then per iteration ``client.map(assign, parts, c=c)`` and
  ``client.gather`` (``peers.DaskSession``).
* **spark**: ``local[W]``, ``sc.parallelize(parts, P).cache()``, per iteration a
  broadcast of the centroids and ``mapPartitions(...).reduce(...)``. Spark's MLlib
  ``KMeans`` is not a row: ``pyspark.ml``'s cannot start from given centroids (its
  ``initMode`` is random or k-means||), so its answer could not be checked against the
  others', and ``pyspark.mllib``'s ``KMeans.train(initialModel=...)`` converts every row
  from Python to the JVM in each call (a call runs all its iterations, so no
  per-iteration time is measured either).
* **shm** ("limit: shared memory, W processes"): a ``multiprocessing`` fork pool made
  before the points exist; the points copied into a ``SharedMemory`` block that the
  processes attach by name; ``pool.map`` of the partitions.
* **numpy** ("limit: numpy, one process"): the partitions in turn in the child itself.

Protocol (``harness.run_all``, ``--passes`` P, 2 by default, A B C A B C ...), per child:

* **first iteration (cold)**: from the points in the driver's memory to the first
  centroids: the shipping (arena copy, scatter, parallelize + cache, shared-memory copy;
  its seconds are ``ship_runs``) and the first iteration, on a freshly started system
  (its start-up untimed). MPI ships nothing.
* an untimed warm-up iteration at full size;
* **per iteration (steady)**: ``--repeat`` R (10; quick 5) timed iterations.

Every child's final centroids must match a reference computed in the parent with the
same number of iterations (rtol 1e-6), else the row is marked wrong. Bytes moved per
iteration: Clamor's fetched pages; the peers' centroids out and sums/counts back (and the
points in the cold iteration). Goals compare Clamor with each peer's faster program;
their explanations are computed from the rows. Writes ``bench/results/kmeans.json``.
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
from harness.options import arguments, systems
from harness.results import goal, median, row, save, unavailable
from harness.tables import limit_row, markdown
from harness.usage import RssSampler
from limits import SharedMemorySession, _shm_view
from peers import WORKERS, DaskSession
from programs import family

PROGRAMS = ("clamor", "mpi", "dask", "spark", "shm", "numpy")
LABELS = {"shm": f"limit: shared memory, {WORKERS} processes",
          "numpy": "limit: numpy, one process"}  # fmt: skip
LIMITS = ("shm", "numpy")
BLOCK = 1 << 16  # rows generated per seeded block (any slice can be generated alone)
COLD, STEADY = "first iteration (cold)", "per iteration (steady)"
CASES = (COLD, STEADY)


def label(system: str) -> str:
    return LABELS.get(system, system)


# --- the data and the kernel, the same everywhere ------------------------------------------


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
    import numpy as np

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


def total(results) -> tuple[np.ndarray, np.ndarray]:
    return sum(r[0] for r in results), sum(r[1] for r in results)


def reference(p: dict, iterations: int) -> np.ndarray:
    """The centroids after ``iterations``, computed here partition by partition."""
    parts = [make_points(lo, hi, p) for lo, hi in bounds(p, p["partitions"])]
    c = initial_centroids(p)
    for _ in range(iterations):
        c = new_centroids(*total([assign(x, c) for x in parts]), c)
    return c


def payload(p: dict) -> int:
    """Bytes a task-based program moves an iteration: centroids out, sums and counts back."""
    k, d = p["k"], p["dims"]
    return p["partitions"] * (k * d * 8 + k * d * 8 + k * 8)


# --- the systems: load() ships the points (timed in the cold case), step(c) an iteration ---


class System:
    """One system holding the points; ``moved_cold`` / ``moved_step``: bytes it moves."""

    note = ""

    def __init__(self, p: dict) -> None:
        self.p = p
        self.pids: list[int] = []
        self.fields: dict = {}  # extra row fields

    def load(self, points: np.ndarray) -> None:
        raise NotImplementedError

    def step(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def moved_cold(self) -> int:
        return self.p["points"] * self.p["dims"] * 8 + payload(self.p)

    def moved_step(self) -> int:
        return payload(self.p)

    def close(self) -> None:
        pass


class ClamorSystem(System):
    note = ("bytes: pages the driver and peers served (on one host the workers map the arena's pages "
            "in place instead: bytes_mapped_runs, the cold iteration's, the warm-up's, each steady one's)")  # fmt: skip

    def __init__(self, p: dict) -> None:
        super().__init__(p)
        import clamor

        self.clamor = clamor
        self.cluster = clamor.Cluster(workers=WORKERS)
        self.pids = [s["pid"] for s in self.cluster.worker_stats()]
        self.fields = {"page_size": self.cluster.page_size, "bytes_mapped_runs": []}
        k, d = p["k"], p["dims"]
        self.sums, self.counts = self.cluster.accumulator((k, d)), self.cluster.accumulator(k, dtype=np.int64)
        self.last: tuple[int, int] | None = None

    def load(self, points: np.ndarray) -> None:
        self.ds = self.cluster.parallelize(self.clamor.asarray(points), partitions=self.p["partitions"])

    def step(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        sums, counts = self.sums, self.counts
        sums.reset()
        counts.reset()

        def task(part: np.ndarray) -> np.ndarray:  # c travels by value with the task
            s, m = assign(part, c)
            sums.add(slice(None), s)
            counts.add(slice(None), m)
            return np.array([len(part)])

        self.ds.map_partitions(task).collect()
        return sums.value.copy(), counts.value.copy()

    def fetched(self) -> int:
        """Bytes served since the last call; the bytes mapped go to ``bytes_mapped_runs``."""
        s = self.cluster.stats()
        now = (int(s.get("bytes_served_by_driver", 0)) + int(s.get("bytes_served_by_peers", 0)),
               int(s.get("bytes_mapped", 0)))  # fmt: skip
        out, last = now, self.last or (0, 0)
        self.last = now
        self.fields["bytes_mapped_runs"].append(out[1] - last[1])
        return out[0] - last[0]

    moved_cold = moved_step = fetched

    def close(self) -> None:
        self.cluster.close()


class DaskSystem(System):
    def __init__(self, p: dict) -> None:
        super().__init__(p)
        self.session = DaskSession()
        self.client = self.session.client
        self.pids = list(self.client.run(os.getpid).values())

    def load(self, points: np.ndarray) -> None:
        from dask.distributed import wait

        self.parts = self.client.scatter([points[lo:hi] for lo, hi in bounds(self.p, self.p["partitions"])],
                                         hash=False)  # fmt: skip
        wait(self.parts)

    def step(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return total(self.client.gather(self.client.map(assign, self.parts, c=c, pure=False)))

    def close(self) -> None:
        self.session.close()


def _spark_assign(it, c):
    """A Spark partition (an iterator of point blocks) -> one (sums, counts) pair."""
    out = None
    for x in it:
        s, m = assign(x, c)
        out = (s, m) if out is None else (out[0] + s, out[1] + m)
    return [] if out is None else [out]


class SparkSystem(System):
    note = f"local[{WORKERS}] (one JVM executor, Python workers reused), RSS: the JVM with its Python workers"

    def __init__(self, p: dict) -> None:
        super().__init__(p)
        import psutil
        from pyspark.sql import SparkSession

        os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"  # else Spark binds the host's external address
        self.spark = (SparkSession.builder.master(f"local[{WORKERS}]").appName("clamor-kmeans")
                      .config("spark.driver.bindAddress", "127.0.0.1").config("spark.driver.host", "127.0.0.1")
                      .config("spark.ui.enabled", "false").config("spark.driver.memory", "6g")
                      .config("spark.python.worker.reuse", "true")
                      .config("spark.ui.showConsoleProgress", "false").getOrCreate())  # fmt: skip
        self.sc = self.spark.sparkContext
        self.sc.setLogLevel("ERROR")
        self.java = [q.pid for q in psutil.Process().children() if "java" in q.name()]
        self.pids = self.java

    def load(self, points: np.ndarray) -> None:
        parts = [points[lo:hi] for lo, hi in bounds(self.p, self.p["partitions"])]
        self.rdd = self.sc.parallelize(parts, self.p["partitions"]).cache()

    def step(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        bc = self.sc.broadcast(c)
        out = self.rdd.mapPartitions(lambda it: _spark_assign(it, bc.value)).reduce(
            lambda a, b: (a[0] + b[0], a[1] + b[1]))  # fmt: skip
        bc.unpersist()
        return out

    def close(self) -> None:
        self.spark.stop()


#: In a pool process of the shared-memory limit: the points' block, attached once.
def _shm_assign(a: tuple) -> tuple[np.ndarray, np.ndarray]:
    name, n, d, lo, hi, c = a
    return assign(_shm_view(name, n * d).view(np.float64).reshape(n, d)[lo:hi], c)


class ShmSystem(System):
    """The limit: W fork-pool processes (made before the points exist) over a SharedMemory block."""

    note = "the cold iteration copies the points into a SharedMemory block"

    def __init__(self, p: dict) -> None:
        super().__init__(p)
        self.session = SharedMemorySession()
        self.pids = [q.pid for q in self.session.pool._pool]

    def load(self, points: np.ndarray) -> None:
        block = self.session.shared_memory.SharedMemory(name=f"clamor-kmeans-{os.getpid()}", create=True,
                                                        size=points.nbytes)  # fmt: skip
        view = np.ndarray(points.shape, np.float64, buffer=block.buf)
        np.copyto(view, points)
        self.session.blocks.append((block, view))
        self.name, (self.n, self.d) = block.name, points.shape

    def step(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        tasks = [(self.name, self.n, self.d, lo, hi, c) for lo, hi in bounds(self.p, self.p["partitions"])]
        return total(self.session.pool.map(_shm_assign, tasks, chunksize=1))

    def moved_cold(self) -> int:
        return 0

    moved_step = moved_cold

    def close(self) -> None:
        self.session.close()


class NumpySystem(System):
    note = "every partition in turn, in one process"

    def __init__(self, p: dict) -> None:
        super().__init__(p)
        self.pids = [os.getpid()]

    def load(self, points: np.ndarray) -> None:
        self.parts = [points[lo:hi] for lo, hi in bounds(self.p, self.p["partitions"])]

    def step(self, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return total([assign(x, c) for x in self.parts])

    def moved_cold(self) -> int:
        return 0

    moved_step = moved_cold


SYSTEMS = {"clamor": ClamorSystem, "dask": DaskSystem, "spark": SparkSystem, "shm": ShmSystem, "numpy": NumpySystem}  # fmt: skip


# --- the protocol, in each child -----------------------------------------------------------


def _rows(name: str, cold: list[float], steady: list[float], c: np.ndarray, moved: dict, rss: int,
          note: str, limit: bool, ship: list[float] | None = None, **extra: object) -> list[dict]:  # fmt: skip
    common = {"peak_worker_rss": rss, "note": note, "limit": limit, "centroids_runs": [c.tolist()], **extra}
    out = [row(name, STEADY, steady, bytes_moved=int(median(moved[STEADY])), bytes_runs=moved[STEADY], **common)]
    if cold:
        out.insert(0, row(name, COLD, cold, bytes_moved=int(median(moved[COLD])), bytes_runs=moved[COLD],
                          ship_runs=ship or [], **common))  # fmt: skip
    return out


def measure(system: str, rows: harness.Rows, p: dict) -> None:
    """In the child: start (untimed), the cold iteration, a warm-up, R timed iterations."""
    if system == "mpi":
        rows.extend(run_mpi(p))
        return
    name = label(system)
    points = make_points(0, p["points"], p)
    sampler = RssSampler()
    t = time.perf_counter()
    s = SYSTEMS[system](p)
    progress(f"  {name}: started in {time.perf_counter() - t:.1f} s")
    sampler.pids = s.pids
    try:
        c = initial_centroids(p)
        t = time.perf_counter()
        s.load(points)
        ship = time.perf_counter() - t
        c = new_centroids(*s.step(c), c)
        cold = [time.perf_counter() - t]
        moved = {COLD: [s.moved_cold()], STEADY: []}
        progress(f"  {name} cold iteration: {cold[0]:.3f} s (shipping {ship:.3f} s)")
        c = new_centroids(*s.step(c), c)  # the untimed warm-up
        s.moved_step()
        steady = []
        for _ in range(p["repeat"]):
            t = time.perf_counter()
            sums, counts = s.step(c)
            c = new_centroids(sums, counts, c)
            steady.append(time.perf_counter() - t)
            moved[STEADY].append(s.moved_step())
            if int(counts.sum()) != p["points"]:
                raise RuntimeError(f"{name}: an iteration counted {int(counts.sum())} points")
        progress(f"  {name} steady: " + " ".join(f"{x:.3f}" for x in steady) + " s")
        rows.extend(_rows(name, cold, steady, c, moved, sampler.stop(), s.note, system in LIMITS, [ship],
                          **s.fields))
    finally:
        sampler.stop()
        s.close()


def mpi_main(p: dict, out: Path) -> None:
    """One MPI rank (under mpirun): its part of the points, Allreduce per iteration."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    lo, hi = bounds(p, size)[rank]
    x = make_points(lo, hi, p)
    k, d = p["k"], p["dims"]
    sums, counts = np.empty((k, d)), np.empty(k, np.int64)

    def step(c: np.ndarray) -> np.ndarray:
        s, m = assign(x, c)
        comm.Allreduce(s, sums, op=MPI.SUM)
        comm.Allreduce(m, counts, op=MPI.SUM)
        return new_centroids(sums, counts, c)

    comm.Barrier()
    t = time.perf_counter()
    c = step(initial_centroids(p))
    cold = [time.perf_counter() - t]
    c = step(c)  # the untimed warm-up
    steady = []
    for _ in range(p["repeat"]):
        comm.Barrier()
        t = time.perf_counter()
        c = step(c)
        steady.append(time.perf_counter() - t)
    rss = comm.gather(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, root=0)
    if rank == 0:
        each = (sums.nbytes + counts.nbytes) * 2 * size  # each rank's sends of the two Allreduces
        moved = {COLD: [each], STEADY: [each] * len(steady)}
        note = f"{size} ranks, each generating its own part (untimed), RSS: ru_maxrss of the ranks"
        out.write_text(json.dumps(_rows("mpi", cold, steady, c, moved, max(rss), note, False, [0.0])))


def run_mpi(p: dict) -> list[dict]:
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        return [unavailable("mpi", c, f"mpi4py not installed ({exc})") for c in CASES]
    out = Path(os.environ.get("TMPDIR", "/tmp")) / f"clamor-kmeans-mpi-{os.getpid()}.json"
    cmd = ["mpirun", "-n", str(WORKERS), "--allow-run-as-root", "--oversubscribe",
           *harness.workload_command(__file__), "--mpi-rank", "--child-out", str(out), "--params", json.dumps(p)]
    try:
        proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, timeout=600, check=False)
    except FileNotFoundError as exc:
        return [unavailable("mpi", c, f"mpirun not found ({exc})") for c in CASES]
    try:
        if proc.returncode != 0 or not out.exists():
            return [unavailable("mpi", c, f"mpirun exited with status {proc.returncode}") for c in CASES]
        return json.loads(out.read_text())
    finally:
        out.unlink(missing_ok=True)


# --- the parent: checks, goals with computed explanations ------------------------------------


def check(rows: list[dict], p: dict) -> None:
    """Every child's final centroids against the reference of as many iterations."""
    refs: dict[int, np.ndarray] = {}
    for r in rows:
        runs = r.pop("centroids_runs", None) or []
        if not r["seconds"]:
            continue
        n = 2 + p["repeat"]
        if n not in refs:
            refs[n] = reference(p, n)
        errs = [float(np.abs(np.array(c) - refs[n]).max()) for c in runs]
        r["checked"] = r["correct"] = bool(runs) and all(
            np.allclose(c, refs[n], rtol=1e-6, atol=1e-9) for c in runs)  # fmt: skip
        r["centroid_error"] = max(errs, default=None)
        if not r["checked"]:
            r["note"] = "; ".join(x for x in (f"WRONG: centroids differ by {max(errs, default=0):.3g}",
                                               r["note"]) if x)  # fmt: skip
        if r.get("ship_runs"):
            r["ship_s"] = median(r["ship_runs"])


def best(rows: list[dict], peer: str, case: str) -> dict | None:
    mine = [r for r in rows if family(r["system"]) == peer and r["case"] == case and r["seconds"]
            and r.get("checked") is not False]  # fmt: skip
    return min(mine, key=lambda r: median(r["seconds"]), default=None)


def ms(s: float) -> str:
    return f"{1e3 * s:.0f} ms"


def goals(result: dict) -> list[dict]:
    """Issue 8's k-means goals, per case, against each peer's faster program."""
    rows, out = result["rows"], []
    for peer, target, text in (("mpi", 1 / 1.5, "within 1.5x of MPI (mpi ÷ clamor >= 0.67)"),
                               ("dask", 1.0, "no slower than Dask"), ("spark", 1.0, "no slower than Spark")):
        for case in CASES:
            c, q = best(rows, "clamor", case), best(rows, peer, case)
            name = f"{case}: {text}" + (f" ({q['system']})" if q and q["system"] != peer else "")
            if not c or not q:
                missing = "clamor" if not c else peer
                why = next((r["note"] for r in rows if family(r["system"]) == missing and r["case"] == case
                            and r["note"]), "not measured")  # fmt: skip
                out.append(goal(name, None, target, f"{missing}: {why}"))
                continue
            why = f"clamor median {ms(median(c['seconds']))}, {q['system']} {ms(median(q['seconds']))}"
            if case == COLD and c.get("ship_s") is not None:
                why += (f" (shipping: clamor {ms(c['ship_s'])}, {q['system']} "
                        f"{ms(q.get('ship_s') or 0.0)})")  # fmt: skip
            if lim := limit_row(rows, case):
                why += (f"; {lim['system']} {ms(median(lim['seconds']))}: clamor is "
                        f"{median(c['seconds']) / median(lim['seconds']):.2f}x it")  # fmt: skip
            out.append(goal(name, median(q["seconds"]) / median(c["seconds"]), target, why))
    return out


def main() -> None:
    ap = arguments(__doc__.split("\n\n")[0], "400,000 points, 1 pass of 5 iterations", PROGRAMS)
    ap.add_argument("--points", type=int, default=None, help="points (2,000,000; quick 400,000)")
    ap.add_argument("--mpi-rank", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mpi_rank:
        mpi_main(json.loads(args.params), args.child_out)
        return
    if args.child:
        p = json.loads(args.params)
        harness.child_main(args.child, args.child_out, CASES, lambda sy, rows: measure(sy, rows, p),
                           label(args.child))  # fmt: skip
        return
    p = {"points": args.points or (400_000 if args.quick else 2_000_000), "dims": 16, "k": 16,
         "repeat": args.repeat or (5 if args.quick else 10), "passes": args.passes or (1 if args.quick else 2),
         "partitions": 8, "seed": 11, "workers": WORKERS}  # fmt: skip
    chosen = systems(ap, args.only, PROGRAMS)
    t0 = time.perf_counter()
    rows = harness.run_all(Path(__file__).resolve(), chosen, ["--params", json.dumps(p)], CASES, args.timeout,
                           args.wait_idle, label=label, passes=p["passes"])  # fmt: skip
    check(rows, p)
    result = {"workload": "kmeans", "quick": args.quick, "page_size": None, "rows": rows,
              "title": f"Dense k-means, {p['points']:,} x {p['dims']} points, k = {p['k']}: Clamor vs. MPI, "
                       "Dask and Spark",
              "params": {**p, "points_bytes": p["points"] * p["dims"] * 8, "systems": [label(s) for s in chosen],
                         "limits": [label(s) for s in LIMITS if s in chosen], "elapsed_s": time.perf_counter() - t0,
                         "timed": "an iteration: the assignment stage, the merge of sums and counts, the new "
                                  "centroids; the cold case also ships the points"}}  # fmt: skip
    result["page_size"] = next((r["page_size"] for r in rows if r.get("page_size")), None)
    result["goals"] = goals(result)
    path = save(result)
    print(markdown(result, [("shipping (s)", lambda r: f"{r['ship_s']:.3f}" if r.get("ship_s") is not None
                             else "—")]))  # fmt: skip
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
