#!/usr/bin/env python3
"""Streaming updates: a fixed set of lookups, iterated, with a one-key driver update
between iterations. Clamor writes the key in place (one page invalidated and moved);
Dask, Ray and ipyparallel either ship the whole table again (re-scatter, re-put,
re-push) or ship each task the values of its keys; the machine's limits beside them.

    python bench/run.py streaming [--quick] [--repeat R] [--passes P]
                              [--only clamor,ray,ray-values,dask,dask-values,ipyparallel,
                                      ipyparallel-values,shm,numpy]
                              [--table-mib M] [--iterations I] [--key-pages K]
                              [--network [RATE]]

The table: ``M`` MiB of int64 values ``7 i + 3`` (1024 MiB; 128 MiB with ``--quick``)
seen as pages of ``B`` bytes (Clamor's, 256 KiB). The key set: ``K`` random pages
(64), dealt to the workers in turn; ``T`` tasks (2 x workers) of ``L`` keys (1024)
each, task ``t`` taking random keys on worker ``t mod W``'s pages (Clamor places task
``t`` on that worker; the peers' schedulers place tasks as they like). A task returns
the sum of its keys' values.

Systems (each in its own child process; the sessions in ``peers.py`` and
``limits.py``): ``clamor`` (the table in the arena, tasks shipping a reference,
workers faulting pages in);
``dask`` / ``ray`` / ``ipyparallel``, the broadcast programs (``client.scatter(table,
broadcast=True, hash=False)``, ``ray.put(table)`` on an object store sized for two
copies, ``rc[:].push``), each task taking the broadcast handle; ``<peer>-values``
(rows "<peer> (ship keys' values)"): the driver gathers ``table[keys]`` for each task
and ships only those values with it; ``shm`` ("limit: shared memory, W processes"):
the table in a ``multiprocessing.shared_memory`` block read in place by a pool of W
processes, the driver writing into the block; ``numpy`` ("limit: numpy, one process"):
every task in turn in the child.

Protocol, per child (``--passes`` children per system, interleaved A B C A B C by
``harness.run_all``): the table broadcast, an untimed warm-up at full size (the tasks,
then one whole iteration: update, re-broadcast, tasks, release), then ``I x R``
rounds (8 x 1 a pass by default; 2 passes), each timed twice, in turns (lookup only
then iteration in even rounds, iteration then lookup only in odd ones, so that neither
always runs right after the other):

* **lookup only**: the tasks alone on what the workers have (the values programs gather
  the values and ship them: that is their lookup);
* **iteration**: from the update to the last result: the driver adds 1,000,003 to one
  random key of the key set (``table[k] += ...``), then clamor and the limits run the
  tasks (Clamor's next stage invalidates the written page on the worker holding it,
  which faults it in again); the broadcast programs broadcast the table again and run
  the tasks on the new handle, and after the timing (untimed) release the old one and
  wait until it is freed (``Session.release``); the values programs gather the new
  values and ship them;
* **update**: its own cost, each iteration's time minus the median lookup-only time.

Bytes moved per iteration: Clamor's driver counters (``bytes_served_by_driver +
bytes_served_by_peers``; on the driver's host workers map the arena's pages instead,
``bytes_mapped``), with the pages fetched or mapped (``pages_fetched + pages_mapped``)
and ``invalidations`` per iteration (the goal: exactly one page, ``B`` bytes, per
update); the broadcast programs: the table x
workers (Ray: x 1, the copy into this host's object store); the values programs: the
values. Every task's sum is compared with the driver's numpy answer after each update,
so a stale page shows as a wrong row. Peak worker RSS and memory as in ``lookups.py``.
Goals compare Clamor with each peer's faster program, every explanation computed from
the rows. Writes ``bench/results/streaming.json``.

``--network [RATE]`` (``network.py``): the same with each system's workers on simulated
hosts behind links of RATE (1gbit) and the driver's uplink shaped to RATE, so every
re-broadcast crosses the driver's link; the limits run on the driver's host (no link);
writes ``bench/results/streaming-network.json``. Ray's bytes are then one copy per host.
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
    PROGRAMS,
    family,
    is_limit,
    label,
    open_session,
    ships_values,
)

CASES = ("lookup only", "iteration", "update")
SEED = 11
DELTA = 1_000_003


def _lookup(table, keys):
    """A task: the sum of the looked-up values, and this worker's pid."""
    import os

    return int(table[keys].sum()), os.getpid()


def _sum_values(values):
    """A values program's task: the sum of the values shipped with it, and the pid."""
    import os

    return int(values.sum()), os.getpid()


def key_sets(pages: int, per_page: int, key_pages: int, tasks: int, lookups: int,
             seed: int) -> tuple[list[np.ndarray], np.ndarray]:  # fmt: skip
    """Task ``t``'s keys on the ``key_pages`` chosen pages dealt to worker ``t mod W``;
    also every key (the updates pick among them)."""
    rng = np.random.default_rng(seed)
    chosen = rng.choice(pages, key_pages, replace=False)
    mine = [chosen[w::WORKERS] for w in range(WORKERS)]
    keys = [rng.choice(mine[t % WORKERS], lookups) * per_page
            + rng.integers(0, per_page, lookups) for t in range(tasks)]  # fmt: skip
    return keys, np.unique(np.concatenate(keys))


def pages_in(stats: dict) -> int:
    """Pages Clamor's workers took from the driver or a peer so far: fetched (copied) or,
    on the driver's host, mapped from its arena."""
    return int(stats.get("pages_fetched", 0)) + int(stats.get("pages_mapped", 0))


def measure(system: str, rows, p: dict) -> None:
    """In the child: the warm-up, then rounds of (lookup only, iteration) on ``system``."""
    per_page = p["page_size"] // 8
    pages = p["table_bytes"] // p["page_size"]
    name, values = label(system), ships_values(system)
    rng = np.random.default_rng(SEED + 1)
    keys, every = key_sets(pages, per_page, p["key_pages"], p["tasks"], p["lookups"], SEED)
    n_iter = p["iterations"] * p["repeat"]
    updates = rng.choice(every, n_iter + 1)  # the first: the warm-up iteration's
    options = {}
    if system == "clamor":
        import clamor

        clamor.configure(page_size=p["page_size"])
        options = {"page_size": p["page_size"]}
    rebroadcast = not values and not is_limit(system) and system != "clamor"
    t0 = time.perf_counter()
    rate = None if is_limit(system) else p["network"]
    with network.hosts_or_loopback(rate, WORKERS) as net, \
            open_session(system, network=net, data_bytes=p["table_bytes"], **options) as s:
        progress(f"  {name}: started in {time.perf_counter() - t0:.1f} s")
        table = s.make_table(pages * per_page)
        clamor_stats = s.cluster.stats if system == "clamor" else None
        problems: list[str] = []
        rss, mem, release = [], [], []

        def tasks(h) -> list:
            """The stage: values gathered and shipped, or the tasks on the handle."""
            if values:
                return s.run(_sum_values, [(table[k],) for k in keys])
            return s.map(_lookup, h, [(k,) for k in keys])

        def check(out: list, what: str) -> None:
            wrong = [i for i, (v, _) in enumerate(out) if v != int(table[keys[i]].sum())]
            if wrong:
                problems.append(f"{what}: stale or wrong sums in tasks {wrong}")
            r, m = worker_memory(out)
            rss.append(r)
            mem.append(m)

        def iteration(h, key: int):
            """One update then the stage; the new handle, the seconds, the results."""
            t = time.perf_counter()
            table[key] += DELTA
            write = time.perf_counter() - t
            new = s.broadcast(table) if rebroadcast else h
            out = tasks(new)
            seconds = time.perf_counter() - t
            if new is not h:
                t = time.perf_counter()
                s.release(h)  # untimed, waited: the old copy freed before the next timing
                release.append(time.perf_counter() - t)
            return new, seconds, write, out

        h = None if values else s.broadcast(table)
        check(tasks(h), "warm-up")
        h, _, _, out = iteration(h, updates[-1])  # the warm-up at full size, untimed
        check(out, "warm-up iteration")
        load = OtherLoad()
        lookup, iters, writes, moved, mapped, fetched, invalid = [], [], [], [], [], [], []

        def lookup_only(i: int) -> None:
            c0 = clamor_stats() if clamor_stats else None
            t = time.perf_counter()
            tasks(h)
            lookup.append(time.perf_counter() - t)
            if c0 is not None and (n := pages_in(clamor_stats()) - pages_in(c0)):
                problems.append(f"lookup-only round {i} fetched or mapped {n} pages")

        for i, key in enumerate(updates[:-1]):
            if i % 2 == 0:  # A B, then B A: neither timing always follows the other
                lookup_only(i)
            c0 = clamor_stats() if clamor_stats else None
            h, seconds, write, out = iteration(h, key)
            iters.append(seconds)
            writes.append(write)
            check(out, f"iteration {i}")
            if c0 is not None:
                c1 = clamor_stats()
                moved.append(sum(int(c1[k]) - int(c0[k])
                                 for k in ("bytes_served_by_driver", "bytes_served_by_peers")))  # fmt: skip
                mapped.append(int(c1.get("bytes_mapped", 0)) - int(c0.get("bytes_mapped", 0)))
                fetched.append(pages_in(c1) - pages_in(c0))
                invalid.append(int(c1["invalidations"]) - int(c0["invalidations"]))
            elif values:
                moved.append(sum(int(table[k].nbytes) for k in keys))
            elif rebroadcast:
                moved.append(table.nbytes * s.copies)
            else:
                moved.append(0)
            if i % 2 == 1:
                lookup_only(i)
            progress(f"  {name} round {i + 1}/{n_iter}: lookup {lookup[-1]:.4f} s, iteration "
                     f"{iters[-1]:.4f} s, moved {fmt_bytes(moved[-1])}")  # fmt: skip
        cores = load.cores()
        if h is not None and not values:
            s.release(h)
        note = ("WRONG: " + "; ".join(problems[:3])) if problems else ""
        if s.system == "ray" and rebroadcast:
            note = "; ".join(x for x in (note, "bytes: one object-store copy per host"
                                         + (f" ({s.copies} hosts)" if net else "")) if x)  # fmt: skip
        if is_limit(system) and p["network"]:
            note = "; ".join(x for x in (note, "on the driver's host, no link") if x)
        common = {"checked": not problems, "peak_worker_rss": max(rss), "limit": is_limit(system),
                  "peak_worker_memory": max(mem), "other_cores": cores, "note": note,
                  "program": system}  # fmt: skip
        extra = {}
        if system == "clamor":
            extra = {"pages_moved_runs": fetched, "invalidations_runs": invalid, "bytes_mapped_runs": mapped,
                     "version_log_bytes": int(clamor_stats()["version_log_bytes"])}  # fmt: skip
        lookup_moved = 0 if not values else moved[0] if moved else 0
        rows.append(row(name, "lookup only", lookup, bytes_moved=lookup_moved, **common))
        rows.append(row(name, "iteration", iters, bytes_moved=int(median(moved)),
                        bytes_moved_runs=moved, write_s_runs=writes,
                        release_s_runs=release or None, **common, **extra))  # fmt: skip
        base = median(lookup)
        rows.append(row(name, "update", [x - base for x in iters],
                        bytes_moved=int(median(moved)), **common))  # fmt: skip


# --- goals, every explanation computed from the rows -------------------------------------


def best(rows: list[dict], peer: str, case: str) -> dict | None:
    """The peer's measured program with the smallest median in ``case``."""
    mine = [r for r in rows if family(r["system"]) == peer and r["case"] == case and r["seconds"]]
    return min(mine, key=lambda r: median(r["seconds"]), default=None)


def _describe(rows: list[dict], system: str) -> str:
    """A program's iteration in numbers: its median, the lookup-only median, bytes moved."""
    it, look = find(rows, system, "iteration"), find(rows, system, "lookup only")
    if not it or not it["seconds"]:
        return f"{system}: not measured"
    text = f"{system}: iteration median {median(it['seconds']) * 1e3:.3g} ms"
    if look and look["seconds"]:
        text += f", lookup only {median(look['seconds']) * 1e3:.3g} ms"
    text += f", {fmt_bytes(it['bytes_moved'])} moved an iteration"
    if it.get("write_s_runs"):
        text += f", the driver's write {median(it['write_s_runs']) * 1e3:.3g} ms"
    return text


def goals(result: dict) -> list[dict]:
    rows, out = result["rows"], []

    def why(peer_row: dict | None) -> str:
        text = "; ".join(_describe(rows, x) for x in ("clamor", *([peer_row["system"]] if peer_row else [])))
        if lim := limit_row(rows, "iteration"):
            text += f"; {lim['system']}: iteration median {median(lim['seconds']) * 1e3:.3g} ms"
        return text

    c_it, c_up = find(rows, "clamor", "iteration"), find(rows, "clamor", "update")
    for peer in ("dask", "ipyparallel"):
        q = best(rows, peer, "iteration")
        text = f"per iteration: {peer} (its faster program) ÷ clamor >= 40"
        value = (median(q["seconds"]) / median(c_it["seconds"])
                 if q and c_it and c_it["seconds"] else None)  # fmt: skip
        out.append(goal(text, value, 40.0, why(q)))
    text = "update cost (iteration − lookup only): ray (its faster program) ÷ clamor >= 50"
    q = best(rows, "ray", "update")
    if not q or not c_up or not c_up["seconds"]:
        out.append(goal(text, None, 50.0, "ray or clamor not measured"))
    elif median(c_up["seconds"]) <= 0 or median(q["seconds"]) <= 0:
        out.append(goal(text, None, 50.0, f"an update cost within the noise of the lookup time "
                        f"(clamor's median {median(c_up['seconds']) * 1e3:.3g} ms, {q['system']}'s "
                        f"{median(q['seconds']) * 1e3:.3g} ms): not measurable as a difference; "
                        + why(q)))  # fmt: skip
    else:
        out.append(goal(text, median(q["seconds"]) / median(c_up["seconds"]), 50.0, why(q)))
    page = result["page_size"]
    if c_it and c_it.get("pages_moved_runs"):
        moved = [b + m for b, m in zip(c_it["bytes_moved_runs"], c_it["bytes_mapped_runs"], strict=True)]
        ok = [f == 1 and b == page for f, b in zip(c_it["pages_moved_runs"], moved, strict=True)]
        out.append(goal("one page moved per update (share of updates that moved or mapped "
                        "exactly one page)", sum(ok) / len(ok), 1.0,
                        f"{sum(ok)} of {len(ok)} updates moved or mapped exactly one page of "
                        f"{fmt_bytes(page)} (pages per update: {min(c_it['pages_moved_runs'])}–"
                        f"{max(c_it['pages_moved_runs'])})"))  # fmt: skip
    else:
        out.append(goal("one page moved per update", None, 1.0, "clamor not measured"))
    return out


def main() -> None:
    ap = arguments(__doc__.split("\n\n")[0], "128 MiB table, 4 iterations, 1 pass", PROGRAMS)
    ap.add_argument("--table-mib", type=int, default=None, help="table size (1024; network 256; quick 128)")
    ap.add_argument("--iterations", type=int, default=None, help="per repetition (8; quick 4)")
    ap.add_argument("--key-pages", type=int, default=64, help="pages the key set covers (64)")
    ap.add_argument("--tasks", type=int, default=2 * WORKERS, help="tasks per iteration (2 x workers)")
    ap.add_argument("--lookups", type=int, default=1024, help="lookups per task (1024)")
    ap.add_argument("--page-size", type=int, default=256 << 10, help="bytes (256 KiB)")
    network.add_network_argument(ap)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    table_mib = args.table_mib or (128 if args.quick else 256 if args.network else 1024)
    pages = (table_mib << 20) // args.page_size
    passes = args.passes or (1 if args.quick else 2)
    p = {"table_bytes": pages * args.page_size, "page_size": args.page_size,
         "iterations": args.iterations or (4 if args.quick else 8), "repeat": args.repeat or 1,
         "passes": passes, "key_pages": min(args.key_pages, pages), "tasks": args.tasks,
         "lookups": args.lookups, "workers": WORKERS, "dtype": "int64", "delta": DELTA,
         "network": args.network}  # fmt: skip
    if args.child:
        child_main(args.child, args.child_out, CASES, lambda sy, rows: measure(sy, rows, p),
                   label(args.child))  # fmt: skip
        return
    chosen = systems(ap, args.only, PROGRAMS)
    network.require(args.network)
    argv = [f"--table-mib={table_mib}", f"--iterations={p['iterations']}",
            f"--key-pages={p['key_pages']}", f"--tasks={args.tasks}",
            f"--lookups={args.lookups}", f"--page-size={args.page_size}",
            f"--repeat={p['repeat']}"]  # fmt: skip
    argv += [f"--network={args.network}"] if args.network else []
    t0 = time.perf_counter()
    try:
        rows = run_all(Path(__file__).resolve(), chosen, argv, CASES, args.timeout, args.wait_idle,
                       label=label, passes=passes)  # fmt: skip
    finally:
        network.sweep_stale()
    text = f"Streaming one-key updates to a {fmt_bytes(p['table_bytes'])} table"
    result = {"workload": network.workload("streaming", args.network), "quick": args.quick,
              "page_size": args.page_size, "title": network.title(text, args.network, WORKERS),
              "params": {**p, **network.params(args.network, WORKERS), "systems": chosen,
                         "limits": [label(x) for x in LIMITS if x in chosen],
                         "elapsed_s": time.perf_counter() - t0,
                         "command": " ".join(["python bench/run.py streaming", *sys.argv[1:]]),
                         "loadavg": os.getloadavg()},
              "rows": rows}  # fmt: skip
    result["goals"] = goals(result)
    path = save(result)

    def pages_cell(r: dict) -> str:
        runs = r.get("pages_moved_runs")
        return f"{min(runs)}–{max(runs)}" if runs else "—"

    print(markdown(result, [("worker memory", lambda r: fmt_bytes(r.get("peak_worker_memory"))),
                            ("pages moved / update", pages_cell),
                            ("other load", lambda r: "—" if r.get("other_cores") is None
                             else f"{r['other_cores']:.2f}")]))  # fmt: skip
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
