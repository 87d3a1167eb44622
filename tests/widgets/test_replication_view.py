"""The replication view: driver vs peer bytes over time, and pages per number of holders."""

from __future__ import annotations

import numpy as np
import pytest
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.observe.snapshots import ClusterSnapshot, PageSnapshot
from clamor.widgets.base import COLORS
from clamor.widgets.replication_view import ReplicationView

import clamor


def make_snapshot(history: tuple, totals: tuple[int, int], holders: list[int], requests: list[int],
                  now: float = 120.0) -> ClusterSnapshot:  # fmt: skip
    n = len(holders)
    req = np.array(requests, np.uint64)
    pages = PageSnapshot(0, 4096, req, req * 4096, np.zeros(n, np.uint64),
                         np.array(holders, np.uint32), np.ones(n, np.uint32))  # fmt: skip
    totals_ = {"bytes_served_by_driver": totals[0], "bytes_served_by_peers": totals[1]}
    return ClusterSnapshot(3, now, (), {}, (), (), (), pages, totals_, history, LineageGraph([], []))


def test_history_and_holders_on_a_hand_made_snapshot():
    history = ((100.0, 0, 0), (101.5, 4096, 0), (103.0, 8192, 12288))
    snap = make_snapshot(history, (8192, 12288), holders=[0, 1, 2, 2, 3, 0, 5], requests=[1, 1, 1, 4, 2, 0, 0])
    view = ReplicationView()
    view.update(snap)
    h = view.history_source.data
    np.testing.assert_allclose(h["t"], [0.0, 1.5, 3.0])
    assert list(h["driver"]) == [0, 4096, 8192] and list(h["peers"]) == [0, 0, 12288]
    # only pages ever requested count: the unrequested page with 5 holders is left out
    b = view.holders_source.data
    assert list(b["holders"]) == [0, 1, 2, 3] and list(b["pages"]) == [1, 1, 2, 1]
    assert view.header.text == "peers served 60% of 20.0 KiB"
    assert "clamor-replication" in view.root.css_classes
    colors = {r.glyph.line_color for r in view.history.renderers}
    assert colors == {COLORS["driver"], COLORS["peers"], COLORS["mapped"]}
    assert list(h["mapped"]) == [0, 0, 0]  # an older history: no mapped bytes
    assert view.holders.title.text == ""  # copies are held: nothing to explain
    text = view.summary(snap)
    assert "peers served 60%" in text and "pages requested: 5; by holders 0: 1, 1: 1, 2: 2, 3: 1" in text


def test_a_lagging_or_empty_history_ends_at_the_totals():
    snap = make_snapshot(((100.0, 10, 0),), (50, 30), holders=[1], requests=[1])
    view = ReplicationView()
    view.update(snap)
    h = view.history_source.data
    np.testing.assert_allclose(h["t"], [0.0, 20.0])
    assert list(h["driver"]) == [10, 50] and list(h["peers"]) == [0, 30]

    empty = make_snapshot((), (0, 0), holders=[], requests=[])
    view.update(empty)
    assert list(view.history_source.data["driver"]) == [0] and list(view.holders_source.data["pages"]) == [0]
    assert view.header.text == "no bytes served yet"


def test_to_png_draws_both_charts():
    snap = make_snapshot(((100.0, 0, 0), (102.0, 1 << 20, 3 << 20)), (1 << 20, 3 << 20),
                         holders=[1, 2, 2], requests=[1, 1, 1])  # fmt: skip
    png = ReplicationView().to_png(snap)
    assert png.startswith(b"\x89PNG") and len(png) > 2000


def read_all(a, per_page):
    """Touch every page of ``a`` once (peers serve pages over TCP only, hence the fixture)."""
    return float(a[::per_page].sum())


@pytest.fixture(scope="module")
def cluster():
    with clamor.Cluster(workers=2, page_size=4096, transport="tcp", replication=True) as c:
        yield c


def test_peers_serve_pages_a_worker_already_holds(cluster):
    ps = cluster.page_size
    with clamor.shared():
        arr = clamor.asarray(np.arange(128 * 1024, dtype=np.float64))  # 1 MiB: 256 pages
    per_page = ps // 8
    expected = float(arr[::per_page].sum())
    view = ReplicationView()
    seen: list = []
    unsubscribe = cluster.publisher.subscribe(seen.append)
    try:
        first, second = cluster.workers[:2]
        assert cluster.run(read_all, arr, per_page, worker=first) == expected
        cluster.snapshot()  # a point in the history between the two reads
        assert cluster.run(read_all, arr, per_page, worker=second) == expected  # redirected to `first`
        snap = cluster.snapshot()
    finally:
        unsubscribe()
    view.update(snap)
    h = view.history_source.data
    assert len(h["t"]) >= 2
    for key in ("t", "driver", "peers"):
        assert (np.diff(h[key]) >= 0).all(), key
    assert h["driver"][-1] == snap.totals["bytes_served_by_driver"]
    assert h["peers"][-1] == snap.totals["bytes_served_by_peers"]
    assert h["peers"][-1] > 0  # the second worker got pages from the first

    counts = dict(zip(view.holders_source.data["holders"], view.holders_source.data["pages"]))
    requested = int((snap.pages.requests > 0).sum())
    assert sum(counts.values()) == requested >= 256
    assert counts.get(2, 0) >= 128  # most of the array is now held by both workers
    assert "peers served" in view.summary(snap)
    assert view.to_png(snap).startswith(b"\x89PNG")


def test_on_one_host_the_charts_show_the_pages_mapped_in_place_and_say_why_no_copy_is_held():
    """Workers on the driver's host map its pages: nothing is served and nobody holds a
    copy. The history shows the mapped bytes climb on axes that start at 0, and the
    holders chart says why it has one bar at 0."""
    history = ((100.0, 0, 0, 0), (101.0, 0, 0, 8 << 20), (102.0, 0, 0, 24 << 20))
    snap = make_snapshot(history, (0, 0), holders=[0, 0, 0], requests=[3, 1, 2])
    snap.totals["bytes_mapped"] = 24 << 20
    view = ReplicationView()
    view.update(snap)
    assert list(view.history_source.data["mapped"]) == [0, 8 << 20, 24 << 20]
    assert view.history.y_range.start == 0 and view.history.x_range.start == 0
    assert view.holders.title.text == "mapped in place: no copies"
    assert view.header.text == "no bytes served; mapped in place (zero copy, no replica needed) 24.0 MiB"
    assert view.holders.xaxis.axis_label == "copies held"
