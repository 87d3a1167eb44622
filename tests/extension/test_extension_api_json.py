"""The REST API's bodies (extension/api.py) and the live documents (extension/pages.py),
on snapshots made by hand: shapes, per-variable sums, JSON-cleanliness, patches."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from clamor.extension import api, pages
from clamor.runtime.data.lineage_graph import LineageGraph
from clamor.runtime.observe.snapshots import (
    ClusterSnapshot,
    PageSnapshot,
    WorkerSnapshot,
)
from clamor.runtime.observe.telemetry import Event, StageRecord, TaskRecord

PAGE = 4096


def make_snapshot(seq: int = 1, requests: list[int] | None = None) -> ClusterSnapshot:
    n = 10
    req = np.array(requests or [0, 3, 1, 0, 0, 5, 0, 0, 2, 0], np.uint64)
    pages_ = PageSnapshot(
        first_page=100, page_size=PAGE, requests=req,
        driver_bytes=req * PAGE, peer_bytes=np.where(req > 2, PAGE, 0).astype(np.uint64),
        holders=np.minimum(req, 2).astype(np.uint16), version=np.ones(n, np.uint32),
        variables={"a": (100, 104), "b": (105, 110)},
    )  # fmt: skip
    now = time.time()
    tasks = (
        TaskRecord(1, 1, "collect: map", 0, 0, now - 1, now - 0.5, "ok"),
        TaskRecord(2, 1, "collect: map", 1, 1, now - 1, None, "running"),
        TaskRecord(3, 2, "count", 0, 1, now - 0.2, now - 0.1, "failed"),
    )
    return ClusterSnapshot(
        seq=seq, time=now,
        workers=(WorkerSnapshot(0, True, 0, 1), WorkerSnapshot(1, True, 1, 1), WorkerSnapshot(2, False)),
        stages={1: {"total": 2, "pending": 0, "running": 1, "done": 1, "speculative": 0}},
        stage_log=(StageRecord(1, "collect: map", 2, 1, now - 1, None, "running"),
                   StageRecord(2, "count", 1, 1, now - 0.2, now - 0.1, "failed")),
        tasks=tasks,
        events=(Event(now - 2, "worker_lost", "worker 2 lost", worker=2),),
        pages=pages_,
        totals={"bytes_served_by_driver": int(req.sum()) * PAGE, "bytes_served_by_peers": 3 * PAGE,
                "epoch": np.int64(1)},
        history=((now - 1, 0, 0), (now, int(req.sum()) * PAGE, 3 * PAGE)),
        lineage=LineageGraph([], []),
    )  # fmt: skip


def roundtrip(body: object) -> object:
    return json.loads(json.dumps(body, allow_nan=False))


def test_pages_sums_per_variable_and_lists_every_page() -> None:
    body = roundtrip(api.pages(make_snapshot()))
    assert body["page_size"] == PAGE and body["first_page"] == 100
    assert body["pages"]["page"] == list(range(100, 110))
    assert body["pages"]["requests"] == [0, 3, 1, 0, 0, 5, 0, 0, 2, 0]
    assert body["pages"]["variable"][:5] == ["a", "a", "a", "a", ""]
    a, b = body["variables"]
    assert (a["name"], a["first_page"], a["end_page"]) == ("a", 100, 104)
    assert (a["requests"], a["pages_touched"], a["driver_bytes"]) == (4, 2, 4 * PAGE)
    assert (b["requests"], b["pages"], b["max_holders"], b["peer_bytes"]) == (7, 5, 2, PAGE)
    assert body["totals"]["requests"] == 11


def test_pages_of_one_variable_and_an_unknown_one() -> None:
    body = roundtrip(api.pages(make_snapshot(), "b"))
    assert body["variable"] == "b"
    assert body["pages"]["page"] == [105, 106, 107, 108, 109]
    assert body["totals"]["requests"] == 7
    with pytest.raises(KeyError, match="no arena variable 'c'.*a, b"):
        api.pages(make_snapshot(), "c")


def test_workers_tasks_lineage_summary_are_plain_json() -> None:
    snap = make_snapshot()
    stats = {"stages_run": 2, "tasks_run": 3, "bytes_served_by_driver": 11 * PAGE,
             "workers": [{"id": 0, "pid": 10, "rss_bytes": 5}, {"id": 1, "pid": 11, "rss_bytes": 7}],
             "scheduler": {"workers": {0: {}}}}  # fmt: skip
    workers = roundtrip(api.workers(snap, stats))["workers"]
    assert [(w["id"], w["alive"], w.get("pid")) for w in workers] == [(0, True, 10), (1, True, 11),
                                                                      (2, False, None)]  # fmt: skip
    tasks = roundtrip(api.tasks(snap))
    assert [t["status"] for t in tasks["tasks"]] == ["ok", "running", "failed"]
    assert tasks["tasks"][1]["end"] is None
    assert tasks["active_stages"]["1"]["running"] == 1
    assert tasks["events"][0]["kind"] == "worker_lost"
    assert [t["attempt"] for t in roundtrip(api.tasks(snap, stage=2))["tasks"]] == [3]
    assert roundtrip(api.lineage(snap)) == {"time": snap.time, "states": {}, "nodes": [], "edges": []}
    summary = roundtrip(api.summary("k1", "127.0.0.1:1", stats, snap))
    assert (summary["workers"], summary["workers_lost"], summary["stages_run"]) == (2, 1, 2)
    assert summary["worker_rss_bytes"] == 12 and summary["running"] is True
    assert api.plain({"x": float("nan"), 1: np.float32(2.5)}) == {"x": None, "1": 2.5}


def test_live_document_sends_only_what_changed() -> None:
    first = make_snapshot(1)
    doc = pages.LiveDocument("kernel-1", "heatmap", pages.make_view("heatmap", first), first)
    item = doc.item()
    assert item["root_id"] == doc.view.root.id and item["doc"]["roots"]
    assert doc.patch(first) is None  # nothing new
    assert doc.patch(make_snapshot(2)) is None  # a new snapshot, same numbers
    patch = doc.patch(make_snapshot(3, [9, 3, 1, 0, 0, 5, 0, 0, 2, 0]))
    assert patch is not None
    kinds = {e["kind"] for e in patch["events"]}
    assert "ColumnDataChanged" in kinds
    json.dumps(patch)  # buffers are inline: plain JSON


def test_make_view_rejects_unknown_names() -> None:
    snap = make_snapshot()
    with pytest.raises(KeyError, match="no view"):
        pages.make_view("pie", snap)
    with pytest.raises(KeyError, match="no arena variable"):
        pages.make_view("heatmap", snap, "zzz")
    assert pages.make_view("heatmap", snap, "a").title == "pages of a"


def test_live_documents_expire_least_recent_first() -> None:
    snap = make_snapshot()
    store = pages.LiveDocuments(limit=2, idle=60)
    docs = [pages.LiveDocument(f"k{i}", "replication", pages.make_view("replication", snap), snap)
            for i in range(3)]  # fmt: skip
    for d in docs:
        store.add(d)
    assert store.get(docs[0].id) is None and store.get(docs[2].id) is docs[2]
    store.drop({"k1"})
    assert store.get(docs[2].id) is None and store.get(docs[1].id) is docs[1]


def test_script_json_cannot_close_the_script_element() -> None:
    text = pages._script_json({"name": "</script><script>alert(1)</script>"})
    assert "</script>" not in text and json.loads(text)["name"].startswith("</script>")
