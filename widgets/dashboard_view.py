"""The dashboard: a status line and the four views together.

Heatmap and replication side by side on top, the timeline below, the lineage
graph at the bottom; one snapshot updates them all. The status line says how
many workers are alive, what runs and how many bytes the driver and the peers
served.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from clamor.runtime.observe.snapshots import ClusterSnapshot
from clamor.runtime.paging.arena import format_bytes
from clamor.widgets.base import View, render_grid
from clamor.widgets.heatmap_view import PageHeatmap
from clamor.widgets.lineage_view import LineageView
from clamor.widgets.replication_view import ReplicationView
from clamor.widgets.timeline_view import TimelineView


def status_line(snapshot: ClusterSnapshot) -> str:
    """One line: workers, the running stages' progress, bytes served, recovery counters."""
    alive = sum(w.alive for w in snapshot.workers)
    lost = len(snapshot.workers) - alive
    parts = [f"{alive} worker{'s' * (alive != 1)}" + (f" ({lost} lost)" if lost else "")]
    for stage in snapshot.stages.values():
        parts.append(f"stage {stage['done']}/{stage['total']} tasks")
    if not snapshot.stages:
        parts.append("idle")
    t = snapshot.totals
    parts.append(f"driver served {format_bytes(t.get('bytes_served_by_driver', 0))}, "
                 f"peers {format_bytes(t.get('bytes_served_by_peers', 0))}"
                 + (f", mapped in place {format_bytes(t['bytes_mapped'])}" if t.get("bytes_mapped") else ""))  # fmt: skip
    if memory := memory_line(snapshot):
        parts.append(memory)
    counters = [f"{t[k]} {k.removeprefix('tasks_')}" for k in
                ("tasks_rerun", "tasks_speculated", "tasks_recomputed") if t.get(k)]  # fmt: skip
    if counters:
        parts.append("tasks " + ", ".join(counters))
    return " · ".join(parts)


def memory_line(snapshot: ClusterSnapshot) -> str:
    """The live workers' memory against their budgets, ``""`` before anything is
    cached or kept: cached arena pages, partitions in memory, and those spilled to disk."""
    live = [w for w in snapshot.workers if w.alive]
    pages, kept = sum(w.cached_bytes for w in live), sum(w.partition_bytes for w in live)
    disk, budget = sum(w.disk_bytes for w in live), sum(w.memory_budget for w in live)
    if not (pages or kept or disk):
        return ""
    text = f"memory: pages {format_bytes(pages)}, partitions {format_bytes(kept)}"
    text += f" of {format_bytes(budget)}" if budget else ""
    return text + (f", {format_bytes(disk)} spilled to disk" if disk else "")


class Dashboard(View):
    """All views of one cluster; ``variable``/``span``: the heatmap's pages, ``graph_source``:
    the lineage of one dataset (default: every persisted dataset's)."""

    title = "Clamor dashboard"
    css = "dashboard"

    def __init__(
        self,
        variable: str | None = None,
        span: tuple[int, int] | None = None,
        graph_source: Callable[[], Any] | None = None,
    ) -> None:
        from bokeh.layouts import column, row
        from bokeh.models import Div

        # about 900 px wide: JupyterLab's output area with the file browser open
        self.heatmap = PageHeatmap(variable=variable, span=span, columns=48, width=450, height=230)
        self.replication = ReplicationView(width=440, height=200)
        self.timeline = TimelineView(width=900, height=220)
        self.lineage = LineageView(graph_source, width=900, height=260)
        self.views: list[View] = [self.heatmap, self.replication, self.timeline, self.lineage]
        self.status = Div(text="", css_classes=["clamor-status"], styles={"font-size": "13px"})
        self.root = column(
            self.status,
            row(self.heatmap.root, self.replication.root),
            self.timeline.root,
            self.lineage.root,
            css_classes=["clamor-dashboard-layout"],
        )

    def update(self, snapshot: ClusterSnapshot) -> None:
        text = status_line(snapshot)
        if self.status.text != text:
            self.status.text = text
        for view in self.views:
            view.update(snapshot)

    def summary(self, snapshot: ClusterSnapshot) -> str:
        parts = [f"{self.title}: {status_line(snapshot)}"]
        parts += [view.summary(snapshot) for view in self.views]
        return "\n\n".join(parts)

    def draw(self, snapshot: ClusterSnapshot, ax: Any) -> None:
        self.heatmap.draw(snapshot, ax)

    def to_png(self, snapshot: ClusterSnapshot, width: float = 11.0, height: float = 8.0) -> bytes:
        """The four views' static pictures on a 2 x 2 grid."""
        return render_grid([(v.title, lambda ax, v=v: v.draw(snapshot, ax)) for v in self.views],
                           width, height, f"{self.title}: {status_line(snapshot)}")  # fmt: skip
