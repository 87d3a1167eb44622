"""The Observer's replies as typed messages: snapshots and stats, to and from the wire.

The kernel builds them (:func:`snapshot_message`, :func:`stats_message`); the notebook
server reads them back (:func:`snapshot_of`, :func:`stats_of`) into the same
:class:`~clamor.runtime.observe.snapshots.ClusterSnapshot` and ``Cluster.stats()`` dict
the views and the REST API read in the kernel. Nothing here unpickles: the server never
runs what a kernel sends it. Per-page counters travel as packed little-endian arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from clamor.runtime.data.lineage_graph import LineageGraph, LineageNode
from clamor.runtime.net.messages import encode_key, worker_stats, worker_stats_message
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.observe.snapshots import (
    ClusterSnapshot,
    PageSnapshot,
    WorkerSnapshot,
)
from clamor.runtime.observe.telemetry import Event, StageRecord, TaskRecord
from clamor.runtime.paging.read_sets import EMPTY, ReadSet, encode
from clamor.runtime.stage import PartitionKey

#: Each per-page array's type on the wire (the pager's own: runtime/paging/pager.py).
PAGE_DTYPES = {"requests": "<u8", "driver_bytes": "<u8", "peer_bytes": "<u8", "holders": "<u4", "version": "<u4"}
#: A stage's progress and a worker's load, as the scheduler's snapshot names them.
_PROGRESS = ("total", "pending", "running", "done", "speculative")
_LOAD = ("running", "tasks_done", "slow", "partition_bytes", "disk_bytes")
#: The entries of ``Cluster.stats()`` with a message of their own; the rest are flat.
_NESTED = ("driver", "scheduler", "workers", "task_streams")
_STREAM = ("sent_messages", "sent_attempts", "received_messages", "received_reports", "transport")


# --- keys: the server never unpickles one ------------------------------------------------


def _key_message(key: PartitionKey) -> pb.PartitionKey:
    """``key`` for a view: a key of another shape than the runtime's (a user's) travels
    as its ``repr`` (the views only show it), never pickled."""
    message = encode_key(key)
    return pb.PartitionKey(kind=repr(key)) if message.pickled else message


def _key_of(message: pb.PartitionKey) -> PartitionKey:
    return (message.kind, *message.numbers)


# --- snapshots -----------------------------------------------------------------------------


def _runs(read_set: Sequence[tuple[int, int]]) -> bytes:
    """A lineage node's read set, packed as runs (runtime/paging/read_sets.py)."""
    if not len(read_set):
        return b""
    found = read_set if isinstance(read_set, ReadSet) else ReadSet.of(read_set)
    return encode(found.pages(), found.versions())


def _lineage_message(graph: LineageGraph) -> pb.LineageGraph:
    nodes = [
        pb.LineageNode(key=_key_message(n.key), dataset=n.dataset, name=n.name, index=n.index, ops=n.ops,
                       persisted=n.persisted, state=n.state, holder=n.holder, epoch=n.epoch,
                       read_runs=_runs(n.read_set))
        for n in graph.nodes
    ]  # fmt: skip
    edges = [pb.LineageEdge(parent=_key_message(p), child=_key_message(c)) for p, c in graph.edges]
    return pb.LineageGraph(nodes=nodes, edges=edges)


def _lineage_of(message: pb.LineageGraph) -> LineageGraph:
    nodes = [
        LineageNode(_key_of(n.key), n.dataset, n.name, n.index, tuple(n.ops), n.persisted, n.state,
                    n.holder if n.HasField("holder") else None, n.epoch if n.HasField("epoch") else None,
                    ReadSet(n.read_runs) if n.read_runs else EMPTY)
        for n in message.nodes
    ]  # fmt: skip
    return LineageGraph(nodes, [(_key_of(e.parent), _key_of(e.child)) for e in message.edges])


def _pages_message(pages: PageSnapshot) -> pb.PageSnapshot:
    arrays = {f: np.ascontiguousarray(getattr(pages, f), dtype=t).tobytes() for f, t in PAGE_DTYPES.items()}
    spans = {name: pb.PageSpan(first=first, end=end) for name, (first, end) in pages.variables.items()}
    return pb.PageSnapshot(first_page=pages.first_page, page_size=pages.page_size, variables=spans, **arrays)


def _pages_of(message: pb.PageSnapshot) -> PageSnapshot:
    arrays = {f: np.frombuffer(getattr(message, f), dtype=t).astype(t[1:]) for f, t in PAGE_DTYPES.items()}
    spans = {name: (s.first, s.end) for name, s in message.variables.items()}
    return PageSnapshot(message.first_page, message.page_size, **arrays, variables=spans)


def _stage_message(r: StageRecord) -> pb.StageRecord:
    return pb.StageRecord(stage=r.stage, name=r.name, tasks=r.tasks, epoch=r.epoch, start=r.start, end=r.end,
                          status=r.status, recompute=r.recompute)  # fmt: skip


def _stage_of(m: pb.StageRecord) -> StageRecord:
    return StageRecord(m.stage, m.name, m.tasks, m.epoch, m.start, m.end if m.HasField("end") else None,
                       m.status, m.recompute)  # fmt: skip


def _task_message(r: TaskRecord) -> pb.TaskRecord:
    return pb.TaskRecord(attempt=r.attempt, stage=r.stage, name=r.name, index=r.index, worker=r.worker,
                         start=r.start, end=r.end, status=r.status, speculative=r.speculative, rerun=r.rerun,
                         recompute=r.recompute)  # fmt: skip


def _task_of(m: pb.TaskRecord) -> TaskRecord:
    return TaskRecord(m.attempt, m.stage, m.name, m.index, m.worker, m.start, m.end if m.HasField("end") else None,
                      m.status, m.speculative, m.rerun, m.recompute)  # fmt: skip


def _event_message(e: Event) -> pb.ClusterEvent:
    return pb.ClusterEvent(time=e.time, kind=e.kind, detail=e.detail, worker=e.worker, stage=e.stage)


def _event_of(m: pb.ClusterEvent) -> Event:
    return Event(m.time, m.kind, m.detail, m.worker if m.HasField("worker") else None,
                 m.stage if m.HasField("stage") else None)  # fmt: skip


def _progress(stages: Mapping[int, Mapping[str, int]]) -> dict[int, pb.StageProgress]:
    return {int(s): pb.StageProgress(**{k: int(v.get(k, 0)) for k in _PROGRESS}) for s, v in stages.items()}


def _progress_of(stages: Mapping[int, pb.StageProgress]) -> dict[int, dict[str, int]]:
    return {s: {k: getattr(v, k) for k in _PROGRESS} for s, v in sorted(stages.items())}


def snapshot_message(snap: ClusterSnapshot) -> pb.ClusterSnapshot:
    """``snap`` as the ``ClusterSnapshot`` message the Observer sends."""
    workers = [pb.WorkerSnapshot(id=w.id, alive=w.alive, running=w.running, tasks_done=w.tasks_done, slow=w.slow,
                                 memory_budget=w.memory_budget, partition_bytes=w.partition_bytes,
                                 disk_bytes=w.disk_bytes, cached_bytes=w.cached_bytes)
               for w in snap.workers]  # fmt: skip
    history = [pb.HistoryPoint(time=t, driver_bytes=d, peer_bytes=p, mapped_bytes=m)
               for t, d, p, m in ((*h, 0)[:4] for h in snap.history)]  # fmt: skip
    return pb.ClusterSnapshot(
        seq=snap.seq, time=snap.time, workers=workers, stages=_progress(snap.stages),
        stage_log=[_stage_message(r) for r in snap.stage_log], tasks=[_task_message(r) for r in snap.tasks],
        events=[_event_message(e) for e in snap.events], pages=_pages_message(snap.pages),
        totals={k: int(v) for k, v in snap.totals.items()}, history=history,
        lineage=_lineage_message(snap.lineage),
    )  # fmt: skip


def snapshot_of(message: pb.ClusterSnapshot) -> ClusterSnapshot:
    """The :class:`ClusterSnapshot` a ``ClusterSnapshot`` message carries."""
    workers = tuple(WorkerSnapshot(w.id, w.alive, w.running, w.tasks_done, w.slow, w.memory_budget,
                                   w.partition_bytes, w.disk_bytes, w.cached_bytes) for w in message.workers)  # fmt: skip
    return ClusterSnapshot(
        seq=message.seq, time=message.time, workers=workers, stages=_progress_of(message.stages),
        stage_log=tuple(map(_stage_of, message.stage_log)), tasks=tuple(map(_task_of, message.tasks)),
        events=tuple(map(_event_of, message.events)), pages=_pages_of(message.pages),
        totals=dict(message.totals),
        history=tuple((h.time, h.driver_bytes, h.peer_bytes, h.mapped_bytes) for h in message.history),
        lineage=_lineage_of(message.lineage),
    )  # fmt: skip


# --- stats ---------------------------------------------------------------------------------


def _flat(entries: Mapping[str, Any], where: str) -> tuple[dict[str, int], dict[str, str]]:
    """Integers and strings, apart (``TypeError`` for anything else)."""
    counters, labels = {}, {}
    for name, value in entries.items():
        if isinstance(value, str):
            labels[name] = value
        elif isinstance(value, int | np.integer):  # bools too
            counters[name] = int(value)
        else:
            raise TypeError(f"{where} entry {name!r} is neither an integer nor a string: {value!r}")
    return counters, labels


def _scheduler_message(state: Mapping[str, Any]) -> pb.SchedulerState:
    flat = {k: v for k, v in state.items() if k not in ("stages", "workers", "speculative")}
    counters, _ = _flat(flat, "scheduler")
    workers = {int(w): pb.WorkerLoad(running=v.get("running", 0), tasks_done=v.get("tasks_done", 0),
                                     slow=bool(v.get("slow")), partition_bytes=v.get("partition_bytes", 0),
                                     disk_bytes=v.get("disk_bytes", 0))
               for w, v in state.get("workers", {}).items()}  # fmt: skip
    return pb.SchedulerState(stages=_progress(state.get("stages", {})), workers=workers,
                             speculative=state.get("speculative", ()), counters=counters)  # fmt: skip


def _scheduler_of(m: pb.SchedulerState) -> dict[str, Any]:
    workers = {w: {k: getattr(v, k) for k in _LOAD} for w, v in sorted(m.workers.items())}
    return {"stages": _progress_of(m.stages), "workers": workers, **m.counters, "speculative": list(m.speculative)}


def _worker_entry(entry: Mapping[str, Any]) -> pb.WorkerEntry:
    message = pb.WorkerEntry(id=entry["id"], pid=entry["pid"], host=entry["host"], address=entry["address"],
                             alive=entry["alive"], error=entry.get("error"), lost=entry.get("lost"))  # fmt: skip
    own = {k: v for k, v in entry.items() if k not in ("host", "address", "alive", "error", "lost")}
    if entry["alive"] and "error" not in entry:
        message.stats.CopyFrom(worker_stats_message(own))
    return message


def _worker_entry_of(m: pb.WorkerEntry) -> dict[str, Any]:
    entry: dict[str, Any] = {"id": m.id, "pid": m.pid, "host": m.host, "address": m.address, "alive": m.alive}
    if m.HasField("stats"):
        entry.update(worker_stats(m.stats), id=m.id, pid=m.pid)
    for name in ("error", "lost"):
        if m.HasField(name):
            entry[name] = getattr(m, name)
    return entry


def stats_message(stats: Mapping[str, Any]) -> pb.ClusterStats:
    """``Cluster.stats()`` as the ``ClusterStats`` message the Observer sends (its flat
    entries must be integers or strings: ``TypeError`` otherwise)."""
    counters, labels = _flat({k: v for k, v in stats.items() if k not in _NESTED}, "stats")
    streams = {int(w): pb.TaskStreamCounters(**{k: s[k] for k in _STREAM if k in s})
               for w, s in stats.get("task_streams", {}).items()}  # fmt: skip
    message = pb.ClusterStats(counters=counters, labels=labels, driver=_flat(stats.get("driver", {}), "driver")[0],
                              workers=[_worker_entry(w) for w in stats.get("workers", ())],
                              task_streams=streams)  # fmt: skip
    if "scheduler" in stats:
        message.scheduler.CopyFrom(_scheduler_message(stats["scheduler"]))
    return message


def stats_of(message: pb.ClusterStats) -> dict[str, Any]:
    """The ``Cluster.stats()`` dict a ``ClusterStats`` message carries."""
    stats: dict[str, Any] = {**message.counters, **message.labels}
    if message.driver:
        stats["driver"] = dict(message.driver)
    if message.HasField("scheduler"):
        stats["scheduler"] = _scheduler_of(message.scheduler)
    stats["workers"] = [_worker_entry_of(w) for w in message.workers]
    stats["task_streams"] = {w: {k: getattr(s, k) for k in _STREAM} for w, s in sorted(message.task_streams.items())}
    return stats
