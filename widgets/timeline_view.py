"""Per-worker task bars, like Dask's task stream, with failures and recovery marked.

One row per worker; a bar per task attempt (:class:`~clamor.runtime.observe.telemetry.TaskRecord`)
from its start to its end (a running attempt to the snapshot's time). The colour says
what happened to it: failed, lost with its worker or cancelled first; otherwise what
kind of attempt it was (a speculative copy of a straggler, a rerun after a lost worker,
a recomputation of lost partitions from lineage), else ok / running. Speculative
copies are also hatched. Cluster events (a worker lost, a recovery, a speculation)
are markers on the worker's row, or a line across every row when no worker is named.

Only attempts that ended in the last ``window`` seconds (and at most ``max_tasks``)
are drawn, so an update stays cheap however long the cluster has run. x is in seconds
since the earliest task or event the view has seen.
"""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

from clamor.runtime.observe.snapshots import ClusterSnapshot
from clamor.runtime.observe.telemetry import Event, TaskRecord
from clamor.widgets.base import COLORS, View, set_data

#: Statuses whose colour wins over the attempt's kind.
_BAD = ("failed", "lost", "cancelled")

#: The outline of speculative copies (also hatched), darker than their fill.
SPECULATIVE_OUTLINE = "#5E2A4F"

#: Marker and colour of each event kind.
EVENT_STYLE = {
    "worker_lost": ("x", "#CC0000"),
    "recompute": ("diamond", COLORS["recompute"]),
    "speculation": ("triangle", COLORS["speculative"]),
    "stage_failed": ("square_x", COLORS["failed"]),
    "worker_added": ("circle", "#666666"),
}
#: Legend labels of events (``recompute`` would clash with the bars' entry).
EVENT_LABELS = {"worker_lost": "worker lost", "recompute": "recovery", "speculation": "speculation",
                "stage_failed": "stage failed", "worker_added": "worker added"}  # fmt: skip
#: matplotlib markers for the Bokeh ones.
_MPL_MARKERS = {"x": "x", "diamond": "D", "triangle": "^", "square_x": "s", "circle": "o"}

TASK_COLUMNS = ("attempt", "stage", "name", "index", "worker", "y", "start", "end",
                "duration", "status", "kind", "category", "color", "alpha", "line_color",
                "line_width", "hatch")  # fmt: skip
EVENT_COLUMNS = ("time", "kind", "label", "detail", "worker", "stage", "color", "marker", "size",
                 "y", "y0", "y1")  # fmt: skip


def kind_of(task: TaskRecord) -> str:
    """``"recompute"``, ``"speculative"``, ``"rerun"`` or ``"task"`` (in that precedence)."""
    if task.recompute:
        return "recompute"
    if task.speculative:
        return "speculative"
    if task.rerun:
        return "rerun"
    return "task"


def category_of(task: TaskRecord) -> str:
    """The legend entry (and colour key) of an attempt: a bad status, else its kind, else
    ``ok`` / ``running`` (a recomputation that finished well stays ``recompute``)."""
    if task.status in _BAD:
        return task.status
    kind = kind_of(task)
    return kind if kind != "task" else task.status


def shown_tasks(snapshot: ClusterSnapshot, window: float | None, max_tasks: int) -> list[TaskRecord]:
    """The attempts ending (or running) in the last ``window`` seconds, at most the newest
    ``max_tasks`` of them, oldest first."""
    now = snapshot.time
    tasks = list(snapshot.tasks)
    if window is not None:
        tasks = [t for t in tasks if (now if t.end is None else t.end) >= now - window]
    tasks.sort(key=lambda t: t.start)
    return tasks[-max_tasks:] if max_tasks > 0 else []


def shown_events(snapshot: ClusterSnapshot, window: float | None) -> list[Event]:
    """The events of the last ``window`` seconds."""
    if window is None:
        return list(snapshot.events)
    return [e for e in snapshot.events if e.time >= snapshot.time - window]


def earliest(snapshot: ClusterSnapshot) -> float:
    """The earliest task start or event time of ``snapshot`` (its time if it has none)."""
    times = [t.start for t in snapshot.tasks] + [e.time for e in snapshot.events]
    return min(times) if times else snapshot.time


def worker_rows(snapshot: ClusterSnapshot, tasks: list[TaskRecord], events: list[Event]) -> list[int]:
    """The workers to give a row: every worker the snapshot knows, and any a shown task
    or event names, in id order."""
    ids = {w.id for w in snapshot.workers} | {t.worker for t in tasks}
    ids |= {e.worker for e in events if e.worker is not None}
    return sorted(ids)


def task_columns(tasks: list[TaskRecord], rows: list[int], now: float, origin: float) -> dict[str, list]:
    """The bars' ``ColumnDataSource`` data (times in seconds since ``origin``)."""
    pos = {w: i for i, w in enumerate(rows)}
    data: dict[str, list] = {c: [] for c in TASK_COLUMNS}
    for t in tasks:
        end = now if t.end is None else t.end
        end = max(end, t.start)
        category = category_of(t)
        values = (t.attempt, t.stage, t.name, t.index, t.worker, pos[t.worker], t.start - origin,
                  end - origin, end - t.start, t.status, kind_of(t), category, COLORS[category],
                  0.55 if t.status == "running" else 0.9,
                  SPECULATIVE_OUTLINE if t.speculative else "white",
                  2.0 if t.speculative else 0.5, "/" if t.speculative else " ")  # fmt: skip
        for column, value in zip(TASK_COLUMNS, values, strict=True):
            data[column].append(value)
    return data


def event_columns(events: list[Event], rows: list[int], origin: float) -> dict[str, list]:
    """The event markers' data: on the worker's row, or across every row (marker on top)."""
    pos = {w: i for i, w in enumerate(rows)}
    top, bottom = -0.5, max(len(rows), 1) - 0.5
    data: dict[str, list] = {c: [] for c in EVENT_COLUMNS}
    for e in events:
        marker, color = EVENT_STYLE.get(e.kind, ("circle", "#666666"))
        row = pos.get(e.worker) if e.worker is not None else None
        y, y0, y1 = (top, top, bottom) if row is None else (row, row - 0.45, row + 0.45)
        values = (e.time - origin, e.kind, EVENT_LABELS.get(e.kind, e.kind), e.detail,
                  -1 if e.worker is None else e.worker, -1 if e.stage is None else e.stage, color, marker,
                  14 if e.kind == "worker_lost" else 7 if e.kind == "worker_added" else 10,
                  y, y0, y1)  # fmt: skip
        for column, value in zip(EVENT_COLUMNS, values, strict=True):
            data[column].append(value)
    return data


class TimelineView(View):
    """Task bars per worker with events; ``window``: seconds of history shown (``None``: all)."""

    title = "Task timeline"

    def __init__(self, window: float | None = 60.0, max_tasks: int = 1000,
                 width: int = 700, height: int = 240) -> None:  # fmt: skip
        from bokeh.models import (
            ColumnDataSource,
            FixedTicker,
            HoverTool,
            Legend,
            Range1d,
        )
        from bokeh.plotting import figure

        self.window = window
        self.max_tasks = max_tasks
        self._origin: float | None = None
        self._last_attempt: int | None = None
        self._rows: tuple[list[int], set[int]] | None = None
        self.source = ColumnDataSource({c: [] for c in TASK_COLUMNS})
        self.events_source = ColumnDataSource({c: [] for c in EVENT_COLUMNS})
        self._ticker = FixedTicker(ticks=[])
        fig = figure(
            width=width, height=height, title=self.title, css_classes=["clamor-timeline"],
            x_axis_label="seconds", y_range=Range1d(start=0.5, end=-0.5),
            tools="xpan,xwheel_zoom,box_zoom,reset,save", toolbar_location="above",
        )  # fmt: skip
        legend = Legend(location="top_left", label_text_font_size="8pt", spacing=0,
                        padding=4, glyph_height=12, glyph_width=12)  # fmt: skip
        fig.add_layout(legend, "right")
        bars = fig.hbar(
            y="y", left="start", right="end", height=0.8, source=self.source,
            fill_color="color", fill_alpha="alpha", line_color="line_color",
            line_width="line_width", hatch_pattern="hatch", hatch_color="white",
            hatch_alpha=0.6, legend_field="category",
        )  # fmt: skip
        fig.segment(x0="time", x1="time", y0="y0", y1="y1", source=self.events_source,
                    line_color="color", line_dash="dashed", line_alpha=0.7)  # fmt: skip
        marks = fig.scatter(x="time", y="y", marker="marker", size="size", source=self.events_source,
                            fill_color="color", line_color="color", line_width=2.5,
                            legend_field="label")  # fmt: skip
        fig.add_tools(HoverTool(renderers=[bars], tooltips=[
            ("stage", "@stage @name"), ("task", "@index (attempt @attempt)"),
            ("worker", "@worker"), ("status", "@status (@kind)"),
            ("start", "@start{0.000} s"), ("duration", "@duration{0.000} s"),
        ]))  # fmt: skip
        fig.add_tools(HoverTool(renderers=[marks], tooltips=[
            ("event", "@kind"), ("at", "@time{0.000} s"), ("detail", "@detail"),
        ]))  # fmt: skip
        fig.yaxis.ticker = self._ticker
        fig.ygrid.grid_line_color = None
        fig.yaxis.major_label_text_font_size = "8pt"
        self.figure = fig
        self.root = fig

    # --- live ---

    def _origin_for(self, snapshot: ClusterSnapshot) -> float:
        """Keeps x fixed while a cluster runs; starts again at anything earlier, or for
        another cluster's telemetry (attempt numbers only grow within one)."""
        last = max((t.attempt for t in snapshot.tasks), default=None)
        start = earliest(snapshot)
        restarted = last is not None and self._last_attempt is not None and last < self._last_attempt
        if self._origin is None or start < self._origin or restarted:
            self._origin = start
        if last is not None:
            self._last_attempt = last
        return self._origin

    def update(self, snapshot: ClusterSnapshot) -> None:
        """Assign the bars' and events' data (each once) for ``snapshot``."""
        tasks = shown_tasks(snapshot, self.window, self.max_tasks)
        events = shown_events(snapshot, self.window)
        rows = worker_rows(snapshot, tasks, events)
        origin = self._origin_for(snapshot)
        lost = {w.id for w in snapshot.workers if not w.alive}
        if (rows, lost) != self._rows:  # rare: set the axis only then
            self._rows = (rows, lost)
            self._ticker.ticks = list(range(len(rows)))
            self.figure.yaxis.major_label_overrides = {
                i: f"worker {w}" + (" (lost)" if w in lost else "") for i, w in enumerate(rows)
            }
            self.figure.y_range.start = max(len(rows), 1) - 0.5
        self.figure.xaxis.axis_label = f"seconds since {time.strftime('%H:%M:%S', time.localtime(origin))}"
        set_data(self.source, task_columns(tasks, rows, snapshot.time, origin))
        set_data(self.events_source, event_columns(events, rows, origin))
        title = self._title(snapshot, len(tasks))
        if self.figure.title.text != title:
            self.figure.title.text = title

    def _title(self, snapshot: ClusterSnapshot, shown: int) -> str:
        span = "all" if self.window is None else f"last {self.window:g} s"
        return f"{self.title}: {shown} of {len(snapshot.tasks)} attempts ({span})"

    # --- static ---

    def summary(self, snapshot: ClusterSnapshot, last_events: int = 5) -> str:
        """Attempts per status and kind, busy seconds per worker, the last few events."""
        tasks = list(snapshot.tasks)
        origin = earliest(snapshot)
        status = Counter(t.status for t in tasks)
        kinds = Counter(kind_of(t) for t in tasks)
        lines = [f"{self.title}: {len(tasks)} attempts on {len(snapshot.workers)} workers",
                 "  status: " + _counts(status), "  kinds: " + _counts(kinds)]  # fmt: skip
        alive = {w.id: w.alive for w in snapshot.workers}
        busy: dict[int, float] = {}
        count: Counter[int] = Counter()
        for t in tasks:
            end = snapshot.time if t.end is None else t.end
            busy[t.worker] = busy.get(t.worker, 0.0) + max(0.0, end - t.start)
            count[t.worker] += 1
        for w in worker_rows(snapshot, tasks, []):
            gone = "" if alive.get(w, True) else " (lost)"
            lines.append(f"  worker {w}{gone}: {count[w]} attempts, busy {busy.get(w, 0.0):.2f} s")
        events = list(snapshot.events)[-last_events:]
        lines.append(f"  events ({len(snapshot.events)}, last {len(events)}):" if events else "  events: none")
        for e in events:
            where = "" if e.worker is None else f" worker {e.worker}"
            lines.append(f"    +{e.time - origin:.2f} s {e.kind}{where}: {e.detail}")
        return "\n".join(lines)

    def draw(self, snapshot: ClusterSnapshot, ax: Any) -> None:
        """Bars per worker (``broken_barh``) in the same colours, event markers on top."""
        import matplotlib
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch

        # white hatches need hatchcolor (matplotlib 3.11); before, a hatch takes the edge colour
        hatch_color = {"hatchcolor": "white"} if _version(matplotlib.__version__) >= (3, 11) else {}

        tasks = shown_tasks(snapshot, self.window, self.max_tasks)
        events = shown_events(snapshot, self.window)
        rows = worker_rows(snapshot, tasks, events)
        origin = earliest(snapshot) if self._origin is None else self._origin
        data = task_columns(tasks, rows, snapshot.time, origin)
        for i in range(len(rows)):
            for hatched in (False, True):
                picked = [j for j, y in enumerate(data["y"]) if y == i and (data["hatch"][j] == "/") == hatched]
                if picked:
                    ax.broken_barh([(data["start"][j], data["duration"][j]) for j in picked], (i - 0.4, 0.8),
                                   facecolors=[data["color"][j] for j in picked],
                                   edgecolor=SPECULATIVE_OUTLINE if hatched else "white", **hatch_color,
                                   linewidth=1.5 if hatched else 0.3, hatch="//" if hatched else None)  # fmt: skip
        ev = event_columns(events, rows, origin)
        for j in range(len(ev["time"])):
            ax.vlines(ev["time"][j], ev["y0"][j], ev["y1"][j], colors=ev["color"][j], linestyles="dashed",
                      linewidth=1)  # fmt: skip
            ax.scatter([ev["time"][j]], [ev["y"][j]], marker=_MPL_MARKERS.get(ev["marker"][j], "o"),
                       color=ev["color"][j], s=ev["size"][j] ** 2 * 0.8, zorder=3, clip_on=False)  # fmt: skip
        lost = {w.id for w in snapshot.workers if not w.alive}
        ax.set_yticks(range(len(rows)), [f"worker {w}" + (" (lost)" if w in lost else "") for w in rows])
        ax.set_ylim(max(len(rows), 1) - 0.5, -0.5)
        ax.set_xlabel("seconds")
        ax.set_title(self._title(snapshot, len(tasks)), fontsize=9, loc="left")
        handles: list[Any] = [Patch(color=COLORS[c], label=c) for c in dict.fromkeys(data["category"])]
        for k in dict.fromkeys(ev["kind"]):
            marker, color = EVENT_STYLE.get(k, ("circle", "#666666"))
            handles.append(Line2D([], [], linestyle="", marker=_MPL_MARKERS.get(marker, "o"), color=color,
                                  label=EVENT_LABELS.get(k, k)))  # fmt: skip
        if handles:
            ax.legend(handles=handles, fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _counts(counter: Counter) -> str:
    return ", ".join(f"{k} {v}" for k, v in counter.most_common()) or "none"


def _version(text: str) -> tuple[int, ...]:
    """``"3.11.0rc1"`` -> ``(3, 11)``: the release's major and minor numbers."""
    return tuple(int("".join(c for c in part if c.isdigit()) or 0) for part in text.split(".")[:2])
