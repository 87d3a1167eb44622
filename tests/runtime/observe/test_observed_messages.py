"""The Observer's typed replies (runtime/observe/observed_messages.py): a snapshot and
the cluster's stats round-trip through them as the views and the REST API read them."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
from clamor.runtime.data.lineage_graph import LineageGraph, LineageNode
from clamor.runtime.net.proto import clamor_pb2 as pb
from clamor.runtime.observe import observed_messages as om
from clamor.runtime.observe.snapshots import (
    PAGE_FIELDS,
    ClusterSnapshot,
    PageSnapshot,
    WorkerSnapshot,
)
from clamor.runtime.observe.telemetry import Event, StageRecord, TaskRecord
from clamor.runtime.paging.read_sets import ReadSet


def make_snapshot() -> ClusterSnapshot:
    now = time.time()
    req = np.array([0, 3, 1, 2**40, 0, 5], np.uint64)
    pages = PageSnapshot(
        first_page=100, page_size=4096, requests=req, driver_bytes=req * 7, peer_bytes=req * 3,
        holders=np.array([0, 2, 1, 1, 0, 1024], np.uint32), version=np.array([1, 1, 2, 2, 3, 2**32 - 1], np.uint32),
        variables={"a": (100, 103), "b": (103, 106)},
    )  # fmt: skip
    persisted = LineageNode(("ds", 2, 0), 2, "map", 0, ("parallelize", "map"), True, "held", holder=1, epoch=3,
                            read_set=ReadSet.of([(100, 3), (101, 3), (105, 2)]))  # fmt: skip
    computing = LineageNode(("ds", 3, 0), 3, "filter", 0, ("filter",), False, "not computed")
    return ClusterSnapshot(
        seq=7, time=now,
        workers=(WorkerSnapshot(0, True, 1, 4, True, 8 << 30, 1000, 20, 4096), WorkerSnapshot(1, False)),
        stages={4: {"total": 3, "pending": 1, "running": 1, "done": 1, "speculative": 1}},
        stage_log=(StageRecord(3, "collect: map", 2, 3, now - 2, now - 1, "ok", True),
                   StageRecord(4, "count", 3, 3, now - 0.5, None, "running")),
        tasks=(TaskRecord(9, 3, "collect: map", 0, 0, now - 2, now - 1.5, "ok", rerun=True),
               TaskRecord(10, 4, "count", 1, 1, now - 0.4, None, "running", speculative=True, recompute=True)),
        events=(Event(now - 3, "worker_added", "worker 0 joined", worker=0),
                Event(now - 1, "stage_failed", "ZeroDivisionError", stage=3), Event(now, "recompute", "2 partitions")),
        pages=pages,
        totals={"epoch": 3, "bytes_served_by_driver": 2**45, "tasks_rerun": 1},
        history=((now - 1, 10, 20, 0), (now, 30, 40, 50)),
        lineage=LineageGraph([persisted, computing], [(("ds", 2, 0), ("ds", 3, 0))]),
    )  # fmt: skip


def through_the_wire(snap: ClusterSnapshot) -> ClusterSnapshot:
    reply = pb.QueryReply(snapshot=om.snapshot_message(snap))
    return om.snapshot_of(pb.QueryReply.FromString(reply.SerializeToString()).snapshot)


def test_a_snapshot_round_trips_through_the_typed_messages():
    snap = make_snapshot()
    back = through_the_wire(snap)
    for field in dataclasses.fields(ClusterSnapshot):
        if field.name != "pages":
            assert getattr(back, field.name) == getattr(snap, field.name), field.name
    for field in PAGE_FIELDS:
        mine, theirs = getattr(snap.pages, field), getattr(back.pages, field)
        assert theirs.dtype == mine.dtype and np.array_equal(theirs, mine), field
        theirs[0] = 1  # arrays of its own, writable like the kernel's
    assert (back.pages.first_page, back.pages.page_size, back.pages.variables) == (100, 4096, snap.pages.variables)
    assert back.pages.owner(104) == "b" and back.running
    node = back.lineage.node(("ds", 2, 0))
    assert node.read_set_size == 3 and list(node.read_set) == [(100, 3), (101, 3), (105, 2)]
    assert back.lineage.parents(("ds", 3, 0)) == [("ds", 2, 0)]
    assert back.lineage.to_dict() == snap.lineage.to_dict()


def test_an_empty_snapshot_and_a_users_key_in_the_lineage():
    snap = dataclasses.replace(
        make_snapshot(), stages={}, tasks=(), events=(), history=(),
        pages=PageSnapshot(0, 4096, *(np.zeros(0, np.uint64),) * 3, *(np.zeros(0, np.uint32),) * 2),
        lineage=LineageGraph([LineageNode(("t", "x"), 1, "put", 0, (), True, "held")], []),
    )  # fmt: skip
    back = through_the_wire(snap)
    assert len(back.pages) == 0 and not back.running and back.stages == {}
    # a key of a user's shape reaches the server as its repr: never a pickle to load there
    assert back.lineage.nodes[0].key == ("('t', 'x')",)


def make_stats() -> dict:
    """Shaped like a real ``Cluster.stats()`` (a live worker, one whose Stats failed, a lost one)."""
    worker = {"id": 0, "pid": 11, "host": "127.0.0.1", "address": "127.0.0.1:5", "alive": True,
              "tasks_run": 2, "rss_bytes": 60 << 20, "memory_budget": 9 << 30, "faults": 0, "spill": "peer"}  # fmt: skip
    return {
        "arena_bytes": 2**35, "epoch": 1, "page_size": 2**18, "write_tracking": "async", "tasks_run": 4,
        "driver": {"epoch": 1, "requests": 0, "version_log_bytes": 0},
        "scheduler": {"stages": {5: {"total": 4, "pending": 0, "running": 2, "done": 2, "speculative": 0}},
                      "workers": {0: {"running": 2, "tasks_done": 2, "slow": False, "partition_bytes": 2024,
                                      "disk_bytes": 0}},
                      "partitions": 4, "partition_bytes": 4048, "partitions_on_disk": 0, "limit": 1,
                      "speculative": [17], "tasks_rerun": 0},
        "workers": [worker,
                    {"id": 1, "pid": 12, "host": "h", "address": "h:6", "alive": True, "error": "UNAVAILABLE: x"},
                    {"id": 2, "pid": 13, "host": "h", "address": "h:7", "alive": False, "lost": "killed by signal 9"}],
        "task_streams": {0: {"sent_messages": 1, "sent_attempts": 2, "received_messages": 2,
                             "received_reports": 2, "transport": "unix"}},
    }  # fmt: skip


def test_the_clusters_stats_round_trip_through_the_typed_messages():
    stats = make_stats()
    reply = pb.QueryReply(stats=om.stats_message(stats))
    back = om.stats_of(pb.QueryReply.FromString(reply.SerializeToString()).stats)
    assert back == stats


def test_stats_that_are_neither_numbers_nor_text_are_refused():
    with pytest.raises(TypeError, match="'ratio' is neither an integer nor a string"):
        om.stats_message({"ratio": 0.5, "workers": [], "task_streams": {}})
