#!/usr/bin/env python3
"""Dense and repeated lookups (issue 29): Clamor's plain faults against Ray and Dask (each
broadcasting the table, and each shipping every task the values of its keys), W processes
over one ``multiprocessing.shared_memory`` table and one plain numpy process (the limits),
first pass and repeat pass.

    python bench/run.py dense [--quick] [--workers 2,14] [--table-mib M] [--lookups L]
                              [--tasks-per-worker T] [--passes P] [--repeat R] [--first-repeat F]
                              [--iterations I] [--only clamor,shm,ray,ray-values,numpy,clamor-exact,
                                                       dask,dask-values] [--no-single] [--out NAME]

The table: ``M`` MiB of int64 (4096 on a machine of 16+ cores and 64+ GiB, else 2048;
512 with ``--quick``), value ``7 i + 3`` at ``i``, seen as pages of 256 KiB. A stage is
``W x T`` tasks (``T`` = 4 a worker); a task draws ``L`` keys (200,000) from its own
seed, over all of the table (``100 %``) or over a random 1 % of its pages (``1 %``), and
returns ``table[keys].sum()``, checked against ``7 sum(keys) + 3 L`` (and the writes so
far). Cases, for every ``W`` of ``--workers`` (2,14 on such a machine, else 2): ``100 %``
and ``1 %`` with ``T`` tasks a worker, and ``100 %`` with 1 task a worker (not for Dask's
broadcast; ``--no-single`` leaves it out), each as

* **first pass**: from the table in the driver's memory to the last result, on a fresh
  system (a new object reference, scatter, block or gather on the same workers; new
  workers for Clamor; the start untimed): Clamor's workers fault in the pages the stage
  touches (no ``clamor.prefetch``), each time on a new cluster (started and warmed up
  on a one-page-a-worker table, untimed), so the table's pages are new to every worker,
  as a peer's new put is (a new table on the same cluster could land on a freed table's
  addresses, which the workers still map and read in place); Ray
  ``ray.put(table)`` and the tasks on the reference (``ray.init(num_cpus=W)``, an object
  store of twice the table; one Ray instance a child, so after its first put a put
  reuses store pages already allocated); Dask ``client.scatter(table, broadcast=True)``
  and a ``client.submit`` a task (left out where W copies would not fit in 60 % of the
  memory); the values programs ("ray (ship keys' values)", "dask (ship keys' values)"):
  the knowledge Clamor's tasks have, their seeds and so their keys: the driver draws
  each task's keys, gathers ``table[keys]`` and ships only those values (Ray: an
  argument of the remote call; Dask: ``client.scatter`` of the list, a future a task);
  shared memory: create a ``SharedMemory`` block, copy the table into it, and the tasks
  on a fork pool of W processes made before anything is timed; numpy: one process
  running every task in turn. ``F`` repetitions a pass (``--first-repeat``); the seconds
  of the put, scatter, gather or fill are recorded (``put_s_runs``);
* **repeat pass**: an untimed warm-up pass, then the identical stage ``R`` times on the
  same system (the values programs gather and ship again: the program as written).

And **write + lookups** (every system but Dask's broadcast): ``I`` iterations of (the
driver adds 1,000,003 to one entry that some task reads; the ``100 %`` stage), timed
from the write: Clamor writes the arena in place, Ray re-puts the table, the values
programs gather again, shared memory and numpy write in place.

Memory: ``/proc/meminfo`` Shmem growth over each first pass and the workers' summed Pss
after it; Clamor's paging counters per pass (every counter of ``cluster.stats()`` and
``cluster.worker_stats()`` that changed, summed over the workers).

Protocol: for each ``W``, ``harness.run_all`` runs every system ``--passes`` times (2),
A B C A B C, each in a fresh child process; rows merge the passes' repetitions. The JSON
is saved after each ``W`` (``params.complete``).

Goals (issue 29), per ``W`` and fraction with ``T`` tasks a worker: repeat pass within
1.5x of shared memory and no slower than Ray's faster program; first pass within 1.5x of
shared memory's touches (its fill left out: Clamor's table was made before the pass
too) and at least 2x faster than Ray's faster program; write + lookups within 1.1x of one
numpy process. Writes ``bench/results/dense.json`` (``--out NAME``: ``NAME.json``).

Beside this script: ``dense_runs.py`` (the interface every system implements, and the
timing of a case's repetitions into its row) and ``dense_peers.py`` (the Ray and Dask
programs). The task functions stay here, in the child's ``__main__``, so that every
system pickles them by value and no worker needs ``bench/`` on its path; the systems get
them as :data:`TASKS`. Clamor's system and the limits stay here, naming the tasks
directly (the shared-memory limit's pool also reads this module's ``_BARRIER``).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import psutil
from harness import child_main, progress, run_all
from harness.results import goal, median, ratio, save
from harness.tables import find, fmt_bytes, markdown
from limits import _ATTACHED, _shm_init, _shm_view
from peers import WORKERS, make_table
from programs import family

from workloads.dense_peers import (
    DaskSystem,
    DaskValuesSystem,
    RaySystem,
    RayValuesSystem,
)
from workloads.dense_runs import PAGING_KEYS, Runs, System, Tasks, finish

#: In the order they run at each worker count (Dask, the slowest to broadcast, last).
SYSTEMS = ("clamor", "shm", "ray", "ray-values", "numpy", "clamor-exact", "dask-values", "dask")
LIMITS = ("shm", "numpy")
#: The systems of the write case (Dask would re-scatter W copies of the table each time).
WRITERS = ("clamor", "ray", "ray-values", "shm", "numpy", "clamor-exact", "dask-values")
FIRST, REPEAT = "first pass", "repeat pass"
SEED = 29
DELTA = 1_000_003
#: Worker counters that are levels, not counts: left out of the per-pass changes.
GAUGES = {"id", "pid", "rss_bytes", "memory_budget", "page_cache_budget", "partition_budget",
          "cache_limit_pages", "partitions", "partitions_in_memory", "partition_bytes",
          "partitions_on_disk", "partition_disk_bytes", "tasks_queued", "cached_pages",
          "arena_bytes", "page_size"}  # fmt: skip


def label(system: str, workers: int = WORKERS) -> str:
    """A child's row name; the limits name their process count (``workers``)."""
    return {"shm": f"limit: shared memory, {workers} processes", "numpy": "limit: numpy, one process",
            "clamor-exact": "clamor, exact read sets (as before)", "ray-values": "ray (ship keys' values)",
            "dask-values": "dask (ship keys' values)"}.get(system, system)  # fmt: skip


# --- the tasks (shipped by value: they are in the child's __main__) ----------------------


def _keys(seed, subset, n, per_page, lookups):
    """A task's keys: ``lookups`` random indices into ``n`` values, or onto ``subset`` pages."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if subset is None:
        return rng.integers(0, n, lookups)
    return subset[rng.integers(0, len(subset), lookups)] * per_page + rng.integers(0, per_page, lookups)


def _lookups(table, seed, subset, per_page, lookups):
    """A task: the sum of its looked-up values, and this worker's pid."""
    import os

    keys = _keys(seed, subset, len(table), per_page, lookups)
    return int(table[keys].sum()), os.getpid()


def _sum_values(values):
    """A values program's task: the sum of the values shipped with it, and the pid."""
    import os

    return int(values.sum()), os.getpid()


def _warm(table, seconds):
    """An untimed warm-up task: loads numpy, touches the (small) table, holds the worker."""
    import os
    import time

    value = int(table[:8].sum())
    time.sleep(seconds)
    return value, os.getpid()


#: The pool's barrier (inherited through fork): a task waiting on it holds its process,
#: so W tasks reach every one of the W processes once.
_BARRIER: Any = None


def _shm_detach() -> None:
    """In a pool process: let go of every block attached (``limits._shm_view``)."""
    for old in list(_ATTACHED):
        block, view = _ATTACHED.pop(old)
        del view
        block.close()


def _shm_table(name: str, n: int) -> np.ndarray:
    if name not in _ATTACHED:
        _shm_detach()  # a new table: let go of the last one
    return _shm_view(name, n)


def _shm_lookups(a: tuple) -> tuple[int, int]:
    name, n, seed, subset, per_page, lookups = a
    return _lookups(_shm_table(name, n), seed, subset, per_page, lookups)


def _shm_each(detach: bool) -> int:
    """Run once in each pool process (the barrier): let go of the table if ``detach``."""
    if detach:
        _shm_detach()
    _BARRIER.wait(60)
    return os.getpid()


#: The tasks every system runs (dense_runs.Tasks): these functions, defined here, in the
#: child's ``__main__``, so that the peers (dense_peers.py) pickle them by value.
TASKS = Tasks(keys=_keys, lookups=_lookups, sum_values=_sum_values, warm=_warm)


# --- the cases ---------------------------------------------------------------------------


def specs(system: str, p: dict) -> list[tuple[str, float, int]]:
    """(case prefix, fraction of pages, tasks a worker) of the read cases ``system`` runs."""
    w, t = p["workers"], p["tasks_per_worker"]
    out = [(f"{w} workers, 100 %, {t} a worker", 1.0, t), (f"{w} workers, 1 %, {t} a worker", 0.01, t)]
    if p["single"] and t != 1 and system != "dask":
        out.append((f"{w} workers, 100 %, 1 a worker", 1.0, 1))
    return out


def write_case(w: int) -> str:
    return f"{w} workers, write + lookups"


def cases(system: str, p: dict) -> list[str]:
    names = [f"{c}, {run}" for c, _, _ in specs(system, p) for run in (FIRST, REPEAT)]
    return names + ([write_case(p["workers"])] if system in WRITERS and p["iterations"] else [])


def task_args(p: dict, fraction: float, tasks: int, seed: int) -> list[tuple]:
    """Per task ``(seed, subset, per_page, lookups)``; ``subset``: the 1 % of pages, or None."""
    per_page, pages = p["page_size"] // 8, p["table_bytes"] // p["page_size"]
    subset = None
    if fraction < 1:
        rng = np.random.default_rng(seed)
        subset = np.sort(rng.choice(pages, max(1, round(fraction * pages)), replace=False))
    return [(seed + 1 + i, subset, per_page, p["lookups"]) for i in range(tasks)]


def expected(p: dict, args: Sequence[tuple]) -> list[int]:
    """What each task must return for the table ``7 i + 3`` (no table read needed)."""
    n = p["table_bytes"] // 8
    return [7 * int(_keys(s, sub, n, pp, lk).sum()) + 3 * lk for s, sub, pp, lk in args]


# --- the systems (one per child process; the interface: dense_runs.py; Ray, Dask: dense_peers.py)


class ClamorSystem(System):
    copies = 0
    #: Cluster(read_sets=...): "exact" re-faults every page a task reads, as before issue 29.
    read_sets = "resident"

    def __init__(self, p: dict, tasks: Tasks) -> None:
        super().__init__(p, tasks)
        import clamor

        self.clamor = clamor
        clamor.configure(page_size=p["page_size"])
        self.cluster = None
        self.small = None

    def make_table(self) -> np.ndarray:
        self.table = make_table(self.n, arena=True)  # in the arena before any cluster exists
        self.small = make_table(self.p["page_size"] // 8 * self.w, arena=True)
        return self.table

    def fresh(self) -> None:
        # Workers that have mapped none of the table's pages: a new cluster, warmed up on
        # the small table. A new table on the old cluster cannot promise that: the arena
        # reuses a freed table's addresses, whose pages the workers still map, and they
        # read a table written there in place at no fault (a repeat pass, not a first);
        # holding freed blocks instead would grow the driver's memory by a table a pass.
        if self.cluster is not None:
            self.cluster.close()
        t0 = time.perf_counter()
        self.cluster = self.clamor.Cluster(workers=self.w, page_size=self.p["page_size"],
                                           read_sets=self.read_sets)
        self.ids = self.cluster.workers
        progress(f"  clamor: {len(self.ids)} workers started in {time.perf_counter() - t0:.1f} s")
        self.cluster.run_stage([(i, _warm, (self.small, 0.05)) for i in self.ids])

    def _stage(self, args: list[tuple]) -> list:
        ids = self.ids
        return self.cluster.run_stage([(ids[i % len(ids)], _lookups, (self.table, *a))
                                       for i, a in enumerate(args)])  # fmt: skip

    first = again = _stage

    def write(self, key: int, delta: int, args: list[tuple]) -> list:
        self.table[key] += delta
        return self._stage(args)

    def pids(self, out: list) -> list[int]:
        return sorted({w["pid"] for w in self.cluster.worker_stats() if w.get("alive")})

    def counters(self) -> dict[str, int]:
        s = self.cluster.stats()
        out: dict[str, int] = {}
        for w in s.get("workers", []):
            for k, v in w.items():
                if k not in GAUGES and isinstance(v, int | float) and not isinstance(v, bool):
                    out[k] = out.get(k, 0) + int(v)
        for k, v in s.items():  # the driver's own (bytes served, invalidations, epoch, ...)
            if k not in GAUGES and k not in out and isinstance(v, int | float) and not isinstance(v, bool):
                out[f"driver.{k}"] = int(v)
        return out

    def moved(self) -> int:
        s = self.cluster.stats()
        return int(s.get("bytes_served_by_driver", 0)) + int(s.get("bytes_served_by_peers", 0))

    def close(self) -> None:
        if self.cluster is not None:
            self.cluster.close()


class ShmSystem(System):
    """W ``multiprocessing`` processes (forked before the table exists, so they share none
    of the driver's memory) over one ``SharedMemory`` block."""

    def __init__(self, p: dict, tasks: Tasks) -> None:
        super().__init__(p, tasks)
        import multiprocessing
        from multiprocessing import resource_tracker, shared_memory

        self.shared_memory = shared_memory
        global _BARRIER
        self.block = self.view = None
        self.count = 0
        context = multiprocessing.get_context("fork")
        # One resource tracker, this process's, shared by the pool: a process that attached a
        # block with a tracker of its own would have it unlink the block when it ends.
        resource_tracker.ensure_running()
        _BARRIER = context.Barrier(self.w)
        self.pool = context.Pool(self.w, initializer=_shm_init)  # terminate() ends them quietly
        self.workers = sorted(self.pool.map(_shm_each, [False] * self.w, chunksize=1))
        shm = os.statvfs("/dev/shm")
        free = shm.f_bavail * shm.f_frsize
        if free < p["table_bytes"] + (64 << 20):
            raise RuntimeError(f"/dev/shm has {fmt_bytes(free)} free, the table needs "
                               f"{fmt_bytes(p['table_bytes'])}")  # fmt: skip

    def fresh(self) -> None:
        if self.block is not None:
            self.view = None
            self.block.close()
            self.block.unlink()
            self.block = None
            self.pool.map(_shm_each, [True] * self.w, chunksize=1)  # every process lets go

    def _tasks(self, args: list[tuple]) -> list:
        name = self.block.name
        return self.pool.map(_shm_lookups, [(name, self.n, *a) for a in args], chunksize=1)

    def first(self, args: list[tuple]) -> list:
        self.count += 1
        t = time.perf_counter()
        self.block = self.shared_memory.SharedMemory(
            name=f"clamor-dense-{os.getpid()}-{self.count}", create=True, size=self.table.nbytes)
        self.view = np.ndarray(self.table.shape, np.int64, buffer=self.block.buf)
        np.copyto(self.view, self.table)
        self.put_s = time.perf_counter() - t
        return self._tasks(args)

    again = _tasks

    def write(self, key: int, delta: int, args: list[tuple]) -> list:
        self.view[key] += delta  # in place: every pool process sees it at once
        return self._tasks(args)

    def pids(self, out: list) -> list[int]:
        return self.workers

    def close(self) -> None:
        try:
            self.fresh()
        finally:
            with contextlib.suppress(Exception):
                self.pool.terminate()
                self.pool.join()


class NumpySystem(System):
    copies = 0

    def _tasks(self, args: list[tuple]) -> list:
        return [_lookups(self.table, *a) for a in args]

    first = again = _tasks

    def write(self, key: int, delta: int, args: list[tuple]) -> list:
        self.table[key] += delta
        return self._tasks(args)

    def pids(self, out: list) -> list[int]:
        return [os.getpid()]


class ClamorExactSystem(ClamorSystem):
    read_sets = "exact"


SESSIONS = {"clamor": ClamorSystem, "ray": RaySystem, "dask": DaskSystem, "shm": ShmSystem,
            "numpy": NumpySystem, "clamor-exact": ClamorExactSystem, "ray-values": RayValuesSystem,
            "dask-values": DaskValuesSystem}  # fmt: skip


def measure(system: str, rows, p: dict) -> None:
    """In the child: per read case ``F`` first passes (each after an untimed ``fresh()``),
    an untimed warm-up repeat pass and ``R`` timed ones; then the write case."""
    w = p["workers"]
    name, extra = label(system, w), {"limit": system in LIMITS, "program": system}
    s = SESSIONS[system](p, TASKS)  # before the table: no worker inherits or maps the driver's copy
    try:
        t0 = time.perf_counter()
        table = s.make_table()
        progress(f"  {name}: {fmt_bytes(table.nbytes)} table made in {time.perf_counter() - t0:.1f} s")
        for k, (case, fraction, per_worker) in enumerate(specs(system, p)):
            args = task_args(p, fraction, w * per_worker, SEED + 1000 * k)
            want = expected(p, args)
            runs = Runs(s, name, f"{case}, {FIRST}", fraction, per_worker, extra)
            for _ in range(p["first_repeat"]):
                s.fresh()
                runs.time(lambda a=args: s.first(a), want, table.nbytes * s.copies)
            rows.append(runs.row())
            runs = Runs(s, name, f"{case}, {REPEAT}", fraction, per_worker, extra)
            runs.check(s.again(args), want, "the untimed warm-up")
            for _ in range(p["repeat"]):
                runs.time(lambda a=args: s.again(a), want)
            rows.append(runs.row())
        if system not in WRITERS or not p["iterations"]:
            return
        args = task_args(p, 1.0, w * p["tasks_per_worker"], SEED + 5000)  # write + lookups
        keys = [_keys(sd, sub, len(table), pp, lk) for sd, sub, pp, lk in args]
        want = expected(p, args)
        rng = np.random.default_rng(SEED + 5001)
        runs = Runs(s, name, write_case(w), 1.0, p["tasks_per_worker"], extra)
        s.fresh()
        runs.check(s.first(args), want, "before any write")  # untimed: the table in place
        for _ in range(p["iterations"]):
            task = int(rng.integers(len(keys)))
            key = int(keys[task][rng.integers(len(keys[task]))])  # an entry some task reads
            want = [v + DELTA * int(np.count_nonzero(k == key)) for v, k in zip(want, keys, strict=True)]
            runs.time(lambda key=key: s.write(key, DELTA, args), want, table.nbytes if system == "ray" else 0)
        rows.append(runs.row({"ray": "re-put each iteration", "ray-values": "gathered again each iteration",
                              "dask-values": "gathered again each iteration"}.get(system, "")))  # fmt: skip
    finally:
        s.close()




def goals(result: dict) -> list[dict]:
    """Issue 29's goals, from the rows (ratios: peer / clamor of the medians; Ray: its faster
    program in the case)."""
    p, out = result["params"], []
    for w in p["workers_list"]:
        shm, t = label("shm", w), p["tasks_per_worker"]
        for frac in ("100 %", "1 %"):
            base = f"{w} workers, {frac}, {t} a worker"
            for run, peer, target, text in (
                (REPEAT, shm, 1 / 1.5, "within 1.5x of shared memory"),
                (REPEAT, "ray", 1.0, "no slower than Ray"),
                (FIRST, shm, 1 / 1.5, "within 1.5x of shared memory's first touches (its fill not counted)"),
                (FIRST, "ray", 2.0, "at least 2x faster than Ray end to end"),
            ):
                case = f"{base}, {run}"
                if peer == "ray":
                    peer = _fastest(result, "ray", case) or "ray"
                # The limit's first pass is its touches: Clamor's table was made in the arena
                # before the pass too, so the copy into the SharedMemory block is left out.
                value = (_touches(result, case, shm) if (run, peer) == (FIRST, shm) else ratio(result, peer, case))
                out.append(goal(f"{case}: {text} ({peer} ÷ clamor)", value, target, _why(result, case, peer)))
        case, numpy = write_case(w), label("numpy")
        value = ratio(result, numpy, case)
        out.append(goal(f"{case}: within 1.1x of one numpy process (numpy ÷ clamor)", value, 1 / 1.1,
                        _why(result, case, numpy)))  # fmt: skip
    for g in out:
        g["why"] = "" if g["met"] else g["why"]
    return out


def _fastest(result: dict, peer: str, case: str) -> str | None:
    """The name of ``peer``'s program with the lowest median in ``case``."""
    mine = [r for r in result["rows"] if family(r["system"]) == peer and r["case"] == case and r["seconds"]
            and r.get("checked") is not False]  # fmt: skip
    return min(mine, key=lambda r: median(r["seconds"]))["system"] if mine else None


def _touches(result: dict, case: str, shm_name: str) -> float | None:
    """Shared memory's first pass without its fill, over Clamor's (above 1: Clamor faster)."""
    shm, clamor = find(result["rows"], shm_name, case), find(result["rows"], "clamor", case)
    if not shm or not clamor or not shm["seconds"] or not clamor["seconds"] or shm.get("put_s") is None:
        return None
    return (median(shm["seconds"]) - shm["put_s"]) / median(clamor["seconds"])


def _why(result: dict, case: str, peer: str) -> str:
    """For a missed goal: both medians (and the peer's put, gather or fill) and Clamor's
    paging counters in ``case``, from the rows."""
    c, q = find(result["rows"], "clamor", case), find(result["rows"], peer, case)
    if not c or not c["seconds"] or not q or not q["seconds"]:
        return "not measured (see the rows)"
    text = (f"clamor median {median(c['seconds']):.3f} s, {peer} {median(q['seconds']):.3f} s"
            + (f" ({q['put_s']:.3f} s of it the put, gather or fill)" if q.get("put_s") is not None else ""))
    if c.get("paging"):
        text += "; Clamor's workers, the pass: " + ", ".join(
            f"{k} {v:,}" for k, v in c["paging"].items() if k in PAGING_KEYS)  # fmt: skip
    return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="512 MiB table, 2 workers, 1 pass: 2 first passes, 3 repeat passes, 3 writes")
    ap.add_argument("--workers", default=None,
                    help="worker counts, comma-separated (2,14 on 16+ cores and 64+ GiB, else 2; quick 2)")
    ap.add_argument("--table-mib", type=int, default=None,
                    help="table size (4096 on 16+ cores and 64+ GiB, else 2048; quick 512)")
    ap.add_argument("--lookups", type=int, default=200_000, help="lookups a task (200,000)")
    ap.add_argument("--tasks-per-worker", type=int, default=4, help="tasks a worker in a stage (4)")
    ap.add_argument("--no-single", action="store_true", help="leave out the 1-task-a-worker case")
    ap.add_argument("--passes", type=int, default=None, help="passes over the systems, A B A B (2; quick 1)")
    ap.add_argument("--repeat", type=int, default=None, help="timed repeat passes a pass (5; quick 3)")
    ap.add_argument("--first-repeat", type=int, default=None,
                    help="first passes a pass, each on a fresh system (5; quick 2)")
    ap.add_argument("--iterations", type=int, default=None,
                    help="write + lookups iterations a pass (5; quick 3; 0: none)")
    ap.add_argument("--page-size", type=int, default=256 << 10, help="bytes (256 KiB)")
    ap.add_argument("--only", default=",".join(SYSTEMS), help=f"systems among {','.join(SYSTEMS)}")
    ap.add_argument("--out", default="dense", help="result name: bench/results/NAME.json (dense)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per system and worker count")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each system, wait up to SECONDS for the machine to go quiet")  # fmt: skip
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    big = len(os.sched_getaffinity(0)) >= 16 and psutil.virtual_memory().total >= 64 << 30
    workers = [int(w) for w in (args.workers or ("2,14" if big and not args.quick else "2")).split(",")
               if w.strip()]  # fmt: skip
    table_mib = args.table_mib or (512 if args.quick else 4096 if big else 2048)
    pages = (table_mib << 20) // args.page_size
    p = {"table_bytes": pages * args.page_size, "page_size": args.page_size, "lookups": args.lookups,
         "tasks_per_worker": args.tasks_per_worker, "single": not args.no_single,
         "repeat": args.repeat or (3 if args.quick else 5), "passes": args.passes or (1 if args.quick else 2),
         "first_repeat": args.first_repeat or (2 if args.quick else 5),
         "iterations": (3 if args.quick else 5) if args.iterations is None else args.iterations,
         "workers_list": workers, "dtype": "int64", "delta": DELTA}  # fmt: skip
    if args.child:
        p["workers"] = workers[0]
        child_main(args.child, args.child_out, cases(args.child, p),
                   lambda sy, rows: measure(sy, rows, p), label(args.child, p["workers"]))  # fmt: skip
        return
    chosen = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in chosen if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {', '.join(bad)}; choose among {', '.join(SYSTEMS)}")
    argv = [f"--table-mib={table_mib}", f"--lookups={args.lookups}",
            f"--tasks-per-worker={args.tasks_per_worker}", f"--repeat={p['repeat']}",
            f"--first-repeat={p['first_repeat']}", f"--iterations={p['iterations']}",
            f"--page-size={args.page_size}"] + (["--no-single"] if args.no_single else [])  # fmt: skip
    t0 = time.perf_counter()
    rows: list[dict] = []
    script = Path(__file__).resolve()
    shm = os.statvfs("/dev/shm")

    def result(done: bool) -> dict:
        out = {"workload": args.out, "quick": args.quick, "page_size": args.page_size,
               "title": f"Dense and repeated lookups into a {fmt_bytes(p['table_bytes'])} table, "
                        f"{' and '.join(map(str, workers))} workers: first and repeat pass",
               "params": {**p, "systems": chosen, "complete": done, "elapsed_s": time.perf_counter() - t0,
                          "loadavg": os.getloadavg(), "dev_shm_bytes": shm.f_blocks * shm.f_frsize},
               "rows": rows}  # fmt: skip
        out["goals"] = goals(out)
        return out

    for w in workers:  # every system at one worker count, then the next
        q = {**p, "workers": w}
        every = list(dict.fromkeys(c for system in chosen for c in cases(system, q)))
        got = run_all(script, chosen, [*argv, f"--workers={w}"], every, args.timeout, args.wait_idle,
                      label=lambda sy, w=w: label(sy, w), passes=p["passes"])  # fmt: skip
        program = {label(sy, w): sy for sy in chosen}  # a row's child: only the cases it runs count
        rows += [r for r in got if r["case"] in cases(program[r["system"]], q)]
        finish(rows)
        save(result(False))  # what is measured so far survives the run being stopped
    path = save(final := result(True))
    print(markdown(final, [("Shmem growth", lambda r: fmt_bytes(r.get("shmem_growth"))),
                            ("workers' Pss", lambda r: fmt_bytes(r.get("workers_pss"))),
                            ("clamor paging", lambda r: ", ".join(
                                f"{k} {v}" for k, v in (r.get("paging") or {}).items()
                                if k in PAGING_KEYS) or "—")]))  # fmt: skip
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
