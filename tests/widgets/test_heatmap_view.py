"""The page heatmap: bucketing, variable views, colour toggles, and a real cluster's pages."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.observe.snapshots import PAGE_FIELDS, ClusterSnapshot, PageSnapshot
from clamor.widgets.heatmap_view import PageHeatmap, owners

import clamor


def make_snapshot(n: int, first_page: int = 0, variables: dict | None = None, seed: int = 0) -> ClusterSnapshot:
    rng = np.random.default_rng(seed)
    requests = rng.integers(0, 9, n).astype(np.uint64)
    pages = PageSnapshot(
        first_page, 4096, requests, requests * 4096, (requests // 3) * 4096,
        rng.integers(0, 4, n).astype(np.uint32), rng.integers(0, 7, n).astype(np.uint32),
        variables=variables or {},
    )  # fmt: skip
    return ClusterSnapshot(1, time.time(), (), {}, (), (), (), pages, {}, (), LineageGraph([], []))


def test_a_cell_per_page_matches_the_page_arrays():
    snap = make_snapshot(300, first_page=5, variables={"a": (5, 105), "b": (200, 305)})
    view = PageHeatmap(columns=64)
    view.update(snap)
    data = view.source.data
    np.testing.assert_array_equal(data["page"], np.arange(5, 305))
    assert (np.asarray(data["pages"]) == 1).all()
    for field in PAGE_FIELDS:
        np.testing.assert_array_equal(data[field], getattr(snap.pages, field))
    assert data["variable"][0] == "a" and data["variable"][100] == "" and data["variable"][-1] == "b"
    assert data["variable"] == [snap.pages.owner(p) for p in range(5, 305)]
    # row-major: 64 columns, 5 rows; the y range is flipped so row 0 is on top
    assert data["x"][65] == 1 and data["y"][65] == 1
    assert view.figure.x_range.end == 63.5 and view.figure.y_range.start == 4.5
    assert view.hover.tooltips[0] == ("page", "@page")
    assert view.figure.title.text == "arena pages"
    assert "300 pages" in view.totals.text


def test_few_pages_use_fewer_columns():
    view = PageHeatmap(columns=64)
    view.update(make_snapshot(10))
    assert view.figure.x_range.end == 9.5 and view.figure.y_range.start == 0.5


def test_many_pages_are_bucketed_and_keep_their_totals():
    snap = make_snapshot(10_000, variables={"a": (0, 3001), "b": (3001, 9000)})
    view = PageHeatmap(max_cells=4096)
    view.update(snap)
    data = view.source.data
    assert len(data["page"]) == 3334 and (data["pages"][:-1] == 3).all() and data["pages"][-1] == 1
    assert int(data["pages"].sum()) == 10_000
    for field in ("requests", "driver_bytes", "peer_bytes"):
        assert int(data[field].sum()) == int(getattr(snap.pages, field).sum())
    assert data["holders"][0] == snap.pages.holders[:3].max()
    assert data["version"][5] == snap.pages.version[15:18].max()
    assert data["variable"][1000] == "a…b"  # pages 3000-3002 straddle the two
    assert data["variable"][-1] == ""
    assert "@last" in view.hover.tooltips[0][1]
    assert "3 per cell" in view.totals.text


def test_a_variable_view_shows_its_pages_only():
    snap = make_snapshot(100, first_page=10, variables={"a": (10, 40), "b": (40, 90)})
    view = PageHeatmap(variable="b")
    view.update(snap)
    data = view.source.data
    np.testing.assert_array_equal(data["page"], np.arange(40, 90))
    np.testing.assert_array_equal(data["requests"], snap.pages.requests[30:80])
    assert set(data["variable"]) == {"b"}
    assert view.figure.title.text == "pages of b"

    spanned = PageHeatmap(span=(20, 30))
    spanned.update(snap)
    np.testing.assert_array_equal(spanned.source.data["page"], np.arange(20, 30))

    unknown = PageHeatmap(variable="nope")
    unknown.update(snap)
    assert len(unknown.source.data["page"]) == 0
    assert "0 pages" in unknown.summary(snap)


def test_owners_are_found_by_span_search():
    pages = make_snapshot(50, variables={"x": (10, 20), "y": (20, 30)}).pages
    p = np.array([0, 10, 19, 20, 29, 30])
    assert owners(pages, p, p) == ["", "x", "x", "y", "y", ""]
    assert owners(pages, np.array([5, 15]), np.array([12, 25])) == ["x", "x…y"]


def test_the_metric_toggle_swaps_the_colour_field():
    snap = make_snapshot(200)
    view = PageHeatmap()
    view.update(snap)
    assert view.metric == "requests"
    assert view.glyph.fill_color["field"] == "color_requests"
    view.metric = "peer_bytes"
    assert view.toggle.active == 2
    assert view.glyph.fill_color["field"] == "color_peer_bytes"
    assert view.glyph.fill_color["transform"] is view.mappers["peer_bytes"]
    view.metric = "holders"
    assert view.glyph.fill_color["field"] == "color_holders" and view.metric == "holders"
    with pytest.raises(ValueError):
        view.metric = "colour"
    # the browser does the same without Python: the toggle's CustomJS sets the field
    (callback,) = view.toggle.js_property_callbacks["change:active"]
    assert "color_" in callback.code and callback.args["names"][3] == "holders"
    # colour columns: untouched pages are -1, the hottest is 1, the rest in between
    data = view.source.data
    requests = snap.pages.requests
    col = np.asarray(data["color_requests"])
    assert (col[requests == 0] == -1).all()
    assert col[np.argmax(requests)] == pytest.approx(1.0)
    assert ((col[requests > 0] > 0) & (col[requests > 0] <= 1)).all()
    assert set(view.figure.css_classes) >= {"clamor-heatmap"}


def test_summary_names_the_hottest_pages():
    snap = make_snapshot(64, variables={"hot": (4, 12)})
    snap.pages.requests[7] = 1000
    snap.pages.requests[9] = 500
    text = PageHeatmap().summary(snap)
    assert "64 pages" in text
    assert "hottest: page 7 (hot) 1000, page 9 (hot) 500" in text


def test_to_png_draws_the_grid():
    view = PageHeatmap(variable="a")
    png = view.to_png(make_snapshot(5000, variables={"a": (100, 4000)}))
    assert png.startswith(b"\x89PNG") and len(png) > 2000
    assert PageHeatmap().to_png(make_snapshot(0)).startswith(b"\x89PNG")


@pytest.fixture(scope="module")
def cluster():
    # Counters are still once a stage is done: no readahead (every fetch happens inside
    # the stage) and no speculation (a cancelled original may run on after the stage).
    with clamor.Cluster(workers=2, page_size=4096, readahead=False, speculation=False) as c:
        yield c


def test_a_real_stage_shows_up_page_by_page(cluster):
    from jupyter_bokeh import BokehModel

    with clamor.shared():
        arr = clamor.asarray(np.arange(256 * 1024, dtype=np.float64))  # 2 MiB: 512 pages
    span = clamor.runtime.paging.arena.page_span(arr, cluster.page_size)
    cluster.publisher.variables = lambda: {"arr": span}
    k = len(arr) // 8
    sums = cluster.parallelize(range(4), partitions=4).map(lambda i: float(arr[i * k : (i + 1) * k].sum())).collect()
    assert sums == [float(np.arange(i * k, (i + 1) * k).sum()) for i in range(4)]

    snap = cluster.snapshot()
    stats = cluster.page_stats()
    n = len(stats["requests"])  # up to the arena's high-water mark: other tests' arrays too
    whole = PageHeatmap(max_cells=1 << 20)
    whole.update(snap)
    data = whole.source.data
    if n <= 1 << 20:  # a cell per page: the page arrays themselves
        np.testing.assert_array_equal(data["page"], stats["first_page"] + np.arange(n))
        for field in PAGE_FIELDS:
            np.testing.assert_array_equal(data[field], stats[field])
    else:  # buckets of k pages: sums (counters) and maxima (holders, version) of the pages
        k = int(data["pages"][0])
        starts = np.arange(0, n, k)
        np.testing.assert_array_equal(data["page"], stats["first_page"] + starts)
        for field in ("requests", "driver_bytes", "peer_bytes"):
            np.testing.assert_array_equal(data[field], np.add.reduceat(stats[field], starts))
        for field in ("holders", "version"):
            np.testing.assert_array_equal(data[field], np.maximum.reduceat(stats[field], starts))

    for view in (PageHeatmap(variable="arr", span=span), PageHeatmap(variable="arr")):
        view.update(snap)
        mine = cluster.page_stats(arr)
        np.testing.assert_array_equal(view.source.data["page"], np.arange(*span))
        for field in PAGE_FIELDS:
            np.testing.assert_array_equal(view.source.data[field], mine[field])
        assert set(view.source.data["variable"]) == {"arr"}
    requested = np.asarray(view.source.data["requests"]) > 0
    assert requested.sum() >= (span[1] - span[0]) // 2 - 1  # the stage read half the array
    assert "hottest: page" in view.summary(snap) and "(arr)" in view.summary(snap)

    # In a notebook the root is wrapped as an ipywidget; here its comm is a DummyComm.
    widget = BokehModel(view.root)
    bundle = widget.render_bundle
    (doc,) = bundle["docs_json"].values()
    assert bundle["render_items"][0]["root_ids"] == [view.root.id]
    assert view.source.id in json.dumps(doc)
    sent: list = []
    widget.send = lambda content, buffers=None: sent.append(content)
    # the driver writes a page of it: the next stage gives that page a new version (and a
    # worker refetches it), whichever worker runs it (one that cached the rest reads none)
    arr[-1] = -1.0
    cluster.parallelize(range(1), partitions=1).map(lambda i: float(arr[-k:].sum())).collect()
    snap = cluster.snapshot()
    view.update(snap)
    events = [e for c in sent if c.get("payload", "").startswith('{"events"')
              for e in json.loads(c["payload"])["events"]]  # fmt: skip
    data_events = [e for e in events if e["model"]["id"] == view.source.id]
    assert [e["kind"] for e in data_events] == ["ColumnDataChanged"]  # one message per update
    np.testing.assert_array_equal(view.source.data["requests"], cluster.page_stats(arr)["requests"])
    assert (np.asarray(view.source.data["requests"])[-k * 8 // cluster.page_size :] > 0).all()


def test_the_colour_legend_follows_the_metric_and_labels_its_ends():
    """Every colouring has its legend: the palette from just above none (grey cells have
    none) to the most a cell has, titled with the metric and its scale."""
    snap = make_snapshot(300)
    view = PageHeatmap(columns=64)
    assert view.legend.major_label_overrides[1.0] == ""  # nothing yet
    view.update(snap)
    most = int(snap.pages.requests.max())
    assert view.legend.color_mapper is view.mappers["requests"]
    assert view.legend.title == "accesses per cell, log scale (grey: none)"
    assert dict(view.legend.major_label_overrides) == {0.15: "> 0", 1.0: f"{most:,}"}
    view.metric = "driver_bytes"
    assert view.legend.color_mapper is view.mappers["driver_bytes"]
    assert view.legend.major_label_overrides[1.0] == clamor.runtime.paging.arena.format_bytes(most * 4096)
    view.metric = "holders"
    assert view.legend.title == "replication per cell (grey: none)"
    assert view.legend.major_label_overrides[1.0] == str(int(snap.pages.holders.max()))
    assert view.legend in view.figure.below  # drawn under the cells
