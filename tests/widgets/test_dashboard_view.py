"""The dashboard's status line (widgets/dashboard_view.py): workers, progress, bytes served
and, once anything is cached or kept, the workers' memory against their budgets, on
hand-made snapshots and on a real cluster whose workers spill."""

from __future__ import annotations

import numpy as np
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.observe.snapshots import (
    ClusterSnapshot,
    PageSnapshot,
    WorkerSnapshot,
)
from clamor.widgets.dashboard_view import memory_line, status_line

import clamor

MiB = 1 << 20


def snap(*workers: WorkerSnapshot) -> ClusterSnapshot:
    empty = np.zeros(0, dtype=np.int64)
    pages = PageSnapshot(0, 4096, empty, empty, empty, empty, empty)
    return ClusterSnapshot(seq=1, time=0.0, workers=workers, stages={}, stage_log=(), tasks=(),
                           events=(), pages=pages, totals={}, history=(),
                           lineage=LineageGraph([], []))  # fmt: skip


def test_the_memory_part_sums_the_live_workers_against_their_budgets():
    s = snap(
        WorkerSnapshot(0, True, memory_budget=64 * MiB, partition_bytes=4 * MiB, disk_bytes=2 * MiB,
                       cached_bytes=30 * MiB),
        WorkerSnapshot(1, True, memory_budget=64 * MiB, partition_bytes=12 * MiB, cached_bytes=2 * MiB),
        WorkerSnapshot(2, False),
    )  # fmt: skip
    assert memory_line(s) == (
        "memory: pages 32.0 MiB, partitions 16.0 MiB of 128.0 MiB, 2.0 MiB spilled to disk"
    )
    assert "2 workers (1 lost) · idle · " in status_line(s) and memory_line(s) in status_line(s)


def test_nothing_is_said_of_memory_before_anything_is_cached_or_kept():
    s = snap(WorkerSnapshot(0, True, memory_budget=64 * MiB))
    assert memory_line(s) == "" and "memory" not in status_line(s)


def test_a_real_clusters_snapshot_shows_what_each_worker_keeps_caches_and_spilled():
    # shm-copy: pages land in the workers' caches (zero copy would cache nothing); a
    # copying worker's partitions get a quarter of its budget: 4 MiB for worker 0
    # no straggler handling: on a loaded machine it moved tasks off worker 0, which then
    # kept too little to spill (seen in a fresh-clone run)
    with clamor.Cluster(workers=2, worker_memory={0: 16 * MiB, 1: 48 * MiB}, spill="disk",
                        transport="shm-copy", speculation=False, speculation_factor=1e6) as cluster:
        x = clamor.array(4 * MiB // 8, np.float64)
        x[:] = 1.0
        assert cluster.run(np.sum, x, worker=1) == len(x)  # worker 1 caches x's pages
        ds = cluster.range(0, 12, partitions=12).map_partitions(
            lambda r: np.full(MiB // 8, float(r[0]))).persist()  # fmt: skip
        assert ds.count() == 12 * (MiB // 8)  # worker 0 keeps 4 of its ~6, spills the rest
        workers = {w.id: w for w in cluster.snapshot().workers}
        kept = cluster.partitions()
        for w in (0, 1):
            mine = [p for p in kept.values() if p["holder"] == w]
            assert workers[w].partition_bytes == sum(p["nbytes"] for p in mine if p["tier"] == "memory")
            assert workers[w].disk_bytes == sum(p["nbytes"] for p in mine if p["tier"] == "disk")
            assert workers[w].memory_budget == cluster.budgets.of(w).total
        assert workers[0].partition_bytes <= 4 * MiB and workers[0].disk_bytes > 0
        assert workers[1].cached_bytes >= 4 * MiB
        assert "spilled to disk" in status_line(cluster.snapshot())
