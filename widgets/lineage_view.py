"""The lineage graph: datasets as columns, their partitions as nodes, coloured by state.

Draws a :class:`~clamor.runtime.data.lineage_graph.LineageGraph`: every live persisted partition
and the datasets of the last actions, computing while their action runs
(``snapshot.lineage``, what the dashboard shows), or one dataset's partitions and
its ancestors' (``LineageView(lambda: ds.lineage())``). Datasets are columns left to
right in dependency order (a dataset's depth is one more than its deepest parent's),
partitions are stacked in their column by index, and an edge runs from each parent
partition to the partition computed from it. Lost partitions (their holder is gone)
and recomputed ones (rebuilt from lineage) are drawn bigger with a thick outline, so
a recovery shows as it happens. Hover gives the partition, its holder, the arena
epoch it read and how many pages.

At most ``max_nodes`` partitions are drawn: each dataset keeps its share, lost and
recomputed partitions first; the title says how many were left out. At most
``max_edges`` edges too (a wide shuffle has partitions squared): those into lost and
recomputed partitions first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from clamor.runtime.data.lineage_graph import LineageGraph, LineageNode
from clamor.runtime.observe.snapshots import ClusterSnapshot
from clamor.widgets.base import COLORS, View, set_data

logger = logging.getLogger("clamor.widgets")

#: Partition states, in legend order, and how a node of each is drawn:
#: (fill colour, outline colour, outline width, size).
STATE_STYLE = {
    "held": (COLORS["held"], "#004466", 1.0, 10),
    "recomputed": (COLORS["recomputed"], "#7A4F00", 3.0, 14),
    "lost": (COLORS["lost"], "#E00000", 3.5, 14),
    "computing": (COLORS["computing"], "#0072B2", 1.5, 10),
    "not computed": (COLORS["not computed"], "#999999", 1.0, 10),
}
NODE_COLUMNS = ("id", "dataset", "name", "index", "state", "persisted", "holder", "holder_label",
                "epoch", "epoch_label", "read_set_size", "ops", "x", "y", "color", "line_color",
                "line_width", "size")  # fmt: skip


def depths(graph: LineageGraph) -> dict[int, int]:
    """Each dataset's depth: 0 without parent datasets, else 1 + its parents' deepest."""
    parents: dict[int, set[int]] = {n.dataset: set() for n in graph.nodes}
    datasets = {n.key: n.dataset for n in graph.nodes}
    for p, c in graph.edges:
        dp, dc = datasets.get(p), datasets.get(c)
        if dp is not None and dc is not None and dp != dc:
            parents[dc].add(dp)
    depth: dict[int, int] = {}
    for d in parents:  # iterative DFS (graphs can be deep chains)
        stack = [d]
        while stack:
            top = stack[-1]
            todo = [p for p in parents[top] if p not in depth and p not in stack]
            if todo:
                stack.extend(todo)
                continue
            stack.pop()
            depth[top] = 1 + max((depth.get(p, 0) for p in parents[top]), default=-1)
    return depth


def activity(snapshot: ClusterSnapshot) -> str:
    """`` · running: NAME (done/total)`` for the stages running now, else `` · last: NAME``
    (the stage that ran last), else ``""``."""
    running = [r for r in snapshot.stage_log if r.end is None and r.stage in snapshot.stages]
    if running:
        parts = [f"{r.name or f'stage {r.stage}'} ({snapshot.stages[r.stage].get('done', 0)}/"
                 f"{snapshot.stages[r.stage].get('total', r.tasks)})" for r in running[-2:]]  # fmt: skip
        return " · running: " + ", ".join(parts)
    if snapshot.stage_log:
        last = snapshot.stage_log[-1]
        return f" · last: {last.name or f'stage {last.stage}'}"
    return ""


def columns(graph: LineageGraph) -> list[int]:
    """The datasets left to right: by depth, then by id (creation order)."""
    depth = depths(graph)
    return sorted(depth, key=lambda d: (depth[d], d))


def keep(graph: LineageGraph, max_nodes: int) -> list[LineageNode]:
    """The nodes drawn: all of them, or each dataset's share of ``max_nodes`` (lost and
    recomputed partitions first, then by index)."""
    if len(graph.nodes) <= max_nodes:
        return list(graph.nodes)
    by_dataset: dict[int, list[LineageNode]] = {}
    for n in graph.nodes:
        by_dataset.setdefault(n.dataset, []).append(n)
    share = max(1, max_nodes // max(1, len(by_dataset)))
    kept: list[LineageNode] = []
    for nodes in by_dataset.values():
        ranked = sorted(nodes, key=lambda n: (n.state not in ("lost", "recomputed"), n.index))
        kept += sorted(ranked[:share], key=lambda n: n.index)
    return kept[:max_nodes]


def layout(graph: LineageGraph, max_nodes: int = 2000,
           max_edges: int = 10000) -> tuple[dict[str, list], dict[str, list], dict[str, list]]:  # fmt: skip
    """``(nodes, edges, labels)`` data: one node row per drawn partition, the edges
    between drawn partitions (``xs``/``ys`` pairs), one label per dataset column."""
    nodes = keep(graph, max_nodes)
    order = columns(graph)
    x_of = {d: i for i, d in enumerate(order)}
    stacks: dict[int, list[LineageNode]] = {d: [] for d in order}
    for n in nodes:
        stacks[n.dataset].append(n)
    pos: dict[Any, tuple[float, float]] = {}
    for d, stack in stacks.items():
        stack.sort(key=lambda n: n.index)
        for rank, n in enumerate(stack):
            pos[n.key] = (float(x_of[d]), (len(stack) - 1) / 2 - rank)  # centred, index 0 on top
    data: dict[str, list] = {c: [] for c in NODE_COLUMNS}
    for n in nodes:
        fill, line, width, size = STATE_STYLE.get(n.state, STATE_STYLE["not computed"])
        values = (n.id, n.dataset, n.name, n.index, n.state, n.persisted, n.holder,
                  "-" if n.holder is None else f"worker {n.holder}", n.epoch,
                  "-" if n.epoch is None else str(n.epoch), n.read_set_size, " > ".join(n.ops),
                  *pos[n.key], fill, line, width, size)  # fmt: skip
        for column, value in zip(NODE_COLUMNS, values, strict=True):
            data[column].append(value)
    edges: dict[str, list] = {"xs": [], "ys": [], "color": []}
    states = {n.key: n.state for n in nodes}
    drawn = [(p, c) for p, c in graph.edges if p in pos and c in pos]
    if len(drawn) > max_edges:
        drawn.sort(key=lambda e: states[e[1]] not in ("lost", "recomputed"))  # stable
        drawn = drawn[:max_edges]
    for p, c in drawn:
        edges["xs"].append([pos[p][0], pos[c][0]])
        edges["ys"].append([pos[p][1], pos[c][1]])
        edges["color"].append(COLORS["recomputed"] if states[c] == "recomputed" else "#888888")
    top = max((len(s) - 1) / 2 for s in stacks.values()) + 0.8 if stacks else 0.8
    labels: dict[str, list] = {"x": [], "y": [], "text": [], "dataset": []}
    for d, stack in stacks.items():
        name = stack[0].name if stack else next(n.name for n in graph.nodes if n.dataset == d)
        total = sum(1 for n in graph.nodes if n.dataset == d)
        labels["x"].append(float(x_of[d]))
        labels["y"].append(top)
        labels["text"].append(f"{name} #{d} ({total})")
        labels["dataset"].append(d)
    return data, edges, labels


class LineageView(View):
    """The lineage graph of ``snapshot.lineage``, or of ``graph_source()`` if given
    (e.g. ``lambda: ds.lineage()`` for one dataset and its ancestors)."""

    title = "Lineage"

    def __init__(self, graph_source: Callable[[], LineageGraph] | None = None, max_nodes: int = 2000,
                 max_edges: int = 10000, width: int = 700, height: int = 320) -> None:  # fmt: skip
        from bokeh.models import ColumnDataSource, HoverTool, Legend
        from bokeh.plotting import figure

        self.graph_source = graph_source
        self.max_nodes = max_nodes
        self.max_edges = max_edges
        self._signature: Any = None
        self.nodes_source = ColumnDataSource({c: [] for c in NODE_COLUMNS})
        self.edges_source = ColumnDataSource({"xs": [], "ys": [], "color": []})
        self.labels_source = ColumnDataSource({"x": [], "y": [], "text": [], "dataset": []})
        fig = figure(width=width, height=height, title=self.title, css_classes=["clamor-lineage"],
                     tools="pan,wheel_zoom,box_zoom,reset,save", toolbar_location="above")  # fmt: skip
        legend = Legend(location="top_left", label_text_font_size="8pt", spacing=0, padding=4)
        fig.add_layout(legend, "right")
        fig.multi_line(xs="xs", ys="ys", source=self.edges_source, line_color="color", line_alpha=0.45,
                       line_width=1)  # fmt: skip
        nodes = fig.scatter(x="x", y="y", size="size", source=self.nodes_source, marker="circle",
                            fill_color="color", line_color="line_color", line_width="line_width",
                            legend_field="state")  # fmt: skip
        fig.text(x="x", y="y", text="text", source=self.labels_source, text_align="center",
                 text_baseline="bottom", text_font_size="8pt")  # fmt: skip
        fig.add_tools(HoverTool(renderers=[nodes], tooltips=[
            ("partition", "@id"), ("dataset", "@name #@dataset"), ("state", "@state"),
            ("holder", "@holder_label"), ("epoch", "@epoch_label"), ("pages read", "@read_set_size"),
            ("ops", "@ops"),
        ]))  # fmt: skip
        fig.axis.visible = False
        fig.grid.visible = False
        fig.x_range.range_padding = 0.15
        fig.y_range.range_padding = 0.1
        self.figure = fig
        self.root = fig

    def graph(self, snapshot: ClusterSnapshot) -> LineageGraph | None:
        """The graph to draw: ``graph_source()`` (``None`` if it fails) or the snapshot's."""
        if self.graph_source is None:
            return snapshot.lineage
        try:
            return self.graph_source()
        except Exception:  # e.g. the dataset's cluster closed: keep the last picture
            logger.debug("lineage graph_source failed", exc_info=True)
            return None

    def update(self, snapshot: ClusterSnapshot) -> None:
        """Redraw if the graph changed (nodes, states, holders or edges); the title also
        says which stages run (or ran last), so the view is not blank while a stage over
        datasets that keep nothing runs."""
        graph = self.graph(snapshot)
        if graph is None:
            return
        signature = (tuple((n.key, n.state, n.holder, n.epoch) for n in graph.nodes), len(graph.edges))
        if signature != self._signature:
            self._signature = signature
            nodes, edges, labels = layout(graph, self.max_nodes, self.max_edges)
            set_data(self.nodes_source, nodes)
            set_data(self.edges_source, edges)
            set_data(self.labels_source, labels)
            self._shown = (len(nodes["id"]), len(edges["xs"]))
        title = self._title(graph, *self._shown) + activity(snapshot)
        if self.figure.title.text != title:
            self.figure.title.text = title

    def _title(self, graph: LineageGraph, shown: int, edges: int | None = None) -> str:
        """Partitions and datasets, how many are lost / recomputed, and what was left out."""
        if not graph.nodes:
            return f"{self.title}: no partition kept yet (persist() a dataset to see its lineage)"
        kept = "" if any(n.persisted for n in graph.nodes) else ", none kept"
        datasets = len({n.dataset for n in graph.nodes})
        counts = graph.states()
        marks = "".join(f", {s} {counts[s]}" for s in ("lost", "recomputed") if counts.get(s))
        cut = f", showing {shown}" if shown < len(graph.nodes) else ""
        if edges is not None and edges >= self.max_edges and len(graph.edges) > edges:
            cut += f" and {edges} of {len(graph.edges)} edges"
        plural = "" if datasets == 1 else "s"
        return f"{self.title}: {len(graph.nodes)} partitions in {datasets} dataset{plural}{kept}{marks}{cut}"

    _shown = (0, 0)  # nodes and edges drawn (a large graph is cut)

    def summary(self, snapshot: ClusterSnapshot) -> str:
        """Partitions per state for each dataset, and which partitions are lost."""
        graph = self.graph(snapshot)
        if graph is None:
            return f"{self.title}: the graph is unavailable"
        lines = [self._title(graph, len(graph.nodes))]
        for d in columns(graph):
            nodes = [n for n in graph.nodes if n.dataset == d]
            counts: dict[str, int] = {}
            for n in nodes:
                counts[n.state] = counts.get(n.state, 0) + 1
            states = ", ".join(f"{s} {counts[s]}" for s in STATE_STYLE if counts.get(s))
            lines.append(f"  {nodes[0].name} #{d}: {len(nodes)} partitions ({states})")
        lost = [n.id for n in graph.nodes if n.state == "lost"]
        if lost:
            lines.append("  lost: " + ", ".join(lost[:20]) + (" ..." if len(lost) > 20 else ""))
        return "\n".join(lines)

    def draw(self, snapshot: ClusterSnapshot, ax: Any) -> None:
        """The same layout with matplotlib: edges as lines, nodes as a scatter."""
        from matplotlib.collections import LineCollection
        from matplotlib.lines import Line2D

        graph = self.graph(snapshot) or LineageGraph([], [])
        nodes, edges, labels = layout(graph, self.max_nodes, self.max_edges)
        if edges["xs"]:
            segments = [list(zip(xs, ys, strict=True)) for xs, ys in zip(edges["xs"], edges["ys"], strict=True)]
            ax.add_collection(LineCollection(segments, colors=edges["color"], alpha=0.45, linewidths=0.8))
        ax.scatter(nodes["x"], nodes["y"], s=[s**2 for s in nodes["size"]], c=nodes["color"],
                   edgecolors=nodes["line_color"], linewidths=nodes["line_width"], zorder=3)  # fmt: skip
        for x, y, text in zip(labels["x"], labels["y"], labels["text"], strict=True):
            ax.text(x, y, text, ha="center", va="bottom", fontsize=7)
        ax.set_axis_off()
        ys = nodes["y"] + labels["y"]
        ax.set_xlim(-0.5, max(labels["x"], default=0.0) + 0.5)
        ax.set_ylim(min(ys, default=0.0) - 0.7, max(ys, default=0.0) + 0.7)
        ax.set_title(self._title(graph, len(nodes["id"]), len(edges["xs"])), fontsize=9, loc="left")
        shown = [s for s in STATE_STYLE if s in set(nodes["state"])]
        handles = [Line2D([], [], marker="o", linestyle="", markerfacecolor=STATE_STYLE[s][0],
                          markeredgecolor=STATE_STYLE[s][1], label=s) for s in shown]  # fmt: skip
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
