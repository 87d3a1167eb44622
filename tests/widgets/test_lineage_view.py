"""The lineage graph view (widgets/lineage_view.py): one node row per partition, datasets as
columns in dependency order, states coloured, big graphs capped, on hand-made graphs; a
persisted dataset on a real cluster before and after one of its holders is killed; the view
inside a ``jupyter_bokeh.BokehModel`` widget with no kernel (a dummy comm)."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
from clamor.runtime.data.lineage_graph import LineageGraph, LineageNode
from clamor.runtime.observe.snapshots import (
    ClusterSnapshot,
    PageSnapshot,
    WorkerSnapshot,
)
from clamor.widgets.base import COLORS
from clamor.widgets.lineage_view import LineageView, depths, layout

import clamor

T0 = 1_700_000_000.0


def snap(graph: LineageGraph) -> ClusterSnapshot:
    empty = np.zeros(0, dtype=np.int64)
    pages = PageSnapshot(0, 4096, empty, empty, empty, empty, empty)
    return ClusterSnapshot(seq=1, time=T0, workers=(WorkerSnapshot(0, True), WorkerSnapshot(1, False)),
                           stages={}, stage_log=(), tasks=(), events=(), pages=pages, totals={},
                           history=(), lineage=graph)  # fmt: skip


def node(ds, i, state="held", name=None, holder=0, reads=3) -> LineageNode:
    computed = state != "not computed"
    return LineageNode(("ds", ds, i), ds, name or f"op{ds}", i, ("parallelize", f"op{ds}"), computed,
                       state, holder if computed else None, 1 if computed else None,
                       tuple((p, 1) for p in range(reads)) if computed else ())  # fmt: skip


def diamond() -> LineageGraph:
    """Source 1 (4 parts) -> 2 (map, 4) and -> 3 (map, 4); 2 and 3 -> 5 (join, 2);
    dataset 4 (2 parts) is a second source of 5. Depths: 1, 4 -> 0; 2, 3 -> 1; 5 -> 2."""
    states = {(2, 1): "lost", (3, 2): "recomputed"}
    nodes = [node(1, i, "not computed") for i in range(4)]
    nodes += [node(d, i, states.get((d, i), "held")) for d in (2, 3) for i in range(4)]
    nodes += [node(4, i) for i in range(2)] + [node(5, i, name="join") for i in range(2)]
    edges = [(("ds", 1, i), ("ds", d, i)) for d in (2, 3) for i in range(4)]
    edges += [(("ds", d, i), ("ds", 5, j)) for d in (2, 3, 4) for i in range(4 if d != 4 else 2)
              for j in range(2)]  # fmt: skip
    return LineageGraph(nodes, edges)


def rows(source) -> list[dict]:
    data = source.data
    return [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]


# --- hand-made graphs -----------------------------------------------------------------------


def test_one_node_row_per_partition_with_the_node_fields():
    graph = diamond()
    view = LineageView()
    view.update(snap(graph))
    got = rows(view.nodes_source)
    assert sorted(r["id"] for r in got) == sorted(n.id for n in graph.nodes) and len(got) == 16
    lost = next(r for r in got if r["id"] == "2:1")
    assert (lost["dataset"], lost["index"], lost["state"], lost["holder"], lost["epoch"]) == (2, 1, "lost", 0, 1)
    assert lost["read_set_size"] == 3 and lost["ops"] == "parallelize > op2"
    required = {"id", "dataset", "name", "index", "state", "holder", "epoch", "read_set_size",
                "ops", "x", "y", "color"}  # fmt: skip
    assert required <= set(view.nodes_source.data)
    assert len(view.edges_source.data["xs"]) == len(graph.edges) == 28
    assert "16 partitions in 5 datasets" in view.figure.title.text


def test_colours_by_state_and_lost_and_recomputed_stand_out():
    view = LineageView()
    view.update(snap(diamond()))
    by_id = {r["id"]: r for r in rows(view.nodes_source)}
    assert by_id["2:0"]["color"] == COLORS["held"]
    assert by_id["2:1"]["color"] == COLORS["lost"] and by_id["2:1"]["line_color"] == "#E00000"
    assert by_id["3:2"]["color"] == COLORS["recomputed"]
    assert by_id["1:0"]["color"] == COLORS["not computed"] and by_id["1:0"]["holder_label"] == "-"
    for special in ("2:1", "3:2"):
        assert by_id[special]["size"] > by_id["2:0"]["size"]
        assert by_id[special]["line_width"] > by_id["2:0"]["line_width"]
    recomputed_edges = [c for c in view.edges_source.data["color"] if c == COLORS["recomputed"]]
    assert len(recomputed_edges) == 1  # the edge into 3:2


def test_datasets_are_columns_in_dependency_order_and_partitions_stack_by_index():
    graph = diamond()
    assert depths(graph) == {1: 0, 2: 1, 3: 1, 4: 0, 5: 2}
    nodes, _, labels = layout(graph)
    x = {d: xs for d, xs in zip(nodes["dataset"], nodes["x"], strict=True)}
    assert x[1] < x[4] < x[2] < x[3] < x[5]  # by depth, then by id: one column each
    for p, c in graph.edges:  # every edge goes left to right
        assert x[p[1]] < x[c[1]]
    ys = [y for d, y in zip(nodes["dataset"], nodes["y"], strict=True) if d == 2]
    assert ys == sorted(ys, reverse=True) and ys == [1.5, 0.5, -0.5, -1.5]  # index 0 on top, centred
    assert labels["dataset"] == [1, 4, 2, 3, 5] and labels["text"][-1] == "join #5 (2)"
    assert len(set(labels["y"])) == 1 and labels["y"][0] > max(nodes["y"])  # above the columns


def test_big_graphs_are_capped_keeping_lost_partitions():
    nodes = [node(1, i, "not computed") for i in range(3000)]
    nodes += [node(2, i, "lost" if i == 2999 else "held") for i in range(3000)]
    edges = [(("ds", 1, i), ("ds", 2, i)) for i in range(3000)]
    view = LineageView(max_nodes=1000)
    view.update(snap(LineageGraph(nodes, edges)))
    data = view.nodes_source.data
    assert len(data["id"]) == 1000 and data["dataset"].count(1) == data["dataset"].count(2) == 500
    assert "2:2999" in data["id"]  # the lost partition is kept
    assert all(len(xs) == 2 for xs in view.edges_source.data["xs"])
    assert 0 < len(view.edges_source.data["xs"]) <= 500
    assert view.figure.title.text == "Lineage: 6000 partitions in 2 datasets, lost 1, showing 1000"


def test_wide_shuffles_draw_at_most_max_edges_those_into_recomputed_partitions_first():
    nodes = [node(1, i) for i in range(100)] + [node(2, j, "recomputed" if j == 99 else "held") for j in range(100)]
    edges = [(("ds", 1, i), ("ds", 2, j)) for j in range(100) for i in range(100)]
    view = LineageView(max_edges=500)
    view.update(snap(LineageGraph(nodes, edges)))
    assert len(view.nodes_source.data["id"]) == 200 and len(view.edges_source.data["xs"]) == 500
    assert view.edges_source.data["color"][:100] == [COLORS["recomputed"]] * 100  # all 100 into 2:99
    assert view.figure.title.text.endswith("recomputed 1 and 500 of 10000 edges")


def test_graph_source_wins_over_the_snapshot_and_updates_only_on_change():
    calls: list[int] = []
    graph = diamond()

    def source() -> LineageGraph:
        calls.append(1)
        return graph

    view = LineageView(source)
    view.update(snap(LineageGraph([node(9, 0)], [])))
    assert len(view.nodes_source.data["id"]) == 16 and calls == [1]
    data = view.nodes_source.data
    view.update(snap(LineageGraph([], [])))
    assert view.nodes_source.data is data and calls == [1, 1]  # unchanged: not reassigned

    def broken() -> LineageGraph:
        raise RuntimeError("the cluster is closed")

    view.graph_source = broken
    view.update(snap(LineageGraph([], [])))  # keeps the last picture
    assert len(view.nodes_source.data["id"]) == 16
    assert "unavailable" in view.summary(snap(graph))


def test_summary_counts_states_per_dataset():
    text = LineageView().summary(snap(diamond()))
    assert text.splitlines()[0].startswith("Lineage: 16 partitions in 5 datasets")
    assert "op2 #2: 4 partitions (held 3, lost 1)" in text
    assert "op3 #3: 4 partitions (held 3, recomputed 1)" in text
    assert "op1 #1: 4 partitions (not computed 4)" in text and "lost: 2:1" in text


def test_to_png_draws_the_graph():
    png = LineageView().to_png(snap(diamond()), height=4.0)
    assert png[:4] == b"\x89PNG" and len(png) > 5000
    empty = LineageView().to_png(snap(LineageGraph([], [])))
    assert empty[:4] == b"\x89PNG"


# --- a real cluster ---------------------------------------------------------------------------


def slow_square(x):
    time.sleep(0.005)
    return x * x


def test_a_persisted_dataset_and_its_recovery_after_a_kill():
    import jupyter_bokeh

    with clamor.Cluster(workers=3) as cluster:
        ds = cluster.parallelize(list(range(240)), partitions=8).map(slow_square).persist()
        assert ds.count() == 240
        view = LineageView(lambda: ds.lineage())
        widget = jupyter_bokeh.BokehModel(view.root)
        sent: list[dict] = []
        widget.send = lambda content, buffers=None: sent.append(content)  # no kernel: record them
        view.update(cluster.snapshot())
        graph = ds.lineage()
        assert len(view.nodes_source.data["id"]) == len(graph.nodes) == 16  # parallelize + map
        assert sent and "ModelChanged" in "".join(str(m.get("payload", "")) for m in sent)
        mine = [r for r in rows(view.nodes_source) if r["dataset"] == ds.id]
        assert [r["state"] for r in mine] == ["held"] * 8
        assert [r["holder"] for r in mine] == ds.locations()
        assert len({r["x"] for r in mine}) == 1 and all(r["x"] > 0 for r in mine)  # right of its source

        victim = ds.locations()[0]
        lost = [i for i, w in enumerate(ds.locations()) if w == victim]
        cluster.kill_worker(victim)
        view.update(cluster.snapshot())
        states = {r["index"]: r["state"] for r in rows(view.nodes_source) if r["dataset"] == ds.id}
        assert sorted(i for i, s in states.items() if s == "lost") == lost
        assert "lost" in view.figure.title.text

        before = len(sent)
        assert ds.collect() == [x * x for x in range(240)]
        view.update(cluster.snapshot())
        assert len(sent) > before  # the widget was sent the recovery
        mine = [r for r in rows(view.nodes_source) if r["dataset"] == ds.id]
        assert sorted(r["index"] for r in mine if r["state"] == "recomputed") == lost
        assert all(r["holder"] != victim for r in mine)
        assert len(view.nodes_source.data["id"]) == len(ds.lineage().nodes)
        state = widget.get_state()
        assert "clamor-lineage" in json.dumps(state["render_bundle"])
        text = view.summary(cluster.snapshot())
        assert f"#{ds.id}: 8 partitions (held {8 - len(lost)}, recomputed {len(lost)})" in text
        png = view.to_png(cluster.snapshot(), height=3.5)
        assert png[:4] == b"\x89PNG"


def test_with_nothing_kept_the_title_says_so_and_what_runs():
    """A stage over datasets that keep nothing (a plain collect) leaves the graph empty:
    the title says why, and which stage runs now or ran last."""
    from clamor.runtime.observe.telemetry import StageRecord

    view = LineageView()
    empty = snap(LineageGraph([], []))
    view.update(empty)
    assert view.figure.title.text == "Lineage: no partition kept yet (persist() a dataset to see its lineage)"
    running = dataclasses.replace(
        empty, stages={4: {"total": 8, "done": 3}},
        stage_log=(StageRecord(4, "collect: map", 8, 1, time.time(), None, "running"),),
    )  # fmt: skip
    view.update(running)
    assert view.figure.title.text.endswith(" · running: collect: map (3/8)")
    ended = dataclasses.replace(empty, stage_log=(StageRecord(4, "collect: map", 8, 1, 0.0, 1.0, "ok"),))
    view.update(ended)
    assert view.figure.title.text.endswith(" · last: collect: map")


def test_the_datasets_of_a_running_collect_show_as_computing_then_as_not_kept():
    """A plain collect keeps nothing, yet the dashboard's graph shows its datasets: their
    partitions computing while it runs, not computed (not kept) once it ended."""
    import threading

    def slow(x):
        time.sleep(0.3)
        return x

    with clamor.Cluster(workers=2) as cluster:
        ds = cluster.parallelize(list(range(8)), partitions=4).map(slow)
        view = LineageView()
        collected: list = []
        action = threading.Thread(target=lambda: collected.append(ds.collect()))
        action.start()
        deadline = time.monotonic() + 20
        mine: list[dict] = []
        while time.monotonic() < deadline and not mine:
            view.update(cluster.snapshot())
            mine = [r for r in rows(view.nodes_source) if r["dataset"] == ds.id and r["state"] == "computing"]
            time.sleep(0.02)
        action.join(30)
        assert collected == [list(range(8))]
        assert len(mine) == 4 and "none kept" in view.figure.title.text
        view.update(cluster.snapshot())
        states = {r["state"] for r in rows(view.nodes_source) if r["dataset"] == ds.id}
        assert states == {"not computed"} and len(view.nodes_source.data["id"]) == 8  # with its source
