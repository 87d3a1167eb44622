#!/usr/bin/env python3
"""Hot-page replication: replication on vs. off, Zipf lookups and a burst, 4 to 16 hosts.

    python bench/run.py replication [--quick] [--repeat R] [--passes P] [--only on,off,limit]
                                [--hosts 8,16] [--cases zipf,burst] [--table-mib M] [--burst-mib B]
                                [--lookups L] [--zipf S] [--wait-idle S] [--network [RATE]]

The dynamic-replication figure of the paper (issue 8, issue 20; docs/paging.md, "Redirects and replication"),
scaled down: a table of M MiB of int64 in the arena (``clamor.array``, filled on the
driver) and H workers, one per simulated host in network mode
(``clamor.Cluster(workers=H, transport="tcp", replication=...)``). Two cases:

* **zipf lookups**: each worker runs 2 tasks of L lookups. A lookup picks a page by a
  bounded Zipf law of exponent S over the table's pages (rank k with probability
  ~ 1/k^S; ranks are mapped to pages by a fixed random permutation, so hot pages are
  scattered) and a random element in it; the task returns the sum of the values read.
* **burst**: every worker runs one task that sums the same B MiB slice of the table,
  all of them at stage start: every page is wanted by every worker at once, before
  anyone holds it (a scan, so read-ahead batches the requests).

With replication the driver redirects a request for a page that a worker holds (or is
being sent) to that worker; without it the driver serves every fetch.

Rows: ``replication on`` (the baseline), ``replication off``, and the limit, ``limit:
shared memory, H processes``: a fork pool of H processes over one ``SharedMemory``
table (nothing is paged or moved) running the same tasks on the same data; in network
mode it runs on the driver's host. Cases ``<case>, <H> hosts``.

Protocol: for each H of ``--hosts`` (a list, ``8,16``), ``harness.run_all`` runs on, off
and the limit ``--passes`` times (2; A B C A B C), each in a fresh child process that
builds the H hosts and one cluster. Per case an untimed warm-up repetition at full size,
then ``--repeat`` (5) timed ones. Each repetition first rewrites the table on the driver,
so every worker starts cold (the pages get a new version and the workers' copies are
invalidated). Per repetition: the stage's wall time (end to end: task shipping, page
fetching, work, results), ``bytes_served_by_driver`` and ``bytes_served_by_peers`` from
``cluster.stats()``, the workers' ``redirects`` and ``peer_fallbacks``, and the workers'
peak RSS; and per child the time of an empty stage (one no-op task a worker). Ratios
off ÷ on of the medians per case and host count: time and driver traffic. Every task's
result is checked against the same computation with numpy on the driver. Before each
child the parent waits (``--wait-idle``, 60 s at most) for the machine to go quiet.

Sizes: the defaults keep the tasks small (20,000 lookups a task, which still touch
every page of a 64 MiB table), since on a small machine the H workers' Python loops
are a floor that on and off share.

``--network [RATE]`` (``network.py``) is the paper's setting: each worker on its own
simulated host (a network namespace) behind a link of RATE (1gbit), and the driver's
uplink shaped to RATE as well, so without replication every worker's copy of the hot
pages squeezes through the driver's one link, while with it most pages travel host to
host in parallel. Writes ``replication-network.json`` (``replication.json`` on loopback).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import network, progress
from harness.results import goal, row, save
from harness.tables import markdown
from limits import _shm_init, _shm_task

TASKS_PER_WORKER = 2  # zipf lookups; the burst runs one task per worker
CONFIGS = {"on": True, "off": False}
CASES = {"zipf": "zipf lookups", "burst": "burst"}
LIMIT = "limit"  # the child name of the limit row


def limit_name(hosts: int) -> str:
    return f"limit: shared memory, {hosts} processes"

WORKER_COUNTERS = ("pages_fetched", "from_driver", "from_peers", "redirects", "peer_fallbacks")


def name(config: str) -> str:
    return f"replication {config}"


def case_name(case: str, hosts: int) -> str:
    """A row's case: ``zipf lookups, 16 hosts``."""
    return f"{CASES[case]}, {hosts} hosts"


def zipf_keys(n: int, page_elems: int, lookups: int, s: float, seed: int) -> np.ndarray:
    """``lookups`` indices into a table of ``n`` elements: page by bounded Zipf(s), element uniform."""
    import numpy as _np

    n_pages = -(-n // page_elems)
    p = 1.0 / _np.arange(1, n_pages + 1) ** s
    perm = _np.random.default_rng(12345).permutation(n_pages)  # the same hot pages for everyone
    rng = _np.random.default_rng(seed)
    pages = perm[rng.choice(n_pages, size=lookups, p=p / p.sum())]
    return _np.minimum(pages * page_elems + rng.integers(0, page_elems, lookups), n - 1)


def lookup_task(table: Any, page_elems: int, lookups: int, s: float, seed: int) -> tuple[int, int]:
    """A task: the sum of the looked-up values (one fault per new page), and the peak RSS."""
    import resource as _r

    keys = zipf_keys(len(table), page_elems, lookups, s, seed)
    total = 0
    for k in keys.tolist():  # one element at a time, as a hash-table probe would
        total += int(table[k])
    return total, _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * 1024


def burst_task(table: Any, lo: int, hi: int) -> tuple[int, int]:
    """A task: the sum of ``table[lo:hi]`` (every worker the same slice), and the peak RSS."""
    import resource as _r

    return int(table[lo:hi].sum()), _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * 1024


def _warm() -> int:
    import os as _os

    import numpy  # noqa: F401

    return _os.getpid()


def fill(table: np.ndarray, rep: int) -> None:
    """(Re)write every page of the table: a new version each repetition, so caches start cold."""
    n = len(table)
    table[:] = (np.arange(n, dtype=np.int64) * 2654435761 + rep) % 1_000_003


def stage_calls(args: argparse.Namespace, case: str, table: np.ndarray, workers: list[int],
                per_page: int) -> tuple[list, list[int]]:  # fmt: skip
    """The stage of ``case`` (its calls) and the results numpy gives on the driver."""
    if case == "burst":
        hi = min(len(table), args.burst_mib * 2**20 // 8)
        return [(w, burst_task, (table, 0, hi)) for w in workers], [int(table[:hi].sum())] * len(workers)
    seeds = [1000 * w + t for w in range(len(workers)) for t in range(TASKS_PER_WORKER)]
    expected = [int(table[zipf_keys(len(table), per_page, args.lookups, args.zipf, s)].sum()) for s in seeds]
    calls = [(workers[i % len(workers)], lookup_task, (table, per_page, args.lookups, args.zipf, s))
             for i, s in enumerate(seeds)]  # fmt: skip
    return calls, expected


def run_config(args: argparse.Namespace, config: str, hosts: int, net: Any = None) -> list[dict]:
    """Measure one configuration (``on`` / ``off``) with ``hosts`` workers in one cluster (on
    the simulated hosts of ``net``, a ``netns.Network``, in network mode): per case an
    untimed warm-up repetition at full size, then ``args.repeat`` timed ones."""
    import clamor

    n = args.table_mib * 2**20 // 8
    kw: dict[str, Any] = {"page_size": args.page_size} if args.page_size else {}
    kw["transport"] = "tcp"
    if net is not None:
        kw.update(network.cluster_options(net))
    rows = []
    with clamor.Cluster(workers=hosts, replication=CONFIGS[config], **kw) as cluster:
        page_size = cluster.page_size
        table = clamor.array(n, np.int64)
        workers = list(cluster.workers)
        cluster.run_stage([(w, _warm, ()) for w in workers])
        empty = []  # what a stage of one no-op task per worker costs here: the floor of any case
        for _ in range(3):
            t0 = time.perf_counter()
            cluster.run_stage([(w, _warm, ()) for w in workers])
            empty.append(time.perf_counter() - t0)
        for case in args.cases:
            seconds, driver, peer, rss, detail, wrong = [], [], [], [], [], 0
            for rep in range(-1, args.repeat):  # -1: the untimed warm-up
                fill(table, rep)
                calls, expected = stage_calls(args, case, table, workers, page_size // 8)
                s0 = cluster.stats()
                t0 = time.perf_counter()
                out = cluster.run_stage(calls)
                dt = time.perf_counter() - t0
                s1 = cluster.stats()
                wrong += [o[0] for o in out] != expected
                if rep < 0:
                    continue
                seconds.append(dt)
                driver.append(s1["bytes_served_by_driver"] - s0["bytes_served_by_driver"])
                peer.append(s1["bytes_served_by_peers"] - s0["bytes_served_by_peers"])
                w0 = {w["id"]: w for w in s0["workers"]}
                counts = {k: sum(int(w.get(k, 0)) - int(w0.get(w["id"], {}).get(k, 0)) for w in s1["workers"])
                          for k in WORKER_COUNTERS}  # fmt: skip
                detail.append(counts)
                rss.append(max(max(o[1] for o in out), max(int(w.get("rss_bytes", 0)) for w in s1["workers"])))
                progress(f"  {name(config)} {case_name(case, hosts)} {rep + 1}/{args.repeat}: {seconds[-1]:.2f} s, "
                         f"driver {driver[-1] / 2**20:.1f} MiB, peers {peer[-1] / 2**20:.1f} MiB, {counts}")  # fmt: skip
            rows.append(row(name(config), case_name(case, hosts), seconds,
                            bytes_moved=int(statistics.median([d + p for d, p in zip(driver, peer)])),
                            peak_worker_rss=max(rss), wrong_runs=[wrong],
                            note=f"WRONG: {wrong} stages differ from numpy on the driver" if wrong else "",
                            bytes_served_by_driver_runs=driver, bytes_served_by_peers_runs=peer,
                            worker_counters_runs=detail, page_size=page_size, table_bytes=n * 8, hosts=hosts,
                            empty_stage_s_runs=empty, wanted_bytes=want_bytes(args, case, hosts, n * 8)))  # fmt: skip
    return rows


def run_limit(args: argparse.Namespace, hosts: int) -> list[dict]:
    """The limit: a fork pool of ``hosts`` processes (made before the table exists) over
    one ``SharedMemory`` table, running the same tasks (``limits._shm_task``: each process
    attaches the block by name once); per case a warm-up, then the timed repetitions."""
    import multiprocessing
    from multiprocessing import resource_tracker, shared_memory

    n = args.table_mib * 2**20 // 8
    per_page = (args.page_size or 256 << 10) // 8
    resource_tracker.ensure_running()  # one tracker, this process's, shared by the pool
    pool = multiprocessing.get_context("fork").Pool(hosts, initializer=_shm_init)
    block = shared_memory.SharedMemory(name=f"clamor-replication-{os.getpid()}", create=True, size=8 * n)
    rows, table, calls = [], np.ndarray((n,), np.int64, buffer=block.buf), None
    try:
        for case in args.cases:
            seconds, rss, wrong = [], [], 0
            for rep in range(-1, args.repeat):  # -1: the untimed warm-up
                fill(table, rep)
                calls, expected = stage_calls(args, case, table, list(range(hosts)), per_page)
                tasks = [(fn, block.name, n, a[1:]) for _, fn, a in calls]
                t0 = time.perf_counter()
                out = pool.map(_shm_task, tasks, chunksize=1)
                dt = time.perf_counter() - t0
                wrong += [o[0] for o in out] != expected
                if rep >= 0:
                    seconds.append(dt)
                    rss.append(max(o[1] for o in out))
            progress(f"  {limit_name(hosts)} {case_name(case, hosts)}: " + " ".join(f"{x:.2f}" for x in seconds) + " s")
            note = f"WRONG: {wrong} stages differ from numpy" if wrong else "on the driver's host" if args.network else ""
            rows.append(row(limit_name(hosts), case_name(case, hosts), seconds, bytes_moved=0, peak_worker_rss=max(rss),
                            wrong_runs=[wrong], limit=True, hosts=hosts, note=note))  # fmt: skip
    finally:
        table = calls = None  # no view on the block may outlive it
        pool.terminate()
        pool.join()
        block.close()
        block.unlink()
    return rows


def want_bytes(args: argparse.Namespace, case: str, hosts: int, table_bytes: int) -> int | None:
    """For the burst: what the workers read in all (every worker the whole slice)."""
    return hosts * min(table_bytes, args.burst_mib * 2**20) if case == "burst" else None


def child_main(args: argparse.Namespace) -> None:
    """Measure one configuration at one host count; its rows go to ``--child-out``."""
    hosts = args.hosts[0]

    def measure(config: str, rows: harness.Rows) -> None:
        if config == LIMIT:
            rows.extend(run_limit(args, hosts))
            return
        with network.hosts_or_loopback(args.network, hosts) as net:
            rows.extend(run_config(args, config, hosts, net))

    label = limit_name(hosts) if args.child == LIMIT else name(args.child)
    harness.child_main(args.child, args.child_out, [case_name(c, hosts) for c in args.cases], measure, label=label)


def _row(result: dict, config: str, case: str) -> dict | None:
    return next((r for r in result["rows"] if r["system"] == name(config) and r["case"] == case and r["seconds"]),
                None)  # fmt: skip


def _med(result: dict, config: str, case: str, key: str) -> float | None:
    r = _row(result, config, case)
    return None if r is None else statistics.median(r[key])


def off_on(result: dict, case: str, key: str) -> float | None:
    """Median with replication off ÷ median with it on (above 1: replication helps)."""
    off, on = _med(result, "off", case, key), _med(result, "on", case, key)
    return None if off is None or not on else off / on


def mib(x: float | None) -> str:
    return "—" if x is None else f"{x / 2**20:.1f}"


def finish(rows: list[dict]) -> None:
    """After the passes are merged: correctness over every child, the medians of the runs."""
    for r in rows:
        if r["seconds"]:
            r["correct"] = r["checked"] = not sum(r.get("wrong_runs") or [0])
            if r.get("empty_stage_s_runs"):
                r["empty_stage_s"] = statistics.median(r["empty_stage_s_runs"])


def render(result: dict) -> str:
    p = result["params"]
    where = ("over loopback" if p.get("network", "loopback") == "loopback" else
             f"one worker per simulated host, links and driver uplink {p['link_rate']}")
    lines = [
        f"# {result['title']}",
        "",
        (f"Table {p['table_mib']} MiB of int64 in the arena, page size {result.get('page_size') or '?'} B, "
         f"transport tcp, {where}. {p['passes']} passes x {p['repeat']} repetitions, caches cold each."),
        "",
        "| case | configuration | driver served (MiB) | peers served (MiB) | peer fallbacks | empty stage (s) |",
        "|---|---|---:|---:|---:|---:|",
    ]  # fmt: skip
    for r in result["rows"]:
        if r["seconds"] and not r.get("limit"):
            fb = statistics.median([c["peer_fallbacks"] for c in r["worker_counters_runs"]])
            lines.append(f"| {r['case']} | {r['system']} | {mib(statistics.median(r['bytes_served_by_driver_runs']))}"
                         f" | {mib(statistics.median(r['bytes_served_by_peers_runs']))} | {fb:.0f} | "
                         f"{r.get('empty_stage_s', 0):.3f} |")  # fmt: skip
    lines += ["", "| case | off ÷ on: time | off ÷ on: driver traffic |", "|---|---:|---:|"]
    for case, rt in result["ratios"].items():
        t, d = rt["time_off_on"], rt["driver_traffic_off_on"]
        lines.append(f"| {case} | {'n/a' if t is None else f'{t:.2f}×'} | {'n/a' if d is None else f'{d:.2f}×'} |")
    return markdown(result) + "\n" + "\n".join(lines) + "\n"


def _why_slower(result: dict, case: str) -> str:
    """For a missed time goal: both configurations' medians, what each moved, the limit and
    the empty stage, from the rows; the cause beyond them is a hypothesis."""
    on, off = _row(result, "on", case), _row(result, "off", case)
    if on is None or off is None:
        return "not measured (see the rows)"
    text = "; ".join(
        f"{r['system']}: median {statistics.median(r['seconds']):.3f} s, driver served "
        f"{mib(statistics.median(r['bytes_served_by_driver_runs']))} MiB, peers "
        f"{mib(statistics.median(r['bytes_served_by_peers_runs']))} MiB"
        for r in (on, off))  # fmt: skip
    text += f"; an empty stage {on.get('empty_stage_s', 0):.3f} s"
    lim = next((r for r in result["rows"] if r["case"] == case and r.get("limit") and r["seconds"]), None)
    if lim is not None:
        text += f"; {lim['system']}: {statistics.median(lim['seconds']):.3f} s"
    if result["params"].get("network", "loopback") == "loopback":
        text += (". Hypothesis: over loopback no link limits the driver, so serving from peers saves no "
                 "transfer time, while the peers' page serving competes with the tasks for the cores")
    return text

def goals(result: dict, hosts: list[int], cases: list[str], wrong: list[str]) -> list[dict]:
    """Issue 8 (4 hosts): >= 3x less driver traffic, faster. Issue 20 (16 hosts and more):
    >= 5x faster and the driver's bytes at most 1/8 of off, per case."""
    why = f"wrong answers: {', '.join(wrong)}" if wrong else ""
    out = []
    for h in hosts:
        for c in cases:
            case = case_name(c, h)
            rt = result["ratios"][case]
            if h >= 16:
                out.append(goal(f"{case}: >= 5x faster with replication on", rt["time_off_on"], 5.0, why))
                out.append(goal(f"{case}: driver bytes on <= 1/8 of off (off / on >= 8)",
                                rt["driver_traffic_off_on"], 8.0, why))  # fmt: skip
            elif h <= 4:
                out.append(goal(f"{case}: >= 3x less driver traffic with replication on",
                                rt["driver_traffic_off_on"], 3.0, why))  # fmt: skip
                g = goal(f"{case}: faster end to end with replication on (off / on > 1)", rt["time_off_on"], 1.0, why)
                g["met"] = (g["value"] or 0.0) > 1.0  # a tie is not faster
                out.append(g)
    for g in out:
        g["met"] = g["met"] and not wrong
        if not g["met"] and not g["why"]:
            g["why"] = _why_slower(result, g["goal"].split(":")[0])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="10k lookups per task, 2 repetitions")
    ap.add_argument("--repeat", type=int, default=None, help="timed repetitions per case and pass (5; quick 2)")
    ap.add_argument("--passes", type=int, default=None, help="passes over on, off and the limit, A B A B (2; quick 1)")
    ap.add_argument("--hosts", default="4", help="worker counts (one per simulated host), a list: 8,16 (4)")
    ap.add_argument("--cases", default="zipf,burst", help="cases among zipf,burst")
    ap.add_argument("--table-mib", type=int, default=64, help="table size in MiB (64)")
    ap.add_argument("--burst-mib", type=int, default=32, help="the slice every burst task sums, MiB (32)")
    ap.add_argument("--lookups", type=int, default=None, help="lookups per task (20,000)")
    ap.add_argument("--zipf", type=float, default=0.99, help="Zipf exponent over pages (0.99)")
    ap.add_argument("--page-size", type=int, default=0, help="arena page size (default: the arena's)")
    ap.add_argument("--only", default="on,off,limit", help="configurations among on,off,limit")
    ap.add_argument("--wait-idle", type=float, default=60.0, metavar="SECONDS",
                    help="before each child, wait up to SECONDS for the machine to go quiet (60)")
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per configuration and host count")
    network.add_network_argument(ap)
    ap.add_argument("--child", choices=(*CONFIGS, LIMIT), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    try:
        args.hosts = [int(h) for h in args.hosts.split(",") if h.strip()]
    except ValueError:
        ap.error(f"--hosts: not a list of numbers: {args.hosts}")
    if not args.hosts or min(args.hosts) < 1:
        ap.error("--hosts: at least one host")
    args.cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    if bad := [c for c in args.cases if c not in CASES]:
        ap.error(f"unknown case(s) {', '.join(bad)}")
    args.repeat = args.repeat or (2 if args.quick else 5)
    args.passes = args.passes or (1 if args.quick else 2)
    args.lookups = args.lookups or (10_000 if args.quick else 20_000)
    if args.child:
        child_main(args)
        return
    configs = [c.strip() for c in args.only.split(",") if c.strip()]
    if bad := [c for c in configs if c not in (*CONFIGS, LIMIT)]:
        ap.error(f"unknown configuration(s) {', '.join(bad)}")
    network.require(args.network)
    argv = ["--repeat", str(args.repeat), "--table-mib", str(args.table_mib), "--lookups", str(args.lookups),
            "--burst-mib", str(args.burst_mib), "--zipf", str(args.zipf), "--page-size", str(args.page_size or 0),
            "--cases", ",".join(args.cases)]  # fmt: skip
    argv += [f"--network={args.network}"] if args.network else []
    rows: list[dict] = []
    try:
        for h in args.hosts:
            rows += harness.run_all(Path(__file__).resolve(), configs, [*argv, "--hosts", str(h)],
                                    [case_name(c, h) for c in args.cases], args.timeout, args.wait_idle,
                                    label=lambda c, h=h: limit_name(h) if c == LIMIT else name(c),
                                    passes=args.passes)  # fmt: skip
    finally:
        network.sweep_stale()
    finish(rows)
    counts = ", ".join(str(h) for h in args.hosts)
    result: dict[str, Any] = {
        "workload": network.workload("replication", args.network),
        "title": network.title(f"Hot-page replication (Zipf lookups and a burst, {counts} workers): "
                               "replication on vs off", args.network, max(args.hosts)).replace(
                                   f"{max(args.hosts)} simulated hosts", f"{counts} simulated hosts"),
        "quick": args.quick,
        "baseline": name("on"),
        "params": {"table_mib": args.table_mib, "burst_mib": args.burst_mib, "lookups": args.lookups,
                   "zipf": args.zipf, "repeat": args.repeat, "passes": args.passes, "hosts_list": args.hosts, "cases": args.cases,
                   "tasks_per_worker": TASKS_PER_WORKER, "transport": "tcp",
                   **network.params(args.network, max(args.hosts)), "configs": configs},
        "page_size": next((r.get("page_size") for r in rows if r.get("page_size")), None),
        "rows": rows,
    }  # fmt: skip
    result["params"].pop("hosts", None)
    result["ratios"] = {case_name(c, h): {"driver_traffic_off_on": off_on(result, case_name(c, h), "bytes_served_by_driver_runs"),
                                          "time_off_on": off_on(result, case_name(c, h), "seconds")}
                        for h in args.hosts for c in args.cases}  # fmt: skip
    wrong = sorted({r["system"] for r in rows if r.get("correct") is False})
    result["goals"] = goals(result, args.hosts, args.cases, wrong)
    path = save(result)
    print(render(result))
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
