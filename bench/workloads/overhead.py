#!/usr/bin/env python3
"""Per-task and per-stage overhead of empty tasks on W workers: Clamor vs. Dask, Ray,
ipyparallel, each batched and unbatched, and the limits of one plain Python process and
``multiprocessing.Pool``.

    python bench/run.py overhead [--tasks N] [--repeat R] [--passes P] [--stages S]
                             [--workers W] [--quick] [--only clamor,dask,ray,ipyparallel,limit]

Every system gets W local worker processes (``--workers``, default ``peers.WORKERS``:
``CLAMOR_BENCH_WORKERS`` or 2) and runs tasks that do nothing (a module-level function
returning ``None``):

* **per task**: N empty tasks (2000) submitted at once and waited for, every result
  back in the driver; wall time / N.
* **per stage**: a stage of W empty tasks, waited for, S times in a row (200); wall
  time / S.

Batching. Clamor's stage API runs tiny tasks in chunks (``runtime/scheduling/fusion.py``:
once a program's last stage showed its tasks tiny, at least ``chunks_per_worker`` chunks
a worker, at most ``max_chunk`` tasks a chunk). Every peer's docs tell users to batch
tiny tasks themselves (Ray: "Anti-pattern: Over-parallelizing with too fine-grained
tasks"; Dask: "Avoid very large graphs" / batch small tasks, and ``dask.bag``;
ipyparallel: ``map``'s ``chunksize``), so each peer runs both programs, with batches of
the size Clamor's fusion picks for the same N and W (``batch_size``, from
``FusionPolicy``'s own defaults; a stage of W tasks is below fusion's threshold, so
its batches hold one item):

============================  =====================================================================
row                           what one batch of n tasks runs
============================  =====================================================================
clamor                        ``cluster.execute(StageSpec(_empty, [TaskSpec(i) ...]))`` (fused)
clamor (no fusion)            the same with ``cluster.fuse = False``: a task an attempt
clamor (dataset API)          ``cluster.range(n, partitions=n).map_partitions(_noop).count()``
clamor (run_stage)            ``cluster.run_stage([(i % W, f, (i,)) ...])`` (context)
dask                          ``client.gather(client.map(f, range(n), pure=False))``
dask (batched)                ``client.gather(client.map(f_batch, chunks, pure=False))``, flattened
dask (bag)                    ``db.from_sequence(range(n), npartitions=len(chunks)).map(f).compute()``
ray                           ``ray.get([f.remote(i) for i in range(n)])``
ray (batched)                 ``ray.get([f_batch.remote(c) for c in chunks])``, flattened
ipyparallel                   ``view.map_sync(f, range(n))`` (chunksize 1)
ipyparallel (chunksize)       ``view.map_sync(f, range(n), chunksize=k)``
limit: one Python process     ``[f(i) for i in range(n)]`` in the child itself
limit: multiprocessing.Pool   ``Pool(W).map(f, range(n), chunksize=k)`` (fork)
============================  =====================================================================

``chunks`` are lists of k consecutive indices; ``f_batch(items)`` is ``[f(i) for i in
items]``. Set-ups: ``clamor.Cluster(workers=W)``; Dask ``LocalCluster(n_workers=W,
threads_per_worker=1, processes=True, dashboard_address=None)``; Ray
``ray.init(num_cpus=W, include_dashboard=False)`` with ``@ray.remote(num_cpus=1)``;
ipyparallel ``ipp.Cluster(n=W)`` and ``rc.load_balanced_view()``. The report pairs
fused Clamor with the batched peers (the faster of Dask's two) and unfused Clamor with
the unbatched ones, and shows every row as a multiple of the limits.

Protocol (steady state). Each row: an untimed warm-up batch of N (its time kept as the
row's *first batch*, the cold number) and max(10, S/10) untimed stages, then R timed
batches and R timed runs of S stages. Each system runs in its own child process (this
script with ``--child``, :func:`harness.run_marked`), one after the other, P passes
over the systems (A B C D E A B C D E; 2 by default, 1 with ``--quick``), each pass
starting every system afresh; a row's repetitions of every pass are merged (R x P
values: median, minimum, and the distribution-free 95 % interval of the median,
``harness.results.median_ci``). A child shuts its system down in a ``finally``; the
parent kills whatever carrying the child's marker is left (flagged in the report). A
system that cannot be imported or started is reported as ``unavailable: <reason>``.

Writes ``bench/results/overhead.json`` (every repetition, the provenance:
``harness.machine.provenance()``) and ``overhead.md`` (``report/overhead.py``); with W
other than 2, ``overhead-W``; ``CLAMOR_BENCH_SUFFIX`` is appended. A benchmark, not a
test: it never fails on a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
from harness import (
    CHILD_MARKER,
    busy_seconds,
    marked_processes,
    progress,
    run_marked,
    wait_until_idle,
    workload_command,
)
from harness.machine import package_versions, provenance
from harness.results import RESULTS
from peers import WORKERS as DEFAULT_WORKERS
from report.overhead import add_stats, render

SYSTEMS = ("clamor", "dask", "ray", "ipyparallel", "limit")
WORKERS = DEFAULT_WORKERS
CHILD_TIMEOUT = 900.0  # default seconds for one system, start-up to shut-down
#: Versions beyond those every result names (``harness.machine.VERSIONED``).
PACKAGES = ("clamor-jupyter", "tornado", "pyzmq", "msgpack")


# --- the empty tasks (module level: shipped by value, this module is __main__) --------


def _empty(ctx: Any) -> None:
    """A Clamor stage program that does nothing."""
    return


def _noop(part: Any) -> Any:
    """A partition function that does nothing."""
    return part


def _empty_peer(i: int) -> None:
    """A Dask / Ray / ipyparallel / multiprocessing task that does nothing."""
    return


def _empty_batch(items: list[int]) -> list[None]:
    """A batch of empty tasks: ``_empty_peer`` on each item (the peers' batched program)."""
    return [_empty_peer(i) for i in items]


# --- batches of the size Clamor's fusion picks ----------------------------------------


def fusion_policy() -> dict[str, int]:
    """``FusionPolicy``'s defaults (``runtime/scheduling/fusion.py``), which size the batches."""
    from clamor.runtime.scheduling.fusion import FusionPolicy

    p = FusionPolicy()
    return {"chunks_per_worker": p.chunks_per_worker, "max_chunk": p.max_chunk}


def batch_size(n: int, workers: int, policy: dict[str, int]) -> int:
    """Items a batch of ``n`` tasks on ``workers`` workers: what ``FusionPolicy.chunk``
    gives a tiny program (at least ``chunks_per_worker`` chunks a worker, at most
    ``max_chunk`` items; 1 below ``2 x chunks_per_worker`` tasks)."""
    per = policy["chunks_per_worker"]
    if n < 2 * per:
        return 1
    return max(1, min(policy["max_chunk"], n // (max(1, workers) * per)))


def chunks(n: int, k: int) -> list[list[int]]:
    """``range(n)`` as lists of ``k`` consecutive items."""
    return [list(range(a, min(a + k, n))) for a in range(0, n, k)]


def flat(batches: list[list[Any]]) -> list[Any]:
    return [x for b in batches for x in b]


# --- the measurement, the same for every row ------------------------------------------


class LoadMeter:
    """CPU time used on the machine by processes other than the measured system's:
    busy time from /proc/stat minus the CPU time of the processes carrying this child's
    marker (the driver, its workers and daemons), over a window."""

    def __init__(self) -> None:
        self.marker = os.environ.get(CHILD_MARKER)

    def snapshot(self) -> tuple[float, float, dict[int, float]]:
        busy = busy_seconds()
        procs = marked_processes(CHILD_MARKER, self.marker, include_self=True) if self.marker else []
        own = {}
        for p in procs:
            with contextlib.suppress(psutil.Error):  # gone meanwhile
                t = p.cpu_times()
                own[p.pid] = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), busy, own

    @staticmethod
    def others(a: tuple, b: tuple) -> dict[str, float]:
        wall = b[0] - a[0]
        own = sum(cpu - a[2].get(pid, 0.0) for pid, cpu in b[2].items())
        cpu = max(0.0, (b[1] - a[1]) - own)
        return {"wall_s": wall, "own_cpu_s": own, "other_cpu_s": cpu,
                "other_cores": cpu / wall if wall > 0 else 0.0}  # fmt: skip


def check(out: Any, n: int, label: str) -> None:
    """``out`` must be ``n`` results of ``None`` (or the count ``n``)."""
    if isinstance(out, int):  # a count
        if out != n:
            raise RuntimeError(f"{label}: counted {out}, expected {n}")
        return
    out = list(out)
    if len(out) != n or any(x is not None for x in out):
        raise RuntimeError(f"{label}: expected {n} None results, got {len(out)}")


def measure(label: str, run: Callable[[int], Any], n: int, reps: int, stages: int) -> dict:
    """Warm ``run`` up (a batch of ``n``, then stages of ``WORKERS``), then time ``R``
    batches of ``n`` and ``R`` runs of ``stages`` stages. ``run(k)`` submits ``k`` empty
    tasks, waits for them and returns their results."""
    t0 = time.perf_counter()
    check(run(n), n, label)
    first = time.perf_counter() - t0
    warm_stages = max(10, stages // 10)
    for _ in range(warm_stages):
        check(run(WORKERS), WORKERS, label)
    progress(f"  {label}: warm-up {time.perf_counter() - t0:.1f} s (first batch {first / n * 1e6:.1f} µs a task)")
    meter = LoadMeter()
    load0 = meter.snapshot()
    task_runs = []
    for r in range(reps):
        t0 = time.perf_counter()
        out = run(n)
        dt = time.perf_counter() - t0
        check(out, n, label)
        task_runs.append(dt / n * 1e6)
        progress(f"  {label}: batch of {n} tasks {r + 1}/{reps}: {dt:.3f} s = {task_runs[-1]:.2f} µs per task")
    stage_runs = []
    for r in range(reps):
        t0 = time.perf_counter()
        for _ in range(stages):
            out = run(WORKERS)
        dt = time.perf_counter() - t0
        check(out, WORKERS, label)
        stage_runs.append(dt / stages * 1e3)
        progress(f"  {label}: {stages} stages of {WORKERS} tasks {r + 1}/{reps}: {stage_runs[-1]:.3f} ms per stage")
    load = LoadMeter.others(load0, meter.snapshot())
    progress(f"  {label}: the system used {load['own_cpu_s'] / load['wall_s']:.2f} cores, "
             f"other processes {load['other_cores']:.2f} cores")  # fmt: skip
    return {"status": "ok", "per_task_runs_us": task_runs, "per_stage_runs_ms": stage_runs,
            "first_batch_runs_us": [first / n * 1e6], "warm_stages": warm_stages,
            "load_runs": [load]}  # fmt: skip


def unavailable(exc: BaseException, what: str = "") -> dict:
    reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    return {"status": "unavailable", "reason": (what + ": " if what else "") + reason,
            "traceback": traceback.format_exc()}  # fmt: skip


# --- the systems: each yields its rows, ``{label: (run, context)}`` --------------------

#: A row: ``run(k)`` (k empty tasks, their results) and a context manager factory around
#: its measurement (``None``: none).
Row = tuple[Callable[[int], Any], Callable[[], contextlib.AbstractContextManager] | None]


@contextlib.contextmanager
def clamor_system(policy: dict[str, int]) -> Iterator[dict[str, Row]]:
    from clamor.runtime.stage import StageSpec, TaskSpec

    import clamor

    cluster = clamor.Cluster(workers=WORKERS)

    def execute(k: int) -> Any:
        return cluster.execute(StageSpec(program=_empty, tasks=[TaskSpec(i) for i in range(k)]))

    @contextlib.contextmanager
    def unfused() -> Iterator[None]:
        cluster.fuse = False
        try:
            yield
        finally:
            cluster.fuse = True

    try:
        yield {  # in this order: the fused row is the program's first (its warm-up measures it)
            "clamor": (execute, None),
            "clamor (dataset API)": (lambda k: cluster.range(k, partitions=k).map_partitions(_noop).count(), None),
            "clamor (no fusion)": (execute, unfused),
            "clamor (run_stage)": (lambda k: cluster.run_stage([(i % WORKERS, _empty_peer, (i,)) for i in range(k)]),
                                   None),
        }  # fmt: skip
    finally:
        cluster.close()


@contextlib.contextmanager
def dask_system(policy: dict[str, int]) -> Iterator[dict[str, Row]]:
    import dask.bag as db
    from dask.distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=WORKERS, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        client = Client(cluster)
        try:
            client.wait_for_workers(WORKERS, timeout=120)

            def batched(k: int) -> list:
                parts = chunks(k, batch_size(k, WORKERS, policy))
                return flat(client.gather(client.map(_empty_batch, parts, pure=False)))

            def bag(k: int) -> list:
                parts = -(-k // batch_size(k, WORKERS, policy))
                return db.from_sequence(range(k), npartitions=parts).map(_empty_peer).compute()

            yield {
                "dask": (lambda k: client.gather(client.map(_empty_peer, range(k), pure=False)), None),
                "dask (batched)": (batched, None),
                "dask (bag)": (bag, None),
            }
        finally:
            client.close()
    finally:
        cluster.close()


@contextlib.contextmanager
def ray_system(policy: dict[str, int]) -> Iterator[dict[str, Row]]:
    import ray

    ray.init(num_cpus=WORKERS, include_dashboard=False)
    try:
        one = ray.remote(num_cpus=1)(_empty_peer)
        many = ray.remote(num_cpus=1)(_empty_batch)
        yield {
            "ray": (lambda k: ray.get([one.remote(i) for i in range(k)]), None),
            "ray (batched)": (lambda k: flat(ray.get([many.remote(c) for c in
                                                      chunks(k, batch_size(k, WORKERS, policy))])), None),
        }  # fmt: skip
    finally:
        if ray.is_initialized():
            ray.shutdown()


@contextlib.contextmanager
def ipyparallel_system(policy: dict[str, int]) -> Iterator[dict[str, Row]]:
    import ipyparallel as ipp

    cluster = ipp.Cluster(n=WORKERS, log_level=40)
    rc = None
    try:
        rc = cluster.start_and_connect_sync()
        rc.wait_for_engines(WORKERS, timeout=120)
        view = rc.load_balanced_view()
        yield {
            "ipyparallel": (lambda k: view.map_sync(_empty_peer, range(k)), None),
            "ipyparallel (chunksize)": (lambda k: view.map_sync(_empty_peer, range(k),
                                                                chunksize=batch_size(k, WORKERS, policy)), None),
        }  # fmt: skip
    finally:
        if rc is not None:
            rc.close()
        try:
            cluster.stop_cluster_sync()
        except Exception as exc:  # noqa: BLE001 - e.g. it never started
            progress(f"  ipyparallel: stop_cluster_sync: {type(exc).__name__}: {exc}")


@contextlib.contextmanager
def limit_system(policy: dict[str, int]) -> Iterator[dict[str, Row]]:
    import multiprocessing

    pool = multiprocessing.get_context("fork").Pool(WORKERS)
    try:
        yield {
            "limit: one Python process": (lambda k: [_empty_peer(i) for i in range(k)], None),
            "limit: multiprocessing.Pool": (lambda k: pool.map(_empty_peer, range(k),
                                                          chunksize=batch_size(k, WORKERS, policy)), None),
        }  # fmt: skip
    finally:
        pool.close()
        pool.join()


SYSTEM_RUNNERS = {"clamor": clamor_system, "dask": dask_system, "ray": ray_system,
                  "ipyparallel": ipyparallel_system, "limit": limit_system}  # fmt: skip

#: The rows each system's child reports, and the program each row runs (the report's API column).
ROWS = {
    "clamor": {
        "clamor": "`cluster.execute(StageSpec(_empty, [TaskSpec(i) for i in range(N)]))` (tiny tasks fused)",
        "clamor (dataset API)": "`cluster.range(N, partitions=N).map_partitions(_noop).count()`",
        "clamor (no fusion)": "the same with `cluster.fuse = False`: a task an attempt",
        "clamor (run_stage)": "`cluster.run_stage([(i % W, f, (i,)) for i in range(N)])` (caller places tasks)",
    },
    "dask": {
        "dask": "`client.gather(client.map(f, range(N), pure=False))`",
        "dask (batched)": "`client.gather(client.map(f_batch, chunks, pure=False))`, flattened",
        "dask (bag)": "`db.from_sequence(range(N), npartitions=len(chunks)).map(f).compute()`",
    },
    "ray": {
        "ray": "`ray.get([f.remote(i) for i in range(N)])`, `@ray.remote(num_cpus=1)`",
        "ray (batched)": "`ray.get([f_batch.remote(c) for c in chunks])`, flattened",
    },
    "ipyparallel": {
        "ipyparallel": "`view.map_sync(f, range(N))` on `rc.load_balanced_view()` (chunksize 1)",
        "ipyparallel (chunksize)": "`view.map_sync(f, range(N), chunksize=k)`",
    },
    "limit": {
        "limit: one Python process": "`[f(i) for i in range(N)]` in one process",
        "limit: multiprocessing.Pool": "`multiprocessing.Pool(W).map(f, range(N), chunksize=k)` (fork)",
    },
}

#: Where the child writes its rows (``--child-out``).
_OUT: Path | None = None


class SavedRows(dict):
    """Rows written to the child's output file as each one is done, so that a system
    that hangs later (and is killed at the time limit) keeps the rows it finished."""

    def __setitem__(self, key: str, value: dict) -> None:
        super().__setitem__(key, value)
        if _OUT is not None:
            _OUT.write_text(json.dumps(dict(self), indent=1) + "\n")


def run_system(system: str, n: int, reps: int, stages: int) -> dict:
    """Start ``system``, measure each of its rows, shut it down; the rows."""
    rows = SavedRows()
    policy = fusion_policy()
    t0 = t1 = time.perf_counter()
    started = False
    try:
        with SYSTEM_RUNNERS[system](policy) as runs:
            started, startup = True, time.perf_counter() - t0
            progress(f"  {system}: started {WORKERS} workers in {startup:.1f} s")
            for label, (run, context) in runs.items():
                try:
                    with context() if context else contextlib.nullcontext():
                        rows[label] = {**measure(label, run, n, reps, stages), "startup_runs_s": [startup]}
                except Exception as exc:  # noqa: BLE001 - reported, never fatal
                    rows[label] = unavailable(exc, "failed")
                    progress(f"  {label}: {rows[label]['reason']}")
            t1 = time.perf_counter()
    except Exception as exc:  # noqa: BLE001 - could not start (or shut down)
        for label in ROWS[system]:
            if label not in rows:
                rows[label] = unavailable(exc, "failed" if started else "could not start")
        progress(f"  {system}: {type(exc).__name__}: {exc}")
        return dict(rows)
    shutdown = time.perf_counter() - t1
    for label, row in rows.items():
        if row["status"] == "ok":
            row["shutdown_runs_s"] = [shutdown]
            rows[label] = row  # saved again, with its shut-down
    return dict(rows)


def child_main(system: str, n: int, reps: int, stages: int, out: Path) -> None:
    # Peers log to stdout/stderr as they like; the parent passes it all to its stderr.
    global _OUT
    _OUT = out

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)  # stopped by the parent: shut down in finally
    try:
        rows = run_system(system, n, reps, stages)
    except BaseException as exc:  # noqa: BLE001 - the parent must get a row
        rows = json.loads(out.read_text()) if out.exists() else {}  # rows done so far
        for name in ROWS[system]:
            rows.setdefault(name, unavailable(exc, "crashed"))
    out.write_text(json.dumps(rows, indent=1) + "\n")


# --- the parent: P passes of one child per system, then the report -----------------------


def run_child(system: str, args: argparse.Namespace) -> dict:
    """One system in its own child (:func:`harness.run_marked`); its rows, every row
    it did not finish marked unavailable with the reason."""
    argv = ["--tasks", str(args.tasks), "--repeat", str(args.repeat), "--stages", str(args.stages),
            "--workers", str(WORKERS)]  # fmt: skip
    run = run_marked(lambda out: [*workload_command(__file__), "--child", system,
                                  "--child-out", str(out), *argv], args.timeout)  # fmt: skip
    rows = run.output or {}
    why = run.failure or f"the child exited with status {run.returncode} before this row"
    for name in ROWS[system]:
        rows.setdefault(name, {"status": "unavailable", "reason": why})
        r = rows[name]
        if run.failure and r["status"] != "ok" and r["reason"] != why:
            r["reason"] = f"{run.failure}: {r['reason']}"
    for name, row in rows.items():
        row["child_elapsed_runs_s"] = [run.wall_s]
        row["left_behind"] = run.leftovers
        row["exit_wait_runs_s"] = [run.waited_s]
    return rows


def merge(passes: list[dict[str, dict]]) -> dict[str, dict]:
    """One row per name from every pass's rows: each ``*_runs*`` list concatenated in pass
    order, what was left behind added up, ``passes`` the passes it measured, a pass that
    failed noted in ``reason`` (the row stays ``ok`` if another pass measured it)."""
    merged: dict[str, dict] = {}
    for number, rows in enumerate(passes, 1):
        for name, r in rows.items():
            r = {k: v for k, v in r.items() if k != "traceback"}
            m = merged.setdefault(name, {"status": r["status"], "passes": 0, "failed_passes": [], "left_behind": []})
            m["left_behind"] = [*m["left_behind"], *r.get("left_behind", [])]
            if r["status"] != "ok":
                m["failed_passes"].append(f"pass {number}: {r['reason']}")
                m.setdefault("reason", r["reason"])
                continue
            m["passes"] += 1
            m["status"] = "ok"
            for field, value in r.items():
                if "_runs" in field:
                    m[field] = [*m.get(field, []), *value]
                elif field not in m:
                    m[field] = value
    return merged


def main() -> None:
    global WORKERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=None, help="N tasks per batch (2000; quick 300)")
    ap.add_argument("--repeat", type=int, default=None, help="R timed repetitions per row and pass (5; quick 3)")
    ap.add_argument("--passes", type=int, default=None,
                    help="P passes over the systems (A B A B), each starting every system afresh (2; quick 1)")
    ap.add_argument("--stages", type=int, default=None, help="S stages per run (200; quick 50)")
    ap.add_argument("--workers", type=int, default=DEFAULT_WORKERS,
                    help=f"worker processes per system ({DEFAULT_WORKERS}); other than 2 writes overhead-W.json")
    ap.add_argument("--quick", action="store_true", help="N=300, R=3, P=1, S=50 unless given")
    ap.add_argument("--only", default=",".join(SYSTEMS), help=f"comma-separated systems among {','.join(SYSTEMS)}")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each system, wait up to SECONDS for other processes to go quiet")
    ap.add_argument("--timeout", type=float, default=CHILD_TIMEOUT, metavar="SECONDS",
                    help=f"time limit per system and pass, start-up to shut-down ({CHILD_TIMEOUT:.0f})")
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()  # fmt: skip
    WORKERS = args.workers
    q = args.quick
    args.tasks = args.tasks or (300 if q else 2000)
    args.repeat = args.repeat or (3 if q else 5)
    args.passes = args.passes or (1 if q else 2)
    args.stages = args.stages or (50 if q else 200)

    if args.child:
        child_main(args.child, args.tasks, args.repeat, args.stages, args.child_out)
        return

    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(f"unknown system(s) {', '.join(bad)}; choose among {', '.join(SYSTEMS)}")
    policy = fusion_policy()
    started = time.perf_counter()
    result: dict = {
        "workload": "overhead",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        **provenance(),  # commit, dirty, changes, machine, command, versions
        "packages": package_versions(PACKAGES),
        "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "parameters": {
            "quick": q, "tasks": args.tasks, "repeat": args.repeat, "passes": args.passes,
            "stages": args.stages, "workers": WORKERS, "systems": systems,
            "batch": batch_size(args.tasks, WORKERS, policy),
            "stage_batch": batch_size(WORKERS, WORKERS, policy), "fusion_policy": policy,
            "warm_stages": max(10, args.stages // 10), "wait_idle_s": args.wait_idle,
            "timeout_s": args.timeout,
        },
        "api": {name: api for rows in ROWS.values() for name, api in rows.items()},
    }  # fmt: skip
    passes = []
    for number in range(args.passes):
        rows: dict[str, dict] = {}
        for system in systems:
            if args.wait_idle:
                wait_until_idle(args.wait_idle)
            progress(f"{system}: pass {number + 1} of {args.passes}")
            rows.update(run_child(system, args))
        passes.append(rows)
    result["rows"] = merge(passes)
    result["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["elapsed_s"] = time.perf_counter() - started
    name = ("overhead" if WORKERS == 2 else f"overhead-{WORKERS}") + os.environ.get("CLAMOR_BENCH_SUFFIX", "")
    result["workload"] = name
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")  # the raw rows, first
    add_stats(result)
    text = render(result)
    (RESULTS / f"{name}.md").write_text(text)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
