"""What the parent of the ``logreg`` workload makes of the programs' rows once the
passes are merged: every row's losses checked against the reference (:func:`check`),
its statistics (:func:`statistics_of`), and the goals, Clamor against the fastest
program of each peer (:func:`goals`); with the row cases and the goals' targets.
"""

from __future__ import annotations

import statistics

import numpy as np
from harness.results import goal, median_ci, ratio

CASE, EARLY, COLD = "per iteration", "iterations 2-11 (warm-up)", "first iteration (cold)"
CASES = (CASE, EARLY, COLD)
PEERS = ("ray", "dask", "ipyparallel")
#: Goal per peer: its fastest program's median iteration / Clamor's (issue 8's targets).
TARGETS = {"ray": 1.5, "dask": 3.0, "ipyparallel": 3.0}
NETWORK_TARGET = 3.0


def check(rows: list[dict], ref: list[float]) -> None:
    """Mark a row whose losses (every pass's) differ from the reference (rtol 1e-6)."""
    for r in rows:
        got = r.get("losses_runs")
        if not r["seconds"] or got is None:
            continue
        ok = len(got) % len(ref) == 0 and np.allclose(np.reshape(got, (-1, len(ref))), ref,
                                                      rtol=1e-6, atol=1e-12)  # fmt: skip
        r["correct"] = bool(ok)
        if not ok:
            r["note"] = (r["note"] + "; " if r["note"] else "") + (
                f"WRONG: losses {np.round(got, 6).tolist()} != reference {np.round(ref, 6).tolist()}")


def statistics_of(rows: list[dict]) -> None:
    """Each row's median, minimum and 95 % interval of the median (None under 6 values)."""
    for r in rows:
        s = r["seconds"]
        r["median"] = statistics.median(s) if s else None
        r["min"] = min(s) if s else None
        r["ci95"] = median_ci(s) if s else None


def peer_of(system: str) -> str | None:
    return next((peer for peer in PEERS if system == peer or system.startswith(peer + " ")), None)


def fastest(result: dict, peer: str, case: str = CASE) -> dict | None:
    """The row of ``peer``'s program with the lowest median for ``case`` (correct ones only)."""
    rows = [r for r in result["rows"] if peer_of(r["system"]) == peer and r["case"] == case
            and r["seconds"] and r.get("correct", True)]  # fmt: skip
    return min(rows, key=lambda r: r["median"], default=None)


def ms(x: float) -> str:
    return f"{x * 1e3:.1f} ms"


def goals(result: dict, net: str | None) -> list[dict]:
    """Per peer: Clamor's median iteration against the fastest program of that peer (issue 8's
    targets: 1.5x Ray on one host, where Ray's workers map one shared object store, 3x Dask and
    ipyparallel, 3x every peer on a network). The why: both iterations, taken apart."""
    rows = result["rows"]
    c = next((r for r in rows if r["system"] == "clamor" and r["case"] == CASE and r["seconds"]), None)
    limit = next((r for r in rows if r.get("limit") and r["case"] == CASE and r["seconds"]), None)
    out = []
    for peer in PEERS:
        best = fastest(result, peer)
        if best is None and not any(peer_of(r["system"]) == peer for r in rows):
            continue
        target = NETWORK_TARGET if net else TARGETS[peer]
        value = ratio(result, best["system"], CASE) if best and c and c.get("correct", True) else None
        why = "not measured (or a wrong answer)"
        if value is not None:
            read = statistics.median(c["bytes_runs"]) / 1024
            update = statistics.median(c["update_seconds_runs"])
            why = (f"fastest {peer} program: {best['system']}, median {ms(best['median'])} an iteration "
                   f"({statistics.median(best['bytes_runs']) / 1024:.0f} KiB of weights and ids shipped); "
                   f"Clamor's median {ms(c['median'])}: {ms(update)} of it the driver's update of w, "
                   f"{ms(c['median'] - update)} the stage ({read:,.0f} KiB of pages and rows read by the "
                   "workers)")  # fmt: skip
            early = next((r for r in rows if r["system"] == "clamor" and r["case"] == EARLY
                          and r.get("update_seconds_runs")), None)  # fmt: skip
            if early is not None:
                why += (f"; in the warm-up's iterations 2-11 an iteration took {ms(statistics.median(early['seconds']))}, "
                        f"the update {ms(statistics.median(early['update_seconds_runs']))}")  # fmt: skip
            if best.get("update_seconds_runs"):
                peer_update = statistics.median(best["update_seconds_runs"])
                why += f"; the peer's merge and update take {ms(peer_update)}"
            if limit is not None:
                why += (f"; one numpy process takes {ms(limit['median'])} an iteration, so Clamor is "
                        f"{c['median'] / limit['median']:.1f}x it and the peer {best['median'] / limit['median']:.1f}x")
            if value < target:
                per_task = statistics.median(best["bytes_runs"]) / result["params"]["partitions"]
                why += (f"; Hypothesis: with {per_task / 1024:.0f} KiB of ids and weights per task, "
                        "shipping them costs the peer less than Clamor's per-stage fixed cost (control "
                        "plane, a fault or mapping per page, the merge)")  # fmt: skip
        out.append(goal(f"per iteration >= {target:g}x faster than {peer} (its fastest program)",
                        value, target, why))  # fmt: skip
    return out
