"""Many local workers: how long a cluster of N takes to start, run and close, and what
each worker costs the driver.

    python bench/run.py many_workers [--quick] [--workers 64,256,512,1000] [--repeat R]
                                     [--only forked,one-by-one,limit,kill]

What a user of a large machine does (issue 34): ``clamor.Cluster(workers=N)``, a stage
of ``2 N`` tiny tasks, the same stage again, a stage in which every worker reads one
arena value, then ``close()``. For each N, in this order, each system ``R`` times:

* ``clamor (forked)``: the default: workers forked from one template process that has
  imported everything (runtime/worker/template.py);
* ``clamor (one start-up each)``: ``LocalLauncher(fork=False)``: a Python start-up per worker;
* ``limit: fork N processes``: the OS's floor: ``os.fork`` N children of this process,
  each exiting at once, and reap them (no Python start-up, no registration);
* ``limit: SIGKILL the workers``: the floor of a close: as ``forked``, but its close time
  is that of SIGKILLing every worker and waiting until each is reaped (the kernel's
  teardown of N processes forked from one template), before an untimed ``close()``.

Recorded per row (medians over the repetitions): ``start_s``, ``first_stage_s``,
``stage_s``, ``read_stage_s``, ``close_s``, and, right after the start, the driver's
file descriptors, threads and RSS per worker, and the CPU time the driver spends on an
idle cluster (heartbeats) over :data:`IDLE_S` seconds, per worker and second. Every stage's result is checked, every
worker must be alive before close and no child process may be left after it. The
issue's goals are computed from the run for the machine it ran on (16 cores: 512 ready
in 5 s, 1,000 in 10 s, the first stage on 512 in 0.3 s, close of 512 in 0.5 s; 2 cores:
128 ready in 5 s). Writes ``bench/results/many_workers.json``.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from harness import progress
from harness.results import goal, row, save

DEFAULTS, QUICK = "64,256,512,1000", "16,64,128"
#: Seconds of an idle cluster over which the driver's CPU time is measured: a whole
#: period of a local worker's heartbeats (runtime/cluster_workers.py), whatever its phase.
IDLE_S = 5.0
SYSTEMS = {"forked": "clamor (forked)", "one-by-one": "clamor (one start-up each)", "limit": "limit: fork N processes",
           "kill": "limit: SIGKILL the workers"}  # fmt: skip


def _value(a: np.ndarray) -> float:
    return float(a[0])


def _children_left(timeout: float = 20.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := [p.pid for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]):
        if time.monotonic() > deadline:
            return left
        time.sleep(0.1)
    return []


def _kill_all(pids: list[int]) -> None:
    """SIGKILL every process and wait until each has been reaped (by its parent)."""
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    for pid in pids:
        while psutil.pid_exists(pid):
            time.sleep(0.0005)


def clamor_once(n: int, fork: bool, kill: bool = False) -> dict[str, float]:
    import clamor

    value = clamor.asarray(np.full(512, 7.0))
    me = psutil.Process()
    rss0 = me.memory_info().rss
    t0 = time.perf_counter()
    launcher = clamor.LocalLauncher(fork=fork)
    cluster = clamor.Cluster(workers=n, launcher=launcher, timeout=600, restarts=0 if kill else None)
    out = {"start_s": time.perf_counter() - t0}
    try:
        out["driver_fds_per_worker"] = len(os.listdir("/proc/self/fd")) / n
        out["driver_threads_per_worker"] = me.num_threads() / n
        out["driver_rss_per_worker"] = (me.memory_info().rss - rss0) / n
        cpu0, t = sum(me.cpu_times()[:2]), time.perf_counter()
        time.sleep(IDLE_S)  # nothing runs: the driver only hears heartbeats (one a second a worker)
        out["driver_idle_cpu_per_worker"] = (sum(me.cpu_times()[:2]) - cpu0) / (time.perf_counter() - t) / n
        tiny = [(None, abs, (-i,)) for i in range(2 * n)]
        for name in ("first_stage_s", "stage_s"):
            t = time.perf_counter()
            assert cluster.run_stage(tiny) == list(range(2 * n))
            out[name] = time.perf_counter() - t
        t = time.perf_counter()
        assert cluster.run_stage([(w, _value, (value,)) for w in cluster.workers]) == [7.0] * n
        out["read_stage_s"] = time.perf_counter() - t
        assert len(cluster.workers) == n, "workers were lost"
    finally:
        t = time.perf_counter()
        if kill:
            _kill_all([cluster.worker_pid(w) for w in cluster.workers])
            out["close_s"] = time.perf_counter() - t
            cluster.close()
        else:
            cluster.close()
            out["close_s"] = time.perf_counter() - t
    assert not _children_left(), "processes were left after close"
    return out


def limit_once(n: int) -> dict[str, float]:
    t0 = time.perf_counter()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        pids.append(pid)
    started = time.perf_counter() - t0
    for pid in pids:
        os.waitpid(pid, 0)
    return {"start_s": started, "close_s": time.perf_counter() - t0 - started}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help=f"workers {QUICK}, 1 repetition")
    ap.add_argument("--workers", default=None, help=f"cluster sizes ({DEFAULTS}; quick {QUICK})")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions per size and system (3; quick 1)")
    ap.add_argument("--only", default=",".join(SYSTEMS), help=f"systems among {','.join(SYSTEMS)}")
    args = ap.parse_args()
    sizes = [int(x) for x in (args.workers or (QUICK if args.quick else DEFAULTS)).split(",")]
    repeat = args.repeat or (1 if args.quick else 3)
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    rows, by = [], {}
    for n in sizes:
        for system in systems:
            runs = []
            for _ in range(repeat):
                r = limit_once(n) if system == "limit" else clamor_once(n, system != "one-by-one", system == "kill")
                runs.append(r)
                progress(f"  {SYSTEMS[system]} {n}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items()))
            med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            by[(system, n)] = med
            rows.append(row(SYSTEMS[system], f"{n} workers", [r["start_s"] for r in runs], **med))
        path = _save(args, sizes, repeat, rows, by)  # after each size: a larger one that never ends keeps these
    progress(f"wrote {path}")


def _save(args: argparse.Namespace, sizes: list[int], repeat: int, rows: list[dict], by: dict) -> Path:
    """Write the rows measured so far, with the goals they decide, to the JSON."""
    cores = os.cpu_count() or 1
    targets = {512: ("start_s", 5.0), 1000: ("start_s", 10.0)} if cores >= 16 else {128: ("start_s", 5.0)}
    goals = [goal(f"{n} workers ready in at most {t:g} s on {cores} cores (target ÷ measured)",
                  t / by[("forked", n)][k] if ("forked", n) in by else None, 1.0)
             for n, (k, t) in targets.items()]  # fmt: skip
    if cores >= 16 and ("forked", 512) in by:
        goals += [goal("the first stage of 2 tiny tasks a worker on 512 fresh workers in at most 0.3 s",
                       0.3 / by[("forked", 512)]["first_stage_s"], 1.0),
                  goal("close of 512 workers in at most 0.5 s", 0.5 / by[("forked", 512)]["close_s"], 1.0,
                       f"SIGKILLing the 512 workers and waiting until they are reaped takes {by[('kill', 512)]['close_s']:.3f} s"
                       if ("kill", 512) in by else "")]  # fmt: skip
    result = {"workload": "many_workers", "quick": args.quick,
              "title": "Many local workers: start, first stage, stage, close, and the driver's cost per worker",
              "params": {"workers": sizes, "repeat": repeat, "cores": cores,
                         "command": " ".join(["python bench/run.py many_workers", *sys.argv[1:]])},
              "rows": rows, "goals": goals}  # fmt: skip
    return save(result)


if __name__ == "__main__":
    main()
