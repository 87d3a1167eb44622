#!/usr/bin/env python3
"""Persisted partitions beyond a worker's budget: spill to a peer's memory, to disk, or recompute.

    python bench/run.py spill [--quick] [--partitions P] [--passes T] [--rounds N]
                          [--only peer,disk,recompute,memory,shm,numpy] [--timeout S] [--wait-idle S]

R3S's spilling experiment (issue 9; the ``worker_memory`` and ``spill`` options of
docs/user-guide.md), scaled down to one 2-core machine: an iterative job persists a dataset of P partitions of
1 MiB (``cluster.range(0, P, partitions=P).map_partitions(make).persist()``), then
re-reads it pass after pass; a pass is one cheap gradient-style reduction per partition
(the partition as a 16-column matrix times a fixed 16-vector, summed), collected on the
driver. P = 500 (``--quick``: 100), 2 workers.

Budgets, with D = P MiB of data: worker 0 may keep D/4 of partitions and worker 1 3D/4
(``worker_memory`` is that over the partitions' share of a zero-copy worker's budget,
``1 - clamor.runtime.paging.memory.ZERO_COPY_CACHE_SHARE``). They are asymmetric on
purpose: the build splits the partitions about evenly between the two workers, so
with both budgets at D/2 nothing would spill at all. R3S's point is using a peer's
spare memory: worker 0 must spill about a quarter of the data, and worker 1, the
"memory-rich peer", has room for its own half and worker 0's overflow. The split is the
scheduler's, so what worker 0 spills varies a little from child to child; every row
records it per child (``spilled_to_peers_runs``, ``held_runs``, ...).

Modes (rows), each in a fresh cluster in its own child process:

- ``peer`` ("spill to peer", the baseline): ``spill="peer"``: worker 0's overflow goes
  to worker 1's memory;
- ``disk``: ``spill="disk"``, the same budgets: the overflow goes to worker 0's disk
  (written, fdatasync'ed and dropped from the OS page cache, so re-reads hit the disk);
- ``recompute``: Spark's MEMORY_ONLY (recompute on a miss), emulated: only the first
  3P/4 partitions are persisted (what the two budgets hold without a peer's help), and
  a second, non-persisted dataset over the last P/4 is regenerated in every pass (a
  pass is both collects); budgets of 3D/2 each, so nothing spills;
- ``memory`` (a reference, no goal): budgets of 3D/2 each, everything persisted;
- ``shm`` ("limit: shared memory, W processes"): a fork pool of W processes makes the
  partitions into one ``SharedMemory`` block (first pass) and reduces them there;
- ``numpy`` ("limit: numpy, one process"): every partition made and kept in one
  process's memory, then reduced in turn.

The generator costs something to recompute, as re-reading and parsing input would:
``np.random.default_rng(i).standard_normal(MiB // 8)`` then ``tanh`` in place; each
child measures it on the driver (``make_ms_runs``).

Protocol (``harness.run_all``, ``--rounds`` N, 2 by default, A B C A B C ...), per child:
an untimed stage importing numpy on the workers; **first pass (build + persist)**, timed
(bytes moved: what was spilled); one untimed warm-up re-read pass; ``--passes`` T (25;
quick 10) timed **re-read passes** (bytes moved: the median pass's reads from disk and
from the other worker). Rows carry every repetition, the spilled partitions, where each
one ended up, the disk and remote reads per pass, the tasks each worker ran and the peak
worker RSS. Tasks prefer the worker holding their partition, but an idle worker takes a
task from the other one when waiting there would cost more than fetching the partition
(the bulk channel; ``partitions_fetched_from_peers``). Every pass's results are checked
against the same reductions computed on the driver (a wrong answer marks the row and
fails the goals). Goals: disk ÷ peer and recompute ÷ peer of the median re-read pass
above 1; their "why" is generated from the rows. Writes ``bench/results/spill.json``.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import time
from collections import Counter
from pathlib import Path
from typing import Any

import harness
import numpy as np
from harness import progress
from harness.results import goal, ratio, row, save, tree_rss
from harness.tables import markdown
from limits import SharedMemorySession, _shm_view

MiB = 1 << 20
WORKERS = 2
LIMITS = ("shm", "numpy")
MODES = ("peer", "disk", "recompute", "memory", *LIMITS)
LABELS = {"peer": "spill to peer", "disk": "spill to disk", "recompute": "recompute (MEMORY_ONLY)",
          "memory": "all in memory (reference)", "shm": f"limit: shared memory, {WORKERS} processes",
          "numpy": "limit: numpy, one process"}  # fmt: skip
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
    """Build, persist and re-read the dataset in one fresh cluster: the first pass (timed),
    an untimed warm-up re-read pass, then ``args.passes`` timed re-read passes; the two rows
    of ``mode``."""
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

        for t in range(args.passes + 2):  # 0: the first pass; 1: the untimed warm-up
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
            errors = [abs(g - e) / max(abs(e), 1e-300) for g, e in zip(got, expected)]
            if len(got) != p or any(not math.isclose(g, e, rel_tol=RTOL, abs_tol=1e-12) for g, e in zip(got, expected)):
                bad_passes += 1
            worst = max([worst, *errors])
            if t == 1:
                continue
            seconds.append(dt)
            per_pass.append(counts)
            rss.append(max(int(w.get("rss_bytes", 0)) for w in s1.values()))
            if t <= 1 or t == args.passes + 1 or args.passes <= 10 or t % 10 == 0:
                progress(f"  {mode} pass {t}/{args.passes + 1}: {seconds[-1]:.3f} s, "
                         + ", ".join(f"{k} {v}" for k, v in counts.items() if v and any(v if isinstance(v, list) else [v])))  # fmt: skip
        final = by_worker(cluster)
        placement = Counter(f"worker {v['holder']} {v['tier']}" for v in cluster.partitions().values())
        rss.append(max(cluster.run_stage([(w, _maxrss, ()) for w in cluster.workers])))
    spilled = [sum(int(w.get(k, 0)) for w in final.values()) for k in ("spilled_to_peers", "spilled_to_disk")]
    common = {
        "mode": mode, "wrong_runs": [bad_passes], "peak_worker_rss": max(rss), "limit": False,
        "note": "" if not bad_passes else f"WRONG: {bad_passes} of {args.passes + 2} passes differ from the driver",
        "partitions": p, "persisted": n_kept, "recomputed_per_pass": p - n_kept, "partition_bytes": MiB,
        "budgets": budgets(mode, p), "spill": spill, "make_ms_runs": [make_ms], "max_rel_error": worst,
        "spilled_to_peers_runs": [spilled[0]], "spilled_to_disk_runs": [spilled[1]],
        "guests_taken_runs": [sum(int(w.get("guests_taken", 0)) for w in final.values())],
        "placement_runs": [dict(sorted(placement.items()))], "held_runs": [[held.get(w, 0) for w in range(WORKERS)]],
    }  # fmt: skip
    reread = per_pass[1:]
    first = row(LABELS[mode], FIRST, seconds[:1], bytes_moved=sum(spilled) * MiB, counters_runs=per_pass[:1],
                **common)  # fmt: skip
    passes = row(LABELS[mode], PASS, seconds[1:], read_from_disk_runs=[sum(c["read_from_disk"]) for c in reread],
                 remote_reads_runs=[c["remote_reads"] for c in reread],
                 read_from_peers_runs=[sum(c["read_from_peers"]) for c in reread],
                 tasks_per_worker_runs=[[sum(c["tasks_run"][w] for c in reread) for w in range(WORKERS)]],
                 counters_runs=reread, **common)  # fmt: skip
    return [first, passes]


# --- the limits: the same work with no cluster -----------------------------------------------


def _shm_make(a: tuple) -> float:
    """In a pool process: partition ``i`` made into its MiB of the block; its reduction."""
    name, n, i = a
    x = _shm_view(name, n).view(np.float64)[i * (MiB // 8):(i + 1) * (MiB // 8)]
    x[:] = make(range(i, i + 1))
    return gradient(x)[0]


def _shm_gradient(a: tuple) -> float:
    name, n, i = a
    return gradient(_shm_view(name, n).view(np.float64)[i * (MiB // 8):(i + 1) * (MiB // 8)])[0]


def run_limit(args: argparse.Namespace, mode: str) -> list[dict]:
    """``numpy``: every partition made and kept in this process's memory, then reduced in
    turn; ``shm``: a fork pool of W processes making the partitions into one SharedMemory
    block and reducing them there. The first pass, an untimed warm-up pass, the passes."""
    p = args.partitions
    expected, make_ms = expected_values(p)
    session = SharedMemorySession() if mode == "shm" else None
    try:
        if session is not None:
            block = session.shared_memory.SharedMemory(name=f"clamor-spill-{os.getpid()}", create=True,
                                                       size=p * MiB)  # fmt: skip
            session.blocks.append((block, np.ndarray((p * MiB // 8,), np.int64, buffer=block.buf)))
            tasks = [(block.name, p * MiB // 8, i) for i in range(p)]
            pids = [q.pid for q in session.pool._pool]
            first_pass = lambda: session.pool.map(_shm_make, tasks, chunksize=1)
            reread = lambda: session.pool.map(_shm_gradient, tasks, chunksize=1)
        else:
            parts: list[np.ndarray] = []
            pids = [os.getpid()]

            def first_pass() -> list[float]:
                parts[:] = [make(range(i, i + 1)) for i in range(p)]
                return [gradient(x)[0] for x in parts]

            reread = lambda: [gradient(x)[0] for x in parts]
        seconds, bad = [], 0
        for t in range(args.passes + 2):
            t0 = time.perf_counter()
            got = first_pass() if t == 0 else reread()
            if t != 1:
                seconds.append(time.perf_counter() - t0)
            bad += any(not math.isclose(g, e, rel_tol=RTOL, abs_tol=1e-12) for g, e in zip(got, expected))
        rss = tree_rss(pids)
    finally:
        if session is not None:
            session.close()
    common = {"mode": mode, "wrong_runs": [bad], "peak_worker_rss": rss, "limit": True, "partitions": p,
              "make_ms_runs": [make_ms], "note": f"WRONG: {bad} passes differ from the driver" if bad else ""}
    return [row(LABELS[mode], FIRST, seconds[:1], bytes_moved=0, **common),
            row(LABELS[mode], PASS, seconds[1:], bytes_moved=0, **common)]  # fmt: skip


def child_main(args: argparse.Namespace) -> None:
    """Measure one mode; its rows (or unavailable rows) go to ``--child-out``."""

    def measure(mode: str, rows: harness.Rows) -> None:
        rows.extend(run_limit(args, mode) if mode in LIMITS else run_mode(args, mode))

    harness.child_main(args.child, args.child_out, CASES, measure, label=LABELS[args.child])


# --- the parent: the passes merged, ratios, goals, the explanation -------------------------------


def finish(rows: list[dict]) -> None:
    """Fields from every pass's runs (``harness.merge`` keeps the first pass's scalars)."""
    for r in rows:
        if not r["seconds"]:
            continue
        r["total_s"] = sum(r["seconds"])
        r["correct"] = r["checked"] = not sum(r.get("wrong_runs") or [0])
        if r.get("make_ms_runs"):
            r["make_ms"] = statistics.median(r["make_ms_runs"])
        for k in ("spilled_to_peers", "spilled_to_disk", "guests_taken"):
            if r.get(f"{k}_runs"):
                r[k] = statistics.median(r[f"{k}_runs"])
        if r["case"] == PASS and r.get("remote_reads_runs"):
            moved = [d + m for d, m in zip(r["read_from_disk_runs"], r["remote_reads_runs"], strict=True)]
            r["bytes_moved"] = int(statistics.median(moved) * MiB)


def pass_row(result: dict, mode: str) -> dict | None:
    return next((r for r in result["rows"] if r.get("mode") == mode and r["case"] == PASS and r["seconds"]), None)


def over_peer(result: dict, mode: str) -> float | None:
    """Median re-read pass of ``mode`` ÷ that of ``peer`` (above 1: spilling to a peer is faster)."""
    return ratio(result, LABELS[mode], PASS, LABELS["peer"])


def explain(result: dict) -> dict[str, str]:
    """What dominated each mode's re-read passes, from the measured rows: its extra time
    per pass over the all-in-memory reference and what it did that the reference did not.
    One sentence per mode, ``"limit"`` and ``"order"``: the modes by median re-read pass."""
    rows = {m: r for m in MODES if (r := pass_row(result, m)) is not None}
    ref = rows.get("memory")
    base = statistics.median(ref["seconds"]) if ref else None
    parts: dict[str, str] = {}
    for mode, r in rows.items():
        med = statistics.median(r["seconds"])
        if mode in LIMITS:
            continue
        remote, disk = statistics.median(r["remote_reads_runs"]), statistics.median(r["read_from_disk_runs"])
        held = ", ".join("/".join(str(h) for h in run) for run in r["held_runs"])
        extra = None if base is None or mode == "memory" else med - base
        over = "" if extra is None else f", {1e3 * extra:+.0f} ms per pass over all in memory"
        if mode == "memory":
            parts[mode] = (f"all in memory: {1e3 * med:.0f} ms per pass, {1e3 * med / r['partitions']:.2f} ms "
                           f"per partition (task, reduction, collect), partitions held {held} (each child), "
                           f"{remote:.0f} read from the other worker per pass")  # fmt: skip
        elif mode == "peer":
            each = f" (~{1e3 * extra / remote:.1f} ms per remote read)" if extra is not None and remote else ""
            parts[mode] = (f"peer: worker 0 moved {r['spilled_to_peers_runs']} partitions to worker 1's memory "
                           f"({r['spilled_to_disk_runs']} to disk; each child), so the workers held {held}; a "
                           f"pass read a median {remote:.0f} partitions from the other worker (bulk channel)"
                           f"{over}{each}")  # fmt: skip
        elif mode == "disk":
            n = disk + remote
            each = f" (~{1e3 * extra / n:.1f} ms per disk or remote read)" if extra is not None and n else ""
            parts[mode] = (f"disk: {r['spilled_to_disk_runs']} partitions on worker 0's disk (each child; held "
                           f"{held}); a pass read a median {disk:.0f} from disk (page cache dropped) and "
                           f"{remote:.0f} from the other worker{over}{each}")  # fmt: skip
        else:
            n = r["recomputed_per_pass"]
            parts[mode] = (f"recompute: {n} partitions regenerated per pass at {r['make_ms']:.2f} ms each "
                           f"(measured on the driver: {n * r['make_ms'] / WORKERS:.0f} ms per pass over "
                           f"{WORKERS} workers) plus a second stage, {remote:.0f} remote reads{over}")  # fmt: skip
    lim = min((r for m, r in rows.items() if m in LIMITS), key=lambda r: statistics.median(r["seconds"]), default=None)
    if lim is not None:
        parts["limit"] = (f"{lim['system']}: {1e3 * statistics.median(lim['seconds']):.0f} ms per pass, "
                          f"{1e3 * statistics.median(lim['seconds']) / lim['partitions']:.2f} ms per partition")
    ranked = sorted(rows.items(), key=lambda kv: statistics.median(kv[1]["seconds"]))
    parts["order"] = "median re-read pass: " + " < ".join(
        f"{m} {1e3 * statistics.median(r['seconds']):.0f} ms" for m, r in ranked)  # fmt: skip
    return parts


def because(parts: dict[str, str], *modes: str) -> str:
    """The sentences of ``modes`` (and the limit and the ranking), as one text."""
    return "; ".join(parts[m] for m in (*modes, "limit", "order") if m in parts) + "." if parts else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 partitions, 1 pass of 10 re-reads")
    ap.add_argument("--partitions", type=int, default=None, help="partitions of 1 MiB (500)")
    ap.add_argument("--passes", type=int, default=None, help="timed re-read passes per child (25; quick 10)")
    ap.add_argument("--rounds", type=int, default=None,
                    help="rounds over the modes, A B A B, each a fresh child (2; quick 1)")  # fmt: skip
    ap.add_argument("--only", default=",".join(MODES), help=f"modes among {','.join(MODES)}")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per mode")
    ap.add_argument("--wait-idle", type=float, default=0.0, metavar="SECONDS",
                    help="before each mode, wait up to this long for other processes to go quiet")
    ap.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--child-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.partitions = args.partitions or (100 if args.quick else 500)
    args.passes = args.passes or (10 if args.quick else 25)
    args.rounds = args.rounds or (1 if args.quick else 2)
    if args.partitions < 4 or args.passes < 1:
        ap.error("need at least 4 partitions and 1 pass")
    if args.child:
        child_main(args)
        return
    modes = [m.strip() for m in args.only.split(",") if m.strip()]
    if bad := [m for m in modes if m not in MODES]:
        ap.error(f"unknown mode(s) {', '.join(bad)}; choose among {', '.join(MODES)}")
    argv = ["--partitions", str(args.partitions), "--passes", str(args.passes)]
    t0 = time.perf_counter()
    rows = harness.run_all(Path(__file__).resolve(), modes, argv, CASES, args.timeout, args.wait_idle,
                           label=lambda m: LABELS[m], passes=args.rounds)  # fmt: skip
    finish(rows)
    result: dict[str, Any] = {
        "workload": "spill",
        "title": "Spilling persisted partitions (R3S): to a peer's memory vs. to disk vs. recomputing",
        "quick": args.quick,
        "baseline": LABELS["peer"],
        "params": {"partitions": args.partitions, "passes": args.passes, "rounds": args.rounds, "workers": WORKERS,
                   "partition_mib": 1, "modes": [LABELS[m] for m in modes],
                   "limits": [LABELS[m] for m in LIMITS if m in modes], "elapsed_s": time.perf_counter() - t0,
                   "worker_memory": "{0: D/2, 1: 3D/2} (recompute, memory: 3D/2 each), D = partitions MiB"},
        "page_size": None,
        "rows": rows,
    }  # fmt: skip
    result["ratios"] = {f"{m}_over_peer": over_peer(result, m) for m in ("disk", "recompute", "memory")}
    result["why"] = explain(result)
    wrong = sorted({r["system"] for r in rows if r.get("correct") is False})
    wrong_why = f"wrong answers: {', '.join(wrong)}" if wrong else ""
    result["goals"] = [
        goal("disk ÷ peer of the median re-read pass > 1: a peer's memory beats the local disk "
             "(R3S: spilling to remote memory took 41 % of the HDD time and 71 % of the SSD time, "
             "i.e. 2.4x and 1.4x)", result["ratios"]["disk_over_peer"], 1.0,
             wrong_why or because(result["why"], "peer", "disk", "memory")),
        goal("recompute ÷ peer of the median re-read pass > 1: a peer's memory beats recomputing what "
             "does not fit (Spark MEMORY_ONLY; R3S: 29 % less time than Tachyon)",
             result["ratios"]["recompute_over_peer"], 1.0,
             wrong_why or because(result["why"], "peer", "recompute", "memory")),
    ]  # fmt: skip
    for g in result["goals"]:
        g["met"] = (g["value"] or 0.0) > 1.0 and not wrong  # a tie is not faster
    path = save(result)
    print(markdown(result) + "\nWhy:\n\n" + "\n".join(f"- {t}" for t in result["why"].values()))
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
