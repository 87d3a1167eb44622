#!/usr/bin/env python3
"""Per-task and per-stage overhead of empty tasks on 2 workers: Clamor vs. Dask, Ray, ipyparallel.

    python bench/run.py overhead [--tasks N] [--repeat R] [--stages S] [--quick]
                             [--only clamor,dask,ray,ipyparallel]

Every system gets 2 local worker processes on this machine and runs tasks that do
nothing (a module-level function returning ``None``):

* **per-task overhead**: one stage (batch) of N empty tasks submitted at once and
  waited for; wall time / N. Median of R repetitions, after one untimed warm-up
  batch of N.
* **per-stage overhead**: a stage of 2 empty tasks (as many as workers), waited
  for, S times in a row; wall time / S. Median of R such runs, after a warm-up.

The systems, each through its ordinary batch API:

* Clamor: ``cluster.execute(StageSpec(_empty, [TaskSpec(i) ...]))`` (the stage
  API: after the warm-up batch has shown the tasks tiny, a batch runs them in chunks,
  runtime/scheduling/fusion.py); the same with ``cluster.fuse = False`` (a task an
  attempt, the ``clamor (no fusion)`` row); also, as more rows if they are there, the dataset API
  (``cluster.range(N, partitions=N).map_partitions(_noop).count()``) and, for
  context, the control plane's ``cluster.run_stage([(worker, fn, args), ...])``
  (tasks placed round-robin by the caller).
* Dask distributed: ``LocalCluster(n_workers=2, threads_per_worker=1,
  processes=True)``; ``client.gather(client.map(f, range(N), pure=False))``.
* Ray: ``ray.init(num_cpus=2, include_dashboard=False)``; a ``@ray.remote(num_cpus=1)``
  function; ``ray.get([f.remote(i) for i in range(N)])``.
* ipyparallel: ``ipp.Cluster(n=2)`` started from here; a load-balanced view;
  ``view.map_sync(f, range(N))`` (one task per element).

Each system runs in its own child process (this script with ``--child``), one
after the other, so that no system's background threads or daemons run while
another is measured, and so that one that crashes or hangs cannot take the run
with it. Each child shuts its system down in a ``finally``; afterwards the
parent kills any process still carrying the child's marker in its environment
(none should: a leftover is flagged in the report). A system that cannot be
imported or started is reported as ``unavailable: <reason>``.

Writes ``bench/results/overhead.md`` and ``bench/results/overhead.json`` and prints
the Markdown. A benchmark, not a test: it never fails on a timing.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import signal
import statistics
import sys
import time
import traceback
from pathlib import Path

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
from harness.machine import git_state, machine, package_versions
from harness.results import RESULTS
from report.overhead import add_ratios, render

SYSTEMS = ("clamor", "dask", "ray", "ipyparallel")
WORKERS = 2
CHILD_TIMEOUT = 900.0  # default seconds for one system, start-up to shut-down
PACKAGES = (
    "clamor-jupyter",
    "dask",
    "distributed",
    "ray",
    "ipyparallel",
    "cloudpickle",
    "grpcio",
    "tornado",
    "pyzmq",
    "msgpack",
)


# --- the empty tasks (module level: shipped by value, this module is __main__) --------


def _empty(ctx):
    """A Clamor stage program that does nothing."""
    return


def _noop(part):
    """A partition function that does nothing."""
    return part


def _empty_peer(i):
    """A Dask / Ray / ipyparallel task that does nothing."""
    return


# --- the measurement, the same for every system ---------------------------------------


class LoadMeter:
    """CPU time used on the machine by processes other than the measured system's.

    System-wide busy time from /proc/stat minus the CPU time of the processes that
    carry this child's marker in their environment (the driver, its workers and
    daemons), over a measurement window.
    """

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
    def others(a: tuple, b: tuple) -> dict:
        wall = b[0] - a[0]
        own = sum(cpu - a[2].get(pid, 0.0) for pid, cpu in b[2].items())
        cpu = max(0.0, (b[1] - a[1]) - own)
        return {
            "wall_s": wall,
            "own_cpu_s": own,
            "other_cpu_s": cpu,
            "other_cores": cpu / wall if wall > 0 else 0.0,
        }


def measure(label: str, batch, stage, n: int, reps: int, stages: int) -> dict:
    """Time ``batch(n)`` (n empty tasks) and ``stage()`` (2 empty tasks) per repetition.

    ``batch`` and ``stage`` submit, wait for every task and return the results.
    """
    t0 = time.perf_counter()
    check(batch(n), n, label)
    warm_stages = max(10, stages // 10)
    for _ in range(warm_stages):
        check(stage(), WORKERS, label)
    progress(f"  {label}: warm-up {time.perf_counter() - t0:.1f} s")
    meter = LoadMeter()
    load0 = meter.snapshot()
    task_runs = []
    for r in range(reps):
        t0 = time.perf_counter()
        out = batch(n)
        dt = time.perf_counter() - t0
        check(out, n, label)
        task_runs.append(dt)
        progress(
            f"  {label}: batch of {n} tasks {r + 1}/{reps}: {dt:.3f} s "
            f"= {dt / n * 1e6:.1f} µs per task"
        )
    stage_runs = []
    for r in range(reps):
        t0 = time.perf_counter()
        for _ in range(stages):
            out = stage()
        dt = time.perf_counter() - t0
        check(out, WORKERS, label)
        stage_runs.append(dt)
        progress(
            f"  {label}: {stages} stages of {WORKERS} tasks {r + 1}/{reps}: {dt:.3f} s "
            f"= {dt / stages * 1e3:.2f} ms per stage"
        )
    load = LoadMeter.others(load0, meter.snapshot())
    progress(
        f"  {label}: the system used {load['own_cpu_s'] / load['wall_s']:.2f} cores, "
        f"other processes {load['other_cores']:.2f} cores"
    )
    per_task = [dt / n * 1e6 for dt in task_runs]
    per_stage = [dt / stages * 1e3 for dt in stage_runs]
    return {
        "status": "ok",
        "per_task_us": statistics.median(per_task),
        "per_task_runs_us": per_task,
        "per_stage_ms": statistics.median(per_stage),
        "per_stage_runs_ms": per_stage,
        "warm_stages": warm_stages,
        "load": load,
    }


def check(out, n: int, label: str) -> None:
    if isinstance(out, int):  # a count
        if out != n:
            raise RuntimeError(f"{label}: counted {out}, expected {n}")
        return
    out = list(out)
    if len(out) != n or any(x is not None for x in out):
        raise RuntimeError(f"{label}: expected {n} None results, got {len(out)}")


def unavailable(exc: BaseException, what: str = "") -> dict:
    reason = f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]
    return {
        "status": "unavailable",
        "reason": (what + ": " if what else "") + reason,
        "traceback": traceback.format_exc(),
    }


# --- one child per system ---------------------------------------------------------------


def run_clamor(n: int, reps: int, stages: int) -> dict:
    rows: dict[str, dict] = SavedRows()
    t0 = time.perf_counter()
    try:
        from clamor.runtime.stage import StageSpec, TaskSpec

        import clamor

        cluster = clamor.Cluster(workers=WORKERS)
    except Exception as exc:  # noqa: BLE001 - reported, never fatal
        return {"clamor": unavailable(exc, "could not start")}
    startup = time.perf_counter() - t0
    progress(f"  clamor: started {WORKERS} workers in {startup:.1f} s")

    def add(label: str, batch, stage, *, missing: str = "") -> None:
        """Measure one row; ``missing``: what an AttributeError means (an API not there yet)."""
        try:
            rows[label] = measure(label, batch, stage, n, reps, stages)
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            if missing and isinstance(exc, AttributeError):
                rows[label] = {"status": "unavailable", "reason": f"skipped: {missing} is not there yet ({exc})"}
            else:
                rows[label] = unavailable(exc, "failed")
            progress(f"  {label}: {rows[label]['reason']}")

    def execute(k: int):
        return cluster.execute(StageSpec(program=_empty, tasks=[TaskSpec(i) for i in range(k)]))

    try:
        # The stage API: the headline row (tiny tasks fused once the warm-up showed them tiny).
        add("clamor", execute, lambda: execute(WORKERS), missing="`Cluster.execute` (the stage API)")
        # The dataset API.
        add("clamor (dataset API)",
            lambda k: cluster.range(k, partitions=k).map_partitions(_noop).count(),
            lambda: cluster.range(WORKERS, partitions=WORKERS).map_partitions(_noop).count(),
            missing="the dataset API")  # fmt: skip
        # The stage API with a task an attempt (runtime/scheduling/fusion.py).
        cluster.fuse = False
        try:
            add("clamor (no fusion)", execute, lambda: execute(WORKERS))
        finally:
            cluster.fuse = True
        # Context: the control plane's run_stage (the caller places the tasks).
        add("clamor (run_stage)",
            lambda k: cluster.run_stage([(i % WORKERS, _empty_peer, (i,)) for i in range(k)]),
            lambda: cluster.run_stage([(i, _empty_peer, (i,)) for i in range(WORKERS)]))  # fmt: skip
    finally:
        t0 = time.perf_counter()
        cluster.close()
        shutdown = time.perf_counter() - t0
    for row in rows.values():
        row["startup_s"] = startup
        row["shutdown_s"] = shutdown
    return dict(rows)


def run_dask(n: int, reps: int, stages: int) -> dict:
    t0 = time.perf_counter()
    cluster = client = None
    try:
        from dask.distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=WORKERS,
            threads_per_worker=1,
            processes=True,
            dashboard_address=None,
        )
        client = Client(cluster)
        client.wait_for_workers(WORKERS, timeout=120)
        startup = time.perf_counter() - t0
        progress(f"  dask: started {WORKERS} workers in {startup:.1f} s")
        row = measure(
            "dask",
            lambda k: client.gather(client.map(_empty_peer, range(k), pure=False)),
            lambda: client.gather(client.map(_empty_peer, range(WORKERS), pure=False)),
            n,
            reps,
            stages,
        )
    except Exception as exc:  # noqa: BLE001
        row = unavailable(exc, "could not start" if client is None else "failed")
        progress(f"  dask: {row['reason']}")
        startup = None
    finally:
        t1 = time.perf_counter()
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
        shutdown = time.perf_counter() - t1
    row.update(startup_s=startup, shutdown_s=shutdown)
    return {"dask": row}


def run_ray(n: int, reps: int, stages: int) -> dict:
    t0 = time.perf_counter()
    ray = None
    try:
        import ray

        ray.init(num_cpus=WORKERS, include_dashboard=False)

        remote = ray.remote(num_cpus=1)(_empty_peer)
        startup = time.perf_counter() - t0
        progress(f"  ray: started with num_cpus={WORKERS} in {startup:.1f} s")
        row = measure(
            "ray",
            lambda k: ray.get([remote.remote(i) for i in range(k)]),
            lambda: ray.get([remote.remote(i) for i in range(WORKERS)]),
            n,
            reps,
            stages,
        )
    except Exception as exc:  # noqa: BLE001
        row = unavailable(exc, "could not start" if ray is None else "failed")
        progress(f"  ray: {row['reason']}")
        startup = None
    finally:
        t1 = time.perf_counter()
        if ray is not None and ray.is_initialized():
            ray.shutdown()
        shutdown = time.perf_counter() - t1
    row.update(startup_s=startup, shutdown_s=shutdown)
    return {"ray": row}


def run_ipyparallel(n: int, reps: int, stages: int) -> dict:
    t0 = time.perf_counter()
    cluster = rc = None
    try:
        import ipyparallel as ipp

        cluster = ipp.Cluster(n=WORKERS, log_level=40)
        rc = cluster.start_and_connect_sync()
        rc.wait_for_engines(WORKERS, timeout=120)
        view = rc.load_balanced_view()
        startup = time.perf_counter() - t0
        progress(f"  ipyparallel: started {WORKERS} engines in {startup:.1f} s")
        row = measure(
            "ipyparallel",
            lambda k: view.map_sync(_empty_peer, range(k)),
            lambda: view.map_sync(_empty_peer, range(WORKERS)),
            n,
            reps,
            stages,
        )
    except Exception as exc:  # noqa: BLE001
        row = unavailable(exc, "could not start" if rc is None else "failed")
        progress(f"  ipyparallel: {row['reason']}")
        startup = None
    finally:
        t1 = time.perf_counter()
        if rc is not None:
            rc.close()
        if cluster is not None:
            try:
                cluster.stop_cluster_sync()
            except Exception as exc:  # noqa: BLE001 - e.g. it never started
                progress(
                    f"  ipyparallel: stop_cluster_sync: {type(exc).__name__}: {exc}"
                )
        shutdown = time.perf_counter() - t1
    row.update(startup_s=startup, shutdown_s=shutdown)
    return {"ipyparallel": row}


#: The rows each system's child reports, and the API each row uses.
ROWS = {
    "clamor": {
        "clamor": "`cluster.execute(StageSpec(_empty, [TaskSpec(i) for i in range(N)]))` (tiny tasks fused)",
        "clamor (no fusion)": "the same with `cluster.fuse = False`: a task an attempt",
        "clamor (dataset API)": "`cluster.range(N, partitions=N).map_partitions(_noop).count()`",
        "clamor (run_stage)": (
            "`cluster.run_stage([(i % 2, f, (i,)) for i in range(N)])` (caller places tasks)"
        ),
    },
    "dask": {"dask": "`client.gather(client.map(f, range(N), pure=False))`"},
    "ray": {
        "ray": "`ray.get([f.remote(i) for i in range(N)])`, `@ray.remote(num_cpus=1)`"
    },
    "ipyparallel": {
        "ipyparallel": "`view.map_sync(f, range(N))` on `rc.load_balanced_view()` (chunksize 1)"
    },
}

#: Where the child writes its rows (``--child-out``).
_OUT: Path | None = None


class SavedRows(dict):
    """Rows written to the child's output file as each one is done, so that a system
    that hangs later (and is killed at the time limit) keeps the rows it finished."""

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        if _OUT is not None:
            _OUT.write_text(json.dumps(dict(self), indent=1) + "\n")


RUNNERS = {
    "clamor": run_clamor,
    "dask": run_dask,
    "ray": run_ray,
    "ipyparallel": run_ipyparallel,
}


def child_main(system: str, n: int, reps: int, stages: int, out: Path) -> None:
    # Peers log to stdout/stderr as they like; the parent passes it all to its stderr.
    global _OUT
    _OUT = out

    def stop(signum, frame):
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)  # stopped by the parent: shut down in finally
    try:
        rows = RUNNERS[system](n, reps, stages)
    except BaseException as exc:  # noqa: BLE001 - the parent must get a row
        rows = json.loads(out.read_text()) if out.exists() else {}  # rows done so far
        for name in ROWS[system]:
            rows.setdefault(name, unavailable(exc, "crashed"))
    out.write_text(json.dumps(rows, indent=1) + "\n")


# --- the parent: one child per system, then the report -----------------------------------


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
        row.setdefault("api", ROWS[system].get(name, ""))
        row["child_elapsed_s"] = run.wall_s
        row["left_behind"] = run.leftovers
        row["exit_wait_s"] = run.waited_s
    return rows


def main() -> None:
    global WORKERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tasks", type=int, default=None, help="N tasks per batch (2000)")
    ap.add_argument("--repeat", type=int, default=None, help="R repetitions (5)")
    ap.add_argument("--stages", type=int, default=None, help="S stages per run (200)")
    ap.add_argument("--workers", type=int, default=WORKERS,
                    help="worker processes per system (2); other than 2 writes overhead-W.json")  # fmt: skip
    ap.add_argument(
        "--quick", action="store_true", help="N=300, R=3, S=50 unless given"
    )
    ap.add_argument(
        "--only",
        default=",".join(SYSTEMS),
        help=f"comma-separated systems to run, among {','.join(SYSTEMS)}",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each system, wait up to SECONDS for other processes to go quiet",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=CHILD_TIMEOUT,
        metavar="SECONDS",
        help=f"time limit per system, start-up to shut-down ({CHILD_TIMEOUT:.0f})",
    )
    ap.add_argument("--child", choices=SYSTEMS, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    WORKERS = args.workers
    q = args.quick
    args.tasks = args.tasks or (300 if q else 2000)
    args.repeat = args.repeat or (3 if q else 5)
    args.stages = args.stages or (50 if q else 200)

    if args.child:
        child_main(args.child, args.tasks, args.repeat, args.stages, args.child_out)
        return

    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad:
        ap.error(
            f"unknown system(s) {', '.join(bad)}; choose among {', '.join(SYSTEMS)}"
        )
    command = "python bench/run.py overhead" + "".join(f" {a}" for a in sys.argv[1:])
    started = time.perf_counter()
    result: dict = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(packages=package_versions(PACKAGES)),
        "git": git_state(),
        "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "parameters": {
            "command": command.strip(),
            "quick": q,
            "tasks": args.tasks,
            "repeat": args.repeat,
            "stages": args.stages,
            "workers": WORKERS,
            "systems": systems,
            "wait_idle_s": args.wait_idle,
            "timeout_s": args.timeout,
        },
        "rows": {},
    }
    for system in systems:
        if args.wait_idle:
            wait_until_idle(args.wait_idle)
        progress(f"{system}:")
        rows = run_child(system, args)
        for name, r in rows.items():
            if r.get("status") == "ok":
                progress(
                    f"{name}: {r['per_task_us']:.1f} µs per task, "
                    f"{r['per_stage_ms']:.2f} ms per stage"
                )
            else:
                progress(f"{name}: unavailable: {r['reason']}")
        result["rows"].update(rows)
    result["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["elapsed_s"] = time.perf_counter() - started
    add_ratios(result)

    RESULTS.mkdir(parents=True, exist_ok=True)
    text = render(result)
    name = "overhead" if WORKERS == 2 else f"overhead-{WORKERS}"
    (RESULTS / f"{name}.md").write_text(text)
    (RESULTS / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
