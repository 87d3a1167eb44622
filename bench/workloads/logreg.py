#!/usr/bin/env python3
"""Sparse logistic regression with Criteo-like hashed features: Clamor's paged weights
against peers that ship each task exactly the weights it reads, or keep them in a
parameter-server actor, and against one plain numpy process (the limit).

    python bench/run.py logreg [--quick] [--repeat R] [--passes N] [--warmup W]
                               [--only clamor,ray,dask,ipyparallel,limit] [--network [RATE]]

The model is a weight vector of D float64 (10^8 = 800 MB; ``--quick``: 10^7). The
examples look like Criteo's: 39 fields (13 bucketised counts with a value, 26
categorical with value 1), each field's values drawn from a Zipf law (a few frequent
values, a long tail), every (field, value) hashed into the D weights. Training is
mini-batch SGD (B = 512 examples per iteration, Zipf exponent 1.2, Clamor pages of 4 KiB:
``--batch``, ``--zipf``, ``--page-size``): iteration t takes the next B examples, cut into
P = 2 x WORKERS partitions (``peers.WORKERS``, ``CLAMOR_BENCH_WORKERS``); a task computes
the logistic-loss gradient of its rows, reading only the weights its rows' feature ids
touch (``ids = np.unique(idx[lo:hi])``), and the update is ``w[touched] -= lr/B * g[touched]``.
Every program knows the same thing: which rows a task has, hence its ids.

Programs (``--only`` takes these names, or a peer's name for its default programs):

* **clamor**: examples and ``w`` in the arena (``clamor.asarray``/``clamor.empty``); one
  stage per iteration (``cluster.range(lo, hi, partitions=P).map_partitions``); a task
  prefetches its rows (``clamor.prefetch``), reads the weights they touch with
  ``clamor.gather(w, ids)``, ``ids = np.unique(idx[rows])`` (the docs' way for scattered
  rows: it copies the rows' bytes, not their 4 KiB pages, from the driver's memory on its
  host and from the driver elsewhere), computes the gradient as the
  peers' tasks do and returns it per id (``collect``), as theirs do; the driver merges the
  pieces as the peers' drivers do and updates ``w`` in place with
  ``clamor.write(w, ids, w[ids] - step * g)``, the docs' way for a sparse update
  (``w[ids] -= ...`` takes a write-protect fault per page written: see docs/paging.md).
  ``--accumulator``: the tasks add their gradient into a dense accumulator instead
  (Clamor's shared sum, merged at the barrier), and the update finds the touched ids
  with ``np.unique`` over the batch's raw ids.
* **ray-ship** "ray (ship w[ids])": the driver computes each task's ``ids`` and passes
  ``ids`` and ``w[ids]`` by value (16 bytes an id; Ray inlines small arguments, and the
  examples are one ``ray.put`` before the clock starts, as Ray's anti-pattern page on
  passing large arguments by value says); tasks return their gradient per id, the driver merges
  and updates. ``ray.init(object_store_memory=...)`` sized for the data.
* **ray-actor** "ray (actor)": Ray's parameter-server example
  (docs.ray.io, ray-core/examples/plot_parameter_server): an actor holds ``w`` (on the
  driver's node, ``num_cpus=0``); each task calls ``ps.get_weights.remote(ids)``, and the
  driver passes the gradient references to ``ps.apply_gradients.remote(*grads)``, which
  updates ``w`` in the actor; an iteration ends when that call returns.
* **dask-ship** "dask (ship w[ids])": the examples ``client.scatter(..., broadcast=True)``
  once; per task ``client.submit(task, data, ids, w[ids], lo, hi)`` (small arguments go in
  the task, as Dask's futures docs do); ``client.gather``, the driver merges and updates.
* **ipyparallel-ship** "ipyparallel (ship w[ids])": the examples ``dview.push`` once;
  ``load_balanced_view().apply_async(task, Reference("data"), ids, w[ids], lo, hi)``.
* **limit** "limit: numpy, one process": the same iterations in one process, no
  parallelism: the gradient of the whole batch in one call, then the update.
* Not run unless named: **ray-broadcast**, **dask-broadcast**, **ipyparallel-broadcast**
  "<peer> (broadcast w)": the whole ``w`` to the workers every iteration (``ray.put``,
  ``scatter(broadcast=True)``, ``dview.push``), the task reading what it needs from it.

Every program's ``w`` (and the actor's) is zeroed page by page before the clock starts, as
Clamor's ``w[:] = 0`` is; every program merges the tasks' per-id gradients sparsely
(``np.unique`` + ``np.bincount``), but Clamor's with ``--accumulator`` (dense).

Protocol: every program runs in its own child (``harness.run_all``), ``--passes`` times
over the programs (A B C A B C; default 2, quick 1), each pass a fresh system. A child
runs W + R iterations of the same SGD from w = 0: the first W (``--warmup``, 100; quick
2) at full size, untimed, then R timed (``--repeat``, 10; quick 3). Rows per program: *per
iteration* (the R timed iterations of every pass: median, min and the 95 % interval of the
median, ``harness.results.median_ci``), *iterations 2-11 (warm-up)* (the early ones,
untimed in the first row) and *first iteration (cold)* (iteration 1 of each pass: a fresh
system's first stage). Why 100 warm-ups: the loop is a training run's, thousands of
iterations long, and a Zipf tail of new feature ids keeps touching pages the driver has
never written through Clamor's writable view of the arena; each such page takes one
first-write fault, once for the driver's life (about 3 us on the 2-core VM), so
``clamor.write`` of 6,700 rows took 8.3 ms an iteration over iterations 1-10, 2.0 ms at
100-110 and 0.6 ms after 550 (2-core VM, this workload). The early row keeps that
transient in the table; the peers run the same iterations. Timed per iteration: computing and shipping
``w[ids]`` (or paging, or the broadcast), the gradient stage, the merge and the update.
Bytes moved per iteration: what Clamor's workers read of the driver's arena (pages and
gathered rows the driver or a peer served, pages mapped in place, rows copied from the
driver's memory: ``shm_row_bytes``); the peers' ``ids`` and ``w[ids]`` sent for the tasks
(the broadcast: ``w`` per copy).
Every program's loss after every iteration (on a fixed evaluation set) must match a
reference computed in the parent (rtol 1e-6), else the row is marked wrong. Goals
compare Clamor with the fastest program of each peer.

``--network [RATE]`` (``harness/network.py``): the workers on simulated hosts behind
links of RATE (1gbit) and the driver's uplink shaped to RATE; programs by default clamor,
ray-ship, ray-actor and the limit (which runs no network). Writes
``bench/results/logreg-network.json``.

The data (the examples, the partitions, what a ship program sends) is made in
``logreg_data.py``, the parent's checks and goals are in ``logreg_report.py``; the task
functions (``grad_rows``, ``task_grad``, ``ps_task``, ``ParameterServer`` and what they
call) stay here, in the child's ``__main__``, so that every system pickles them by value
and no worker needs ``bench/`` on its path.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import network, progress
from harness.results import row, save, tree_rss
from harness.tables import markdown
from harness.usage import RssSampler
from peers import WORKERS

from workloads.logreg_data import (
    FIELDS,
    batches,
    make_examples,
    shipments,
    shipped_bytes,
)
from workloads.logreg_report import (
    CASE,
    CASES,
    COLD,
    EARLY,
    PEERS,
    check,
    goals,
    statistics_of,
)

#: Program (``--child``/``--only`` name) -> its row's system name.
PROGRAMS = {
    "clamor": "clamor",
    "ray-ship": "ray (ship w[ids])",
    "ray-actor": "ray (actor)",
    "dask-ship": "dask (ship w[ids])",
    "ipyparallel-ship": "ipyparallel (ship w[ids])",
    "ray-broadcast": "ray (broadcast w)",
    "dask-broadcast": "dask (broadcast w)",
    "ipyparallel-broadcast": "ipyparallel (broadcast w)",
    "limit": "limit: numpy, one process",
}
DEFAULT = ("clamor", "ray-ship", "ray-actor", "dask-ship", "ipyparallel-ship", "limit")
NETWORK_DEFAULT = ("clamor", "ray-ship", "ray-actor", "limit")


# --- the gradient and the update (the tasks shipped by value: in the child's __main__) -----


def grad_rows(idx: np.ndarray, val: np.ndarray, y: np.ndarray, w: np.ndarray,
              lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """The logistic-loss gradient of rows [lo, hi) as (feature ids, contributions)."""
    i, v = idx[lo:hi], val[lo:hi]
    p = 1.0 / (1.0 + np.exp(-(w[i] * v).sum(axis=1)))
    return i.ravel(), ((p - y[lo:hi])[:, None] * v).ravel()


def task_grad(data: Sequence[np.ndarray], ids: np.ndarray | None, w: np.ndarray,
              lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, int]:  # fmt: skip
    """A peer's task (and the limit's whole batch): the gradient of rows [lo, hi) summed per
    feature id, ``(ids, g, pid)``. ``w`` is ``w[ids]`` (``ids``: the rows' sorted unique
    feature ids, what the driver shipped) or, with ``ids`` None, the whole ``w``."""
    idx, val, y = data
    i, v = idx[lo:hi], val[lo:hi]
    if ids is None:
        ids, local = np.unique(i, return_inverse=True)
        wl = w[ids]
    else:
        local, wl = np.searchsorted(ids, i), w
    local = local.reshape(i.shape)
    p = 1.0 / (1.0 + np.exp(-(wl[local] * v).sum(axis=1)))
    g = np.bincount(local.ravel(), weights=((p - y[lo:hi])[:, None] * v).ravel(), minlength=len(ids))
    return ids, g, os.getpid()


def zeros(n: int) -> np.ndarray:
    """``n`` zeros with every page touched before any clock starts, as the arena's ``w[:] = 0``
    is: numpy's lazily zeroed (huge) pages would otherwise bill a first iteration for them."""
    a = np.empty(n)
    a.fill(0.0)
    return a


def apply_sparse(w: np.ndarray, pieces: Sequence[tuple], step: float,
                 write: Callable | None = None) -> np.ndarray:  # fmt: skip
    """``w[ids] -= step * g`` with the tasks' ``(ids, g, ...)`` summed per id (in task order,
    as the reference adds them), through ``write(w, ids, values)`` if given; the ids touched."""
    if len(pieces) == 1:  # one task's ids are unique already
        u, g = pieces[0][:2]
    else:
        u, inv = np.unique(np.concatenate([pc[0] for pc in pieces]), return_inverse=True)
        g = np.bincount(inv, weights=np.concatenate([pc[1] for pc in pieces]), minlength=len(u))
    if write is None:
        w[u] -= step * g
    else:
        write(w, u, w[u] - step * g)
    return u


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
        z = (w[inv[ev]] * val[ev]).sum(axis=1)
        out.append(float(np.mean(np.logaddexp(0.0, z) - y[ev] * z)))
    return out


class Driver:
    """The driver's side shared by every program: the merge, the update, the records.
    ``w`` the driver's weights, or ``weights_at(ids)`` where another process holds them."""

    def __init__(self, p: dict, idx: np.ndarray, val: np.ndarray, y: np.ndarray,
                 w: np.ndarray | None = None,
                 weights_at: Callable[[np.ndarray], np.ndarray] | None = None) -> None:  # fmt: skip
        self.p, self.idx, self.val, self.y, self.w = p, idx, val, y, w
        ev = slice(0, p["eval"])
        self.ev_ids, inv = np.unique(idx[ev], return_inverse=True)
        self.ev_inv, self.ev_val, self.ev_y = inv.reshape(idx[ev].shape), val[ev], y[ev]
        self.weights_at = weights_at or (lambda ids: self.w[ids])
        self.losses: list[float] = []
        self.seconds: list[float] = []  # timed iterations
        self.warmup: list[float] = []  # untimed ones (their seconds, for the record)
        self.warmup_updates: list[float] = []  # the part of each of those spent in update()
        self.moved: list[int] = []
        self.mapped: list[int] = []
        self.updates: list[float] = []  # the part of each timed iteration spent in update()
        self.cold: tuple[float, int] | None = None
        self._update: float | None = None

    def update(self, parts: list[tuple[int, int]], g: np.ndarray | None = None,
               pieces: Sequence[tuple] = (), write: Callable | None = None) -> None:  # fmt: skip
        """Update ``w`` on the touched ids only: from ``pieces`` (the tasks' ``(ids, g, ...)``;
        through ``write(w, ids, values)`` if given), or from ``g`` (Clamor's dense
        accumulator, whose touched entries are then zeroed for the next iteration)."""
        t0 = time.perf_counter()
        step = self.p["lr"] / self.p["batch"]
        if g is None:
            apply_sparse(self.w, pieces, step, write)
        else:
            import clamor  # Clamor's program only: the update without a write fault per page

            touched = np.unique(self.idx[parts[0][0]:parts[-1][1]])
            clamor.write(self.w, touched, self.w[touched] - step * g[touched])
            g[touched] = 0.0
        self._update = time.perf_counter() - t0

    def record(self, seconds: float, moved: int, mapped: int = 0) -> None:
        """One iteration done (``seconds`` wall): its loss, and its time where it belongs."""
        z = (self.weights_at(self.ev_ids)[self.ev_inv] * self.ev_val).sum(axis=1)
        self.losses.append(float(np.mean(np.logaddexp(0.0, z) - self.ev_y * z)))
        t = len(self.losses)
        if t == 1:
            self.cold = (seconds, moved)
        if t <= self.p["warmup"]:
            self.warmup.append(seconds)
            if self._update is not None:
                self.warmup_updates.append(self._update)
        else:
            self.seconds.append(seconds)
            self.moved.append(moved)
            self.mapped.append(mapped)
            if self._update is not None:
                self.updates.append(self._update)
        self._update = None
        progress(f"  iteration {t}{' (warm-up)' if t <= self.p['warmup'] else ''}: {seconds:.4f} s, "
                 f"loss {self.losses[-1]:.6f}, {moved / 2**10:.1f} KiB moved")  # fmt: skip

    def rows(self, system: str, rss: int | None, note: str = "", **extra: Any) -> list[dict]:
        """The program's rows: the timed iterations, the early warm-up ones (2-11), and the
        cold first iteration."""
        timed = row(system, CASE, self.seconds, bytes_moved=int(np.median(self.moved)),
                    peak_worker_rss=rss, note=note, losses_runs=self.losses,
                    warmup_seconds_runs=self.warmup, bytes_runs=self.moved,
                    bytes_mapped_runs=self.mapped, update_seconds_runs=self.updates, **extra)  # fmt: skip
        cold = row(system, COLD, [self.cold[0]], bytes_moved=self.cold[1], peak_worker_rss=rss,
                   note="a fresh system's first iteration (untimed in the per-iteration row)", **extra)  # fmt: skip
        if len(self.warmup) < 2:
            return [timed, cold]
        early = row(system, EARLY, self.warmup[1:11], peak_worker_rss=rss, update_seconds_runs=self.warmup_updates[1:11],
                    note="the warm-up's early iterations (untimed in the per-iteration row)", **extra)  # fmt: skip
        return [timed, early, cold]


# --- the programs (in a child each) -------------------------------------------------------------


def run_clamor(p: dict, net: Any = None) -> list[dict]:
    """Examples and w in the arena, one stage per iteration, the tasks' gradients per id (or
    the accumulator), in-place update."""
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
        grad = cluster.accumulator(p["dim"]) if p["accumulator"] or not p["prefetch"] else None
        drv = Driver(p, idx, val, y, w=w)

        def step(rows: range) -> Any:
            if not p["prefetch"]:  # every page faults in on its first touch
                grad.add(*grad_rows(idx, val, y, w, rows.start, rows.stop))
                return np.array([len(rows)])
            for a in (idx, val, y):  # the rows as one stream, then the weights they read
                clamor.prefetch(a, rows)
            ids = np.unique(idx[rows.start:rows.stop])
            ids, g, _ = task_grad((idx, val, y), ids, clamor.gather(w, ids), rows.start, rows.stop)
            if grad is None:
                return [(ids, g, len(rows))]  # the task's gradient per id, as the peers' tasks return it
            grad.add(ids, g)
            return np.array([len(rows)])

        def read() -> tuple[int, int]:  # bytes served (copied) or mapped, from the driver's counters
            s = cluster.summary()
            return s["bytes_served_by_driver"] + s["bytes_served_by_peers"], s["bytes_mapped"]

        def gathered() -> int:  # rows the workers copied in place: their counters, one call each
            return sum(w["shm_row_bytes"] for w in cluster.worker_stats())

        # The workers' counters are read around the first iteration and the timed block only:
        # a Stats call to each worker before every iteration slowed the next one by 1-2 ms on
        # 2 cores (its gRPC threads still ran). The block's gathered bytes go to its
        # iterations evenly.
        marks = {0: gathered()}
        for t, parts in enumerate(batches(p), start=1):
            before = read()
            t0 = time.perf_counter()
            lo, hi = parts[0][0], parts[-1][1]
            out = cluster.range(lo, hi, partitions=len(parts)).map_partitions(step).collect()
            if grad is None:
                n = sum(piece[2] for piece in out)
                drv.update(parts, pieces=out, write=clamor.write)
            else:
                n = int(out.sum())
                drv.update(parts, g=grad.value)
            dt = time.perf_counter() - t0
            if n != hi - lo:
                raise RuntimeError(f"counted {n} rows, not {hi - lo}")
            after = read()
            fetched, mapped = after[0] - before[0], after[1] - before[1]
            if t == 1:  # the cold iteration's own
                marks[1] = gathered()
                mapped += marks[1] - marks[0]
            drv.record(dt, fetched + mapped, mapped)
            if t == p["warmup"]:
                marks[t] = gathered()
        shared = int(p["warmup"] == 0)  # without warm-up the first timed iteration has its own
        share = (gathered() - marks[max(1, p["warmup"])]) // max(1, len(drv.moved) - shared)
        for runs in (drv.moved, drv.mapped):
            runs[shared:] = [m + share for m in runs[shared:]]
        return drv.rows("clamor", sampler.stop(), page_size=cluster.page_size,
                        note="bytes: pages and gathered rows the workers read (served by the driver or a "
                             "peer, or read in place on the driver's host: bytes_mapped_runs; rows gathered "
                             "in place: the timed block's mean per iteration); RSS "
                             "counts the driver's arena pages a worker maps to copy rows from, shared "
                             "with the driver (docs/paging.md, Gather)")  # fmt: skip
    finally:
        sampler.stop()
        cluster.close()


class ParameterServer:
    """Ray's parameter-server pattern (ray-core/examples/plot_parameter_server) for sparse
    weights: an actor holding ``w``; tasks get the weights they read, gradients are applied here."""

    def __init__(self, dim: int, step: float) -> None:
        self.w, self.step = zeros(dim), step

    def get_weights(self, ids: np.ndarray) -> np.ndarray:
        return self.w[ids]

    def apply_gradients(self, *grads: tuple) -> int:
        """Each task's ``(ids, g, pid)``: sum them per id, then ``w -= lr/B * g``."""
        return len(apply_sparse(self.w, grads, self.step))

    def pid(self) -> int:
        return os.getpid()


def ps_task(ps: Any, data: Sequence[np.ndarray], lo: int, hi: int) -> tuple:
    """A Ray task of the parameter-server program: its weights from the actor, its gradient."""
    import ray

    ids = np.unique(data[0][lo:hi])
    return task_grad(data, ids, ray.get(ps.get_weights.remote(ids)), lo, hi)


def run_ray(p: dict, net: Any, how: str) -> list[dict]:
    """``how``: "ship" (ids and w[ids] by value), "actor" (a parameter server), "broadcast"."""
    import ray

    name = PROGRAMS[f"ray-{how}"]
    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    data_bytes = idx.nbytes + val.nbytes + y.nbytes
    # the examples, and w three times over where it is put every iteration (a put while the
    # last one's release is under way): no spilling, no waiting for memory
    store = 4 * data_bytes + (3 * 8 * p["dim"] if how == "broadcast" else 0) + (256 << 20)
    session = None
    if net is None:
        ray.init("local", num_cpus=WORKERS, include_dashboard=False, logging_level="ERROR",
                 object_store_memory=store)  # fmt: skip
    else:  # a head (0 CPUs) on the driver's address, a node per simulated host
        from peers import RaySession

        session = RaySession(network=net)
    sampler = RssSampler()
    try:
        task = ray.remote(num_cpus=1)(task_grad)
        data = ray.put((idx, val, y))
        extra: dict[str, Any] = {"object_store_memory": store if net is None else "ray start's default"}
        if how == "actor":
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            ps = ray.remote(ParameterServer).options(num_cpus=0, scheduling_strategy=here).remote(
                p["dim"], p["lr"] / p["batch"])  # fmt: skip
            ray.get(ps.pid.remote())  # started and holding w before the first iteration
            ptask = ray.remote(num_cpus=1)(ps_task)
            drv = Driver(p, idx, val, y, weights_at=lambda ids: ray.get(ps.get_weights.remote(ids)))
        else:
            w = zeros(p["dim"])
            drv = Driver(p, idx, val, y, w=w)
        copies = 1 if net is None else WORKERS  # w into each host's object store
        for parts in batches(p):
            t0 = time.perf_counter()
            if how == "ship":
                out = ray.get([task.remote(data, *args) for args in shipments(idx, w, parts)])
                drv.update(parts, pieces=out)
            elif how == "broadcast":
                wref = ray.put(w)
                out = ray.get([task.remote(data, None, wref, lo, hi) for lo, hi in parts])
                drv.update(parts, pieces=out)
                del wref  # the last reference: the object store frees it
            else:
                refs = [ptask.remote(ps, data, lo, hi) for lo, hi in parts]
                ray.get(ps.apply_gradients.remote(*refs))
            dt = time.perf_counter() - t0
            if how == "actor":
                out = ray.get(refs)  # untimed: the workers' pids, for the RSS sampler
            sampler.pids = sorted(set(sampler.pids) | {o[2] for o in out})
            del out
            drv.record(dt, 8 * p["dim"] * copies if how == "broadcast" else shipped_bytes(idx, parts))
        extra["task_processes_runs"] = [len(sampler.pids)]  # more than CPUs: started while tasks block
        if how == "actor":
            extra["server_rss"] = tree_rss([ray.get(ps.pid.remote())])
        note = {"ship": "bytes: ids and w[ids] passed with the tasks",
                "actor": "bytes: ids to the actor and w[ids] back, per task (server_rss: the actor's RSS)",
                "broadcast": "bytes: w put into each host's object store (its workers map it)"}[how]  # fmt: skip
        return drv.rows(name, sampler.stop(), note=note, **extra)
    finally:
        sampler.stop()
        if session is not None:
            session.close()
        else:
            ray.shutdown()


def run_dask(p: dict, net: Any, how: str) -> list[dict]:
    """``how``: "ship" (ids and w[ids] in each task) or "broadcast" (scatter w every iteration)."""
    from dask.distributed import wait
    from peers import DaskSession

    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    sampler = RssSampler()
    session = DaskSession(net)
    client = session.client
    try:
        sampler.pids = list(client.run(os.getpid).values())
        data = client.scatter([idx, val, y], broadcast=True, hash=False)
        wait(data)
        w = zeros(p["dim"])
        drv = Driver(p, idx, val, y, w=w)
        for parts in batches(p):
            t0 = time.perf_counter()
            if how == "ship":
                futs = [client.submit(task_grad, data, *args, pure=False) for args in shipments(idx, w, parts)]
            else:
                wf = client.scatter(w, broadcast=True, hash=False)
                futs = [client.submit(task_grad, data, None, wf, lo, hi, pure=False) for lo, hi in parts]
            drv.update(parts, pieces=client.gather(futs))
            dt = time.perf_counter() - t0
            del futs
            if how == "broadcast":
                session.release(wf)  # untimed: wait until the workers dropped this w
            drv.record(dt, 8 * p["dim"] * WORKERS if how == "broadcast" else shipped_bytes(idx, parts))
        note = "bytes: ids and w[ids] in the tasks" if how == "ship" else "bytes: w scattered to every worker"
        return drv.rows(PROGRAMS[f"dask-{how}"], sampler.stop(), note=note)
    finally:
        sampler.stop()
        session.close()


def run_ipyparallel(p: dict, net: Any, how: str) -> list[dict]:
    """``how``: "ship" (ids and w[ids] with each apply) or "broadcast" (push w every iteration)."""
    import ipyparallel as ipp
    from peers import IpyparallelSession

    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    sampler = RssSampler()
    session = IpyparallelSession(net)
    try:
        dview, view = session.dview, session.view
        dview.use_cloudpickle().get()
        sampler.pids = dview.apply_sync(os.getpid)
        dview.push({"data": (idx, val, y)}, block=True)
        data = ipp.Reference("data")
        w = zeros(p["dim"])
        drv = Driver(p, idx, val, y, w=w)
        for parts in batches(p):
            t0 = time.perf_counter()
            if how == "ship":
                futs = [view.apply_async(task_grad, data, *args) for args in shipments(idx, w, parts)]
            else:
                dview.push({"w": w}, block=True)
                futs = [view.apply_async(task_grad, data, None, ipp.Reference("w"), lo, hi) for lo, hi in parts]
            drv.update(parts, pieces=[f.get() for f in futs])
            drv.record(time.perf_counter() - t0,
                       8 * p["dim"] * WORKERS if how == "broadcast" else shipped_bytes(idx, parts))  # fmt: skip
        note = "bytes: ids and w[ids] with the tasks" if how == "ship" else "bytes: w pushed to every engine"
        return drv.rows(PROGRAMS[f"ipyparallel-{how}"], sampler.stop(), note=note)
    finally:
        sampler.stop()
        session.close()


def run_limit(p: dict) -> list[dict]:
    """One process, no parallelism: per iteration the whole batch's gradient, then the update."""
    idx, val, y = make_examples(p["examples"], p["dim"], p["seed"], p["zipf"])
    w = zeros(p["dim"])
    drv = Driver(p, idx, val, y, w=w)
    for parts in batches(p):
        t0 = time.perf_counter()
        lo, hi = parts[0][0], parts[-1][1]
        drv.update(parts, pieces=[task_grad((idx, val, y), None, w, lo, hi)])
        drv.record(time.perf_counter() - t0, 0)
    return drv.rows(PROGRAMS["limit"], None, note="one numpy process, w in its memory", limit=True)


def run(program: str, p: dict, net: Any) -> list[dict]:
    """The rows of one program (in its child)."""
    if program == "clamor":
        return run_clamor(p, net)
    if program == "limit":
        return run_limit(p)
    peer, how = program.split("-")
    return {"ray": run_ray, "dask": run_dask, "ipyparallel": run_ipyparallel}[peer](p, net, how)


# --- the parent (its checks and goals: logreg_report.py) -------------------------------------


def choose(ap: argparse.ArgumentParser, only: str | None, net: str | None) -> list[str]:
    """The programs ``--only`` names (a peer's name: its default programs), in order."""
    if only is None:
        return list(NETWORK_DEFAULT if net else DEFAULT)
    chosen: list[str] = []
    for name in (s.strip() for s in only.split(",") if s.strip()):
        if name in PROGRAMS:
            chosen.append(name)
        elif name in PEERS:
            chosen += [q for q in (NETWORK_DEFAULT if net else DEFAULT) if q.startswith(name + "-")]
        else:
            ap.error(f"unknown program {name}; choose among {', '.join(PROGRAMS)} or {', '.join(PEERS)}")
    return list(dict.fromkeys(chosen))


def arguments() -> argparse.ArgumentParser:
    """``harness.options.arguments``'s options (--quick --repeat --passes --only --timeout
    --wait-idle), with this workload's program names, and its own."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="D=10^7 weights, 3 timed iterations, 1 pass")
    ap.add_argument("--repeat", type=int, default=None, help="timed iterations per pass (10; quick 3)")
    ap.add_argument("--passes", type=int, default=None,
                    help="passes over the programs (A B A B), each a fresh system (2; quick 1)")  # fmt: skip
    ap.add_argument("--warmup", type=int, default=None,
                    help="untimed iterations first, at full size (100; quick: 2)")
    ap.add_argument("--only", default=None,
                    help=f"programs among {','.join(PROGRAMS)}, or a peer's name "
                         f"(default {','.join(DEFAULT)}; network mode {','.join(NETWORK_DEFAULT)})")  # fmt: skip
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per program and pass")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each program, wait up to SECONDS for the machine to go quiet")  # fmt: skip
    ap.add_argument("--dim", type=int, default=None, help="weights (10^8; quick 10^7)")
    ap.add_argument("--batch", type=int, default=512, help="examples per iteration (512)")
    ap.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the field values (1.2)")
    ap.add_argument("--page-size", type=int, default=4096, help="Clamor page size (4 KiB)")
    ap.add_argument("--accumulator", action="store_true",
                    help="Clamor's tasks add their gradient into a dense accumulator (merged at the "
                         "barrier; the update finds the touched ids with np.unique) instead of returning it per id")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="Clamor's tasks fault their pages in one by one (no clamor.prefetch, no "
                         "clamor.gather) and add their gradient into the accumulator")
    network.add_network_argument(ap)
    ap.add_argument("--child", choices=tuple(PROGRAMS), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    return ap


def main() -> None:
    ap = arguments()
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    if args.child:
        params = json.loads(args.params)

        def measure(program: str, rows: harness.Rows) -> None:
            if program == "limit":  # one process: no hosts to build
                rows.extend(run_limit(params))
                return
            with network.hosts_or_loopback(args.network, WORKERS) as net:
                rows.extend(run(program, params, net))

        harness.child_main(args.child, args.child_out, CASES, measure, label=PROGRAMS[args.child])
        return
    network.require(args.network)
    programs = choose(ap, args.only, args.network)
    passes = args.passes or (1 if args.quick else 2)
    repeat = args.repeat or (3 if args.quick else 10)
    warmup = args.warmup if args.warmup is not None else (2 if args.quick else 100)
    iters = warmup + repeat
    batch = args.batch
    p = {"dim": args.dim or (10**7 if args.quick else 10**8), "batch": batch, "iterations": iters,
         "warmup": warmup, "repeat": repeat, "passes": passes, "examples": iters * batch,
         "partitions": 2 * WORKERS, "lr": 0.5, "zipf": args.zipf, "seed": 8, "eval": min(4096, iters * batch),
         "page_size": args.page_size, "fields": FIELDS, "workers": WORKERS, "quick": args.quick,
         "prefetch": not args.no_prefetch, "accumulator": args.accumulator}  # fmt: skip
    ref = reference_losses(p)
    argv = ["--params", json.dumps(p)] + ([f"--network={args.network}"] if args.network else [])
    if args.network:
        network.sweep_stale()
    rows = harness.run_all(Path(__file__).resolve(), programs, argv, CASES, args.timeout, args.wait_idle,
                           label=lambda s: PROGRAMS[s], passes=passes)  # fmt: skip
    check(rows, ref)
    statistics_of(rows)
    result = {"workload": network.workload("logreg", args.network), "quick": args.quick,
              "page_size": args.page_size, "rows": rows,
              "title": network.title("Sparse logistic regression (Criteo-like hashed features): paged "
                                     "weights vs. shipping w[ids], a parameter-server actor, one numpy "
                                     "process", args.network, WORKERS),
              "params": {**p, "weights_bytes": p["dim"] * 8, "programs": programs,
                         **network.params(args.network, WORKERS), "reference_losses": ref,
                         "timed": f"per iteration, after {warmup} untimed at full size: shipping "
                                  "w[ids] / paging / the broadcast, the gradient stage, the merge and "
                                  "the update"}}  # fmt: skip
    result["goals"] = goals(result, args.network)
    path = save(result)
    print(markdown(result))  # median, its 95 % interval, min-max, ÷ clamor, ÷ the limit
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
