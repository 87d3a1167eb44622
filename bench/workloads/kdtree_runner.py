"""What every system of the ``kdtree`` workload is to the child that measures it: the
:class:`Runner` interface (the tree to the workers and a pass over the queries, cold and
steady) and :func:`measure`, the protocol that times a runner into its two rows (the
cases :data:`COLD` and :data:`STEADY`), checking every pass's answer.

The runners are in ``kdtree.py`` (those whose workers run the script's task functions,
which must stay in the child's ``__main__`` to be pickled by value) and
``kdtree_redis.py``.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np
from harness import progress
from harness.results import row
from peers import WORKERS

TASKS = 4 * WORKERS  # the queries are cut into this many tasks
K = 10  # neighbours per query
LEAF = 40  # the KDTree's leaf size
COLD, STEADY = "first pass (cold)", "queries (steady)"
CASES = (COLD, STEADY)


def check_exact(parts: list, ref: tuple[np.ndarray, np.ndarray]) -> tuple[bool, str]:
    """Do the tasks' answers, concatenated, equal the local sklearn query ``ref`` (dist, idx)?"""
    idx = np.concatenate([p[0] for p in parts])
    dist = np.concatenate([p[1] for p in parts])
    if idx.shape != ref[1].shape:
        return False, f"WRONG: shape {idx.shape}, expected {ref[1].shape}"
    bad = int((idx != ref[1]).any(axis=1).sum())
    if bad or not np.allclose(dist, ref[0]):
        return False, f"WRONG: {bad} of {len(idx)} queries differ from a local sklearn query"
    return True, ""


class Runner:
    """One system in a child: ``fresh()`` (untimed) before each cold ``first()`` (timed:
    the tree to the workers and one pass); ``settle()`` (untimed) before the steady
    ``again()`` passes (timed). ``mark()``/``count()`` read counters around a timed call."""

    name = ""
    limit = False

    def __init__(self, points: np.ndarray, queries: np.ndarray) -> None:
        self.chunks = np.array_split(queries, TASKS)
        self.ship: list[float] = []  # seconds of each first pass spent shipping the tree
        self.fields: dict[str, Any] = {}  # row fields common to both cases

    def fresh(self) -> None:
        """Untimed, before each first pass: a state in which the tree is not on the workers."""

    def first(self) -> list:
        raise NotImplementedError

    def again(self) -> list:
        raise NotImplementedError

    def settle(self) -> None:
        """Untimed, before the steady passes: the tree on the workers (if no cold pass put it)."""

    def mark(self) -> None:
        """Untimed, just before a timed call."""

    def count(self, case: str) -> int | None:
        """Untimed, just after a timed call of ``case``: the bytes it moved (None: unknown)."""
        return None

    def check(self, parts: list) -> tuple[bool, str]:
        return check_exact(parts, self.ref)

    def rss(self, parts: list) -> int:
        return max(int(p[2]) for p in parts)

    def close(self) -> None:
        pass



def measure(runner: Runner, args: argparse.Namespace) -> list[dict]:
    """``args.cold`` cold passes (each after an untimed ``fresh()``), then an untimed
    warm-up pass and ``args.repeat`` timed steady passes; both cases' rows."""
    seconds: dict[str, list[float]] = {COLD: [], STEADY: []}
    moved: dict[str, list] = {COLD: [], STEADY: []}
    notes: list[str] = []
    rss: list[int] = []
    ok = True

    def timed(case: str, call: Any) -> None:
        """``call()`` timed for ``case`` (``""``: the warm-up, untimed), then checked."""
        nonlocal ok
        runner.mark()
        t0 = time.perf_counter()
        parts = call()
        if case:
            seconds[case].append(time.perf_counter() - t0)
            moved[case].append(runner.count(case))
        good, why = runner.check(parts)
        ok &= good
        if why and why not in notes:
            notes.append(why)
        rss.append(runner.rss(parts))

    try:
        for rep in range(args.cold):
            runner.fresh()
            timed(COLD, runner.first)
            progress(f"  {runner.name} cold {rep + 1}/{args.cold}: {seconds[COLD][-1]:.3f} s"
                     + (f" (shipping {runner.ship[-1]:.3f} s)" if runner.ship else ""))  # fmt: skip
        runner.settle()
        timed("", runner.again)  # the untimed warm-up pass at full size
        for _ in range(args.repeat):
            timed(STEADY, runner.again)
        progress(f"  {runner.name} steady: " + " ".join(f"{s:.3f}" for s in seconds[STEADY]) + " s")
    finally:
        runner.close()
    if note := runner.fields.pop("release_note", None):
        notes.append(note)
    common = {"peak_worker_rss": max(rss, default=None), "note": "; ".join(notes), "correct": ok,
              "checked": ok, "limit": runner.limit, **runner.fields}  # fmt: skip
    return [row(runner.name, COLD, seconds[COLD], bytes_runs=moved[COLD], ship_runs=runner.ship, **common),
            row(runner.name, STEADY, seconds[STEADY], bytes_runs=moved[STEADY], **common)]  # fmt: skip
