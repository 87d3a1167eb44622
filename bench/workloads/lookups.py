#!/usr/bin/env python3
"""Sparse lookups into a large table touching 1 %, 10 %, 100 % of its pages: Clamor's
demand paging against Dask, Ray and ipyparallel, each with two programs (broadcast the
table; ship each task the values of its keys), and the machine's limits.

    python bench/run.py lookups [--quick] [--repeat R] [--passes P] [--cold C]
                            [--only clamor,ray,ray-values,dask,dask-values,ipyparallel,
                                    ipyparallel-values,shm,numpy]
                            [--table-mib M] [--tasks T] [--lookups L] [--page-size B]
                            [--no-prefetch] [--network [RATE]]

The table: ``M`` MiB of int64 values (2048 MiB; 256 MiB with ``--quick``), value
``7 i + 3`` at index ``i``, seen as pages of ``B`` bytes (Clamor's page size, 256 KiB).
For a fraction ``f`` the keys touch exactly ``round(f x pages)`` pages, chosen at random:
one key on each chosen page, the rest of the ``T x L`` lookups (``T`` = 4 x workers
tasks of ``L`` = ``2 x pages / T`` lookups by default, the same for every fraction) on
random chosen pages at random offsets, shuffled and cut into ``T`` tasks of ``L`` keys;
a task returns ``table[keys].sum()``. Every task's sum is compared with the driver's
numpy answer; a wrong answer marks the row (``checked: false`` and a note).

Systems (each in its own child process; ``peers.py`` has the sessions, ``limits.py`` the
limits'):

* ``clamor``: the table is a ``clamor.empty`` arena array; ``cluster.run_stage`` with
  the tasks placed round-robin, each shipping a reference; a task reads its keys' values
  with ``clamor.gather(table, keys)`` (it knows its keys: the docs' way for scattered
  rows, which copies the values, not their pages; ``--no-prefetch``: ``table[keys]``, the
  workers fault in the pages they touch). Bytes moved: the driver's
  ``bytes_served_by_driver + bytes_served_by_peers`` (on one host workers read the
  driver's arena in place instead: the pages mapped and the values copied from it,
  ``bytes_mapped`` and the workers' ``shm_row_bytes``, are recorded beside it).
* ``dask``: ``client.scatter(table, broadcast=True, hash=False)`` then a
  ``client.submit`` per task with the future (Dask's docs, "Data Locality": scatter large
  data once, ``broadcast=True`` to every worker); bytes moved: the table x workers.
* ``ray``: ``ray.put(table)`` then ``f.remote(ref, keys)`` per task (Ray's docs, "Anti-pattern:
  passing the same large argument by value repeatedly": put it once, pass the
  reference), on ``ray.init(object_store_memory=...)`` sized for two copies of the table
  (``peers.ray_store_bytes``); bytes moved: one copy into this host's object store, which
  the workers read in place (one per host in network mode).
* ``ipyparallel``: ``rc[:].push({name: table})`` then ``apply_async`` per task on a
  load-balanced view with ``Reference(name)``; bytes moved: the table x engines.
* ``<peer>-values`` (rows "<peer> (ship keys' values)"): the same knowledge Clamor's tasks
  have, their keys: the driver gathers ``table[keys]`` for each task and ships only
  those values (``client.submit(f, values)``, ``f.remote(values)``,
  ``view.apply_async(f, values)``: small arguments go inline with the task); bytes
  moved: the values.
* ``shm`` ("limit: shared memory, W processes"): the table lives in a
  ``multiprocessing.shared_memory`` block; a pool of W processes (forked before it
  exists) attaches it by name and reads it in place; nothing moves.
* ``numpy`` ("limit: numpy, one process"): every task in turn in the child itself.

Protocol, per child (``--passes`` children per system, interleaved A B C A B C by
``harness.run_all``; every release waited for, untimed):

* **1% (cold)**: ``C`` times (``--cold``), a fresh system (a new cluster, ``ray.init``,
  ``LocalCluster``, ``ipp.Cluster``, pool; its start untimed, as no system's is) and an
  untimed warm-up of its code paths on a one-page table; then one timed repetition of
  the 1 % stage on the real table: the first time it meets the table (Ray: an object
  store that has not yet touched its pages; Clamor: workers with empty caches).
* an untimed warm-up at full size: one repetition of the 100 % stage end to end;
* **1%**, **10%**, **100%** (steady state): ``R`` rounds (``--repeat``), each one timed
  repetition of every fraction in turn, on the same warm system. Before each
  repetition (untimed) the driver adds 1 to one value on every page the stage reads, so
  no system can reuse what it moved before: Clamor's workers drop those pages
  (invalidations) and fetch or map them again, the peers broadcast the changed table,
  the values programs gather the changed values.

* **100%, tasks returning at once** (Clamor only, after the steady rounds): ``R``
  repetitions of the 100 % stage with the same arguments and the same driver writes
  before each, but tasks that return at once: the fixed cost of that stage on this
  machine (write tracking, invalidations, scheduling, shipping), which the 100 % goal's
  explanation compares with the peer's whole repetition.

A repetition is timed end to end, from the table in the driver's memory to every
task's result: the broadcast (or the gather of the values) and the tasks. Rows carry
every repetition's seconds (``median_ci`` of the harness gives the 95 % interval from 6
repetitions on), the bytes moved, the release's seconds (``release_s_runs``), and the
workers' memory: the largest RSS (``common.tree_rss``) of the processes that ran the
tasks, read right after the stage while they still hold what they were sent, and the
same plus the part of a Clamor worker's page cache (a memfd) that RSS does not show
(``harness.usage.worker_memory``); ``idle_worker_rss`` is a worker's memory after the one-page
warm-up. For Clamor the driver's per-page request counters must show exactly the chosen
pages requested in the cold repetitions. Goals compare Clamor with each peer's faster
program (its smaller one for memory), every explanation computed from the rows. Writes
``bench/results/lookups.json``.

``--network [RATE]`` (``network.py``): the same with each system's workers on simulated
hosts behind links of RATE (1gbit) and the driver's uplink shaped to RATE, and a 512
MiB table unless given; the limits run on the driver's host (no link); writes
``bench/results/lookups-network.json``. Ray's bytes are then one copy per host.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
from harness import child_main, network, progress, run_all
from harness.options import arguments, systems
from harness.results import goal, median, row, save
from harness.tables import find, fmt_bytes, limit_row, markdown
from harness.usage import OtherLoad, worker_memory
from peers import WORKERS
from programs import (
    LIMITS,
    PEERS,
    PROGRAMS,
    family,
    is_limit,
    label,
    open_session,
    ships_values,
)

FRACTIONS = (0.01, 0.10, 1.00)
STEADY = tuple(f"{f:.0%}" for f in FRACTIONS)
COLD = "1% (cold)"
CASES = (COLD, *STEADY)
FLOOR = "100%, tasks returning at once"
SEED = 8


def _lookup(table, keys):
    """A task: the sum of the looked-up values, and this worker's pid."""
    import os

    return int(table[keys].sum()), os.getpid()


def _lookup_gathered(table, keys):
    """Clamor's task: the values of its keys without their pages (``clamor.gather``)."""
    import os

    import clamor

    return int(clamor.gather(table, keys).sum()), os.getpid()


def _return_at_once(table, keys):
    """Clamor's floor task: the same arguments as :func:`_lookup_gathered`, no work."""
    import os

    return 0, os.getpid()


def _sum_values(values):
    """A values program's task: the sum of the values shipped with it, and the pid."""
    import os

    return int(values.sum()), os.getpid()


def key_sets(pages: int, per_page: int, fraction: float, tasks: int, lookups: int,
             seed: int) -> tuple[list[np.ndarray], np.ndarray]:  # fmt: skip
    """``tasks`` key arrays of ``lookups`` keys touching exactly ``round(fraction x pages)``
    pages (at least 1), and those pages (sorted)."""
    rng = np.random.default_rng(seed)
    n = max(1, round(fraction * pages))
    total = tasks * lookups
    if total < n:
        raise ValueError(f"{total} lookups cannot touch {n} pages: raise --lookups")
    chosen = np.sort(rng.choice(pages, n, replace=False))
    on = np.concatenate([chosen, rng.choice(chosen, total - n)])
    rng.shuffle(on)
    keys = on * per_page + rng.integers(0, per_page, total)
    return [keys[i * lookups:(i + 1) * lookups] for i in range(tasks)], chosen


class Runs:
    """One case's repetitions in a child, and its row."""

    def __init__(self) -> None:
        self.secs: list[float] = []
        self.moved: list[int] = []
        self.mapped: list[int] = []
        self.rss: list[int] = []
        self.mem: list[int] = []
        self.release: list[float] = []
        self.problems: list[str] = []


def measure(system: str, rows, p: dict) -> None:
    """In the child: the cold repetitions, the warm-up, the steady rounds; rows at the end
    of each part."""
    per_page = p["page_size"] // 8
    pages = p["table_bytes"] // p["page_size"]
    name, values = label(system), ships_values(system)
    options = {"page_size": p["page_size"]} if system == "clamor" else {}
    if system == "clamor":
        import clamor

        clamor.configure(page_size=p["page_size"])
    keys = {case: key_sets(pages, per_page, f, p["tasks"], p["lookups"], SEED + int(f * 1000))
            for case, f in zip(STEADY, FRACTIONS, strict=True)}  # fmt: skip
    keys[COLD] = keys[STEADY[0]]
    t0 = time.perf_counter()
    rate = None if is_limit(system) else p["network"]
    with network.hosts_or_loopback(rate, WORKERS) as net, \
            open_session(system, network=net, data_bytes=p["table_bytes"], **options) as s:
        progress(f"  {name}: started in {time.perf_counter() - t0:.1f} s")
        table = s.make_table(pages * per_page)
        small = s.make_table(per_page)  # the code-path warm-up's table
        task = _lookup_gathered if system == "clamor" and p["prefetch"] else _lookup
        idle: list[int] = []

        def warm_code() -> None:
            """Untimed: every worker runs the task once on the one-page table."""
            if values:
                out = s.run(_sum_values, [(small[:WORKERS],)] * (2 * WORKERS))
            else:
                h = s.broadcast(small)
                out = s.map(task, h, [(np.arange(WORKERS),)] * (2 * WORKERS))
                s.release(h)
            idle.append(worker_memory(out)[1])

        def repetition(case: str, runs: Runs | None, change: bool) -> None:
            """One timed repetition of ``case`` (``runs`` None: an untimed warm-up)."""
            ks, chosen = keys[case]
            if change:  # new data on every page the stage reads: nothing may be reused
                table[chosen * per_page] += 1
            expected = [int(table[k].sum()) for k in ks]
            c0 = s.cluster.stats() if system == "clamor" else None
            r0 = s.cluster.page_stats(table)["requests"].copy() if system == "clamor" else None
            h = None
            t = time.perf_counter()
            if values:
                out = s.run(_sum_values, [(table[k],) for k in ks])
            else:
                h = s.broadcast(table)
                out = s.map(task, h, [(k,) for k in ks])
            seconds = time.perf_counter() - t
            rss, mem = worker_memory(out)
            t = time.perf_counter()
            if h is not None:
                s.release(h)
            released = time.perf_counter() - t
            if runs is None:
                return
            runs.secs.append(seconds)
            runs.rss.append(rss)
            runs.mem.append(mem)
            runs.release.append(released)
            if c0 is not None:
                c1 = s.cluster.stats()
                runs.moved.append(sum(int(c1.get(k, 0)) - int(c0.get(k, 0))
                                      for k in ("bytes_served_by_driver", "bytes_served_by_peers")))
                gathered = sum(w.get("shm_row_bytes", 0) for w in c1["workers"]) - sum(
                    w.get("shm_row_bytes", 0) for w in c0["workers"])
                runs.mapped.append(int(c1.get("bytes_mapped", 0)) - int(c0.get("bytes_mapped", 0)) + gathered)
                got = np.flatnonzero(s.cluster.page_stats(table)["requests"] > r0)
                if case == COLD and not np.array_equal(got, chosen):
                    runs.problems.append(f"requested {got.size} pages, not the {chosen.size} touched")
                elif not np.isin(got, chosen).all():
                    runs.problems.append(f"requested {np.setdiff1d(got, chosen).size} pages it does not read")
            elif values:
                runs.moved.append(sum(int(table[k].nbytes) for k in ks))
            else:
                runs.moved.append(table.nbytes * s.copies)
            wrong = [i for i, (v, _) in enumerate(out) if v != expected[i]]
            if wrong:
                runs.problems.append(f"{case} rep {len(runs.secs)}: wrong sums in tasks {wrong}")
            progress(f"  {name} {case} {len(runs.secs)}: {seconds:.3f} s, moved "
                     f"{fmt_bytes(runs.moved[-1])}, worker memory {fmt_bytes(mem)}, "
                     f"release {released:.2f} s")  # fmt: skip

        def finish(case: str, runs: Runs, load: OtherLoad, how: str) -> None:
            note = "; ".join(runs.problems[:3])
            if s.system == "ray" and not values:
                note = "; ".join(x for x in (note, "bytes: one object-store copy per host"
                                             + (f" ({s.copies} hosts)" if net else "")) if x)  # fmt: skip
            if is_limit(system) and p["network"]:
                note = "; ".join(x for x in (note, "on the driver's host, no link") if x)
            f = FRACTIONS[STEADY.index(case)] if case in STEADY else FRACTIONS[0]
            rows.append(row(name, case, runs.secs, bytes_moved=int(median(runs.moved)),
                            peak_worker_rss=max(runs.rss), note=("WRONG: " if runs.problems else "") + note,
                            checked=not runs.problems, fraction=f, pages_touched=int(keys[case][1].size),
                            pages_total=pages, bytes_moved_runs=runs.moved, worker_rss_runs=runs.rss,
                            peak_worker_memory=max(runs.mem), worker_memory_runs=runs.mem,
                            bytes_mapped_runs=runs.mapped or None, release_s_runs=runs.release,
                            idle_worker_rss=min(idle), other_cores=load.cores(), protocol=how,
                            limit=is_limit(system), program=system))  # fmt: skip

        cold, load = Runs(), OtherLoad()
        for i in range(p["cold"]):
            if i:
                t = time.perf_counter()
                s.restart()
                progress(f"  {name}: restarted in {time.perf_counter() - t:.1f} s")
            warm_code()
            repetition(COLD, cold, change=False)
        finish(COLD, cold, load, "a fresh system each repetition")
        repetition(STEADY[-1], None, change=True)  # the warm-up at full size, untimed
        steady, load = {case: Runs() for case in STEADY}, OtherLoad()
        for _ in range(p["repeat"]):
            for case in STEADY:
                repetition(case, steady[case], change=True)
        for case in STEADY:
            finish(case, steady[case], load, "steady state: the same warm system, changed data")
        if system == "clamor" and p["prefetch"]:
            ks, chosen = keys[STEADY[-1]]
            secs, load = [], OtherLoad()
            for _ in range(p["repeat"]):
                table[chosen * per_page] += 1  # the steady rounds' writes
                t = time.perf_counter()
                s.map(_return_at_once, s.broadcast(table), [(k,) for k in ks])
                secs.append(time.perf_counter() - t)
            rows.append(row(name, FLOOR, secs, bytes_moved=0, other_cores=load.cores(), program=system,
                            protocol="after the steady rounds: the 100 % stage's arguments and writes, "
                                     "tasks that return at once"))  # fmt: skip


# --- goals, every explanation computed from the rows -------------------------------------


def best(rows: list[dict], peer: str, case: str, key: str = "seconds") -> dict | None:
    """The peer's measured program with the smallest median seconds (or ``key``)."""
    mine = [r for r in rows if family(r["system"]) == peer and r["case"] == case and r["seconds"]]
    if key == "seconds":
        return min(mine, key=lambda r: median(r["seconds"]), default=None)
    return min((r for r in mine if r.get(key)), key=lambda r: r[key], default=None)


def _describe(r: dict) -> str:
    """What a row did, in numbers: median seconds, bytes moved (and mapped)."""
    text = f"{r['system']}: median {median(r['seconds']):.3g} s, {fmt_bytes(r['bytes_moved'])} moved"
    if r.get("bytes_mapped_runs"):
        text += f", {fmt_bytes(median(r['bytes_mapped_runs']))} mapped"
    return text + " a repetition"


def time_goal(rows: list[dict], peer: str, case: str, target: float, what: str) -> dict:
    c, q = find(rows, "clamor", case), best(rows, peer, case)
    text = f"{what}: end to end, {peer} (its faster program) ÷ clamor >= {target:g}"
    if not c or not c["seconds"] or not q:
        return goal(text, None, target, f"{'clamor' if q else peer} not measured in this case")
    value = median(q["seconds"]) / median(c["seconds"])
    why = f"{_describe(q)}; {_describe(c)}"
    if lim := limit_row(rows, case):
        why += f"; {lim['system']}: median {median(lim['seconds']):.3g} s"
    if case == "100%" and (floor := find(rows, "clamor", FLOOR)) and floor["seconds"]:
        f = median(floor["seconds"])
        why += (f"; the same Clamor stage with tasks that return at once (the same arguments and "
                f"writes) takes {f:.3g} s, {f / median(c['seconds']):.0%} of Clamor's and "
                f"{f / median(q['seconds']):.0%} of {q['system']}'s repetition: "
                f"{median(q['seconds']) / f:.2f}x is the most a faster lookup could give here")
    return goal(text, value, target, why)


def memory_goal(rows: list[dict], peer: str, target: float) -> dict:
    c, q = find(rows, "clamor", COLD), best(rows, peer, COLD, "peak_worker_memory")
    text = f"at 1 % (cold): peak worker memory, {peer} (its smaller program) ÷ clamor >= {target:g}"
    if not c or not c.get("peak_worker_memory") or not q:
        return goal(text, None, target, f"{'clamor' if q else peer} not measured in this case")
    why = (f"{q['system']}: {fmt_bytes(q['peak_worker_memory'])} at the peak, "
           f"{fmt_bytes(q['idle_worker_rss'])} after the one-page warm-up; clamor: "
           f"{fmt_bytes(c['peak_worker_memory'])} at the peak, {fmt_bytes(c['idle_worker_rss'])} "
           "after the warm-up")  # fmt: skip
    return goal(text, q["peak_worker_memory"] / c["peak_worker_memory"], target, why)


def goals(result: dict) -> list[dict]:
    """The issue's goals, per peer, against the peer's best program in each case."""
    rows, out = result["rows"], []
    for peer in PEERS:
        out.append(time_goal(rows, peer, "1%", 10.0, "at 1 %"))
        out.append(time_goal(rows, peer, COLD, 10.0, "at 1 % (cold)"))
        out.append(memory_goal(rows, peer, 20.0))
    for peer, target in (("ray", 2.0), ("dask", 10.0), ("ipyparallel", 10.0)):
        out.append(time_goal(rows, peer, "100%", target, "at 100 %"))
    return out


def main() -> None:
    ap = arguments(__doc__.split("\n\n")[0], "256 MiB table, 1 pass of 2 rounds, 1 cold", PROGRAMS)
    ap.add_argument("--table-mib", type=int, default=None, help="table size (2048; network 512; quick 256)")
    ap.add_argument("--tasks", type=int, default=4 * WORKERS, help="tasks per stage (4 x workers)")
    ap.add_argument("--lookups", type=int, default=None,
                    help="lookups per task (2 x pages / tasks)")  # fmt: skip
    ap.add_argument("--cold", type=int, default=None,
                    help="cold repetitions per pass, each on a fresh system (2; quick 1)")  # fmt: skip
    ap.add_argument("--page-size", type=int, default=256 << 10, help="bytes (256 KiB)")
    ap.add_argument("--no-prefetch", action="store_true",
                    help="Clamor's tasks fault their pages in one by one (table[keys], no clamor.gather)")
    network.add_network_argument(ap)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    table_mib = args.table_mib or (256 if args.quick else 512 if args.network else 2048)
    pages = (table_mib << 20) // args.page_size
    passes = args.passes or (1 if args.quick else 2)
    p = {"table_bytes": pages * args.page_size, "page_size": args.page_size,
         "tasks": args.tasks, "lookups": args.lookups or -(-2 * pages // args.tasks),
         "repeat": args.repeat or (2 if args.quick else 5), "passes": passes,
         "cold": args.cold or (1 if args.quick else 2), "workers": WORKERS,
         "fractions": list(FRACTIONS), "dtype": "int64", "network": args.network,
         "prefetch": not args.no_prefetch}  # fmt: skip
    if args.child:
        child_main(args.child, args.child_out, CASES, lambda sy, rows: measure(sy, rows, p),
                   label(args.child))  # fmt: skip
        return
    chosen = systems(ap, args.only, PROGRAMS)
    network.require(args.network)
    argv = [f"--table-mib={table_mib}", f"--tasks={args.tasks}", f"--lookups={p['lookups']}",
            f"--page-size={args.page_size}", f"--repeat={p['repeat']}", f"--cold={p['cold']}"]  # fmt: skip
    argv += [f"--network={args.network}"] if args.network else []
    argv += ["--no-prefetch"] if args.no_prefetch else []
    t0 = time.perf_counter()
    try:
        rows = run_all(Path(__file__).resolve(), chosen, argv, CASES, args.timeout, args.wait_idle,
                       label=label, passes=passes)  # fmt: skip
    finally:
        network.sweep_stale()
    result = {"workload": network.workload("lookups", args.network), "quick": args.quick,
              "page_size": args.page_size,
              "title": network.title(f"Sparse lookups into a {fmt_bytes(p['table_bytes'])} table",
                                     args.network, WORKERS),
              "params": {**p, **network.params(args.network, WORKERS), "systems": chosen,
                         "limits": [label(x) for x in LIMITS if x in chosen],
                         "elapsed_s": time.perf_counter() - t0,
                         "command": " ".join(["python bench/run.py lookups", *sys.argv[1:]]),
                         "loadavg": os.getloadavg()},
              "rows": rows}  # fmt: skip
    result["goals"] = goals(result)
    path = save(result)
    print(markdown(result, [("worker memory", lambda r: fmt_bytes(r.get("peak_worker_memory"))),
                            ("pages", lambda r: f"{r.get('pages_touched', '—')}/"
                                                  f"{r.get('pages_total', '—')}"),
                            ("other load", lambda r: "—" if r.get("other_cores") is None
                             else f"{r['other_cores']:.2f}")]))  # fmt: skip
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
