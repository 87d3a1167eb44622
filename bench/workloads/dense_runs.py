"""What a system of the ``dense`` workload is to the child that measures it: the
:class:`System` interface every program implements (Clamor's and the limits' in
``dense.py``, the peers' in ``dense_peers.py``), the :class:`Tasks` it runs, and
:class:`Runs`, one case's timed repetitions with the memory, paging counters and bytes
moved around each, made into the case's row; :func:`finish` then gives the parent the
fields every pass's runs give, once the passes are merged.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from harness import progress
from harness.results import median, row, tree_rss
from harness.tables import fmt_bytes
from harness.usage import OtherLoad
from peers import make_table

from workloads.same_host import pss, shmem_bytes

#: Always recorded (0 included): what says whether a pass faulted.
PAGING_KEYS = ("faults", "soft_faults", "pages_mapped", "subpage_maps")


class Tasks(NamedTuple):
    """The task functions of ``dense.py``, handed to every :class:`System` rather than
    imported: defined in the child's ``__main__``, they are pickled by value, so no
    worker needs ``bench/`` on its path (a function of an imported module would be
    pickled by reference)."""

    keys: Callable  # a task's keys from its seed (the values programs draw them on the driver)
    lookups: Callable  # a task: the sum of its looked-up values, and the worker's pid
    sum_values: Callable  # a values program's task: the sum of the values shipped with it
    warm: Callable  # an untimed warm-up task


class System:
    """One system with ``W`` workers: ``fresh`` (untimed) then ``first`` (the put, if any,
    and the tasks) give a first pass; ``again`` the repeat pass; ``write`` one iteration.
    ``tasks``: the task functions it runs."""

    copies = 1  # copies of the table a first pass makes (bytes moved = nbytes x this)
    #: Seconds the last first pass spent making the table available (put, scatter, fill).
    put_s: float | None = None

    def __init__(self, p: dict, tasks: Tasks) -> None:
        self.p, self.w, self.tasks = p, p["workers"], tasks
        self.n = p["table_bytes"] // 8
        self.table: np.ndarray | None = None

    def make_table(self) -> np.ndarray:
        self.table = make_table(self.n, arena=False)
        return self.table

    def fresh(self) -> None:
        """Before a first pass (untimed): drop what the last one made, warm the workers."""

    def first(self, args: list[tuple]) -> list:
        raise NotImplementedError

    def again(self, args: list[tuple]) -> list:
        raise NotImplementedError

    def write(self, key: int, delta: int, args: list[tuple]) -> list:
        """The driver changes one entry; the stage again (timed together)."""
        raise NotImplementedError

    def pids(self, out: list) -> list[int]:
        return sorted({pid for _, pid in out})

    def counters(self) -> dict[str, int] | None:
        return None

    def moved(self) -> int | None:
        return None

    def close(self) -> None:
        pass


# --- measuring, in the child ---------------------------------------------------------------


def changes(before: dict | None, after: dict | None) -> dict[str, int] | None:
    """Counters that changed (and :data:`PAGING_KEYS`, changed or not)."""
    if before is None or after is None:
        return None
    out = {k: v - before.get(k, 0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v or k in PAGING_KEYS}


class Runs:
    """One case's timed repetitions in a child (:meth:`time`), and its row (:meth:`row`)."""

    def __init__(self, s: System, name: str, case: str, fraction: float, per_worker: int, extra: dict) -> None:
        self.s, self.name, self.case, self.fraction, self.per_worker, self.extra = (
            s, name, case, fraction, per_worker, extra)  # fmt: skip
        self.secs: list[float] = []
        self.runs: dict[str, list] = {k: [] for k in ("moved", "rss", "grown", "pss", "paging", "puts")}
        self.problems: list[str] = []
        self.load = OtherLoad()

    def check(self, out: list, want: list[int], what: str) -> None:
        if wrong := [i for i, (v, _) in enumerate(out) if v != want[i]]:
            self.problems.append(f"{what}: wrong sums in tasks {wrong[:5]}")

    def time(self, call: Any, want: list[int], unmoved: int = 0) -> list:
        """``call()`` timed, checked against ``want``; the counters, memory, bytes moved (the
        system's count, else ``unmoved``) and the put, gather or fill it made, untimed."""
        s, r = self.s, self.runs
        c0, m0, shm0 = s.counters(), s.moved(), shmem_bytes()
        s.put_s = None
        t = time.perf_counter()
        out = call()
        self.secs.append(time.perf_counter() - t)
        r["grown"].append(shmem_bytes() - shm0)
        pids = s.pids(out)
        r["pss"].append(pss(pids))
        r["rss"].append(tree_rss(pids))
        r["paging"].append(changes(c0, s.counters()))
        r["moved"].append(s.moved() - m0 if m0 is not None else unmoved)
        r["puts"].append(s.put_s)
        self.check(out, want, f"repetition {len(self.secs)}")
        progress(f"  {self.name} {self.case} {len(self.secs)}: {self.secs[-1]:.3f} s"
                 + (f" (put {s.put_s:.3f} s)" if s.put_s is not None else "")
                 + f", Shmem +{fmt_bytes(r['grown'][-1])}, workers' Pss {fmt_bytes(r['pss'][-1])}"
                 + (f", paging {r['paging'][-1]}" if r["paging"][-1] else ""))  # fmt: skip
        return out

    def row(self, note: str = "") -> dict:
        r = self.runs
        wrong = "WRONG: " + "; ".join(self.problems[:3]) if self.problems else ""
        puts = [x for x in r["puts"] if x is not None]
        return row(self.name, self.case, self.secs, bytes_moved=int(median(r["moved"])),
                   peak_worker_rss=max(r["rss"]), note="; ".join(x for x in (wrong, note) if x),
                   checked=not self.problems, fraction=self.fraction, tasks_per_worker=self.per_worker,
                   shmem_growth=max(r["grown"]), shmem_growth_runs=r["grown"], workers_pss=max(r["pss"]),
                   workers_pss_runs=r["pss"], paging=_most(r["paging"]), paging_runs=r["paging"],
                   put_s=median(puts) if puts else None, put_s_runs=puts, bytes_moved_runs=r["moved"],
                   wrong_runs=[len(self.problems)], other_cores_runs=[self.load.cores()], **self.extra)  # fmt: skip


# --- after the passes merged, in the parent ---------------------------------------------------


def finish(rows: list[dict]) -> None:
    """After the passes are merged (``harness.merge`` keeps the first pass's scalars): the
    fields every pass's runs give."""
    for r in rows:
        if not r["seconds"]:
            continue
        r["checked"] = not sum(r.get("wrong_runs") or [0])
        r["bytes_moved"] = int(median(r["bytes_moved_runs"])) if r.get("bytes_moved_runs") else None
        r["put_s"] = median(r["put_s_runs"]) if r.get("put_s_runs") else None
        r["shmem_growth"] = max(r.get("shmem_growth_runs") or [], default=None)
        r["workers_pss"] = max(r.get("workers_pss_runs") or [], default=None)
        r["paging"] = _most(r.get("paging_runs") or [])
        r["other_cores"] = max(r.get("other_cores_runs") or [], default=None)


def _most(runs: list[dict | None]) -> dict | None:
    """Per counter, the largest change over the runs (for a repeat pass: any new fault shows)."""
    runs = [r for r in runs if r is not None]
    if not runs:
        return None
    return {k: max(r.get(k, 0) for r in runs) for k in dict.fromkeys(k for r in runs for k in r)}

