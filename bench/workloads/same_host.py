"""Dense reads on the driver's host: zero copy vs copying pages vs one plain process.

    python bench/run.py same_host [--quick] [--table-mib M] [--workers W] [--repeat R]
                                  [--only zero-copy,copy,plain]

Every worker of a cluster on this machine reads (sums) all of one arena table, once
per stage: one task per worker, so W workers read W times the table. Three systems,
each in its own child process (harness.run_all):

* ``zero-copy``: ``Cluster(transport="auto")``, the default: workers map the
  driver's pages in place;
* ``copy``: ``Cluster(transport="shm-copy")``: each worker copies every page it
  touches from the driver's memfd into its own page cache (the data plane before
  zero copy);
* ``plain``: one process sums the table W times (the physical limit on these
  cores: memory bandwidth, no cluster).

Cases: ``first pass`` (a fresh cluster's first stage: page faults, and for ``copy``
the copies) and ``next pass`` (the same stage again). Memory: the growth of the
machine's shared memory (``/proc/meminfo`` Shmem) over the first pass, which is
where copies go, and the workers' summed Pss. Writes ``results/same_host.json``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import psutil
from harness import child_main, progress, run_all
from harness.results import row, save

SYSTEMS = ("zero-copy", "copy", "plain")
CASES = ("first pass", "next pass")
TRANSPORT = {"zero-copy": "auto", "copy": "shm-copy"}


def shmem_bytes() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("Shmem:"):
            return int(line.split()[1]) * 1024
    return 0


def pss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            total += psutil.Process(pid).memory_full_info().pss
        except psutil.Error:
            pass
    return total


def _sum(table: np.ndarray) -> int:
    return int(table.sum())


def timed_stage(cluster, table: np.ndarray, expected: int) -> tuple[float, dict]:
    """One stage in which every worker sums the table: its seconds, memory, bytes."""
    before = cluster.stats()
    shm0 = shmem_bytes()
    t0 = time.perf_counter()
    got = cluster.run_stage([(w, _sum, (table,)) for w in cluster.workers])
    seconds = time.perf_counter() - t0
    assert got == [expected] * len(cluster.workers), "a wrong sum"
    stats = cluster.stats()
    return seconds, {"shmem_growth": shmem_bytes() - shm0,
                     "workers_pss": pss([w["pid"] for w in stats["workers"]]),
                     "bytes_mapped": stats["bytes_mapped"] - before["bytes_mapped"],
                     "bytes_fetched": stats["bytes_fetched"] - before["bytes_fetched"]}  # fmt: skip


def measure(system: str, rows: list, p: dict) -> None:
    import clamor

    table = clamor.empty(p["table_mib"] << 20 >> 3, np.int64)
    table[:] = np.arange(len(table))
    expected, workers = int(table.sum()), p["workers"]
    if system == "plain":
        for case in CASES:
            seconds = []
            for _ in range(p["repeat"]):
                t0 = time.perf_counter()
                assert [_sum(table) for _ in range(workers)] == [expected] * workers
                seconds.append(time.perf_counter() - t0)
            rows.append(row(system, case, seconds))
        return

    def cluster():
        return clamor.Cluster(workers=workers, transport=TRANSPORT[system], page_size=p["page_size"])

    for case in CASES:
        seconds, extra = [], {}
        with cluster() if case == "next pass" else contextlib.nullcontext() as warm:
            if warm is not None:
                timed_stage(warm, table, expected)  # the first pass, not timed here
            for rep in range(p["repeat"]):
                with contextlib.nullcontext(warm) if warm is not None else cluster() as c:
                    s, extra = timed_stage(c, table, expected)
                seconds.append(s)
                progress(f"  {system} {case} {rep + 1}/{p['repeat']}: {s:.3f} s, shared memory "
                         f"+{extra['shmem_growth'] >> 20} MiB, workers' Pss {extra['workers_pss'] >> 20} MiB")  # fmt: skip
        rows.append(row(system, case, seconds, bytes_moved=extra.get("bytes_fetched"), **extra))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 256 MiB table, 2 repetitions")
    ap.add_argument("--table-mib", type=int, default=None, help="table size (1024; quick 256)")
    ap.add_argument("--workers", type=int, default=None, help="workers (default: the cores)")
    ap.add_argument("--page-size", type=int, default=256 << 10, help="bytes (256 KiB)")
    ap.add_argument("--repeat", type=int, default=None, help="repetitions per case (3; quick 2)")
    ap.add_argument("--only", default=",".join(SYSTEMS), help="systems to run")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per system")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    p = {"table_mib": args.table_mib or (256 if args.quick else 1024),
         "workers": args.workers or len(os.sched_getaffinity(0)), "page_size": args.page_size,
         "repeat": args.repeat or (2 if args.quick else 3)}  # fmt: skip
    if args.child:
        child_main(args.child, args.child_out, CASES, lambda system, rows: measure(system, rows, p))
        return
    systems = [s.strip() for s in args.only.split(",") if s.strip()]
    argv = [f"--table-mib={p['table_mib']}", f"--workers={p['workers']}", f"--page-size={args.page_size}",
            f"--repeat={p['repeat']}"]  # fmt: skip
    rows = run_all(Path(__file__).resolve(), systems, argv, CASES, args.timeout)
    result = {"workload": "same_host", "quick": args.quick, "baseline": "zero-copy",
              "title": f"{p['workers']} workers on the driver's host each read all of a "
                       f"{p['table_mib']} MiB table",
              "params": {**p, "systems": systems, "command": " ".join(["python bench/run.py same_host", *sys.argv[1:]])},
              "rows": rows}  # fmt: skip
    path = save(result)
    print("| system | case | median (s) | shared memory growth (MiB) | workers' Pss (MiB) |\n|---|---|---:|---:|---:|")
    for r in rows:
        med = sorted(r["seconds"])[len(r["seconds"]) // 2] if r["seconds"] else None
        print(f"| {r['system']} | {r['case']} | {'—' if med is None else f'{med:.3f}'} | "
              f"{(r.get('shmem_growth') or 0) >> 20} | {(r.get('workers_pss') or 0) >> 20} |")
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
