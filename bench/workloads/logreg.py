#!/usr/bin/env python3
"""Sparse logistic regression with Criteo-like hashed features: a parameter server
(weights demand-paged from the arena) vs. broadcasting the weights every iteration.

    python bench/run.py logreg [--quick] [--repeat R] [--only clamor,dask,ray,ipyparallel]
                               [--network [RATE]]

The model is a weight vector of D float64 (10^8 = 800 MB; ``--quick``: 10^7). The
examples look like Criteo's: 39 fields (13 bucketised counts with a value, 26
categorical with value 1), each field's values drawn from a Zipf law (a few frequent
values, a long tail), every (field, value) hashed into the D weights. Training is
mini-batch SGD (B = 512 examples per iteration, Zipf exponent 1.2, Clamor pages of 4 KiB:
``--batch``, ``--zipf``, ``--page-size``): iteration t takes the next B examples, cut
into P partitions (2 per worker); a task computes the logistic-loss gradient of its rows, reading only the
weights its features touch, and the driver applies ``w[touched] -= lr/B * g[touched]``.

* **clamor**: examples and ``w`` in the arena (``clamor.asarray``/``clamor.empty``);
  one stage per iteration (``cluster.range(lo, hi, partitions=P).map_partitions``),
  tasks add their gradients into an accumulator (merged at the barrier), the driver
  updates ``w`` in place; workers re-fetch only the pages they touch that changed.
* **dask / ray / ipyparallel**: the examples are placed on the workers once (not
  timed), then every iteration broadcasts the whole ``w`` (``client.scatter(w,
  broadcast=True)``, ``ray.put(w)``, ``dview.push({"w": w})``) and runs the same
  gradient function on the same partitions; the driver merges and updates the same way.

Per-iteration wall time (median of the iterations, min-max shown), bytes moved per
iteration (Clamor: the workers' ``bytes_fetched``; peers: the broadcast), peak worker RSS.
Every system's loss after each iteration (on a fixed evaluation set) must match a
reference computed in the parent (rtol 1e-6), else the row is marked wrong.

``--network [RATE]`` (``harness/network.py``): Clamor and Ray with their 2 workers on 2
simulated hosts behind links of RATE (1gbit) and the driver's uplink shaped to RATE:
Clamor's workers fetch the pages they touch over TCP, Ray ships ``w`` to each host's
object store every iteration. Writes ``bench/results/logreg-network.json``.

Each system runs in its own child (:func:`harness.run_all`); :class:`RssSampler` is also
used by ``kmeans.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import network, progress
from harness.results import goal, ratio, row, save, tree_rss, unavailable

WORKERS = 2
FIELDS, NUMERIC = 39, 13
SYSTEMS = ("clamor", "dask", "ray", "ipyparallel")


# --- worker memory (shared with kmeans.py) ---------------------------------------------


class RssSampler:
    """Peak resident memory of the largest worker (with its children), sampled every 0.1 s
    in a thread while the measured system runs; ``pids`` is set once they are known."""

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def sample(self) -> int:
        if self.pids:
            self.peak = max(self.peak, tree_rss(self.pids))
        return self.peak

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.sample()


# --- the data: Criteo-like hashed examples -------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a well-spread 64-bit hash of ``x`` (uint64)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def make_examples(n: int, dim: int, seed: int, zipf: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` examples: feature ids (n x 39 int64 in [0, dim)), values (float64), labels.

    Field f's value is a Zipf(``zipf``) rank (numeric fields: a log2 bucket of a Zipf
    count, with value log1p(count)/10); the id is a hash of (f, value) mod ``dim``. Labels
    are Bernoulli draws from a hidden model whose weight for an id is also a hash.
    """
    rng = np.random.default_rng(seed)
    ranks = rng.zipf(zipf, size=(n, FIELDS)).astype(np.uint64)
    val = np.ones((n, FIELDS))
    counts = ranks[:, :NUMERIC].astype(np.float64)
    val[:, :NUMERIC] = np.log1p(counts) / 10.0
    ranks[:, :NUMERIC] = np.floor(np.log2(counts)).astype(np.uint64)
    with np.errstate(over="ignore"):
        keys = _mix(ranks * np.uint64(64) + np.arange(FIELDS, dtype=np.uint64))
        idx = (keys % np.uint64(dim)).astype(np.int64)
        truth = ((_mix(keys) >> np.uint64(40)).astype(np.float64) / 2**24 - 0.5) * 2.0
    z = (truth * val).sum(axis=1)
    y = (rng.random(n) < 1.0 / (1.0 + np.exp(-z))).astype(np.float64)
    return idx, val, y


def grad_rows(idx: np.ndarray, val: np.ndarray, y: np.ndarray, w: np.ndarray,
              lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The logistic-loss gradient of rows [lo, hi) as (feature ids, contributions)."""
    i, v = idx[lo:hi], val[lo:hi]
    p = 1.0 / (1.0 + np.exp(-(w[i] * v).sum(axis=1)))
    return i.ravel(), ((p - y[lo:hi])[:, None] * v).ravel()


def loss(w: np.ndarray, idx: np.ndarray, val: np.ndarray, y: np.ndarray) -> float:
    """Mean logistic loss of the model ``w`` on the examples."""
    z = (w[idx] * val).sum(axis=1)
    return float(np.mean(np.logaddexp(0.0, z) - y * z))


def batches(p: dict) -> list[list[tuple[int, int]]]:
    """Per iteration, its P partitions' row ranges (iteration t: rows [t*B, (t+1)*B))."""
    b, parts = p["batch"], p["partitions"]
    out = []
    for t in range(p["iterations"]):
        edges = np.linspace(t * b, (t + 1) * b, parts + 1).astype(int)
        out.append([(int(edges[j]), int(edges[j + 1])) for j in range(parts)])
    return out


def reference_losses(p: dict) -> list[float]:
    """The same SGD in this process, on a compressed weight vector (only touched ids)."""
    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    ids, inv = np.unique(idx, return_inverse=True)
    inv = inv.reshape(idx.shape)
    w = np.zeros(len(ids))
    ev = slice(0, p["eval"])
    out = []
    for parts in batches(p):
        lo, hi = parts[0][0], parts[-1][1]
        i, c = grad_rows(inv, val, y, w, lo, hi)
        g = np.zeros(len(ids))
        np.add.at(g, i, c)
        w -= p["lr"] / p["batch"] * g
        out.append(loss(w, inv[ev], val[ev], y[ev]))
    return out


class Driver:
    """The driver's side shared by every system: the weights, the merge and the update."""

    def __init__(self, p: dict, w: np.ndarray, idx: np.ndarray, val: np.ndarray, y: np.ndarray) -> None:
        self.p, self.w, self.idx, self.val, self.y = p, w, idx, val, y
        self.g = np.zeros(p["dim"])  # dense, but only touched entries are ever written
        self.losses: list[float] = []
        self.seconds: list[float] = []
        self.moved: list[int] = []
        self.update_seconds: list[float] = []  # the part of each iteration spent in update()

    def update(self, parts: list[tuple[int, int]], g: np.ndarray | None = None,
               pieces: list[tuple[np.ndarray, np.ndarray]] = ()) -> None:
        """Merge ``pieces`` (peers) or take ``g`` (an accumulator), update ``w`` in place
        on the touched ids only, and zero them in the gradient for the next iteration."""
        t0 = time.perf_counter()
        g = self.g if g is None else g
        for i, c in pieces:
            np.add.at(g, i, c)
        touched = np.unique(self.idx[parts[0][0]:parts[-1][1]])
        self.w[touched] -= self.p["lr"] / self.p["batch"] * g[touched]
        g[touched] = 0.0
        self.update_seconds.append(time.perf_counter() - t0)

    def record(self, seconds: float, moved: int) -> None:
        ev = slice(0, self.p["eval"])
        self.seconds.append(seconds)
        self.moved.append(moved)
        self.losses.append(loss(self.w, self.idx[ev], self.val[ev], self.y[ev]))
        progress(f"  iteration {len(self.seconds)}: {seconds:.3f} s, loss {self.losses[-1]:.6f}, "
                 f"{moved / 2**20:.1f} MiB moved")

    def row(self, system: str, rss: int, note: str = "", **extra: Any) -> dict:
        return row(system, "per iteration", self.seconds, bytes_moved=int(np.median(self.moved)),
                   peak_worker_rss=rss, note=note, losses=self.losses, bytes_per_iteration=self.moved,
                   driver_update_seconds=self.update_seconds, **extra)


# --- the systems (in a child each) -----------------------------------------------------------


def run_clamor(p: dict, net: Any = None) -> list[dict]:
    import clamor

    clamor.configure(page_size=p["page_size"])
    idx0, val0, y0 = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    idx, val, y = clamor.asarray(idx0), clamor.asarray(val0), clamor.asarray(y0)
    w = clamor.empty(p["dim"])
    w[:] = 0.0
    sampler = RssSampler()
    cluster = clamor.Cluster(workers=WORKERS, **(network.cluster_options(net) if net else {}))
    try:
        sampler.pids = [s["pid"] for s in cluster.worker_stats()]
        grad = cluster.accumulator(p["dim"])
        drv = Driver(p, w, idx, val, y)

        def step(rows: range) -> np.ndarray:
            if p["prefetch"]:  # the rows, then the weights they read: streams, not scattered faults
                for a in (idx, val, y):
                    clamor.prefetch(a, rows)
                clamor.prefetch(w, np.unique(idx[rows.start:rows.stop]))
            i, c = grad_rows(idx, val, y, w, rows.start, rows.stop)
            grad.add(i, c)
            return np.array([len(rows)])

        def fetched() -> int:
            return sum(s.get("bytes_fetched", 0) for s in cluster.worker_stats())

        for parts in batches(p):
            before = fetched()
            t0 = time.perf_counter()
            lo, hi = parts[0][0], parts[-1][1]
            n = int(cluster.range(lo, hi, partitions=len(parts)).map_partitions(step).collect().sum())
            drv.update(parts, g=grad.value)
            dt = time.perf_counter() - t0
            if n != hi - lo:
                raise RuntimeError(f"counted {n} rows, not {hi - lo}")
            drv.record(dt, fetched() - before)
        return [drv.row("clamor", sampler.stop(), page_size=cluster.page_size)]
    finally:
        sampler.stop()
        cluster.close()


def run_dask(p: dict, net: Any = None) -> list[dict]:
    try:
        from dask.distributed import Client, LocalCluster, wait
    except ImportError as exc:
        return [unavailable("dask", "per iteration", f"not installed ({exc})")]
    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    w = np.zeros(p["dim"])
    sampler = RssSampler()
    cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True,
                           dashboard_address=None, memory_limit=0)
    client = Client(cluster)
    try:
        client.wait_for_workers(WORKERS, timeout=120)
        sampler.pids = list(client.run(os.getpid).values())
        data = client.scatter((idx, val, y), broadcast=True, hash=False)
        wait(data)
        drv = Driver(p, w, idx, val, y)

        def task(d: tuple, wv: np.ndarray, lo: int, hi: int) -> tuple:
            return grad_rows(*d, wv, lo, hi)

        for parts in batches(p):
            t0 = time.perf_counter()
            wf = client.scatter(w, broadcast=True, hash=False)
            futs = [client.submit(task, data, wf, lo, hi, pure=False) for lo, hi in parts]
            drv.update(parts, pieces=client.gather(futs))
            del futs, wf
            drv.record(time.perf_counter() - t0, w.nbytes * WORKERS)
        return [drv.row("dask", sampler.stop(), note="bytes: the broadcast (w to every worker)")]
    finally:
        sampler.stop()
        client.close()
        cluster.close()


def _ray_grad(d: tuple, wv: np.ndarray, lo: int, hi: int) -> tuple:
    """A Ray task: its worker's pid (for the RSS sampler) and the gradient of [lo, hi)."""
    return os.getpid(), grad_rows(*d, wv, lo, hi)


def run_ray(p: dict, net: Any = None) -> list[dict]:
    try:
        import ray
    except ImportError as exc:
        return [unavailable("ray", "per iteration", f"not installed ({exc})")]
    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    w = np.zeros(p["dim"])
    sampler = RssSampler()
    session = None
    if net is None:
        ray.init(num_cpus=WORKERS, include_dashboard=False,
                 object_store_memory=max(4 * w.nbytes, 256 << 20))
    else:  # a head on the driver's address, a node per simulated host (peers.RaySession)
        from peers import RaySession

        session = RaySession(network=net)
    copies = 1 if net is None else WORKERS  # one object-store copy of w per host
    try:
        task = ray.remote(num_cpus=1)(_ray_grad)
        data = ray.put((idx, val, y))
        drv = Driver(p, w, idx, val, y)
        for parts in batches(p):
            t0 = time.perf_counter()
            wref = ray.put(w)
            out = ray.get([task.remote(data, wref, lo, hi) for lo, hi in parts])
            drv.update(parts, pieces=[o[1] for o in out])
            dt = time.perf_counter() - t0
            sampler.pids = sorted(set(sampler.pids) | {o[0] for o in out})
            del wref, out
            drv.record(dt, w.nbytes * copies)
        return [drv.row("ray", sampler.stop(),
                        note="bytes: one copy of w into each host's object store per iteration "
                             "(its workers map it)")]
    finally:
        sampler.stop()
        if session is not None:
            session.close()
        else:
            ray.shutdown()


def run_ipyparallel(p: dict, net: Any = None) -> list[dict]:
    try:
        import ipyparallel as ipp
    except ImportError as exc:
        return [unavailable("ipyparallel", "per iteration", f"not installed ({exc})")]
    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    w = np.zeros(p["dim"])
    sampler = RssSampler()
    cluster = ipp.Cluster(n=WORKERS, log_level=40)
    rc = cluster.start_and_connect_sync()
    try:
        rc.wait_for_engines(WORKERS, timeout=120)
        dview = rc[:]
        dview.use_cloudpickle().get()
        sampler.pids = dview.apply_sync(os.getpid)
        dview.push({"idx": idx, "val": val, "y": y}, block=True)
        engines = [rc[e] for e in rc.ids]
        drv = Driver(p, w, idx, val, y)
        refs = [ipp.Reference(n) for n in ("idx", "val", "y", "w")]
        for parts in batches(p):
            t0 = time.perf_counter()
            dview.push({"w": w}, block=True)
            futs = [engines[j % len(engines)].apply_async(grad_rows, *refs, lo, hi)
                    for j, (lo, hi) in enumerate(parts)]
            drv.update(parts, pieces=[f.get() for f in futs])
            drv.record(time.perf_counter() - t0, w.nbytes * WORKERS)
        return [drv.row("ipyparallel", sampler.stop(), note="bytes: the push (w to every engine)")]
    finally:
        sampler.stop()
        rc.close()
        cluster.stop_cluster_sync()


RUNNERS = {"clamor": run_clamor, "dask": run_dask, "ray": run_ray, "ipyparallel": run_ipyparallel}


# --- the parent -------------------------------------------------------------------------------


def check(rows: list[dict], ref: list[float]) -> None:
    """Mark a row whose losses differ from the reference (rtol 1e-6): a wrong answer."""
    for r in rows:
        got = r.get("losses")
        if not r["seconds"] or got is None:
            continue
        ok = len(got) == len(ref) and np.allclose(got, ref, rtol=1e-6, atol=1e-12)
        r["correct"] = bool(ok)
        if not ok:
            r["note"] = (r["note"] + "; " if r["note"] else "") + (
                f"WRONG: losses {np.round(got, 6).tolist()} != reference {np.round(ref, 6).tolist()}")


def goals(result: dict, systems: list[str], net: str | None) -> list[dict]:
    """Per peer, per iteration: Clamor >= 1.5x faster than Ray on one host (Ray's workers
    map one shared copy of w, as Clamor's do) and >= 3x on a network; >= 3x faster than
    Dask and ipyparallel, which send w to every worker. A miss says where the time went."""
    out = []
    c = next((r for r in result["rows"] if r["system"] == "clamor" and r["seconds"]), None)
    for peer in [s for s in systems if s != "clamor"]:
        target = 1.5 if peer == "ray" and net is None else 3.0
        r = ratio(result, peer, "per iteration")
        why = "not measured" if r is None else ""
        if r is not None and r < target and c is not None:
            pages = c["bytes_moved"] / result["page_size"]
            update = float(np.median(c["driver_update_seconds"]))
            why = (f"Clamor's median iteration is {np.median(c['seconds']) * 1e3:.0f} ms: "
                   f"{update * 1e3:.0f} ms of it the driver's update of w (an in-kernel write-protect "
                   "fault per first-written page, ~2 µs each on this VM, as async write "
                   "tracking needs), "
                   f"{pages:,.0f} pages fetched, the rest the stage itself (tasks mapping "
                   "their pages: one UFFDIO_CONTINUE each, and the control plane)")
        out.append(goal(f"per iteration >= {target:g}x faster than {peer}", r, target, why))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="D=10^7 weights, fewer iterations")
    ap.add_argument("--repeat", type=int, default=None,
                    help="iterations measured per system (median over them; default 10, quick 5)")
    ap.add_argument("--only", default=None, help="systems (all; network mode: clamor,ray)")
    ap.add_argument("--dim", type=int, default=None, help="weights (10^8; quick 10^7)")
    ap.add_argument("--batch", type=int, default=512, help="examples per iteration (512)")
    ap.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the field values (1.2)")
    ap.add_argument("--page-size", type=int, default=4096, help="Clamor page size (4 KiB)")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="Clamor's tasks fault their pages in one by one (no clamor.prefetch)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per system")
    network.add_network_argument(ap)
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.only_given = args.only is not None
    args.only = args.only or ",".join(SYSTEMS)
    network.check_rate(ap, args.network)
    if args.child:
        params = json.loads(args.params)

        def measure(system: str, rows: harness.Rows) -> None:
            with network.hosts_or_loopback(args.network, WORKERS) as net:
                rows.extend(RUNNERS[system](params, net))

        harness.child_main(args.child, args.child_out, params["cases"], measure)
        return
    network.require(args.network)
    if args.network is not None and not args.only_given:
        args.only = "clamor,ray"
    iters = args.repeat or (5 if args.quick else 10)
    batch = args.batch
    p = {"dim": args.dim or (10**7 if args.quick else 10**8), "batch": batch, "iterations": iters,
         "examples": iters * batch, "partitions": 2 * WORKERS, "lr": 0.5, "zipf": args.zipf, "seed": 8,
         "eval": min(4096, iters * batch), "page_size": args.page_size, "fields": FIELDS,
         "workers": WORKERS, "quick": args.quick, "cases": ["per iteration"], "prefetch": not args.no_prefetch}
    systems = [s for s in args.only.split(",") if s]
    ref = reference_losses(p)
    argv = ["--params", json.dumps(p)] + ([f"--network={args.network}"] if args.network else [])
    if args.network:
        network.sweep_stale()
    rows = harness.run_all(Path(__file__).resolve(), systems, argv, p["cases"], args.timeout)
    check(rows, ref)
    result = {"workload": network.workload("logreg", args.network), "quick": args.quick,
              "page_size": args.page_size, "rows": rows,
              "title": network.title("Sparse logistic regression (Criteo-like hashed features): paged "
                                     "weights vs. broadcast per iteration", args.network, WORKERS),
              "params": {**{k: v for k, v in p.items() if k != "cases"}, "weights_bytes": p["dim"] * 8,
                         **network.params(args.network, WORKERS),
                         "reference_losses": ref, "timed": "per iteration: broadcast/paging, the "
                         "gradient stage, the merge and the driver's update"}}
    result["goals"] = goals(result, systems, args.network)
    path = save(result)
    print("| system | median s/iteration | min–max | peer/clamor | MiB moved/iteration | peak worker RSS MiB | note |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for r in rows:
        s = r["seconds"]
        ra = ratio(result, r["system"], r["case"])
        print(f"| {r['system']} | {np.median(s):.4f} | {min(s):.4f}–{max(s):.4f} | "
              f"{'' if ra is None else f'{ra:.2f}'} | {(r['bytes_moved'] or 0) / 2**20:.1f} | "
              f"{(r['peak_worker_rss'] or 0) / 2**20:.0f} | {r['note']} |" if s else
              f"| {r['system']} | — | — | — | — | — | {r['note']} |")
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
