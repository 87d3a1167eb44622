#!/usr/bin/env python3
"""Hot-page replication: Zipf lookups from 4 workers, replication on vs. off.

    python bench/run.py replication [--quick] [--repeat R] [--only on,off]
                                [--table-mib M] [--lookups L] [--zipf S] [--network [RATE]]

The dynamic-replication figure of the paper (issue 8, DESIGN.md section 9), scaled
down: a table of M MiB of int64 in the arena (``clamor.array``, filled on the driver),
and 4 workers (``clamor.Cluster(workers=4, transport="tcp", replication=...)``), each
running 2 tasks of L lookups. A lookup picks a page by a bounded Zipf law of exponent S
over the table's pages (rank k with probability ~ 1/k^S; ranks are mapped to pages by a
fixed random permutation, so hot pages are scattered) and a random element in it; the
task returns the sum of the values it read. Every worker thus reads the same hot pages:
with replication the driver redirects a request for a page some worker already holds
to that worker (its page server answers), without it the driver serves every fetch.

Per configuration and repetition (a fresh cluster each, start-up not timed; the first
stage imports numpy only): the stage's wall time (end to end: task shipping, page
fetching, lookups, results), ``bytes_served_by_driver`` and ``bytes_served_by_peers``
from ``cluster.stats()``, the workers' ``redirects`` and ``peer_fallbacks``, and the
workers' peak RSS. Reported as ratios off / on: driver traffic and time. Each
configuration runs in its own child process (this script with ``--child``).

Check: every task's sum equals the same lookups done with numpy on the driver.

On loopback TCP (the default) a page from a peer costs about what a page from the
driver does, so the time ratio understates what replication saves when the driver's
link is the bottleneck. ``--network [RATE]`` (``network.py``) is the paper's setting:
each of the 4 workers on its own simulated host (a network namespace) behind a link of
RATE (1gbit), and the driver's uplink shaped to RATE as well, so without replication
every worker's copy of the hot pages squeezes through the driver's one link, while with
it most pages travel host to host in parallel. Writes ``replication-network.json``
(``replication.json`` on loopback).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import network, progress
from harness.results import goal, goal_lines, median, row, save

WORKERS = 4
TASKS_PER_WORKER = 2
CONFIGS = {"on": True, "off": False}
CASE = "zipf lookups"


def name(config: str) -> str:
    return f"replication {config}"


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


def _warm() -> int:
    import os as _os

    import numpy  # noqa: F401

    return _os.getpid()


WORKER_COUNTERS = ("pages_fetched", "from_driver", "from_peers", "redirects", "peer_fallbacks")


def run_config(args: argparse.Namespace, config: str, net: Any = None) -> list[dict]:
    """Measure one configuration (``on`` / ``off``) ``args.repeat`` times (on the
    simulated hosts of ``net``, a ``netns.Network``, in network mode)."""
    import clamor

    n = args.table_mib * 2**20 // 8
    seconds, driver, peer, rss, notes, detail = [], [], [], [], [], []
    ok = True
    page_size = 0
    table = None
    for rep in range(args.repeat):
        kw: dict[str, Any] = {"page_size": args.page_size} if args.page_size else {}
        kw["transport"] = "tcp"
        if net is not None:
            kw.update(network.cluster_options(net))
        with clamor.Cluster(workers=WORKERS, replication=CONFIGS[config], **kw) as cluster:
            page_size = cluster.page_size
            if table is None:
                table = clamor.array(n, np.int64)
                table[:] = (np.arange(n, dtype=np.int64) * 2654435761) % 1_000_003
                per_page = page_size // 8
                seeds = [1000 * w + t for w in range(WORKERS) for t in range(TASKS_PER_WORKER)]
                expected = [int(table[zipf_keys(n, per_page, args.lookups, args.zipf, s)].sum()) for s in seeds]
            cluster.run_stage([(w, _warm, ()) for w in cluster.workers])
            calls = [(i % WORKERS, lookup_task, (table, per_page, args.lookups, args.zipf, s))
                     for i, s in enumerate(seeds)]  # fmt: skip
            s0 = cluster.stats()
            t0 = time.perf_counter()
            out = cluster.run_stage(calls)
            seconds.append(time.perf_counter() - t0)
            s1 = cluster.stats()
            got = [o[0] for o in out]
            if got != expected:
                ok = False
                bad = sum(a != b for a, b in zip(got, expected, strict=True))
                msg = f"WRONG: {bad} of {len(got)} task sums differ from numpy on the driver"
                if msg not in notes:
                    notes.append(msg)
            driver.append(s1["bytes_served_by_driver"] - s0["bytes_served_by_driver"])
            peer.append(s1["bytes_served_by_peers"] - s0["bytes_served_by_peers"])
            w0 = {w["id"]: w for w in s0["workers"]}
            counts = {k: sum(int(w.get(k, 0)) - int(w0.get(w["id"], {}).get(k, 0)) for w in s1["workers"])
                      for k in WORKER_COUNTERS}  # fmt: skip
            detail.append(counts)
            rss.append(max(max(o[1] for o in out), max(int(w.get("rss_bytes", 0)) for w in s1["workers"])))
        progress(f"  {name(config)} {rep + 1}/{args.repeat}: {seconds[-1]:.2f} s, driver {driver[-1] / 2**20:.1f} MiB, "
                 f"peers {peer[-1] / 2**20:.1f} MiB, {counts}")  # fmt: skip
    return [row(name(config), CASE, seconds, bytes_moved=int(statistics.median([d + p for d, p in zip(driver, peer)])),
                peak_worker_rss=max(rss), note="; ".join(notes), correct=ok,
                bytes_served_by_driver=driver, bytes_served_by_peers=peer, worker_counters=detail,
                page_size=page_size, table_bytes=n * 8)]  # fmt: skip


def child_main(args: argparse.Namespace) -> None:
    """Measure one configuration; its rows (or an unavailable row) go to ``--child-out``."""

    def measure(config: str, rows: harness.Rows) -> None:
        with network.hosts_or_loopback(args.network, WORKERS) as net:
            rows.extend(run_config(args, config, net))

    harness.child_main(args.child, args.child_out, (CASE,), measure, label=name(args.child))


def _med(result: dict, config: str, key: str) -> float | None:
    r = next((r for r in result["rows"] if r["system"] == name(config) and r["seconds"]), None)
    return None if r is None else statistics.median(r[key])


def off_on(result: dict, key: str) -> float | None:
    """Median with replication off ÷ median with it on (above 1: replication helps)."""
    off, on = _med(result, "off", key), _med(result, "on", key)
    return None if off is None or not on else off / on


def mib(x: float | None) -> str:
    return "—" if x is None else f"{x / 2**20:.1f}"


def render(result: dict) -> str:
    p = result["params"]
    where = ("over loopback" if p.get("network", "loopback") == "loopback" else
             f"between {WORKERS} simulated hosts, links and driver uplink {p['link_rate']}")
    lines = [
        f"# {result['title']}",
        "",
        (f"Table {p['table_mib']} MiB of int64 in the arena, page size {result.get('page_size') or '?'} B, "
         f"transport tcp {where}; {WORKERS} workers × {TASKS_PER_WORKER} tasks × {p['lookups']:,} lookups, "
         f"pages by bounded Zipf(s = {p['zipf']}); median of {p['repeat']} repetitions (min–max), "
         "a fresh cluster each."),
        "",
        "| configuration | seconds (min–max) | driver served (MiB) | peers served (MiB) | peak worker RSS (MiB) | note |",
        "|---|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for r in result["rows"]:
        s = r["seconds"]
        if not s:
            lines.append(f"| {r['system']} | — | — | — | — | {r['note']} |")
            continue
        lines.append(f"| {r['system']} | {median(s):.3f} ({min(s):.3f}–{max(s):.3f}) | "
                     f"{mib(statistics.median(r['bytes_served_by_driver']))} | "
                     f"{mib(statistics.median(r['bytes_served_by_peers']))} | {mib(r['peak_worker_rss'])} | "
                     f"{r['note']} |")  # fmt: skip
    for r in result["rows"]:
        if r["seconds"]:
            fetched = statistics.median([c["pages_fetched"] for c in r["worker_counters"]])
            pages = r["table_bytes"] / r["page_size"]
            lines.append(f"\n{r['system']}: the workers fetched {fetched:.0f} pages, "
                         f"{100 * fetched / (WORKERS * pages):.0f} % of the table's {pages:.0f} pages on each "
                         "of the 4 workers (on average); 4× is the most replication can save here.")  # fmt: skip
    dr, tr = result["ratios"]["driver_traffic_off_on"], result["ratios"]["time_off_on"]
    lines += ["", (f"Off ÷ on: driver traffic {'n/a' if dr is None else f'{dr:.2f}×'}, "
              f"end-to-end time {'n/a' if tr is None else f'{tr:.2f}×'}."), "", "## Goals", ""]  # fmt: skip
    return "\n".join(lines + goal_lines(result["goals"])) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="a 64 MiB table, 20k lookups per task, 2 repetitions")
    ap.add_argument("--repeat", type=int, default=None)
    ap.add_argument("--table-mib", type=int, default=None, help="table size in MiB (512)")
    ap.add_argument("--lookups", type=int, default=None, help="lookups per task (100,000)")
    ap.add_argument("--zipf", type=float, default=0.99, help="Zipf exponent over pages (0.99)")
    ap.add_argument("--page-size", type=int, default=0, help="arena page size (default: the arena's)")
    ap.add_argument("--only", default="on,off", help="configurations among on,off")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per configuration")
    network.add_network_argument(ap)
    ap.add_argument("--child", choices=tuple(CONFIGS), help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    network.check_rate(ap, args.network)
    args.repeat = args.repeat or (2 if args.quick else 5)
    args.table_mib = args.table_mib or (64 if args.quick else 512)
    args.lookups = args.lookups or (20_000 if args.quick else 100_000)
    if args.child:
        child_main(args)
        return
    configs = [c.strip() for c in args.only.split(",") if c.strip()]
    if bad := [c for c in configs if c not in CONFIGS]:
        ap.error(f"unknown configuration(s) {', '.join(bad)}")
    network.require(args.network)
    argv = ["--repeat", str(args.repeat), "--table-mib", str(args.table_mib), "--lookups", str(args.lookups),
            "--zipf", str(args.zipf), "--page-size", str(args.page_size or 0)]  # fmt: skip
    argv += [f"--network={args.network}"] if args.network else []
    try:
        rows = harness.run_all(Path(__file__).resolve(), configs, argv, (CASE,), args.timeout, label=name)
    finally:
        network.sweep_stale()
    result: dict[str, Any] = {
        "workload": network.workload("replication", args.network),
        "title": network.title("Hot-page replication (Zipf lookups, 4 workers): replication on vs off",
                               args.network, WORKERS),
        "quick": args.quick,
        "baseline": name("on"),
        "params": {"table_mib": args.table_mib, "lookups": args.lookups, "zipf": args.zipf, "repeat": args.repeat,
                   "workers": WORKERS, "tasks_per_worker": TASKS_PER_WORKER, "transport": "tcp",
                   **network.params(args.network, WORKERS), "configs": configs,
                   "command": "python bench/run.py replication" + "".join(f" {a}" for a in sys.argv[1:])},
        "page_size": next((r.get("page_size") for r in rows if r.get("page_size")), None),
        "rows": rows,
    }  # fmt: skip
    result["ratios"] = {"driver_traffic_off_on": off_on(result, "bytes_served_by_driver"),
                        "time_off_on": off_on(result, "seconds")}  # fmt: skip
    wrong = sorted({r["system"] for r in rows if r.get("correct") is False})
    why = f"wrong answers: {', '.join(wrong)}" if wrong else ""
    result["goals"] = [
        goal(">= 3x less driver traffic with replication on", result["ratios"]["driver_traffic_off_on"], 3.0, why),
        goal("faster end to end with replication on (off / on > 1)", result["ratios"]["time_off_on"], 1.0, why),
    ]
    result["goals"][1]["met"] = (result["goals"][1]["value"] or 0.0) > 1.0  # a tie is not faster
    for g in result["goals"]:
        g["met"] = g["met"] and not wrong
    slower = result["goals"][1]
    if not slower["met"] and not slower["why"] and args.network is None and slower["value"]:
        slower["why"] = ("on loopback a page from a peer costs what a page from the driver does, "
                         "and redirects add a round trip; replication pays off when the driver's "
                         "link is the bottleneck: see replication-network")
    save(result)
    print(render(result))


if __name__ == "__main__":
    main()
