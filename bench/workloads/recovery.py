#!/usr/bin/env python3
"""Recovery from a lost worker and speculative replicas for a straggler (the paper's
Figures 11 and 12, scaled to a 2-core machine).

    python bench/run.py recovery [--quick] [--repeat R] [--only recovery,stragglers]
                             [--wait-idle SECONDS] [--timeout SECONDS]

1. **Recovery** (Figure 11): 10 iterations of dense k-means on ``Cluster(workers=3)``.
   The points (1,000,000 × 8 float64, 61 MiB; ``--quick``: 400,000) live in the arena
   (``clamor.asarray``); ``parallelize(points, partitions=16)`` cuts them into arena
   slices that travel as references, so every task demand-pages its slice. Each
   iteration is one action (``ds.map_partitions(step).collect()``): a task assigns its
   points to the 16 centroids (shipped by value, 1 KiB) and adds its partial sums and
   counts to two accumulators; the driver then computes the new centroids. Run once as
   is and once with ``cluster.kill_worker(w)`` fired by a ``threading.Timer`` half an
   iteration into iteration 4 (half the median iteration 2-10 time of the first run
   without a failure); for context, also without a failure on a cluster of 2 workers
   from the start. Wall time per iteration; the centroids of every iteration must
   equal a single-process numpy reference bit for bit (same partial sums, added in
   task order). If the runtime does not recover by itself (the action raises), the
   benchmark says so and re-runs the iteration itself, as a user would.
2. **Stragglers** (Figure 12): a job of S stages of T uniform tasks (``--quick``: fewer,
   shorter) of pure numpy work on 3 workers, each stage one action
   (``cluster.range(...).map(burn).collect()``), with one worker slowed 10×
   (``cluster.slow_worker(w, 10)``, a SIGSTOP/SIGCONT duty cycle of the real process)
   or not, with speculation on or off (``clamor.Cluster(..., speculation=...)``).
   Total job time, median of R repetitions after an untimed warm-up stage, and the
   runtime's ``tasks_speculated`` / ``tasks_rerun`` / ``tasks_recomputed`` counters.

Each run is a child process (this script with ``--child``) with a fresh cluster, closed
in a ``finally``; afterwards the parent kills anything still carrying the child's marker
in its environment (nothing should: it is flagged). Writes ``bench/results/recovery.md``,
``recovery.json``, ``recovery_iterations.png`` and ``recovery_stragglers.png`` (the plots
need matplotlib, ``make bench-deps``), and prints the Markdown. A benchmark, not a test:
it never fails on a timing.
"""

from __future__ import annotations

import argparse
import datetime
import inspect
import json
import os
import resource
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

import numpy as np
from harness import (
    busy_seconds,
    progress,
    run_marked,
    wait_until_idle,
    workload_command,
)
from harness.machine import git_state, machine, package_versions
from harness.results import RESULTS
from report.recovery import plot, render, summarize_recovery

EXPERIMENTS = ("recovery", "stragglers")
#: Counters of ``cluster.stats()`` read per iteration / repetition (top level, or in
#: ``stats()["scheduler"]``); a counter the runtime does not report is ``None``.
COUNTERS = (
    "stages_run",
    "tasks_run",
    "tasks_rerun",
    "tasks_lost",
    "tasks_recomputed",
    "tasks_speculated",
    "bytes_served_by_driver",
    "bytes_served_by_peers",
)
PACKAGES = ("clamor-jupyter", "numpy", "cloudpickle", "grpcio", "matplotlib")

FULL = {
    # recovery (k-means)
    "points": 1_000_000,
    "dims": 8,
    "k": 16,
    "partitions": 16,
    "iterations": 10,
    "kill_iteration": 4,  # 1-based
    "workers": 3,
    "repeat": 3,
    "seed": 11,
    # stragglers
    "straggler_workers": 3,
    "tasks": 40,
    "task_ms": 50.0,
    "stages": 5,
    "slow_factor": 10.0,
    "straggler_repeat": 3,
}
QUICK = dict(
    FULL, points=400_000, repeat=1, tasks=24, task_ms=30.0, stages=3, straggler_repeat=1
)


# --- the workloads (module level: shipped by value, this module is __main__) ----------


def make_points(n: int, d: int, k: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` points in ``d`` dimensions around ``k`` Gaussian centres, and the initial
    centroids (``k`` of the points, chosen with the same seed)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(scale=4.0, size=(k, d))
    points = centres[rng.integers(0, k, n)] + rng.normal(size=(n, d))
    initial = points[rng.choice(n, k, replace=False)].copy()
    return points, initial


def assign(p: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Partial sums and counts of the points ``p`` assigned to their nearest centroid."""
    k = len(c)
    label = np.argmin(((p[:, None, :] - c[None, :, :]) ** 2).sum(axis=2), axis=1)
    s = np.zeros(c.shape)
    np.add.at(s, label, p)
    return s, np.bincount(label, minlength=k)


#: Elements of the buffer one ``burn`` pass works through (512 KiB: stays in L2).
BURN_N = 1 << 16


def burn(i: int, reps: int) -> float:
    """Deterministic single-threaded numpy work (no BLAS), ``reps`` passes; a checksum."""
    x = np.full(BURN_N, 1.0 + (i % 97) / 97.0)
    y = np.empty_like(x)
    for _ in range(reps):
        np.multiply(x, 0.5, out=y)
        y += 1.0
        np.sqrt(y, out=x)
    return float(x.sum())


def calibrate(task_s: float) -> tuple[int, float]:
    """Passes of :func:`burn` that take ``task_s`` seconds here (best of 5), and the
    measured seconds per pass."""
    burn(0, 20)
    best = min(_timed(burn, 0, 200) for _ in range(5)) / 200
    return max(1, round(task_s / best)), best


def _timed(f, *args) -> float:
    t0 = time.perf_counter()
    f(*args)
    return time.perf_counter() - t0


# --- helpers of the children -----------------------------------------------------------


def counters(stats: dict) -> dict:
    sched = stats.get("scheduler") or {}
    out = {}
    for key in COUNTERS:
        v = stats.get(key, sched.get(key) if isinstance(sched, dict) else None)
        out[key] = int(v) if isinstance(v, (int, np.integer)) else None
    return out


def delta(after: dict, before: dict) -> dict:
    return {
        k: (
            after[k] - before[k]
            if after[k] is not None and before[k] is not None
            else None
        )
        for k in after
    }


def speculation_option() -> dict:
    """Whether ``clamor.Cluster`` takes ``speculation=``, and its defaults."""
    import clamor

    params = inspect.signature(clamor.Cluster).parameters
    out = {"supported": "speculation" in params}
    for name in (
        "speculation",
        "speculation_factor",
        "speculation_min",
        "speculation_quantile",
    ):
        if name in params and params[name].default is not inspect.Parameter.empty:
            out[name] = params[name].default
    return out


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}".strip().splitlines()[0][:300]


# --- child: one k-means run ------------------------------------------------------------


def child_kmeans(p: dict) -> dict:
    import clamor

    n, d, k, parts = p["points"], p["dims"], p["k"], p["partitions"]
    points_np, initial = make_points(n, d, k, p["seed"])
    points = clamor.asarray(points_np)
    del points_np
    t0 = time.perf_counter()
    cluster = clamor.Cluster(workers=p["workers"])
    out: dict = {"startup_s": time.perf_counter() - t0, "iterations": []}
    try:
        out["workers_at_start"] = list(cluster.workers)
        sums = cluster.accumulator((k, d))
        counts = cluster.accumulator(k, dtype=np.int64)
        ds = cluster.parallelize(points, partitions=parts)  # arena slices: paged in
        centroids = initial.copy()
        kill = p.get("kill_delay_s")
        victim = max(cluster.workers) if kill is not None else None
        before = counters(cluster.stats())

        def one_pass(it: int, c: np.ndarray) -> np.ndarray:
            """Iteration ``it`` from centroids ``c``: one action, then the new centroids."""
            sums.reset()
            counts.reset()

            def step(part):  # this iteration's centroids, shipped by value
                s, m = assign(part, c)
                sums.add(slice(None), s)
                counts.add(slice(None), m)
                return np.array([len(part)])

            total = int(ds.map_partitions(step).collect().sum())
            if total != n:
                raise RuntimeError(f"iteration {it}: {total} points counted, not {n}")
            return sums.value / np.maximum(counts.value, 1)[:, None]

        def do_kill(start: float, info: dict) -> None:
            info["at_s"] = time.perf_counter() - start
            try:
                cluster.kill_worker(victim)
                info["done_at_s"] = time.perf_counter() - start
            except Exception as exc:  # noqa: BLE001 - reported
                info["error"] = error_text(exc)

        for it in range(1, p["iterations"] + 1):
            rec: dict = {"iteration": it}
            timer = None
            kill_info: dict = {}
            start = time.perf_counter()
            if kill is not None and it == p["kill_iteration"]:
                timer = threading.Timer(kill, do_kill, (start, kill_info))
                timer.start()
            try:
                new = one_pass(it, centroids)
                rec["recovered_by_runtime"] = True if timer else None
            except Exception as exc:
                if timer is None:
                    raise
                rec["error"] = error_text(exc)
                rec["error_after_s"] = time.perf_counter() - start
                rec["recovered_by_runtime"] = False
                progress(f"  iteration {it}: {rec['error']}; re-running it by hand")
                timer.join()
                new = one_pass(
                    it, centroids
                )  # what a user would do: run the cell again
            centroids = new
            rec["seconds"] = time.perf_counter() - start
            if timer is not None:
                timer.join()
                rec["kill"] = dict(kill_info, worker=victim, delay_s=kill)
                rec["kill"]["mid_iteration"] = (
                    "at_s" in kill_info and kill_info["at_s"] < rec["seconds"]
                )
            after = counters(cluster.stats())
            rec["counters"] = delta(after, before)
            before = after
            rec["live_workers"] = len(cluster.workers)
            rec["centroids"] = centroids.tolist()
            out["iterations"].append(rec)
            progress(
                f"  iteration {it}: {rec['seconds']:.3f} s, {rec['live_workers']} workers"
                + (
                    f", killed worker {victim} at {kill_info.get('at_s', float('nan')):.3f} s"
                    if timer
                    else ""
                )
            )
        out["stats_end"] = {
            k: v for k, v in cluster.stats().items() if k not in ("workers", "driver")
        }
    finally:
        t1 = time.perf_counter()
        cluster.close()
        out["shutdown_s"] = time.perf_counter() - t1
    out["status"] = "ok"
    return out


# --- child: one straggler configuration --------------------------------------------------


def child_stragglers(p: dict) -> dict:
    import clamor

    opt = speculation_option()
    spec = p["speculation"]
    if not opt["supported"] and spec is not None:
        return {
            "status": "unavailable",
            "reason": "clamor.Cluster has no `speculation` option yet",
            "speculation_option": opt,
        }
    kwargs = {} if spec is None else {"speculation": spec}
    t0 = time.perf_counter()
    cluster = clamor.Cluster(workers=p["straggler_workers"], **kwargs)
    out: dict = {
        "startup_s": time.perf_counter() - t0,
        "speculation_option": opt,
        "reps": [],
    }
    tasks, reps = p["tasks"], p["burn_reps"]
    try:
        victim = max(cluster.workers)
        out["slow_worker"] = victim if p["slow"] else None

        def stage(s: int) -> list:
            return (
                cluster.range(s * tasks, (s + 1) * tasks, partitions=tasks)
                .map(lambda i: burn(i, reps))
                .collect()
            )

        t1 = time.perf_counter()
        stage(
            p["stages"]
        )  # warm-up (other indices than the job's), before any slow-down
        out["warmup_s"] = time.perf_counter() - t1
        if p["slow"]:
            cluster.slow_worker(victim, p["slow_factor"])
        try:
            for r in range(p["straggler_repeat"]):
                st0 = cluster.stats()
                before, done0 = counters(st0), _tasks_done(st0)
                results, stage_s = [], []
                t1 = time.perf_counter()
                for s in range(p["stages"]):
                    t2 = time.perf_counter()
                    results.append(stage(s))
                    stage_s.append(time.perf_counter() - t2)
                total = time.perf_counter() - t1
                st1 = cluster.stats()
                done1 = _tasks_done(st1)
                out["reps"].append(
                    {
                        "total_s": total,
                        "stage_s": stage_s,
                        "counters": delta(counters(st1), before),
                        "tasks_done_per_worker": {
                            w: done1.get(w, 0) - done0.get(w, 0) for w in done1
                        },
                        "results": results,
                    }
                )
                progress(
                    f"  repetition {r + 1}: {total:.3f} s "
                    f"({', '.join(f'{x:.2f}' for x in stage_s)} per stage)"
                )
        finally:
            if p["slow"]:
                cluster.slow_worker(victim, 1)
    finally:
        t1 = time.perf_counter()
        cluster.close()
        out["shutdown_s"] = time.perf_counter() - t1
    out["status"] = "ok"
    return out


def _tasks_done(stats: dict) -> dict:
    """Per live worker, tasks it finished (the scheduler's count, else the worker's own)."""
    sched = (stats.get("scheduler") or {}).get("workers") or {}
    if sched:
        return {str(w): int(v.get("tasks_done", 0)) for w, v in sched.items()}
    return {str(w["id"]): int(w.get("tasks_run", 0)) for w in stats.get("workers", [])}


CHILDREN = {"kmeans": child_kmeans, "stragglers": child_stragglers}


def child_main(kind: str, params_path: Path) -> None:
    p = json.loads(params_path.read_text())
    out_path = Path(p["out"])

    def stop(signum, frame):
        raise KeyboardInterrupt(f"stopped by signal {signum}")

    signal.signal(signal.SIGTERM, stop)  # stopped by the parent: close in finally
    try:
        out = CHILDREN[kind](p)
    except BaseException as exc:  # noqa: BLE001 - the parent must get a record
        out = {
            "status": "failed",
            "reason": error_text(exc),
            "traceback": traceback.format_exc(),
        }
    out_path.write_text(json.dumps(out) + "\n")


# --- the parent: children, the reference, the report ---------------------------------------


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_child(kind: str, params: dict, args: argparse.Namespace) -> dict:
    """Run one child to completion (or its time limit, :func:`harness.run_marked`); its
    record, with the machine's other load while it ran."""
    if args.wait_idle:
        wait_until_idle(args.wait_idle)
    with tempfile.TemporaryDirectory(prefix="clamor-recovery-") as tmp:
        ppath = Path(tmp) / "params.json"

        def command(out: Path) -> list[str]:
            ppath.write_text(json.dumps(dict(params, out=str(out))))
            return [*workload_command(__file__), "--child", kind, str(ppath)]

        busy0, cpu0 = busy_seconds(), children_cpu()
        run = run_marked(command, args.timeout)
        own = children_cpu() - cpu0
        other = max(0.0, busy_seconds() - busy0 - own)
    rec = run.output or {}
    if not rec:
        rec = {"status": "failed", "reason": run.failure or f"the child exited with status {run.returncode}"}
    elif run.failure:
        rec["reason"] = f"{run.failure}: {rec.get('reason', '')}"
    rec["child"] = {
        "wall_s": run.wall_s,
        "own_cpu_s": own,
        "other_cores": other / run.wall_s if run.wall_s > 0 else 0.0,
        "left_behind": run.leftovers,
        "exit_status": run.returncode,
    }
    if rec.get("status") != "ok":
        progress(f"  {kind}: {rec['status']}: {rec.get('reason')}")
    return rec


def reference_kmeans(p: dict) -> list[np.ndarray]:
    """The centroids after each iteration: the same partial sums, added in task order
    (as the accumulators merge them at the barrier), in this process."""
    from clamor.runtime.data.ops import bounds

    points, c = make_points(p["points"], p["dims"], p["k"], p["seed"])
    parts = [
        points[slice(*bounds(len(points), p["partitions"], i))]
        for i in range(p["partitions"])
    ]
    out = []
    for _ in range(p["iterations"]):
        sums, cnt = np.zeros((p["k"], p["dims"])), np.zeros(p["k"], np.int64)
        for part in parts:
            s, m = assign(part, c)
            sums += s
            cnt += m
        c = sums / np.maximum(cnt, 1)[:, None]
        out.append(c)
    return out


def check_kmeans(run: dict, ref: list[np.ndarray]) -> None:
    """Adds ``equal_to_reference`` (every iteration bit for bit) and ``max_abs_diff``."""
    if run.get("status") != "ok":
        return
    diffs, equal = [], True
    for rec, r in zip(run["iterations"], ref):
        c = np.array(rec.pop("centroids"))
        equal &= bool(np.array_equal(c, r))
        diffs.append(float(np.max(np.abs(c - r))))
    run["equal_to_reference"] = equal and len(run["iterations"]) == len(ref)
    run["max_abs_diff"] = max(diffs) if diffs else None


def run_recovery(p: dict, args: argparse.Namespace) -> dict:
    runs: dict[str, list] = {"no_failure": [], "kill": [], "fewer": []}
    kill_delay = args.kill_delay
    for r in range(p["repeat"]):
        progress(f"recovery: k-means without a failure, run {r + 1}/{p['repeat']}")
        run = run_child("kmeans", dict(p, kill_delay_s=None), args)
        runs["no_failure"].append(run)
        if kill_delay is None and run.get("status") == "ok":
            steady = [x["seconds"] for x in run["iterations"][1:]]
            kill_delay = 0.5 * statistics.median(steady)
        if kill_delay is None:
            continue
        progress(
            f"recovery: k-means, worker killed {kill_delay:.3f} s into iteration "
            f"{p['kill_iteration']}, run {r + 1}/{p['repeat']}"
        )
        runs["kill"].append(run_child("kmeans", dict(p, kill_delay_s=kill_delay), args))
        progress(
            f"recovery: k-means without a failure on {p['workers'] - 1} workers (context), "
            f"run {r + 1}/{p['repeat']}"
        )
        fewer = dict(p, workers=p["workers"] - 1, kill_delay_s=None)
        runs["fewer"].append(run_child("kmeans", fewer, args))
    progress("recovery: the numpy reference")
    t0 = time.perf_counter()
    ref = reference_kmeans(p)
    ref_s = time.perf_counter() - t0
    for run in runs["no_failure"] + runs["kill"] + runs["fewer"]:
        check_kmeans(run, ref)
    return {
        "runs": runs,
        "kill_delay_s": kill_delay,
        "reference_s": ref_s,
        **summarize_recovery(runs, p),
    }


STRAGGLER_CONFIGS = (
    # (name, slowed?, speculation)
    ("no straggler, speculation off", False, False),
    ("no straggler, speculation on", False, True),
    ("straggler, speculation off", True, False),
    ("straggler, speculation on", True, True),
)


def run_stragglers(p: dict, args: argparse.Namespace) -> dict:
    if args.wait_idle:
        wait_until_idle(args.wait_idle)  # the calibration is a timing too
    reps, per_pass = calibrate(p["task_ms"] / 1000)
    progress(
        f"stragglers: one burn pass takes {per_pass * 1e6:.1f} µs here: "
        f"{reps} passes per task for {p['task_ms']:.0f} ms"
    )
    # the expected results of a few tasks, computed here (the rest: equal across runs)
    sample = sorted({0, p["tasks"] - 1, p["stages"] * p["tasks"] - 1})
    expected = {i: burn(i, reps) for i in sample}
    rows = {}
    for name, slow, spec in STRAGGLER_CONFIGS:
        progress(f"stragglers: {name}")
        rows[name] = run_child(
            "stragglers", dict(p, slow=slow, speculation=spec, burn_reps=reps), args
        )
    # the checks: every repetition of every configuration gives the same values
    first = None
    for row in rows.values():
        for rep in row.get("reps", []):
            res = rep.pop("results")
            flat = [x for stage in res for x in stage]
            if first is None:
                first = flat
            rep["results_ok"] = (
                len(flat) == p["stages"] * p["tasks"]
                and flat == first
                and all(flat[i] == v for i, v in expected.items())
            )
    for row in rows.values():
        if row.get("status") == "ok":
            totals = [r["total_s"] for r in row["reps"]]
            row["total_s"] = statistics.median(totals)
            row["total_runs_s"] = totals
            row["results_ok"] = all(r["results_ok"] for r in row["reps"])
            row["counters"] = {
                k: (
                    sum(r["counters"][k] for r in row["reps"])
                    if all(r["counters"][k] is not None for r in row["reps"])
                    else None
                )
                for k in COUNTERS
            }
    base = rows["no straggler, speculation off"]
    for row in rows.values():
        if row.get("status") == "ok" and base.get("status") == "ok":
            row["ratio_to_no_straggler"] = row["total_s"] / base["total_s"]
    on, off = rows["straggler, speculation on"], rows["straggler, speculation off"]
    speedup = (
        off["total_s"] / on["total_s"]
        if on.get("status") == "ok" and off.get("status") == "ok"
        else None
    )
    return {
        "burn_reps": reps,
        "burn_pass_us": per_pass * 1e6,
        "task_s_calibrated": reps * per_pass,
        "rows": rows,
        "speculation_speedup": speedup,
    }


# --- the report ---------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="400k points, 1 run each; 3 stages × 24 tasks of 30 ms (≤ 2 min)",
    )
    ap.add_argument(
        "--repeat", type=int, default=None, help="R runs / repetitions of each kind"
    )
    ap.add_argument(
        "--only",
        default=",".join(EXPERIMENTS),
        help=f"comma-separated experiments among {','.join(EXPERIMENTS)}",
    )
    ap.add_argument(
        "--kill-delay",
        type=float,
        default=None,
        metavar="SECONDS",
        help="kill this long into the kill iteration (default: half an iteration)",
    )
    ap.add_argument(
        "--wait-idle",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="before each run, wait up to SECONDS for other processes to go quiet",
    )
    ap.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="time limit of one run (child process), start-up to shut-down",
    )
    ap.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    ap.add_argument("params", nargs="?", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child_main(args.child, args.params)
        return

    p = dict(QUICK if args.quick else FULL)
    if args.repeat:
        p["repeat"] = p["straggler_repeat"] = args.repeat
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    bad = [s for s in only if s not in EXPERIMENTS]
    if bad:
        ap.error(
            f"unknown experiment(s) {', '.join(bad)}; choose among {', '.join(EXPERIMENTS)}"
        )
    command = "python bench/run.py recovery" + "".join(f" {a}" for a in sys.argv[1:])
    started = time.perf_counter()
    result: dict = {
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "machine": machine(packages=package_versions(PACKAGES)),
        "git": git_state(),
        "loadavg_before": " ".join(f"{x:.2f}" for x in os.getloadavg()),
        "parameters": dict(
            p,
            command=command.strip(),
            quick=args.quick,
            experiments=only,
            wait_idle_s=args.wait_idle,
            timeout_s=args.timeout,
        ),
    }
    if "recovery" in only:
        result["recovery"] = run_recovery(p, args)
    if "stragglers" in only:
        result["stragglers"] = run_stragglers(p, args)
    result["loadavg_after"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
    result["elapsed_s"] = time.perf_counter() - started

    RESULTS.mkdir(parents=True, exist_ok=True)
    try:
        plot(result)
    except ImportError as exc:
        result["plots_error"] = f"{exc} (`make bench-deps` installs matplotlib)"
    text = render(result)
    (RESULTS / "recovery.md").write_text(text)
    (RESULTS / "recovery.json").write_text(json.dumps(result, indent=1) + "\n")
    print(text)


if __name__ == "__main__":
    main()
