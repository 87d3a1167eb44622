"""The driver at scale: its CPU per task, memory per partition and per worker.

    python bench/run.py driver_scale [--quick] [--tasks 1000,10000,100000]
                                     [--partitions 10,100,1000] [--workers 2,50]

What a notebook's kernel pays as the work grows, each measured in the driver process
(``time.process_time``: every driver thread; ``psutil`` RSS after a ``gc.collect``):

* ``tasks``: one stage of N empty tasks (``cluster.execute(StageSpec(...))``) on 2
  workers, for each N, an attempt a task (``fuse=False``: fused, the driver would see
  64 times fewer attempts): wall and driver CPU per task. Flat means the 100,000-task stage
  costs per task what the 1,000-task one does.
* ``partitions``: ``cluster.range(P * 8, partitions=P).persist()`` and a ``count()``
  over it, for each P: what the driver's Python heap keeps per persisted partition
  (``tracemalloc``), and a second count's wall time per partition.
* ``workers``: a cluster of W workers, for each W: the driver's RSS growth per
  registered worker (after a first cluster, so one-time allocations are out), its CPU
  per second while idle (heartbeats), and a stage of 2 empty tasks.

Each row records the raw numbers; the report shows per-unit costs and the ratio of
the largest size to the smallest (1.0: flat). A benchmark, not a test: no timing fails
it. Writes ``bench/results/driver_scale.json``.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import psutil
from harness import progress
from harness.results import goal, row, save

DEFAULTS = {"tasks": "1000,10000,100000", "partitions": "10,100,1000", "workers": "2,50"}
QUICK = {"tasks": "100,1000", "partitions": "10,100", "workers": "2,8"}


def _empty(ctx) -> None:
    return None


def rss() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


def tasks_case(clamor, n: int) -> dict:
    from clamor.runtime.stage import StageSpec, TaskSpec

    with clamor.Cluster(workers=2, fuse=False) as c:  # an attempt a task: the scheduler's own cost
        c.execute(StageSpec(_empty, [TaskSpec(i) for i in range(min(n, 1000))]))  # warm
        cpu0, t0 = time.process_time(), time.perf_counter()
        out = c.execute(StageSpec(_empty, [TaskSpec(i) for i in range(n)]))
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    assert len(out) == n
    return {"n": n, "seconds": wall, "wall_us_per_task": wall / n * 1e6, "driver_cpu_us_per_task": cpu / n * 1e6}


def partitions_case(clamor, p: int) -> dict:
    """Memory: what the driver's Python heap keeps per persisted partition (lineage,
    locations), by tracemalloc, which unlike RSS is not blurred by the allocator."""
    import tracemalloc

    with clamor.Cluster(workers=2) as c:
        c.range(16, partitions=2).persist().count()  # warm
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        ds = c.range(p * 8, partitions=p).persist()
        assert ds.count() == p * 8
        gc.collect()
        grown = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        t0 = time.perf_counter()
        assert ds.count() == p * 8
        wall = time.perf_counter() - t0
        ds.unpersist()
    return {"n": p, "seconds": wall, "count_us_per_partition": wall / p * 1e6,
            "driver_bytes_per_partition": grown / p}  # fmt: skip


def workers_case(clamor, w: int) -> dict:
    from clamor.runtime.stage import StageSpec, TaskSpec

    with clamor.Cluster(workers=1) as c:  # what the first cluster of a process allocates once
        c.execute(StageSpec(_empty, [TaskSpec(0)]))
    before = rss()
    t0 = time.perf_counter()
    with clamor.Cluster(workers=w) as c:
        start = time.perf_counter() - t0
        grown = rss() - before
        cpu0, t1 = time.process_time(), time.perf_counter()
        time.sleep(3.0)
        idle_cpu = (time.process_time() - cpu0) / (time.perf_counter() - t1)
        c.execute(StageSpec(_empty, [TaskSpec(i) for i in range(2)]))
        stages = []
        for _ in range(20):
            t2 = time.perf_counter()
            c.execute(StageSpec(_empty, [TaskSpec(i) for i in range(2)]))
            stages.append(time.perf_counter() - t2)
    stages.sort()
    return {"n": w, "seconds": stages[len(stages) // 2], "start_s": start,
            "driver_bytes_per_worker": grown / w, "idle_driver_cores": idle_cpu,
            "two_task_stage_ms": stages[len(stages) // 2] * 1e3}  # fmt: skip


#: Per case: the function, and the per-unit cost that must stay flat (None: reported only).
CASES = {"tasks": (tasks_case, "driver_cpu_us_per_task"),
         "partitions": (partitions_case, "driver_bytes_per_partition"),
         "workers": (workers_case, None)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes")
    for name in CASES:
        ap.add_argument(f"--{name}", default=None, help=f"sizes ({DEFAULTS[name]}; quick {QUICK[name]})")
    ap.add_argument("--only", default=",".join(CASES), help="cases to run")
    args = ap.parse_args()
    import clamor

    sizes = {k: [int(x) for x in (getattr(args, k) or (QUICK if args.quick else DEFAULTS)[k]).split(",")]
             for k in CASES}  # fmt: skip
    rows, goals = [], []
    for name in args.only.split(","):
        fn, flat_key = CASES[name]
        measured = []
        for n in sizes[name]:
            r = fn(clamor, n)
            measured.append(r)
            progress(f"  {name} {n}: " + ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k != "n"))
            rows.append(row("clamor", f"{name} {n}", [r.pop("seconds")], **r))
        if flat_key is None or len(measured) < 2:
            continue
        first, last = measured[0][flat_key], measured[-1][flat_key]
        value = last / first if first > 0 else None
        goals.append(goal(f"{name}: {flat_key} flat from {sizes[name][0]} to {sizes[name][-1]} "
                          f"(at {sizes[name][0]} ÷ at {sizes[name][-1]} >= 0.5)",
                          None if not value else 1 / value, 0.5))  # fmt: skip
    result = {"workload": "driver_scale", "quick": args.quick,
              "title": "The driver at scale: CPU per task, memory per partition and per worker",
              "params": {**sizes, "cores": os.cpu_count(),
                         "command": " ".join(["python bench/run.py driver_scale", *sys.argv[1:]])},
              "rows": rows, "goals": goals}  # fmt: skip
    path = save(result)
    for r in rows:
        print(f"| {r['case']} | " + " | ".join(f"{k} {v:.3g}" for k, v in r.items()
                                              if isinstance(v, float)) + " |")
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
