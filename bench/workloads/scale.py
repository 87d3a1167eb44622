"""Many workers on one big machine: lookups into one table, 2 workers against many.

    python bench/run.py scale [--quick] [--table-mib M] [--workers 2,14] [--repeat R]
                              [--page-size B] [--only clamor-2,clamor-14,plain]

The question of a JupyterHub node with dozens of cores: do more workers on the
driver's host share the one table (zero copy) or does each pay for its own copy?
The table: ``M`` MiB of int64 (4096; 256 with ``--quick``), value ``7 i + 3``.
Systems (each in its own child process, ``harness.run_all``): ``clamor-W`` for every
``W`` of ``--workers`` (a ``Cluster(workers=W)`` on this host, the default
transport: zero copy), ``copy-W`` if asked for with ``--only`` (the same with
``transport="shm-copy"``: every worker copies the pages it touches, the data plane
before zero copy) and ``plain`` (one process doing every task in turn: the work itself).

Cases, each one stage of ``4 W`` tasks (``plain``: 56 tasks in turn):

* ``1%`` / ``100%``: random lookups (``lookups.key_sets``: 2 x pages keys in all)
  touching 1 % / all of the table's pages; a task returns ``table[keys].sum()``;
* ``dense``: task ``i`` sums the ``i``-th contiguous slice of the table (every byte
  read once, by one task).

Each case runs on a fresh cluster (``first``: page faults included) and then again
on the same cluster (``next``). Recorded per row: seconds, the growth of the
machine's shared memory (``/proc/meminfo`` Shmem) over the first run, the workers'
summed Pss after it, bytes mapped in place vs copied (the cluster's stats) and the
driver's page requests. Every answer is checked against numpy. Writes
``results/scale.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from harness import child_main, progress, run_all
from harness.results import row, save
from workloads.lookups import key_sets
from workloads.same_host import pss, shmem_bytes

FRACTIONS = {"1%": 0.01, "100%": 1.0}
CASES = tuple(f"{c} {run}" for c in (*FRACTIONS, "dense") for run in ("first", "next"))
SEED = 14


def _lookup(table: np.ndarray, keys: np.ndarray) -> int:
    return int(table[keys].sum())


def _slice_sum(table: np.ndarray, lo: int, hi: int) -> int:
    return int(table[lo:hi].sum())


def stage_args(table: np.ndarray, case: str, tasks: int, p: dict) -> tuple:
    """(function, per-task argument tuples) for ``case``."""
    if case == "dense":
        bounds = np.linspace(0, len(table), tasks + 1).astype(np.int64)
        return _slice_sum, [(int(bounds[i]), int(bounds[i + 1])) for i in range(tasks)]
    per_page = p["page_size"] // 8
    pages = len(table) // per_page
    keys, _ = key_sets(pages, per_page, FRACTIONS[case], tasks, -(-2 * pages // tasks), SEED)
    return _lookup, [(k,) for k in keys]


def expected_answers(fn, args: list[tuple]) -> list[int]:
    """What every task must return: table values are 7 i + 3, computed without the table."""
    if fn is _slice_sum:
        return [int(7 * (hi * (hi - 1) - lo * (lo - 1)) // 2 + 3 * (hi - lo)) for lo, hi in args]
    return [int((7 * k.astype(np.int64) + 3).sum()) for (k,) in args]


def measure(system: str, rows: list, p: dict) -> None:
    import clamor

    clamor.configure(page_size=p["page_size"])
    table = clamor.empty(p["table_mib"] << 20 >> 3, np.int64)
    for lo in range(0, len(table), 1 << 24):
        hi = min(len(table), lo + (1 << 24))
        table[lo:hi] = np.arange(lo, hi, dtype=np.int64) * 7 + 3
    workers = int(system.split("-")[1]) if system != "plain" else 0
    transport = "shm-copy" if system.startswith("copy-") else "auto"
    tasks = 4 * (workers or max(p["workers"]))
    for case in (*FRACTIONS, "dense"):
        fn, args = stage_args(table, case, tasks, p)
        want = expected_answers(fn, args)
        first, nxt, extra = [], [], {}
        for rep in range(p["repeat"]):
            if system == "plain":
                for out in (first, nxt):
                    t0 = time.perf_counter()
                    got = [fn(table, *a) for a in args]
                    out.append(time.perf_counter() - t0)
                    assert got == want, f"plain: a wrong answer in {case}"
                continue
            t0 = time.perf_counter()
            with clamor.Cluster(workers=workers, transport=transport) as c:
                started = time.perf_counter() - t0
                before, shm0 = c.stats(), shmem_bytes()
                for out in (first, nxt):
                    t0 = time.perf_counter()
                    got = c.run_stage([(c.workers[i % workers], fn, (table, *a)) for i, a in enumerate(args)])
                    out.append(time.perf_counter() - t0)
                    assert list(got) == want, f"{system}: a wrong answer in {case}"
                    if out is first:
                        stats = c.stats()
                        extra = {"shmem_growth": shmem_bytes() - shm0,
                                 "workers_pss": pss([w["pid"] for w in stats["workers"]]),
                                 "bytes_mapped": stats["bytes_mapped"] - before["bytes_mapped"],
                                 "bytes_fetched": stats["bytes_fetched"] - before["bytes_fetched"],
                                 "page_requests": int(c.page_stats(table)["requests"].sum()),
                                 "start_s": started}  # fmt: skip
            progress(f"  {system} {case} {rep + 1}/{p['repeat']}: first {first[-1]:.3f} s, next "
                     f"{nxt[-1]:.3f} s, shared memory +{extra['shmem_growth'] >> 20} MiB, workers' "
                     f"Pss {extra['workers_pss'] >> 20} MiB, copied {extra['bytes_fetched'] >> 20} MiB")  # fmt: skip
        rows.append(row(system, f"{case} first", first, bytes_moved=extra.get("bytes_fetched"),
                        tasks=len(args), **extra))  # fmt: skip
        rows.append(row(system, f"{case} next", nxt, tasks=len(args)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 256 MiB table, workers 2,3, 1 repetition")
    ap.add_argument("--table-mib", type=int, default=None, help="table size (4096; quick 256)")
    ap.add_argument("--workers", default=None, help="worker counts to compare (2,14; quick 2,3)")
    ap.add_argument("--page-size", type=int, default=256 << 10, help="bytes (256 KiB)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions per case (2; quick 1)")
    ap.add_argument("--only", default=None, help="systems to run (clamor-W for each W, copy-W, plain)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per system")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    workers = [int(w) for w in (args.workers or ("2,3" if args.quick else "2,14")).split(",")]
    p = {"table_mib": args.table_mib or (256 if args.quick else 4096), "workers": workers,
         "page_size": args.page_size, "repeat": args.repeat or (1 if args.quick else 2)}  # fmt: skip
    if args.child:
        child_main(args.child, args.child_out, CASES, lambda system, rows: measure(system, rows, p))
        return
    systems = [s.strip() for s in (args.only or ",".join([*(f"clamor-{w}" for w in workers), "plain"])).split(",")]
    argv = [f"--table-mib={p['table_mib']}", f"--workers={','.join(map(str, workers))}",
            f"--page-size={args.page_size}", f"--repeat={p['repeat']}"]  # fmt: skip
    rows = run_all(Path(__file__).resolve(), systems, argv, CASES, args.timeout)
    result = {"workload": "scale", "quick": args.quick, "baseline": f"clamor-{workers[0]}", "page_size": p["page_size"],
              "title": f"{' vs '.join(map(str, workers))} workers on one host, a {p['table_mib']} MiB table",
              "params": {**p, "cores": os.cpu_count(), "systems": systems,
                         "command": " ".join(["python bench/run.py scale", *sys.argv[1:]])},
              "rows": rows}  # fmt: skip
    path = save(result)
    print("| system | case | median (s) | shared memory growth (MiB) | workers' Pss (MiB) | copied (MiB) | page requests |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        med = sorted(r["seconds"])[len(r["seconds"]) // 2] if r["seconds"] else None
        print(f"| {r['system']} | {r['case']} | {'—' if med is None else f'{med:.3f}'} | "
              f"{(r.get('shmem_growth') or 0) >> 20} | {(r.get('workers_pss') or 0) >> 20} | "
              f"{(r.get('bytes_fetched') or 0) >> 20} | {r.get('page_requests', '')} |")
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
