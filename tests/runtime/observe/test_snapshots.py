"""Snapshots of a real cluster (runtime/observe/snapshots.py): what the views read (docs/user-guide.md, "Live views").

A snapshot calls no worker; its page counters are the driver pager's, its task bars
and events the driver's telemetry. The publisher builds them a few times a second
while something changes and only while somebody subscribes.
"""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from clamor.runtime.cluster import Cluster
from clamor.runtime.observe.snapshots import PAGE_FIELDS
from clamor.runtime.paging import arena
from clamor.runtime.paging.paging_api import NullDriverPaging

import clamor


@pytest.fixture(scope="module")
def cluster():
    # No speculation: a task slowed by a loaded machine (> 50 ms) would get a copy, the
    # copy's result would end the stage, and the original, cancelled but still running,
    # would go on counting page touches after the snapshot was taken.
    with clamor.Cluster(workers=2, speculation=False) as c:
        yield c


@pytest.fixture(scope="module")
def table(cluster):
    with clamor.shared():
        return clamor.asarray(np.arange(1 << 19, dtype=np.float64))  # 4 MiB


def scan(cluster, table, parts: int = 4) -> list[float]:
    k = len(table) // parts
    return cluster.parallelize(list(range(parts)), partitions=parts).map(
        lambda i: float(table[i * k : (i + 1) * k].sum())
    ).collect()


def test_page_counters_are_the_pagers_and_variables_are_named(cluster, table):
    assert sum(scan(cluster, table)) == table.sum()
    cluster.publisher.variables = lambda: {"table": arena.page_span(table, cluster.page_size)}
    try:
        snap = cluster.snapshot()
    finally:
        cluster.publisher.variables = None
    stats = cluster.page_stats()
    for field in PAGE_FIELDS:
        assert np.array_equal(getattr(snap.pages, field), stats[field]), field
    first, end = arena.page_span(table, cluster.page_size)
    assert snap.pages.variables == {"table": (first, end)}
    assert snap.pages.owner(first) == "table" and snap.pages.owner(end) == ""
    mine = snap.pages.select(first, end)
    assert np.array_equal(mine.requests, cluster.page_stats(table)["requests"])
    assert mine.requests.sum() > 0
    # on one host the workers map the table in place (zero copy): nothing is served
    assert snap.totals["bytes_mapped"] >= table.nbytes
    assert snap.totals["bytes_served_by_driver"] + snap.totals["bytes_served_by_peers"] == 0
    assert [w.id for w in snap.workers if w.alive] == cluster.workers


def test_task_bars_cover_every_task_of_a_stage(cluster, table):
    before = cluster.snapshot()
    scan(cluster, table, parts=6)
    snap = cluster.snapshot()
    assert snap.seq > before.seq and not snap.running
    stage = snap.stage_log[-1]
    assert (stage.status, stage.tasks) == ("ok", 6)
    bars = [t for t in snap.tasks if t.stage == stage.stage]
    assert sorted(t.index for t in bars if t.status == "ok") == list(range(6))
    assert {t.worker for t in bars} <= set(cluster.workers)
    assert all(t.start <= t.end <= snap.time for t in bars)


def test_the_publisher_publishes_while_a_stage_runs_and_not_to_nobody(cluster, table):
    publisher = cluster.publisher
    seen = []
    unsubscribe = publisher.subscribe(seen.append)
    try:
        busy = 3 * publisher.interval  # the stage lasts about 6 publishing intervals
        cluster.parallelize(list(range(4)), partitions=4).map(lambda i: time.sleep(busy)).collect()
        time.sleep(2 * publisher.interval)
    finally:
        unsubscribe()
    time.sleep(publisher.interval)  # a snapshot already being built when it unsubscribed
    during = [s for s in seen if s.running]
    assert len(during) >= 2, "snapshots while the stage ran"
    assert [s.seq for s in seen] == sorted(s.seq for s in seen)
    assert not seen[-1].running  # and one after it ended
    count = publisher.published
    cluster.parallelize([1], partitions=1).map(lambda i: time.sleep(0.3)).collect()
    assert publisher.published == count and publisher.subscribers == 0


def test_an_idle_cluster_publishes_nothing_new(cluster):
    seen = []
    unsubscribe = cluster.publisher.subscribe(seen.append)
    try:
        time.sleep(1.0)
    finally:
        unsubscribe()
    assert len(seen) == 1  # the newcomer's first snapshot, then nothing changed


def test_a_failing_subscriber_is_logged_and_the_others_still_get_snapshots(cluster, table, caplog):
    got = threading.Event()

    def broken(snap):
        raise RuntimeError("broken view")

    off1 = cluster.publisher.subscribe(broken)
    off2 = cluster.publisher.subscribe(lambda snap: got.set())
    try:
        scan(cluster, table)
        assert got.wait(5)
    finally:
        off1()
        off2()
    assert "a snapshot subscriber failed" in caplog.text


def test_a_killed_worker_is_an_event_and_its_partitions_are_recomputed():
    with Cluster(3, paging=NullDriverPaging(), timeout=30) as cluster:  # no arena needed
        ds = cluster.parallelize(list(range(60)), partitions=6).map(lambda x: x * x).persist()
        assert ds.count() == 60
        victim = ds.locations()[0]
        held = sum(1 for w in ds.locations() if w == victim)
        cluster.kill_worker(victim)
        assert sorted(ds.collect()) == [x * x for x in range(60)]
        snap = cluster.snapshot()
    lost = [e for e in snap.events if e.kind == "worker_lost"]
    assert [e.worker for e in lost] == [victim]
    assert [w.id for w in snap.workers if not w.alive] == [victim]
    assert any(e.kind == "recompute" for e in snap.events)
    recomputed = [t for t in snap.tasks if t.recompute and t.status == "ok"]
    assert len(recomputed) >= held
    states = [n.state for n in snap.lineage.nodes]
    assert len(states) == 6 and states.count("recomputed") == held
