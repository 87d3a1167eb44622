"""The result format every peer benchmark writes, and the statistics it reports.

A workload script (``bench/workloads/lookups.py``, ``bench/workloads/kdtree.py``, ...) measures each
system in its own child process (see ``children.py``) and saves one JSON file per
workload with :func:`save`; ``bench/report/summary.py`` turns all of them into
``bench/results/REPORT.md``. Rows hold raw seconds of every repetition, so the
report can show medians *and* spread; ratios are always ``peer / clamor`` of the
medians (above 1: Clamor is faster).

Result layout::

    {"workload": "lookups", "title": "...", "quick": False,
     "params": {...}, "page_size": 262144, "machine": {...}, "commit": "abc123",
     "baseline": "clamor",
     "rows": [{"system": "clamor", "case": "1%", "seconds": [..],
               "bytes_moved": 123, "peak_worker_rss": 456, "note": ""}, ...],
     "goals": [{"goal": "at 1 %: >= 10x faster than every peer", "value": 12.3,
                "target": 10.0, "met": True, "why": ""}],
     "plots": ["lookups.png"]}
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil

from harness.machine import provenance

RESULTS = Path(__file__).resolve().parents[1] / "results"


def row(system: str, case: str, seconds: Iterable[float], *, bytes_moved: int | None = None,
        peak_worker_rss: int | None = None, note: str = "", **extra: Any) -> dict[str, Any]:
    """One measured (system, case): every repetition's seconds and what it moved."""
    return {"system": system, "case": case, "seconds": [float(s) for s in seconds],
            "bytes_moved": bytes_moved, "peak_worker_rss": peak_worker_rss, "note": note, **extra}  # fmt: skip


def unavailable(system: str, case: str, why: str) -> dict[str, Any]:
    """A row for a peer that could not run here (the report says why)."""
    return row(system, case, [], note=f"unavailable: {why}")


def median(seconds: list[float]) -> float | None:
    return statistics.median(seconds) if seconds else None


def median_ci(seconds: list[float], level: float = 0.95) -> tuple[float, float] | None:
    """A distribution-free ``level`` interval of the median: the order statistics
    ``x(j) .. x(n+1-j)`` with the largest ``j`` whose binomial(n, 1/2) tails leave at
    least ``level``. ``None`` below 6 repetitions (no such ``j``: the report says so)."""
    xs, n = sorted(seconds), len(seconds)
    tail, best = 0.0, None
    for j in range(1, n // 2 + 1):  # P(B <= j - 1), B ~ binomial(n, 1/2)
        tail += math.comb(n, j - 1) / 2**n
        if 1 - 2 * tail < level:
            break
        best = j
    return None if best is None else (xs[best - 1], xs[n - best])


def spread(seconds: list[float]) -> tuple[float, float] | None:
    """(min, max) of the repetitions: the variance the report shows."""
    return (min(seconds), max(seconds)) if seconds else None


def ratio(result: dict[str, Any], system: str, case: str, baseline: str = "clamor") -> float | None:
    """``median(system) / median(baseline)`` for ``case`` (above 1: the baseline is faster)."""
    def med(name: str) -> float | None:
        return next((median(r["seconds"]) for r in result["rows"]
                     if r["system"] == name and r["case"] == case and r["seconds"]), None)  # fmt: skip

    a, b = med(system), med(baseline)
    return None if a is None or not b else a / b


def commit_of(result: dict[str, Any]) -> tuple[str, bool | None]:
    """The commit a result measured and whether the tree differed from it (``None``: not
    recorded). A run on a copy of the tree (bench/device) names the tree's commit as
    ``tree_commit``: the copy's own .git can lag it, and the changes it lists are the
    difference from that older commit."""
    if result.get("tree_commit"):
        return result["tree_commit"], False
    return result.get("commit") or "?", result.get("dirty")


def goal(text: str, value: float | None, target: float, why: str = "") -> dict[str, Any]:
    """A goal of the issue: met when ``value >= target`` (values are ratios)."""
    return {"goal": text, "value": value, "target": target,
            "met": value is not None and value >= target, "why": why}  # fmt: skip


def goal_lines(goals: list[dict[str, Any]], digits: int = 2) -> list[str]:
    """The Markdown bullets of a workload's goals: value, met or not, and why."""
    lines = []
    for g in goals:
        v = "n/a" if g["value"] is None else f"{g['value']:.{digits}f}×"
        why = f" ({g['why']})" if g["why"] else ""
        lines.append(f"- {g['goal']}: {v} — {'met' if g['met'] else 'NOT met'}{why}")
    return lines


def process_tree(pid: int) -> list[psutil.Process]:
    """Process ``pid`` and its children (empty if it is gone)."""
    try:
        p = psutil.Process(pid)
        return [p, *p.children(recursive=True)]
    except psutil.Error:
        return []


def rss(p: psutil.Process) -> int:
    """Resident bytes of ``p`` (0 once it is gone)."""
    try:
        return p.memory_info().rss
    except psutil.Error:
        return 0


def tree_rss(pids: Iterable[int]) -> int:
    """Resident bytes of the largest of ``pids`` (with their children): a worker's peak proxy."""
    return max((sum(rss(p) for p in process_tree(pid)) for pid in pids), default=0)


def save(result: dict[str, Any]) -> Path:
    """Write ``results/<workload>.json`` with its provenance added (the commit, whether
    the tree had uncommitted changes, the machine, the command, the versions); its path."""
    result.setdefault("baseline", "clamor")
    result.setdefault("goals", [])
    result.setdefault("plots", [])
    result.update(provenance())
    result["date"] = datetime.datetime.now().isoformat(timespec="seconds")
    suffix = os.environ.get("CLAMOR_BENCH_SUFFIX", "")  # e.g. "-16cores": a run on another machine
    if suffix and not result["workload"].endswith(suffix):
        result["workload"] += suffix
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{result['workload']}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    return path
