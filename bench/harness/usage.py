"""What a child measures besides its seconds: its workers' memory and the other load
on the machine while it ran.

- :func:`worker_memory`: (RSS, memory) of the largest worker that ran a stage's tasks,
  read after the stage (the broadcast-table workloads, ``lookups.py``, ``streaming.py``);
- :class:`RssSampler`: the peak RSS of the largest worker, sampled in a thread while the
  system runs (``logreg.py``, ``kmeans.py``);
- :class:`OtherLoad`: the cores that processes not of this child used meanwhile (the
  child's system carries :data:`harness.CHILD_MARKER`).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from harness.children import CHILD_MARKER, busy_seconds, marked_processes
from harness.results import process_tree, rss, tree_rss

#: A worker's own page cache, a memfd: its pages count in RSS only where a task touched
#: them through the mapping, so :func:`worker_memory` adds the part RSS does not show.
PAGE_CACHE = "/memfd:clamor-page-cache"


def _memory(pid: int) -> int:
    """RssAnon + RssFile + max(RssShmem, bytes allocated in the process's page-cache memfd)."""
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Rss"):
            key, value = line.split(":", 1)
            status[key] = int(value.split()[0]) * 1024
    cache = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(PAGE_CACHE):
                cache += os.stat(f"/proc/{pid}/fd/{fd}").st_blocks * 512
    return status.get("RssAnon", 0) + status.get("RssFile", 0) + max(status.get("RssShmem", 0), cache)


def worker_memory(results: Sequence[tuple]) -> tuple[int, int]:
    """(RSS, memory) of the largest worker that ran ``results`` (tasks end with their pid).

    RSS is psutil's (:func:`harness.results.tree_rss`). Memory also counts a Clamor
    worker's page cache in full: the cache is a memfd mapped over the arena, and RSS shows
    only the 4 KiB pieces a task touched through the mapping, not the whole pages fetched
    into it. For every other system the two are the same (less any shared memory RSS
    counted twice).
    """
    pids = {r[-1] for r in results}
    mem = 0
    for pid in pids:  # like tree_rss: the process and its children
        with contextlib.suppress(OSError):
            mem = max(mem, sum(_memory(p.pid) for p in process_tree(pid)))
    return tree_rss(pids), mem


class RssSampler:
    """Peak resident memory of the largest worker (with its children), sampled every 0.1 s
    in a thread while the measured system runs; ``pids`` is set once they are known.

    The process trees are listed again only every :data:`TREE_EVERY` samples: listing a
    process's children reads every ``/proc`` entry (psutil's ppid map), which took a
    quarter of a core in the measured driver's own process, under its GIL."""

    TREE_EVERY = 20

    def __init__(self) -> None:
        self.pids: list[int] = []
        self.peak = 0
        self._trees: list[list[psutil.Process]] = []
        self._samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            self.sample()

    def sample(self) -> int:
        if not self.pids:
            return self.peak
        if self._samples % self.TREE_EVERY == 0 or not self._trees:
            self._trees = [process_tree(pid) for pid in self.pids]
        self._samples += 1
        for tree in self._trees:
            self.peak = max(self.peak, sum(rss(p) for p in tree))
        return self.peak

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return self.sample()


class OtherLoad:
    """Cores used on the machine by processes that are not this child's (its system's
    daemons and workers carry :data:`CHILD_MARKER`), between two snapshots."""

    def __init__(self) -> None:
        self.marker = os.environ.get(CHILD_MARKER)
        self.start = self.snapshot()

    def snapshot(self) -> tuple[float, float, dict[int, float]]:
        own: dict[int, float] = {}
        procs = marked_processes(CHILD_MARKER, self.marker, include_self=True) if self.marker else []
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                own[p.pid] = t.user + t.system + t.children_user + t.children_system
        return time.monotonic(), busy_seconds(), own

    def cores(self) -> float:
        (t0, b0, own0), (t1, b1, own1) = self.start, self.snapshot()
        own = sum(cpu - own0.get(pid, 0.0) for pid, cpu in own1.items())
        return max(0.0, (b1 - b0) - own) / max(t1 - t0, 1e-9)
