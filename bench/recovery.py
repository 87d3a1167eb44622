#!/usr/bin/env python3
"""Recovery from a lost worker and speculative replicas for a straggler (the paper's
Figures 11 and 12, scaled to a 2-core machine).

    python bench/recovery.py [--quick] [--repeat R] [--only recovery,stragglers]
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
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path

import numpy as np
from harness import (
    BUSY_CORES,
    busy_seconds,
    progress,
    sweep,
    wait_child,
    wait_until_idle,
)
from machine import git, machine, package_versions

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = Path(__file__).resolve().parent.parent
MARKER = (
    "CLAMOR_RECOVERY_BENCH"  # in every child's environment, inherited by its workers
)
STOP_GRACE = 30.0  # seconds a child gets to close its cluster when stopped
SWEEP_GRACE = 10.0  # seconds the child's processes get to exit after it did
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
    """Run one child to completion (or its time limit); its record, with the load."""
    if args.wait_idle:
        wait_until_idle(args.wait_idle)
    marker = uuid.uuid4().hex
    env = dict(
        os.environ,
        **{MARKER: marker},
        OMP_NUM_THREADS="1",
        OPENBLAS_NUM_THREADS="1",
        MKL_NUM_THREADS="1",
    )
    with tempfile.TemporaryDirectory(prefix="clamor-recovery-") as tmp:
        out = Path(tmp) / "out.json"
        ppath = Path(tmp) / "params.json"
        ppath.write_text(json.dumps(dict(params, out=str(out))))
        cmd = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--child",
            kind,
            str(ppath),
        ]
        busy0, cpu0, t0 = busy_seconds(), children_cpu(), time.perf_counter()
        proc = subprocess.Popen(
            cmd, env=env, stdout=sys.stderr, cwd=ROOT, start_new_session=True
        )
        failure = wait_child(proc, args.timeout, STOP_GRACE)
        wall = time.perf_counter() - t0
        own = children_cpu() - cpu0
        other = max(0.0, busy_seconds() - busy0 - own)
        leftovers, _ = sweep(MARKER, marker, SWEEP_GRACE)
        if failure == "interrupted":
            raise KeyboardInterrupt
        rec = json.loads(out.read_text()) if out.exists() else {}
    if not rec:
        rec = {
            "status": "failed",
            "reason": failure or f"the child exited with status {proc.returncode}",
        }
    elif failure:
        rec["reason"] = f"{failure}: {rec.get('reason', '')}"
    rec["child"] = {
        "wall_s": wall,
        "own_cpu_s": own,
        "other_cores": other / wall if wall > 0 else 0.0,
        "left_behind": leftovers,
        "exit_status": proc.returncode,
    }
    if leftovers:
        progress(f"  killed {len(leftovers)} process(es) left behind: {leftovers}")
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


def summarize_recovery(runs: dict, p: dict) -> dict:
    per_iter: dict[str, list] = {}
    totals: dict[str, list] = {}
    for name, rs in runs.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        per_iter[name] = (
            [
                [r["iterations"][i]["seconds"] for r in ok]
                for i in range(p["iterations"])
            ]
            if ok
            else []
        )
        totals[name] = [sum(x["seconds"] for x in r["iterations"]) for r in ok]
    out: dict = {"per_iteration": per_iter, "totals": totals}
    if per_iter.get("no_failure") and per_iter.get("kill"):
        ki = p["kill_iteration"] - 1
        base = [statistics.median(x) for x in per_iter["no_failure"]]
        kill = [statistics.median(x) for x in per_iter["kill"]]
        after = range(ki + 1, p["iterations"])
        out["ratios"] = {
            "kill_iteration": kill[ki] / base[ki],
            "kill_iteration_extra_s": kill[ki] - base[ki],
            "after_kill": (
                statistics.median(kill[i] for i in after)
                / statistics.median(base[i] for i in after)
                if after
                else None
            ),
            "total": statistics.median(totals["kill"])
            / statistics.median(totals["no_failure"]),
        }
        if per_iter.get("fewer") and after:
            fewer = [statistics.median(x) for x in per_iter["fewer"]]
            out["ratios"]["after_kill_vs_fewer"] = statistics.median(
                kill[i] for i in after
            ) / statistics.median(fewer[i] for i in after)
            out["ratios"]["fewer_vs_no_failure"] = statistics.median(
                fewer[i] for i in after
            ) / statistics.median(base[i] for i in after)
    return out


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


def git_state() -> dict:

    changes = [  # "XY path" lines: the paths
        line.split(maxsplit=1)[-1]
        for line in git("status", "--porcelain", "--", "runtime", "clamor").splitlines()
        if line.strip()
    ]
    return {
        "commit": git("rev-parse", "--short", "HEAD") or "?",
        "runtime_dirty": bool(changes),
        "runtime_changes": changes,
    }


def fmt(x, f=".3f", none="—") -> str:
    return none if x is None else format(x, f)


def mib(x) -> str:
    return "—" if x is None else f"{x / 2**20:.1f}"


def md_row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def render(result: dict) -> str:
    m, p = result["machine"], result["parameters"]
    pk = ", ".join(f"{k} {v}" for k, v in m["packages"].items() if v)
    g = result["git"]
    lines = [
        "# Recovery from a lost worker and speculation against a straggler, 2 cores",
        "",
        (
            f"Run {result['date']} on `{m['hostname']}`: nproc {m['nproc']} "
            f"(cpu_count {m['cpu_count']}), {m['cpu']}, Linux {m['kernel']}, Python "
            f"{m['python']}. Packages: {pk}. Command: `{p['command']}` (total "
            f"{result['elapsed_s']:.0f} s), at commit `{g['commit']}`"
            + (
                " with uncommitted changes in "
                + ", ".join(f"`{c}`" for c in g["runtime_changes"])
                if g["runtime_dirty"]
                else ""
            )
            + f". Load average before / after: {result['loadavg_before']} / "
            f"{result['loadavg_after']}."
        ),
        "",
    ]
    lines += ["## Headline", "", *headline(result), ""]
    if "recovery" in result:
        lines += render_recovery(result["recovery"], p)
    if "stragglers" in result:
        lines += render_stragglers(result["stragglers"], p)
    lines += render_caveats(result)
    return "\n".join(lines) + "\n"


def headline(result: dict) -> list[str]:
    out = []
    p = result["parameters"]
    rec = result.get("recovery")
    if rec:
        kills = [r for r in rec["runs"]["kill"] if r.get("status") == "ok"]
        ok = [r for rs in rec["runs"].values() for r in rs if r.get("status") == "ok"]
        ki = p["kill_iteration"]
        if "ratios" in rec:
            r = rec["ratios"]
            recovered = all(
                x["iterations"][ki - 1].get("recovered_by_runtime") for x in kills
            )
            mid = all(
                x["iterations"][ki - 1].get("kill", {}).get("mid_iteration")
                for x in kills
            )
            base = statistics.median(rec["per_iteration"]["no_failure"][ki - 1])
            kill = statistics.median(rec["per_iteration"]["kill"][ki - 1])
            out.append(
                f"- **Recovery** (k-means, {p['workers']} workers, one killed "
                f"{rec['kill_delay_s']:.2f} s into iteration {ki}): iteration {ki} took "
                f"{kill:.2f} s instead of {base:.2f} s (**{r['kill_iteration']:.2f}×**, "
                f"{r['kill_iteration_extra_s']:+.2f} s); the {p['iterations']} iterations "
                f"took **{r['total']:.2f}×** as long as without the failure; the iterations "
                f"after it **{fmt(r['after_kill'], '.2f')}×**"
                + (
                    f" (a cluster of {p['workers'] - 1} workers from the start, without a "
                    f"failure: **{r['fewer_vs_no_failure']:.2f}×** in the same iterations)"
                    if "fewer_vs_no_failure" in r
                    else ""
                )
                + ". "
                + (
                    "The runtime recovered by itself (no error reached the program)"
                    if recovered
                    else "**The runtime did not recover by itself**: the action raised and "
                    "the benchmark re-ran the iteration"
                )
                + (
                    ""
                    if mid
                    else " (**the kill did not land mid-iteration in every run**)"
                )
                + "."
            )
        else:
            out.append("- **Recovery**: not measured (see below).")
        if ok:
            eq = all(x.get("equal_to_reference") for x in ok)
            out.append(
                f"- k-means result: **{'equal' if eq else 'NOT equal'}** to the numpy "
                f"reference, bit for bit, in every iteration of every run ({len(ok)} runs"
                f"; largest difference {max(x['max_abs_diff'] for x in ok):.3g})."
            )
    st = result.get("stragglers")
    if st:
        rows = st["rows"]
        names = [n for n, *_ in STRAGGLER_CONFIGS]
        if all(rows[n].get("status") == "ok" for n in names):
            on, off = rows[names[3]], rows[names[2]]
            out.append(
                f"- **Stragglers** (one of {p['straggler_workers']} workers "
                f"{p['slow_factor']:g}× slower, {p['stages']} stages × {p['tasks']} tasks of "
                f"~{p['task_ms']:.0f} ms): speculation on {on['total_s']:.2f} s, off "
                f"{off['total_s']:.2f} s (speculation is **{st['speculation_speedup']:.2f}×** "
                f"faster), no straggler {rows[names[0]]['total_s']:.2f} s; with speculation "
                f"the straggler costs **{on['ratio_to_no_straggler']:.2f}×** the time without "
                f"one, without speculation **{off['ratio_to_no_straggler']:.2f}×**. "
                f"Speculative copies: {fmt(on['counters']['tasks_speculated'], 'd')} (on), "
                f"{fmt(off['counters']['tasks_speculated'], 'd')} (off)."
            )
        else:
            bad = [
                f"{n}: {rows[n].get('reason')}"
                for n in names
                if rows[n].get("status") != "ok"
            ]
            out.append(
                "- **Stragglers**: not every configuration ran: " + "; ".join(bad)
            )
    children = [r["child"] for r in all_runs(result)]
    perturbed = [c for c in children if c["other_cores"] > BUSY_CORES]
    left = sum(len(c["left_behind"]) for c in children)
    out.append(
        f"- Other load: {len(perturbed)} of {len(children)} runs perturbed (other processes "
        f"used more than {BUSY_CORES:g} cores; at most "
        f"{max((c['other_cores'] for c in children), default=0):.2f}). Processes left "
        f"behind: {left}."
    )
    return out


def all_runs(result: dict) -> list[dict]:
    """Every child's record (k-means runs and straggler configurations)."""
    runs = []
    if "recovery" in result:
        runs += [r for rs in result["recovery"]["runs"].values() for r in rs]
    if "stragglers" in result:
        runs += list(result["stragglers"]["rows"].values())
    return [r for r in runs if "child" in r]


def render_recovery(rec: dict, p: dict) -> list[str]:
    ki = p["kill_iteration"]
    lines = [
        "## 1. Recovery from a lost worker (Figure 11)",
        "",
        (
            f"Dense k-means, {p['points']:,} points × {p['dims']} dims float64 "
            f"({p['points'] * p['dims'] * 8 / 2**20:.0f} MiB) in the arena, k = {p['k']}, "
            f"`parallelize(points, partitions={p['partitions']})` (arena slices shipped as "
            "references, demand-paged by the tasks), one action per iteration "
            "(`ds.map_partitions(step).collect()`, the step adds partial sums and counts to "
            f"two accumulators), {p['iterations']} iterations on `Cluster(workers="
            f"{p['workers']})`, R = {p['repeat']} runs of each kind, each in a fresh child "
            f"process and cluster. *Kill*: `cluster.kill_worker(w)` (SIGKILL, w = the highest "
            f"worker id) from a `threading.Timer` {fmt(rec['kill_delay_s'])} s into iteration "
            f"{ki} (half the median time of iterations 2–{p['iterations']} of the first run "
            "without a failure). For context, the same without a failure on "
            f"`Cluster(workers={p['workers'] - 1})` from the start (what the survivors "
            "are). Times: wall time of the action plus the centroid update, median over the "
            "runs (min–max in brackets)."
        ),
        "",
    ]
    per = rec["per_iteration"]
    if not per.get("no_failure"):
        lines += [
            "No run without a failure completed: "
            + "; ".join(str(r.get("reason")) for r in rec["runs"]["no_failure"]),
            "",
        ]
        return lines
    kill_ok = bool(per.get("kill"))
    kills = [r for r in rec["runs"]["kill"] if r.get("status") == "ok"]
    lines += [
        md_row(
            "iteration",
            "no failure (s)",
            "worker killed (s)",
            "killed ÷ no failure",
            f"{p['workers'] - 1} workers, no failure (s)",
            "tasks lost",
            "tasks rerun",
            "tasks recomputed",
            "tasks speculated",
            "MiB paged from driver",
            "live workers",
        ),
        md_row("---:", *["---:"] * 10),
    ]

    def cell(xs):
        med = statistics.median(xs)
        return f"{med:.3f}" + (f" ({min(xs):.3f}–{max(xs):.3f})" if len(xs) > 1 else "")

    def ctr(it, key):
        vals = [r["iterations"][it]["counters"][key] for r in kills]
        if not vals or any(v is None for v in vals):
            return "n/a"
        return "/".join(str(v) for v in vals)

    for i in range(p["iterations"]):
        b = per["no_failure"][i]
        k = per["kill"][i] if kill_ok else None
        lines.append(
            md_row(
                f"**{i + 1}** (kill)" if i + 1 == ki else i + 1,
                cell(b),
                cell(k) if k else "—",
                f"**{statistics.median(k) / statistics.median(b):.2f}×**" if k else "—",
                cell(per["fewer"][i]) if per.get("fewer") else "—",
                ctr(i, "tasks_lost"),
                ctr(i, "tasks_rerun"),
                ctr(i, "tasks_recomputed"),
                ctr(i, "tasks_speculated"),
                "/".join(
                    mib(r["iterations"][i]["counters"]["bytes_served_by_driver"])
                    for r in kills
                )
                or "—",
                "/".join(str(r["iterations"][i]["live_workers"]) for r in kills) or "—",
            )
        )
    tn = rec["totals"]["no_failure"]
    tk = rec["totals"].get("kill") or []
    tf = rec["totals"].get("fewer") or []
    lines.append(
        md_row(
            "**total**",
            cell(tn),
            cell(tk) if tk else "—",
            f"**{rec['ratios']['total']:.2f}×**" if "ratios" in rec else "—",
            cell(tf) if tf else "—",
            "",
            "",
            "",
            "",
            "",
            "",
        )
    )
    lines += [
        "",
        (
            "Counter columns are per iteration of the runs with the kill, one value per run "
            "(`cluster.stats()` before and after the iteration; `n/a`: the runtime does not "
            "report that counter). *MiB paged from driver*: `bytes_served_by_driver` (shm "
            "copies and TCP), i.e. arena pages the workers faulted in during the iteration."
        ),
        "",
        "![time per iteration](recovery_iterations.png)",
        "",
        "### Runs",
        "",
        md_row(
            "run",
            "status",
            "total (s)",
            "kill at (s into it.)",
            "kill returned at (s)",
            "mid-iteration",
            "recovered by the runtime",
            "equal to reference",
            "start-up (s)",
            "other load (cores)",
        ),
        md_row("---", "---", *["---:"] * 8),
    ]
    for name, rs in rec["runs"].items():
        for j, r in enumerate(rs):
            kind = {
                "no_failure": "no failure",
                "kill": "worker killed",
                "fewer": f"no failure, {p['workers'] - 1} workers",
            }[name]
            label = f"{kind} #{j + 1}"
            load = r["child"]["other_cores"]
            if r.get("status") != "ok":
                lines.append(
                    md_row(
                        label,
                        f"{r['status']}: {r.get('reason')}",
                        *[""] * 7,
                        f"{load:.2f}",
                    )
                )
                continue
            kr = r["iterations"][ki - 1] if name == "kill" else {}
            kinfo = kr.get("kill", {})
            rec_cell = "—"
            if name == "kill":
                rec_cell = (
                    "yes"
                    if kr.get("recovered_by_runtime")
                    else (
                        f"**no**: {kr.get('error')} after {kr.get('error_after_s', 0):.3f} s; "
                        "re-run by the benchmark"
                    )
                )
            lines.append(
                md_row(
                    label,
                    "ok",
                    f"{sum(x['seconds'] for x in r['iterations']):.3f}",
                    fmt(kinfo.get("at_s")),
                    fmt(kinfo.get("done_at_s")),
                    ("yes" if kinfo.get("mid_iteration") else "**no**")
                    if kinfo
                    else "—",
                    rec_cell,
                    "yes"
                    if r.get("equal_to_reference")
                    else f"**no** (max diff {r.get('max_abs_diff')})",
                    f"{r['startup_s']:.2f}",
                    f"{load:.2f}" + (" **perturbed**" if load > BUSY_CORES else ""),
                )
            )
    lines += [
        "",
        (
            f"The numpy reference (one process, the same partial sums added in task order) "
            f"took {rec['reference_s']:.1f} s for the {p['iterations']} iterations."
        ),
        "",
    ]
    return lines


def render_stragglers(st: dict, p: dict) -> list[str]:
    rows = st["rows"]
    lines = [
        "## 2. Stragglers and speculative replicas (Figure 12)",
        "",
        (
            f"A job of {p['stages']} stages, each one action "
            f"(`cluster.range(s*T, (s+1)*T, partitions=T).map(burn).collect()`) of T = "
            f"{p['tasks']} uniform tasks of single-threaded numpy work ({st['burn_reps']} "
            f"passes over a 512 KiB buffer, calibrated to {st['task_s_calibrated'] * 1000:.0f} "
            f"ms on one idle core here), on `Cluster(workers={p['straggler_workers']}, "
            "speculation=...)`. *Straggler*: `cluster.slow_worker(w, "
            f"{p['slow_factor']:g})` on the highest worker id after an untimed warm-up stage "
            f"(the process runs {1 / p['slow_factor']:.0%} of every 50 ms, SIGSTOP/SIGCONT). "
            f"Total job time, median of R = {p['straggler_repeat']} repetitions in one "
            "cluster per configuration (min–max in brackets). Every result is checked against "
            "the other runs and a few against values computed here."
        ),
        "",
        md_row(
            "configuration",
            "total (s)",
            "÷ no straggler (spec. off)",
            "per stage (s)",
            "tasks speculated",
            "tasks rerun",
            "tasks recomputed",
            "tasks done per worker",
            "results",
            "other load (cores)",
        ),
        md_row("---", *["---:"] * 7, "---", "---:"),
    ]
    for name, *_ in STRAGGLER_CONFIGS:
        r = rows[name]
        load = r["child"]["other_cores"]
        if r.get("status") != "ok":
            lines.append(
                md_row(
                    name, f"{r['status']}: {r.get('reason')}", *[""] * 7, f"{load:.2f}"
                )
            )
            continue
        tot = r["total_runs_s"]
        stage_med = [
            statistics.median(x) for x in zip(*(rep["stage_s"] for rep in r["reps"]))
        ]
        done = r["reps"][-1]["tasks_done_per_worker"]
        slow = r.get("slow_worker")
        c = r["counters"]
        lines.append(
            md_row(
                name,
                f"{r['total_s']:.3f}"
                + (f" ({min(tot):.3f}–{max(tot):.3f})" if len(tot) > 1 else ""),
                f"**{r['ratio_to_no_straggler']:.2f}×**"
                if "ratio_to_no_straggler" in r
                else "—",
                ", ".join(f"{x:.2f}" for x in stage_med),
                fmt(c["tasks_speculated"], "d", "n/a"),
                fmt(c["tasks_rerun"], "d", "n/a"),
                fmt(c["tasks_recomputed"], "d", "n/a"),
                ", ".join(
                    f"w{w}{' (slow)' if slow is not None and str(slow) == w else ''}: {n}"
                    for w, n in sorted(done.items())
                ),
                "ok" if r["results_ok"] else "**wrong**",
                f"{load:.2f}" + (" **perturbed**" if load > BUSY_CORES else ""),
            )
        )
    opt = next(
        (
            r.get("speculation_option")
            for r in rows.values()
            if r.get("speculation_option")
        ),
        {},
    )
    lines += [
        "",
        "Counters: summed over the repetitions (`cluster.stats()` before and after each). "
        "*Tasks done per worker*: in the last repetition, from the scheduler "
        "(a task won by a speculative copy counts for the copy's worker). "
        + (
            "Speculation option of `clamor.Cluster`: "
            + ", ".join(f"`{k}={v!r}`" for k, v in opt.items() if k != "supported")
            + "."
            if opt.get("supported")
            else "`clamor.Cluster` has no `speculation` option in this run."
        ),
        "",
    ]
    if st.get("speculation_speedup"):
        lines += [
            f"Speculation on vs. off with the straggler: **{st['speculation_speedup']:.2f}×** faster.",
            "",
        ]
    lines += ["![stragglers](recovery_stragglers.png)", ""]
    return lines


def render_caveats(result: dict) -> list[str]:
    p = result["parameters"]
    lines = [
        "## Caveats when reading the numbers",
        "",
        (
            f"- {p['workers']} workers share {result['machine']['nproc']} cores. Killing one "
            f"leaves {p['workers'] - 1} workers on {result['machine']['nproc']} cores, so the "
            "iterations after the loss do not lose CPU, unlike the paper's cluster, which lost "
            "a share of its cores; they can even be faster, since fewer processes contend for "
            f"the cores (compare the `{p['workers'] - 1} workers, no failure` column). What "
            "the loss costs here is re-running the lost worker's unfinished tasks and paging "
            "its share of the points into the survivors."
        ),
        (
            "- The points are read from the arena, not from persisted partitions, so a lost "
            "worker loses no data that lineage must recompute: recovery here is re-running the "
            "lost worker's unfinished tasks on the survivors, which page in what they read "
            "(`tasks_recomputed` counts lineage recomputation of lost persisted partitions)."
        ),
        (
            "- In the straggler experiment the slowed worker gives up its CPU to the others while "
            f"stopped, so on {result['machine']['nproc']} cores the "
            f"{p['straggler_workers'] - 1} healthy workers have the cores to themselves; with "
            f"no straggler, {p['straggler_workers']} workers compete for "
            f"{result['machine']['nproc']} cores."
        ),
        (
            "- Both experiments run the real processes on one small VM: other processes perturb "
            f"them (the *other load* column; above {BUSY_CORES:g} cores a run is flagged)."
        ),
    ]
    if result["git"]["runtime_dirty"]:
        lines.append(
            "- The runtime had uncommitted changes when this ran (listed in the JSON, "
            "`git.runtime_changes`): the numbers are for that working tree."
        )
    if result.get("plots_error"):
        lines.append(f"- No plots: {result['plots_error']}")
    return lines + [""]


# --- plots --------------------------------------------------------------------------------


def plot(result: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    p = result["parameters"]
    rec = result.get("recovery")
    if rec and rec["per_iteration"].get("no_failure"):
        fig, ax = plt.subplots(figsize=(7, 4))
        xs = np.arange(1, p["iterations"] + 1)
        for name, label, colour in (
            ("no_failure", "no failure", "tab:blue"),
            ("kill", f"worker killed in iteration {p['kill_iteration']}", "tab:red"),
            ("fewer", f"no failure, {p['workers'] - 1} workers (context)", "tab:grey"),
        ):
            per = rec["per_iteration"].get(name)
            if not per:
                continue
            med = np.array([statistics.median(x) for x in per])
            lo = np.array([min(x) for x in per])
            hi = np.array([max(x) for x in per])
            style = "--" if name == "fewer" else "-"
            ax.plot(xs, med, style, marker="o", color=colour, label=label, markersize=5)
            if p["repeat"] > 1:
                ax.fill_between(xs, lo, hi, color=colour, alpha=0.15, linewidth=0)
        ax.axvspan(
            p["kill_iteration"] - 0.4,
            p["kill_iteration"] + 0.4,
            color="grey",
            alpha=0.12,
        )
        ax.annotate(
            "worker killed",
            (p["kill_iteration"], 0),
            xytext=(0, 4),
            textcoords="offset points",
            ha="center",
            fontsize=8,
            color="dimgrey",
        )
        ax.set_xticks(xs)
        ax.set_xlabel("iteration")
        ax.set_ylabel("wall time per iteration (s)")
        ax.set_ylim(bottom=0)
        ax.set_title(
            f"k-means, {p['points']:,} × {p['dims']}, k={p['k']}, {p['workers']} workers on "
            f"{result['machine']['nproc']} cores"
            + (f" (median of {p['repeat']}, band: min–max)" if p["repeat"] > 1 else ""),
            fontsize=9,
        )
        ax.legend()
        fig.tight_layout()
        fig.savefig(RESULTS / "recovery_iterations.png", dpi=150)
        plt.close(fig)
    st = result.get("stragglers")
    if st:
        names = [
            n for n, *_ in STRAGGLER_CONFIGS if st["rows"][n].get("status") == "ok"
        ]
        if names:
            fig, ax = plt.subplots(figsize=(7, 4))
            rows = [st["rows"][n] for n in names]
            med = [r["total_s"] for r in rows]
            err = [
                [r["total_s"] - min(r["total_runs_s"]) for r in rows],
                [max(r["total_runs_s"]) - r["total_s"] for r in rows],
            ]
            colours = [
                "tab:grey"
                if "no straggler" in n
                else ("tab:green" if n.endswith("on") else "tab:red")
                for n in names
            ]
            bars = ax.bar(
                range(len(names)),
                med,
                color=colours,
                yerr=err if p["straggler_repeat"] > 1 else None,
                capsize=4,
            )
            for b, r in zip(bars, rows):
                label = f"{r['total_s']:.2f} s"
                if "ratio_to_no_straggler" in r:
                    label += f"\n{r['ratio_to_no_straggler']:.2f}×"
                top = (
                    max(r["total_runs_s"])
                    if p["straggler_repeat"] > 1
                    else b.get_height()
                )
                ax.annotate(
                    label,
                    (b.get_x() + b.get_width() / 2, top),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    xytext=(0, 3),
                    textcoords="offset points",
                )
            ax.set_xticks(range(len(names)))
            ax.set_xticklabels([n.replace(", ", "\n") for n in names], fontsize=8)
            ax.set_ylabel("job time (s)")
            ax.set_ylim(0, max(max(r["total_runs_s"]) for r in rows) * 1.25)
            ax.set_title(
                f"{p['stages']} stages × {p['tasks']} tasks of ~{p['task_ms']:.0f} ms, "
                f"{p['straggler_workers']} workers on {result['machine']['nproc']} cores, "
                f"one slowed {p['slow_factor']:g}×\n(median"
                + (
                    f" of {p['straggler_repeat']}, bars: min–max"
                    if p["straggler_repeat"] > 1
                    else ""
                )
                + "; ratios ÷ no straggler, speculation off)",
                fontsize=9,
            )
            fig.tight_layout()
            fig.savefig(RESULTS / "recovery_stragglers.png", dpi=150)
            plt.close(fig)


# --- main -----------------------------------------------------------------------------------


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
    command = "python bench/recovery.py" + "".join(f" {a}" for a in sys.argv[1:])
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
