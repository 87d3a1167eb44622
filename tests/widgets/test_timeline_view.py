"""The task timeline (widgets/timeline.py): bars, colours, events and window trimming on
hand-made snapshots; a killed worker and its recomputed tasks on a real cluster; the view
inside a ``jupyter_bokeh.BokehModel`` widget with no kernel (a dummy comm)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.observe.snapshots import (
    ClusterSnapshot,
    PageSnapshot,
    WorkerSnapshot,
)
from clamor.runtime.observe.telemetry import Event, TaskRecord
from clamor.widgets.base import COLORS
from clamor.widgets.timeline_view import EVENT_STYLE, SPECULATIVE_OUTLINE, TimelineView

import clamor

T0 = 1_700_000_000.0


def snap(tasks=(), events=(), now=T0 + 10, workers=(0, 1, 2), lost=()) -> ClusterSnapshot:
    empty = np.zeros(0, dtype=np.int64)
    pages = PageSnapshot(0, 4096, empty, empty, empty, empty, empty)
    return ClusterSnapshot(
        seq=1, time=now,
        workers=tuple(WorkerSnapshot(w, w not in lost) for w in workers),
        stages={}, stage_log=(), tasks=tuple(tasks), events=tuple(events), pages=pages,
        totals={}, history=(), lineage=LineageGraph([], []),
    )  # fmt: skip


def task(attempt, worker, start, end, status="ok", **kinds) -> TaskRecord:
    return TaskRecord(attempt, 1, "collect: map", attempt, worker, T0 + start,
                      None if end is None else T0 + end, status, **kinds)  # fmt: skip


def rows(source) -> list[dict]:
    data = source.data
    return [dict(zip(data, values, strict=True)) for values in zip(*data.values(), strict=True)]


# --- hand-made snapshots ---------------------------------------------------------------------


def test_colours_follow_status_then_kind():
    tasks = [
        task(1, 0, 0.0, 1.0),
        task(2, 1, 0.0, None, "running"),
        task(3, 2, 0.0, 0.5, "failed"),
        task(4, 0, 1.0, 2.0, "lost", recompute=True),  # lost wins over recompute
        task(5, 1, 1.0, 1.5, "cancelled", speculative=True),
        task(6, 2, 1.0, 2.0, speculative=True),
        task(7, 0, 2.0, 3.0, rerun=True),
        task(8, 1, 2.0, 3.0, recompute=True),  # recompute and ok: the recompute colour
    ]
    view = TimelineView()
    view.update(snap(tasks))
    got = {r["attempt"]: r for r in rows(view.source)}
    assert {a: (got[a]["kind"], got[a]["color"]) for a in got} == {
        1: ("task", COLORS["ok"]),
        2: ("task", COLORS["running"]),
        3: ("task", COLORS["failed"]),
        4: ("recompute", COLORS["lost"]),
        5: ("speculative", COLORS["cancelled"]),
        6: ("speculative", COLORS["speculative"]),
        7: ("rerun", COLORS["rerun"]),
        8: ("recompute", COLORS["recompute"]),
    }
    assert COLORS["lost"] == "#000000" and got[4]["category"] == "lost"
    # speculative copies also get a hatch and an outline in their colour, the others none
    assert [got[a]["hatch"] for a in (5, 6, 1)] == ["/", "/", " "]
    assert got[6]["line_color"] == SPECULATIVE_OUTLINE and got[1]["line_color"] == "white"
    required = {"attempt", "stage", "name", "index", "worker", "start", "end", "status", "kind",
                "color", "duration"}  # fmt: skip
    assert required <= set(view.source.data)


def test_running_bars_end_at_snapshot_time_and_x_is_relative():
    view = TimelineView()
    view.update(snap([task(1, 0, 2.0, 3.5), task(2, 1, 4.0, None, "running")], now=T0 + 9.0))
    first, running = rows(view.source)
    assert (first["start"], first["end"], first["duration"]) == pytest.approx((0.0, 1.5, 1.5))
    assert running["end"] == pytest.approx(7.0) and running["duration"] == pytest.approx(5.0)
    assert running["status"] == "running" and running["alpha"] < first["alpha"]


def test_one_row_per_worker_with_labels_and_lost_workers_marked():
    view = TimelineView()
    view.update(snap([task(1, 5, 0, 1), task(2, 2, 0, 1)], workers=(2, 5, 9), lost=(5,)))
    assert view.source.data["worker"] == [5, 2] and view.source.data["y"] == [1, 0]
    assert view.figure.yaxis.major_label_overrides == {0: "worker 2", 1: "worker 5 (lost)", 2: "worker 9"}
    assert list(view.figure.yaxis.ticker.ticks) == [0, 1, 2]
    assert (view.figure.y_range.start, view.figure.y_range.end) == (2.5, -0.5)  # worker 2 on top
    view.update(snap([task(1, 5, 0, 1)], workers=(2, 5, 9), lost=(5, 9)))  # same rows, one more lost
    assert view.figure.yaxis.major_label_overrides[2] == "worker 9 (lost)"


def test_window_and_task_cap_trim_old_bars():
    tasks = [task(i, i % 3, float(i), i + 0.5) for i in range(100)]
    now = T0 + 100.0
    view = TimelineView(window=10.0)
    view.update(snap(tasks, now=now))
    assert sorted(view.source.data["attempt"]) == list(range(90, 100))  # ended in the last 10 s
    view = TimelineView(window=None, max_tasks=25)
    view.update(snap(tasks, now=now))
    assert sorted(view.source.data["attempt"]) == list(range(75, 100))  # the newest 25
    view = TimelineView(window=10.0)
    view.update(snap(tasks + [task(100, 0, 1.0, None, "running")], now=now))
    assert 100 in view.source.data["attempt"]  # a long-running attempt stays, however old
    assert view.figure.title.text == "Task timeline: 11 of 101 attempts (last 10 s)"


def test_events_are_marked_on_their_worker_row_or_across_all_rows():
    events = [
        Event(T0 + 1.0, "worker_lost", "worker 1 was lost: SIGKILL", worker=1),
        Event(T0 + 1.2, "recompute", "2 partition(s) recomputed in 2 task(s), 0.30 s"),
        Event(T0 + 2.0, "speculation", "copy of task 3", worker=2, stage=1),
    ]
    view = TimelineView()
    view.update(snap([task(1, 0, 0.0, 3.0)], events, lost=(1,)))
    lost, recompute, spec = rows(view.events_source)
    assert (lost["kind"], lost["worker"], lost["y"], lost["marker"]) == ("worker_lost", 1, 1, "x")
    assert lost["color"] == EVENT_STYLE["worker_lost"][1] and lost["time"] == pytest.approx(1.0)
    assert (recompute["worker"], recompute["y0"], recompute["y1"]) == (-1, -0.5, 2.5)  # every row
    assert recompute["color"] == COLORS["recompute"] and spec["color"] == COLORS["speculative"]
    assert spec["y"] == 2 and spec["detail"] == "copy of task 3"
    assert {"time", "kind", "detail", "worker", "color"} <= set(view.events_source.data)


def test_x_origin_stays_put_while_the_cluster_runs():
    view = TimelineView(window=5.0)
    view.update(snap([task(1, 0, 0.0, 1.0)], now=T0 + 2))
    view.update(snap([task(1, 0, 0.0, 1.0), task(2, 0, 20.0, 21.0)], now=T0 + 22))
    assert view.source.data["start"] == [pytest.approx(20.0)]  # not re-based on the shown task
    view.update(snap([task(3, 0, 50.0, 51.0)], now=T0 + 52))  # older attempts rolled out of the log
    assert view.source.data["start"] == [pytest.approx(50.0)]
    view.update(snap([task(1, 0, 100.0, 101.0)], now=T0 + 102))  # another cluster: numbers restart
    assert view.source.data["start"] == [pytest.approx(0.0)]
    view.update(snap([task(1, 0, 100.0, 101.0)], events=[Event(T0 + 99, "worker_added")], now=T0 + 102))
    assert view.source.data["start"] == [pytest.approx(1.0)]  # something earlier: x starts there


def test_summary_counts_statuses_kinds_busy_time_and_events():
    tasks = [task(1, 0, 0, 1), task(2, 0, 1, 3, recompute=True), task(3, 1, 0, 0.5, "lost")]
    events = [Event(T0 + 0.5, "worker_lost", "worker 1 was lost", worker=1)]
    text = TimelineView().summary(snap(tasks, events, workers=(0, 1), lost=(1,)))
    assert "3 attempts on 2 workers" in text
    assert "status: ok 2, lost 1" in text and "kinds: task 2, recompute 1" in text
    assert "worker 0: 2 attempts, busy 3.00 s" in text
    assert "worker 1 (lost): 1 attempts, busy 0.50 s" in text
    assert "+0.50 s worker_lost worker 1: worker 1 was lost" in text


def test_to_png_draws_bars_and_events():
    tasks = [task(i, i % 3, i * 0.3, i * 0.3 + 0.25, recompute=i > 6, speculative=i == 4)
             for i in range(10)] + [task(10, 1, 3.0, None, "running")]  # fmt: skip
    events = [Event(T0 + 1.9, "worker_lost", "lost", worker=2), Event(T0 + 2.0, "recompute", "r")]
    png = TimelineView().to_png(snap(tasks, events, now=T0 + 3.5, lost=(2,)))
    assert png[:4] == b"\x89PNG" and len(png) > 5000


# --- a real cluster ---------------------------------------------------------------------------


def slow_double(x):
    time.sleep(0.01)
    return 2 * x


def test_a_killed_worker_appears_as_an_event_and_its_recomputed_tasks_are_marked():
    from clamor.widgets.lineage_view import LineageView

    with clamor.Cluster(workers=3) as cluster:
        ds = cluster.parallelize(list(range(160)), partitions=8).map(slow_double).persist()
        assert ds.count() == 160
        victim = ds.locations()[0]
        lost = [i for i, w in enumerate(ds.locations()) if w == victim]
        cluster.kill_worker(victim)
        assert ds.collect() == [2 * x for x in range(160)]
        snapshot = cluster.snapshot()

    timeline = TimelineView(window=None)
    timeline.update(snapshot)
    events = rows(timeline.events_source)
    gone = [e for e in events if e["kind"] == "worker_lost"]
    assert [e["worker"] for e in gone] == [victim]
    assert gone[0]["y"] == sorted(w.id for w in snapshot.workers).index(victim)
    assert any(e["kind"] == "recompute" for e in events)
    bars = rows(timeline.source)
    recomputed = [b for b in bars if b["kind"] == "recompute"]
    assert len(recomputed) >= len(lost)
    assert all(b["color"] == COLORS["recompute"] and b["status"] == "ok" for b in recomputed)
    assert all(b["worker"] != victim for b in recomputed)
    assert min(b["start"] for b in recomputed) > gone[0]["time"]  # after the loss
    assert "worker_lost" in timeline.summary(snapshot) and "recompute" in timeline.summary(snapshot)

    lineage = LineageView()  # the live graph in the same snapshot: those partitions recomputed
    lineage.update(snapshot)
    states = dict(zip(lineage.nodes_source.data["index"], lineage.nodes_source.data["state"], strict=True))
    assert sorted(i for i, s in states.items() if s == "recomputed") == lost


def test_the_view_inside_a_bokeh_widget_without_a_kernel_sends_patches():
    import jupyter_bokeh

    view = TimelineView()
    widget = jupyter_bokeh.BokehModel(view.root)
    sent: list[dict] = []
    widget.send = lambda content, buffers=None: sent.append(content)  # the dummy comm drops them
    state = widget.get_state()
    assert "clamor-timeline" in json.dumps(state["render_bundle"])
    view.update(snap([task(1, 0, 0.0, 1.0, recompute=True)], [Event(T0 + 0.5, "recompute", "r")]))
    payloads = "".join(str(m.get("payload", "")) for m in sent)
    assert sent and all(m["msg"] == "patch" for m in sent)
    assert "ModelChanged" in payloads and "recompute" in payloads
    assert view.source.document is widget._document  # the widget's document holds the sources
    n = len(sent)
    view.update(snap([task(1, 0, 0.0, 1.0, recompute=True)], [Event(T0 + 0.5, "recompute", "r")]))
    assert len(sent) == n  # nothing changed: nothing goes out
    view.update(snap([task(1, 0, 0.0, 1.0, recompute=True), task(2, 1, 0.5, 1.5)],
                     [Event(T0 + 0.5, "recompute", "r")]))  # fmt: skip
    assert len(sent) > n  # a new bar: the changed columns go out

