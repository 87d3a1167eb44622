"""Cluster snapshots and stats as JSON-ready data: the REST API's bodies.

Pure functions of a :class:`~clamor.runtime.observe.snapshots.ClusterSnapshot` and of
``cluster.stats()`` (both fetched from the kernel by the handlers); nothing here
does I/O, so the shapes are tested on snapshots made by hand as well.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from clamor.runtime.observe.snapshots import PAGE_FIELDS, ClusterSnapshot, PageSnapshot


def plain(value: Any) -> Any:
    """``value`` with numpy scalars/arrays, tuples, sets and dataclasses turned into JSON
    types (mapping keys become strings; non-finite floats become None)."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return plain(dataclasses.asdict(value))
    if isinstance(value, np.ndarray):
        return plain(value.tolist())
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if isinstance(value, np.generic):
        return plain(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def summary(kernel_id: str, address: str, stats: Mapping[str, Any],
            snapshot: ClusterSnapshot) -> dict[str, Any]:  # fmt: skip
    """``clusters/{id}``: what the cluster did so far, in one object."""
    workers = stats.get("workers", [])
    alive = [w for w in snapshot.workers if w.alive]
    counters = {k: v for k, v in stats.items() if k not in ("workers", "scheduler")}
    return plain({
        "kernel_id": kernel_id,
        "address": address,
        "time": snapshot.time,
        "running": snapshot.running,
        "workers": len(alive),
        "workers_lost": len(snapshot.workers) - len(alive),
        "stages_run": stats.get("stages_run", 0),
        "tasks_run": stats.get("tasks_run", 0),
        "bytes_served_by_driver": stats.get("bytes_served_by_driver",
                                            snapshot.totals.get("bytes_served_by_driver", 0)),
        "bytes_served_by_peers": stats.get("bytes_served_by_peers",
                                           snapshot.totals.get("bytes_served_by_peers", 0)),
        "bytes_mapped": stats.get("bytes_mapped", snapshot.totals.get("bytes_mapped", 0)),
        "pages_fetched": stats.get("pages_fetched", 0),
        "pages_mapped": stats.get("pages_mapped", 0),
        "faults": stats.get("faults", 0),
        "active_stages": snapshot.stages,
        "worker_rss_bytes": sum(int(w.get("rss_bytes", 0)) for w in workers),
        "counters": counters,
        "totals": snapshot.totals,
    })  # fmt: skip


def workers(snapshot: ClusterSnapshot, stats: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``clusters/{id}/workers``: each worker as the scheduler sees it (alive, running,
    tasks done, slow), with its process counters from ``stats`` when given."""
    details = {int(w["id"]): w for w in (stats or {}).get("workers", []) if "id" in w}
    out = []
    for w in snapshot.workers:
        row = dataclasses.asdict(w)
        row.update({k: v for k, v in details.get(w.id, {}).items() if k not in row})
        out.append(row)
    return plain({"time": snapshot.time, "workers": out})


def _counts(pages: PageSnapshot) -> dict[str, int]:
    return {
        "pages": len(pages),
        "pages_touched": int(np.count_nonzero(pages.requests)),
        "requests": int(pages.requests.sum()),
        "driver_bytes": int(pages.driver_bytes.sum()),
        "peer_bytes": int(pages.peer_bytes.sum()),
        "max_holders": int(pages.holders.max()) if len(pages) else 0,
    }


def pages(snapshot: ClusterSnapshot, var: str | None = None) -> dict[str, Any]:
    """``clusters/{id}/pages[?var=NAME]``: a summary per named variable and per-page
    counters (columns ``page``, ``variable``, ``requests``, ``driver_bytes``,
    ``peer_bytes``, ``holders``, ``version``) of the arena's used pages, or of
    ``var``'s pages only. ``KeyError`` names the known variables if ``var`` is unknown."""
    snap = snapshot.pages
    if var is not None:
        if var not in snap.variables:
            known = ", ".join(sorted(snap.variables)) or "none"
            raise KeyError(f"no arena variable {var!r} (known: {known})")
        snap = snap.select(*snap.variables[var])
    variables = [
        {"name": name, "first_page": first, "end_page": end, **_counts(snap.select(first, end))}
        for name, (first, end) in sorted(snap.variables.items(), key=lambda item: item[1])
    ]
    numbers = np.arange(snap.first_page, snap.first_page + len(snap), dtype=np.int64)
    columns: dict[str, Any] = {"page": numbers, "variable": [snap.owner(int(p)) for p in numbers]}
    columns.update({field: getattr(snap, field) for field in PAGE_FIELDS})
    return plain({
        "time": snapshot.time,
        "page_size": snap.page_size,
        "first_page": snap.first_page,
        "variable": var,
        "totals": _counts(snap),
        "variables": variables,
        "pages": columns,
    })  # fmt: skip


def lineage(snapshot: ClusterSnapshot) -> dict[str, Any]:
    """``clusters/{id}/lineage``: the live lineage graph (nodes, edges by node id) and how
    many partitions are in each state (held, lost, recomputed, ...)."""
    graph = snapshot.lineage
    return plain({"time": snapshot.time, "states": graph.states(), **graph.to_dict()})


def tasks(snapshot: ClusterSnapshot, stage: int | None = None) -> dict[str, Any]:
    """``clusters/{id}/tasks[?stage=N]``: task attempts (newest last), stages (active ones
    with their counts, and the log), and cluster events."""
    attempts = [t for t in snapshot.tasks if stage is None or t.stage == stage]
    stages = [s for s in snapshot.stage_log if stage is None or s.stage == stage]
    return plain({
        "time": snapshot.time,
        "active_stages": snapshot.stages,
        "stages": stages,
        "tasks": attempts,
        "events": snapshot.events,
    })  # fmt: skip
