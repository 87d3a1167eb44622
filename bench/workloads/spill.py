#!/usr/bin/env python3
"""Persisted partitions beyond a worker's budget: spill to a peer's memory, to disk, or recompute.

    python bench/run.py spill [--quick] [--partitions P] [--passes T]
                          [--only peer,disk,recompute,memory] [--timeout SECONDS] [--wait-idle SECONDS]

R3S's spilling experiment (issue 9, DESIGN.md section 5, "Memory budgets"), scaled
down to one 2-core machine: an iterative job persists a dataset of P partitions of
1 MiB (``cluster.range(0, P, partitions=P).map_partitions(make).persist()``), then
re-reads it for T passes; a pass is one cheap gradient-style reduction per partition
(the partition as a 16-column matrix times a fixed 16-vector, summed), collected on the
driver. P = 500, T = 50 (``--quick``: P = 100, T = 10), 2 workers.

Budgets, with D = P MiB of data: worker 0 may keep D/4 of partitions and worker 1 3D/4
(``worker_memory`` is that over the partitions' share of a zero-copy worker's budget,
``1 - clamor.runtime.paging.memory.ZERO_COPY_CACHE_SHARE``). They are asymmetric on
purpose: the build splits the partitions about evenly between the two workers, so
with both budgets at D/2 nothing would spill at all. R3S's point is using a peer's
spare memory: worker 0 holds only half of its share and must spill about a quarter
of the data, while worker 1, the "memory-rich peer", has room for its own half and
worker 0's overflow (the cluster's pool holds the whole dataset). The split is the
scheduler's (tasks go to whichever worker is free), so what worker 0 spills varies
a little from run to run; every row reports it.

Modes, each in a fresh cluster in its own child process (this script with ``--child``):

- ``peer``: ``spill="peer"``: worker 0's overflow goes to worker 1's memory;
- ``disk``: ``spill="disk"``, the same budgets: the overflow goes to worker 0's disk
  (written, fdatasync'ed and dropped from the OS page cache, so re-reads hit the disk);
- ``recompute``: Spark's MEMORY_ONLY (recompute on a miss), emulated: only what the
  two budgets hold without a peer's help is persisted, the first 3P/4 partitions
  (worker 0's D/4 and worker 1's own D/2), and a second, non-persisted dataset over
  the last P/4 indices is regenerated in every pass (a pass is both collects).
  Budgets of 3D/2 each, so that nothing spills: the recomputed quarter stands for
  what the per-worker caches would not keep;
- ``memory`` (a reference, no goal): budgets of 3D/2 each, everything persisted and
  nothing spilled, so each worker holds about half the data. What a mode's pass costs
  beyond this one is what its spilling (or recomputing) costs.

The generator costs something to recompute, as re-reading and parsing input would:
``np.random.default_rng(i).standard_normal(MiB // 8)`` then ``tanh`` in place (about
2-3 ms per partition on this VM; each run measures it on the driver and reports it as
``make_ms``).

Per mode, two rows (``common.row``): the first pass (build + persist, after an
untimed stage importing numpy; bytes moved: what was spilled), and the T re-read
passes (every pass's seconds and their total; bytes moved: the median pass's reads
from disk and from the other worker). Also the partitions spilled to peers and to
disk, where each one ended up, the disk reads, the tasks each worker ran, and the
peak worker RSS (the largest of the sampled ``rss_bytes`` and the workers'
``ru_maxrss``). Tasks prefer the worker holding their partition, but an idle worker
takes a task from the other one when waiting there would cost more than fetching the
partition (the bulk channel); each worker counts the partitions it fetched from its
peer (``partitions_fetched_from_peers``). Every pass's
results are checked against the same reductions computed on the driver (a wrong
answer marks the row and fails the goals). Ratios: disk / peer and recompute / peer
of the total re-read time (goals: above 1), and a "why" per mode generated from the
rows. Writes ``bench/results/spill.json`` (``common.save``) and prints a Markdown
summary.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import progress
from harness.results import goal, goal_lines, row, save

MiB = 1 << 20
WORKERS = 2
MODES = ("peer", "disk", "recompute", "memory")
LABELS = {"peer": "spill to peer", "disk": "spill to disk", "recompute": "recompute (MEMORY_ONLY)",
          "memory": "all in memory (reference)"}  # fmt: skip
FIRST = "first pass (build + persist)"
PASS = "re-read pass"
CASES = (FIRST, PASS)
#: The "model" of the gradient-style reduction: a fixed small vector.
WEIGHTS = np.linspace(-1.0, 1.0, 16)
#: Relative tolerance of the check against the driver (the same numpy code on the same
#: data; only a different BLAS kernel could make a difference).
RTOL = 1e-9
COUNTERS = ("tasks_run", "read_from_disk", "read_from_peers", "partitions_fetched_from_peers", "spilled_to_peers",
            "spilled_to_disk", "guests_taken")  # fmt: skip


def make(r: range) -> np.ndarray:
    """Partition ``r`` (a range of one number ``i``): 1 MiB of seeded normals, squashed."""
    import numpy as _np

    z = _np.random.default_rng(r[0]).standard_normal(MiB // 8)
    _np.tanh(z, out=z)
    return z


def gradient(x: np.ndarray) -> list[float]:
    """A pass's work on one partition: ``sum(X @ w)`` with ``X`` the partition as 16 columns."""
    return [float((x.reshape(-1, 16) @ WEIGHTS).sum())]


def _warm() -> int:
    import os as _os

    import numpy  # noqa: F401

    return _os.getpid()


def _maxrss() -> int:
    import resource as _r

    return _r.getrusage(_r.RUSAGE_SELF).ru_maxrss * 1024


def budgets(mode: str, partitions: int) -> dict[int, int]:
    """``worker_memory`` of a mode (see the module docstring)."""
    from clamor.runtime.paging.memory import ZERO_COPY_CACHE_SHARE

    def total(kept_bytes: int) -> int:  # the budget whose partition share is kept_bytes
        return math.ceil(kept_bytes / (1 - ZERO_COPY_CACHE_SHARE))

    d = partitions * MiB
    if mode in ("peer", "disk"):
        return {0: total(d // 4), 1: total(3 * d // 4)}
    return {0: total(3 * d // 4), 1: total(3 * d // 4)}


def kept(mode: str, partitions: int) -> int:
    """How many partitions (the first ones) a mode persists."""
    return 3 * partitions // 4 if mode == "recompute" else partitions


def expected_values(partitions: int) -> tuple[list[float], float]:
    """Every partition's reduction computed on the driver, and the generator's cost (ms each)."""
    values, spent = [], 0.0
    for i in range(partitions):
        t0 = time.perf_counter()
        z = make(range(i, i + 1))
        spent += time.perf_counter() - t0
        values.append(gradient(z)[0])
    return values, 1e3 * spent / partitions


def by_worker(cluster: Any) -> dict[int, dict]:
    return {w["id"]: w for w in cluster.worker_stats()}


def deltas(before: dict[int, dict], after: dict[int, dict]) -> dict[str, list[int]]:
    """Per counter, how much each worker's went up (worker order)."""
    return {k: [int(after[w].get(k, 0)) - int(before.get(w, {}).get(k, 0)) for w in sorted(after)] for k in COUNTERS}


def run_mode(args: argparse.Namespace, mode: str) -> list[dict]:
    """Build, persist and re-read the dataset in one fresh cluster; the two rows of ``mode``."""
    import clamor

    p, n_kept = args.partitions, kept(mode, args.partitions)
    expected, make_ms = expected_values(p)
    progress(f"  {mode}: generator {make_ms:.2f} ms per partition on the driver")
    spill = "peer" if mode == "peer" else "disk"
    seconds: list[float] = []
    per_pass: list[dict[str, Any]] = []
    rss: list[int] = []
    held: Counter = Counter()
    bad_passes, worst = 0, 0.0
    with clamor.Cluster(workers=WORKERS, worker_memory=budgets(mode, p), spill=spill) as cluster:
        cluster.run_stage([(w, _warm, ()) for w in cluster.workers])
        data = cluster.range(0, n_kept, partitions=n_kept).map_partitions(make).persist()
        rest = cluster.range(n_kept, p, partitions=p - n_kept).map_partitions(make) if n_kept < p else None

        def timed(ds: Any) -> tuple[list[float], float]:
            t0 = time.perf_counter()
            out = ds.map_partitions(gradient).collect()
            return list(out), time.perf_counter() - t0

        for t in range(args.passes + 1):
            s0 = by_worker(cluster)
            got, dt = timed(data)
            s1 = by_worker(cluster)
            counts: dict[str, Any] = deltas(s0, s1)
            if t == 0:
                held = Counter(v["holder"] for v in cluster.partitions().values())
            if rest is not None:  # not timed: the stats call between the two collects
                more, dt2 = timed(rest)
                got, dt = got + more, dt + dt2
                s1 = by_worker(cluster)
                counts["recompute_tasks"] = deltas(s0, s1)["tasks_run"]
            counts["remote_reads"] = sum(counts["partitions_fetched_from_peers"])
            seconds.append(dt)
            per_pass.append(counts)
            rss.append(max(int(w.get("rss_bytes", 0)) for w in s1.values()))
            errors = [abs(g - e) / max(abs(e), 1e-300) for g, e in zip(got, expected)]
            if len(got) != p or any(not math.isclose(g, e, rel_tol=RTOL, abs_tol=1e-12) for g, e in zip(got, expected)):
                bad_passes += 1
            worst = max([worst, *errors])
            if t == 0 or t == args.passes or args.passes <= 10 or t % 10 == 0:
                progress(f"  {mode} pass {t}/{args.passes}: {seconds[-1]:.3f} s, "
                         + ", ".join(f"{k} {v}" for k, v in counts.items() if v and any(v if isinstance(v, list) else [v])))  # fmt: skip
        final = by_worker(cluster)
        placement = Counter(f"worker {v['holder']} {v['tier']}" for v in cluster.partitions().values())
        rss.append(max(cluster.run_stage([(w, _maxrss, ()) for w in cluster.workers])))
    ok = bad_passes == 0
    note = "" if ok else f"WRONG: {bad_passes} of {args.passes + 1} passes differ from the driver"
    spilled_peers = sum(int(w.get("spilled_to_peers", 0)) for w in final.values())
    spilled_disk = sum(int(w.get("spilled_to_disk", 0)) for w in final.values())
    reread = per_pass[1:]
    common = {
        "mode": mode, "correct": ok, "note": note, "peak_worker_rss": max(rss),
        "partitions": p, "persisted": n_kept, "recomputed_per_pass": p - n_kept, "partition_bytes": MiB,
        "budgets": budgets(mode, p), "spill": spill, "make_ms": make_ms, "max_rel_error": worst,
        "spilled_to_peers": spilled_peers, "spilled_to_disk": spilled_disk,
        "guests_taken": sum(int(w.get("guests_taken", 0)) for w in final.values()),
        "placement": dict(sorted(placement.items())), "held_per_worker": [held.get(w, 0) for w in range(WORKERS)],
        "partition_budget": {w: int(s.get("partition_budget", 0)) for w, s in final.items()},
    }  # fmt: skip
    disk_reads = [sum(c["read_from_disk"]) for c in reread]
    remote = [c["remote_reads"] for c in reread]
    first = row(LABELS[mode], FIRST, seconds[:1], bytes_moved=(spilled_peers + spilled_disk) * MiB,
                counters=per_pass[0], **common)  # fmt: skip
    passes = row(LABELS[mode], PASS, seconds[1:],
                 bytes_moved=int(statistics.median(disk_reads) + statistics.median(remote)) * MiB,
                 total_s=sum(seconds[1:]), read_from_disk=disk_reads, remote_reads=remote,
                 read_from_peers=[sum(c["read_from_peers"]) for c in reread],
                 tasks_per_worker=[sum(c["tasks_run"][w] for c in reread) for w in range(WORKERS)],
                 counters=reread, **common)  # fmt: skip
    return [first, passes]


def child_main(args: argparse.Namespace) -> None:
    """Measure one mode; its rows (or unavailable rows) go to ``--child-out``."""

    def measure(mode: str, rows: harness.Rows) -> None:
        rows.extend(run_mode(args, mode))

    harness.child_main(args.child, args.child_out, CASES, measure, label=LABELS[args.child])


# --- the parent: ratios, goals, the explanation ------------------------------------------


def pass_row(result: dict, mode: str) -> dict | None:
    return next((r for r in result["rows"] if r.get("mode") == mode and r["case"] == PASS and r["seconds"]), None)


def total_ratio(result: dict, mode: str) -> float | None:
    """Total re-read time of ``mode`` ÷ that of ``peer`` (above 1: spilling to a peer is faster)."""
    a, b = pass_row(result, mode), pass_row(result, "peer")
    return None if a is None or b is None or not b["total_s"] else a["total_s"] / b["total_s"]


def explain(result: dict) -> dict[str, str]:
    """What dominated each mode's re-read passes, from the measured rows: its extra time
    per pass over the all-in-memory reference and what it did that the reference did not.
    One sentence per mode, and ``"order"``: the modes by total re-read time."""
    rows = {m: r for m in MODES if (r := pass_row(result, m)) is not None}
    ref = rows.get("memory")
    base = statistics.median(ref["seconds"]) if ref else None
    parts: dict[str, str] = {}
    for mode, r in rows.items():
        med = statistics.median(r["seconds"])
        remote, disk = statistics.median(r["remote_reads"]), statistics.median(r["read_from_disk"])
        held = " / ".join(str(h) for h in r["held_per_worker"])
        extra = None if base is None or mode == "memory" else med - base
        over = "" if extra is None else f", {1e3 * extra:+.0f} ms per pass over all in memory"
        if mode == "memory":
            parts[mode] = (f"all in memory: {1e3 * med:.0f} ms per pass, {1e3 * med / r['partitions']:.2f} ms "
                         f"per partition (task, reduction, collect), partitions held {held}, "
                         f"{remote:.0f} read from the other worker per pass")  # fmt: skip
        elif mode == "peer":
            each = f" (~{1e3 * extra / remote:.1f} ms per remote read)" if extra is not None and remote else ""
            parts[mode] = (f"peer: worker 0 moved {r['spilled_to_peers']} partitions to worker 1's memory "
                         f"({r['spilled_to_disk']} to disk), so the workers held {held}; to keep both busy "
                         f"a pass read {remote:.0f} partitions from the other worker (bulk channel){over}{each}")  # fmt: skip
        elif mode == "disk":
            n = disk + remote
            each = f" (~{1e3 * extra / n:.1f} ms per disk or remote read)" if extra is not None and n else ""
            parts[mode] = (f"disk: {r['spilled_to_disk']} partitions on worker 0's disk (held {held}); a pass "
                         f"read {disk:.0f} from disk (page cache dropped) and {remote:.0f} from the "
                         f"other worker{over}{each}")  # fmt: skip
        else:
            n = r["recomputed_per_pass"]
            parts[mode] = (f"recompute: {n} partitions regenerated per pass at {r['make_ms']:.2f} ms each "
                         f"(measured on the driver: {n * r['make_ms'] / WORKERS:.0f} ms per pass over "
                         f"{WORKERS} workers) plus a second stage, {remote:.0f} remote reads{over}")  # fmt: skip
    ranked = sorted(rows.items(), key=lambda kv: kv[1]["total_s"])
    parts["order"] = "total re-read time: " + " < ".join(f"{m} {r['total_s']:.2f} s" for m, r in ranked)
    return parts


def because(parts: dict[str, str], *modes: str) -> str:
    """The sentences of ``modes`` (and the ranking), as one text."""
    return "; ".join(parts[m] for m in (*modes, "order") if m in parts) + "." if parts else ""


def render(result: dict) -> str:
    p = result["params"]
    lines = [
        f"# {result['title']}", "",
        (f"{p['partitions']} partitions of 1 MiB, {p['passes']} re-read passes, {WORKERS} workers; "
         f"worker_memory {{0: D/2, 1: 3D/2}} with D = {p['partitions']} MiB (recompute and all in memory: "
         f"3D/2 each; recompute regenerates {p['partitions'] - 3 * p['partitions'] // 4} partitions per pass)."), "",
        ("| mode | first pass | re-read median (min–max) | re-read total | spilled to peer / disk | "
         "disk / remote reads per pass | peak worker RSS (MiB) | generator (ms) | note |"),
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for mode in MODES:
        first = next((r for r in result["rows"] if r.get("mode") == mode and r["case"] == FIRST), None)
        r = pass_row(result, mode)
        if r is None or first is None or not first["seconds"]:
            note = next((x["note"] for x in result["rows"] if x["system"] == LABELS[mode]), "not run")
            lines.append(f"| {LABELS[mode]} | — | — | — | — | — | — | — | {note} |")
            continue
        s = r["seconds"]
        lines.append(
            f"| {LABELS[mode]} | {first['seconds'][0]:.2f} s | {1e3 * statistics.median(s):.0f} ms "
            f"({1e3 * min(s):.0f}–{1e3 * max(s):.0f}) | {r['total_s']:.2f} s | {r['spilled_to_peers']} / "
            f"{r['spilled_to_disk']} | {statistics.median(r['read_from_disk']):.0f} / "
            f"{statistics.median(r['remote_reads']):.0f} | {r['peak_worker_rss'] / MiB:.0f} | "
            f"{r['make_ms']:.2f} | {r['note']} |")  # fmt: skip
    ratios = result["ratios"]
    lines += ["", "Total re-read time ÷ peer: " + ", ".join(
        f"{k.split('_')[0]} {'n/a' if v is None else f'{v:.2f}×'}" for k, v in ratios.items()) + ".",
        "", "Why:", "", *(f"- {t}" for t in result["why"].values()), "", "## Goals", ""]  # fmt: skip
    return "\n".join(lines + goal_lines(result["goals"])) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 partitions, 10 passes")
    ap.add_argument("--partitions", type=int, default=None, help="partitions of 1 MiB (500)")
    ap.add_argument("--passes", type=int, default=None, help="re-read passes after the first (50)")
    ap.add_argument("--only", default=",".join(MODES), help=f"modes among {','.join(MODES)}")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mode")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each mode, wait up to this long for other processes to go quiet")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.partitions = args.partitions or (100 if args.quick else 500)
    args.passes = args.passes or (10 if args.quick else 50)
    if args.partitions < 4 or args.passes < 1:
        ap.error("need at least 4 partitions and 1 pass")
    if args.child:
        child_main(args)
        return
    modes = [m.strip() for m in args.only.split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {', '.join(bad)}; choose among {', '.join(MODES)}")
    argv = ["--partitions", str(args.partitions), "--passes", str(args.passes)]
    rows = harness.run_all(Path(__file__).resolve(), modes, argv, CASES, args.timeout, args.wait_idle,
                           label=lambda m: LABELS[m])
    result: dict[str, Any] = {
        "workload": "spill",
        "title": "Spilling persisted partitions (R3S): to a peer's memory vs. to disk vs. recomputing",
        "quick": args.quick,
        "baseline": LABELS["peer"],
        "params": {"partitions": args.partitions, "passes": args.passes, "workers": WORKERS,
                   "partition_mib": 1, "modes": modes,
                   "worker_memory": "{0: D/2, 1: 3D/2} (recompute, memory: 3D/2 each), D = partitions MiB",
                   "command": "python bench/run.py spill" + "".join(f" {a}" for a in sys.argv[1:])},
        "page_size": None,
        "rows": rows,
    }  # fmt: skip
    result["ratios"] = {f"{m}_over_peer": total_ratio(result, m) for m in ("disk", "recompute", "memory")}
    result["why"] = explain(result)
    wrong = sorted({r["system"] for r in rows if r.get("correct") is False})
    wrong_why = f"wrong answers: {', '.join(wrong)}" if wrong else ""
    result["goals"] = [
        goal("disk / peer of the total re-read time > 1: a peer's memory beats the local disk "
             "(R3S: spilling to remote memory took 41 % of the HDD time and 71 % of the SSD time, "
             "i.e. 2.4x and 1.4x)", result["ratios"]["disk_over_peer"], 1.0,
             wrong_why or because(result["why"], "peer", "disk", "memory")),
        goal("recompute / peer of the total re-read time > 1: a peer's memory beats recomputing what "
             "does not fit (Spark MEMORY_ONLY; R3S: 29 % less time than Tachyon)",
             result["ratios"]["recompute_over_peer"], 1.0,
             wrong_why or because(result["why"], "peer", "recompute", "memory")),
    ]  # fmt: skip
    for g in result["goals"]:
        g["met"] = (g["value"] or 0.0) > 1.0 and not wrong  # a tie is not faster
    save(result)
    print(render(result))


if __name__ == "__main__":
    main()
