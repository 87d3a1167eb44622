"""Read-only snapshots of a cluster, and the thread that publishes them.

A :class:`ClusterSnapshot` is the only thing the views read: per-page counters
(accesses, driver- and peer-served bytes, holders, version, the variable that
owns the page), the attempts and stages the driver saw
(:mod:`clamor.runtime.observe.telemetry`), cluster events, the live lineage graph and a
short history of bytes served. Building one calls no worker: the page counters
come from the driver pager's shared tables, the rest from driver memory.

:class:`Publisher` builds one a few times a second while something changes (a
stage runs, pages are served, a worker is lost) and hands it to its subscribers,
on its own thread; nothing is built while nobody subscribes::

    unsubscribe = cluster.publisher.subscribe(lambda snap: print(snap.totals))

The runtime never imports UI code: widgets subscribe from the outside.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np
from clamor.runtime.data import lineage_graph
from clamor.runtime.data.lineage import LineageStore
from clamor.runtime.observe.telemetry import Event, StageRecord, TaskRecord, Telemetry
from clamor.runtime.paging.paging_api import DriverPaging

logger = logging.getLogger("clamor.snapshots")

#: Names of arena arrays: ``{name: (first page, end page)}``, given by the kernel.
VariableSpans = Mapping[str, tuple[int, int]]


@dataclasses.dataclass(frozen=True)
class PageSnapshot:
    """Per-page arrays for pages ``[first_page, first_page + len)``.

    ``requests``: page requests the driver answered or redirected; ``driver_bytes``
    / ``peer_bytes``: bytes of the page served by the driver / by peer workers;
    ``holders``: workers holding a copy now; ``version``: the page's version;
    ``variables``: the named arrays (``{name: (first, end)}``) among these pages.
    """

    first_page: int
    page_size: int
    requests: np.ndarray
    driver_bytes: np.ndarray
    peer_bytes: np.ndarray
    holders: np.ndarray
    version: np.ndarray
    variables: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.requests)

    def owner(self, page: int) -> str:
        """The name of the variable holding ``page``, or ``""``."""
        for name, (first, end) in self.variables.items():
            if first <= page < end:
                return name
        return ""

    def select(self, first: int, end: int) -> PageSnapshot:
        """The pages ``[first, end)`` only (e.g. one variable's)."""
        lo = max(0, first - self.first_page)
        hi = max(lo, min(len(self), end - self.first_page))
        arrays = {f: getattr(self, f)[lo:hi] for f in PAGE_FIELDS}
        spans = {n: s for n, s in self.variables.items() if s[0] < end and s[1] > first}
        return PageSnapshot(self.first_page + lo, self.page_size, **arrays, variables=spans)


PAGE_FIELDS = ("requests", "driver_bytes", "peer_bytes", "holders", "version")


@dataclasses.dataclass(frozen=True)
class WorkerSnapshot:
    """A worker as the scheduler sees it: ``running`` attempts queued or running there,
    ``tasks_done``, ``slow`` (marked a straggler); lost workers have ``alive`` False.
    Memory, as the driver knows it: the worker's ``memory_budget``, the bytes of the
    partitions it keeps in memory and on its disk, and of the arena pages it caches (by
    the driver's directory)."""

    id: int
    alive: bool
    running: int = 0
    tasks_done: int = 0
    slow: bool = False
    memory_budget: int = 0
    partition_bytes: int = 0
    disk_bytes: int = 0
    cached_bytes: int = 0


@dataclasses.dataclass(frozen=True)
class ClusterSnapshot:
    """Everything the views show, at ``time`` (wall seconds); ``seq`` counts up."""

    seq: int
    time: float
    workers: tuple[WorkerSnapshot, ...]
    stages: dict[int, dict]  # active stages: total / pending / running / done / speculative
    stage_log: tuple[StageRecord, ...]
    tasks: tuple[TaskRecord, ...]
    events: tuple[Event, ...]
    pages: PageSnapshot
    totals: dict[str, int]
    #: (time, driver bytes, peer bytes, bytes mapped in place) so far
    history: tuple[tuple[float, int, int, int], ...]
    lineage: lineage_graph.LineageGraph

    @property
    def running(self) -> bool:
        """Whether a stage is running."""
        return bool(self.stages)


#: Counters copied into ``ClusterSnapshot.totals``.
_TOTALS = ("epoch", "bytes_served_by_driver", "bytes_served_by_peers", "bytes_mapped", "invalidations",
           "version_log_bytes", "arena_bytes")  # fmt: skip


class Observed(Protocol):
    """What a snapshot reads of a cluster (``Cluster`` is one; the lineage graph also reads
    it as a runner: its workers and holders)."""

    lineage: LineageStore

    @property
    def closed(self) -> bool: ...

    @property
    def paging(self) -> DriverPaging: ...

    @property
    def page_size(self) -> int: ...

    @property
    def telemetry(self) -> Telemetry: ...

    @property
    def publisher(self) -> Publisher: ...

    def counters(self) -> dict[str, int]: ...

    def scheduler_snapshot(self) -> dict: ...

    def page_stats(self, var: Any = None) -> dict: ...


def take(cluster: Observed, variables: VariableSpans | None = None, seq: int = 0,
         history: tuple = (), paging: dict | None = None) -> ClusterSnapshot:  # fmt: skip
    """A snapshot of ``cluster`` now (``variables``: see :data:`VariableSpans`;
    ``paging``: the driver pager's ``stats()`` if the caller has just read them)."""
    telemetry = cluster.telemetry
    sched = cluster.scheduler_snapshot()
    paging = cluster.paging.stats() if paging is None else paging
    stats = cluster.page_stats()
    first = int(stats.pop("first_page"))
    spans = {n: (int(a), int(b)) for n, (a, b) in (variables or {}).items()}
    pages = PageSnapshot(first, cluster.page_size, **stats, variables=spans)
    live = sched["workers"]
    events = telemetry.events()
    lost = {e.worker for e in events if e.kind == "worker_lost"} - set(live)
    cached = _cached_bytes(cluster, pages)
    budgets = getattr(cluster, "budgets", None)
    workers = [
        WorkerSnapshot(
            w, True, s["running"], s["tasks_done"], s["slow"],
            memory_budget=budgets.of(w).total if budgets else 0,
            partition_bytes=s.get("partition_bytes", 0),
            disk_bytes=s.get("disk_bytes", 0),
            cached_bytes=cached.get(w, 0),
        )
        for w, s in live.items()
    ] + [WorkerSnapshot(w, False) for w in sorted(lost) if w is not None]
    totals = {k: int(paging.get(k, 0)) for k in _TOTALS}
    totals.update(cluster.counters())
    return ClusterSnapshot(
        seq=seq,
        time=time.time(),
        workers=tuple(sorted(workers, key=lambda w: w.id)),
        stages=dict(sched["stages"]),
        stage_log=tuple(telemetry.stages()),
        tasks=tuple(telemetry.tasks()),
        events=tuple(sorted(events + _recoveries(cluster.lineage.events), key=lambda e: e.time)),
        pages=pages,
        totals=totals,
        history=history,
        lineage=lineage_graph.live_graph(cluster),
    )


def _cached_bytes(cluster: Observed, pages: PageSnapshot) -> dict[int, int]:
    """Worker -> bytes of arena pages it caches, by the driver's directory ({} without one)."""
    cached_bytes = getattr(cluster.paging, "cached_bytes", None)
    if cached_bytes is None or not len(pages):
        return {}
    return cached_bytes(((pages.first_page * pages.page_size, len(pages) * pages.page_size),))


def _recoveries(recoveries: Iterable[dict]) -> list[Event]:
    """Lineage recoveries (``LineageStore.events``) as events."""
    out = []
    for e in list(recoveries):
        if e.get("kind") == "recompute":
            detail = (f"{e['partitions']} partition(s) recomputed in {e['tasks']} task(s), "
                      f"{e['seconds']:.2f} s")  # fmt: skip
            out.append(Event(e["time"], "recompute", detail))
    return out


class Publisher:
    """Publishes snapshots of ``cluster`` to subscribers, on one daemon thread.

    ``interval``: seconds between snapshots while something changes (a stage
    runs, counters move); ``variables``: a callable naming arena arrays (the
    kernel supplies one). A subscriber that raises is logged and kept.
    """

    def __init__(self, cluster: Observed, interval: float = 0.4, history: int = 600) -> None:
        self._cluster = weakref.ref(cluster)  # its thread must not keep the cluster alive
        self.interval = interval
        self.variables: Callable[[], VariableSpans] | None = None
        self._subscribers: dict[int, Callable[[ClusterSnapshot], None]] = {}
        self._ids = itertools.count()
        self._seq = itertools.count(1)
        self._history: deque[tuple[float, int, int, int]] = deque(maxlen=history)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_key: Any = None
        self._closed = False
        #: Snapshots published and the seconds spent building them (overhead bench).
        self.published = 0
        self.build_seconds = 0.0

    def subscribe(self, callback: Callable[[ClusterSnapshot], None]) -> Callable[[], None]:
        """Call ``callback(snapshot)`` on every snapshot from now on; returns the unsubscriber."""
        key = next(self._ids)
        with self._lock:
            self._subscribers[key] = callback
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="clamor-snapshots", daemon=True)
                self._thread.start()
        self._last_key = None  # the newcomer gets a snapshot soon
        self._wake.set()
        return lambda: self._subscribers.pop(key, None)

    @property
    def cluster(self) -> Any:
        cluster = self._cluster()
        if cluster is None:
            raise ReferenceError("the cluster is gone")
        return cluster

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    def snapshot(self) -> ClusterSnapshot:
        """A snapshot now (also recorded in the bytes-served history)."""
        started = time.perf_counter()
        paging = self.cluster.paging.stats()
        point = (time.time(), int(paging.get("bytes_served_by_driver", 0)),
                 int(paging.get("bytes_served_by_peers", 0)), int(paging.get("bytes_mapped", 0)))  # fmt: skip
        with self._lock:
            if not self._history or self._history[-1][1:] != point[1:]:
                self._history.append(point)
            history = tuple(self._history)
        snap = take(self.cluster, self._names(), next(self._seq), history, paging)
        self.build_seconds += time.perf_counter() - started
        return snap

    def _names(self) -> VariableSpans:
        if self.variables is None:
            return {}
        try:
            return self.variables()
        except Exception:
            logger.exception("naming arena variables failed")
            return {}

    def _change_key(self) -> Any:
        """Cheap to compute; differs whenever a new snapshot would (always while a stage
        runs: its running bars grow)."""
        telemetry = self.cluster.telemetry
        if telemetry.active:
            return time.monotonic()
        paging = self.cluster.paging.stats()
        store = self.cluster.lineage
        return (telemetry.version, store.generation, len(store.events),
                paging.get("bytes_served_by_driver"), paging.get("bytes_served_by_peers"),
                paging.get("epoch"), paging.get("invalidations"))  # fmt: skip

    def _run(self) -> None:
        while not self._closed:
            cluster = self._cluster()
            if cluster is None or cluster.closed:
                return
            del cluster
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._subscribers:
                continue
            try:
                key = self._change_key()
                if key == self._last_key:
                    continue
                self._last_key = key
                snap = self.snapshot()
            except Exception:
                logger.debug("snapshot failed", exc_info=True)
                continue
            self.published += 1
            for callback in list(self._subscribers.values()):
                try:
                    callback(snap)
                except Exception:
                    logger.exception("a snapshot subscriber failed")

    def close(self, timeout: float = 5.0) -> None:
        """Stop publishing and wait for a snapshot being built to finish: the cluster
        closes its pager only after this (the thread reads the pager's tables)."""
        self._closed = True
        self._subscribers.clear()
        self._wake.set()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout)
