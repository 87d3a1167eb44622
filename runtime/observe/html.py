"""What a cluster looks like as a notebook cell's result (``_repr_html_``), as Dask's
``Client`` and ``LocalCluster`` show themselves: the workers, their memory,
what ran, and a link to the live dashboard. Built from what the driver knows, without
calling a worker, so a repr never waits.
"""

from __future__ import annotations

import html
from typing import Any

from clamor.runtime.paging.arena import format_bytes

#: Opens the dashboard under the notebook server's base URL (JupyterLab and Notebook
#: publish it in ``#jupyter-config-data``), in a new tab.
_OPEN = ("var c=document.getElementById('jupyter-config-data');"
         "var b=c?JSON.parse(c.textContent).baseUrl:'/';"
         "window.open(b+'{path}','_blank');return false;")  # fmt: skip


def _table(rows: list[tuple[str, str]]) -> str:
    cells = "".join(
        f"<tr><th style='text-align:left;padding-right:1em'>{html.escape(k)}</th>"
        f"<td style='text-align:left'>{v}</td></tr>"
        for k, v in rows
    )
    return f"<table style='margin:0'>{cells}</table>"


def cluster_html(summary: dict[str, Any]) -> str:
    """A cluster's summary (:meth:`~clamor.runtime.cluster_inspection.ClusterInspector.summary`):
    address, workers (live, lost, replaced), their memory budgets, stages and tasks run,
    pages read in place or served, and the dashboard link."""
    title = f"<b>Clamor cluster</b> <code>{html.escape(summary['address'])}</code>"
    if summary["closed"]:
        return f"<div>{title} (closed)</div>"
    workers = f"{summary['live']} live" + (f", {summary['lost']} lost" if summary["lost"] else "")
    if summary["replaced"]:
        workers += f", {summary['replaced']} replaced"
    pages = (f"{format_bytes(summary['bytes_mapped'])} mapped in place, "
             f"{format_bytes(summary['bytes_served_by_driver'])} served by the driver, "
             f"{format_bytes(summary['bytes_served_by_peers'])} by peers")  # fmt: skip
    rows = [
        ("Workers", f"{workers} ({html.escape(summary['launcher'])})"),
        ("Memory", f"{format_bytes(summary['memory_budget'])} budget in all"),
        ("Ran", f"{summary['stages_run']} stages, {summary['tasks_run']} tasks"),
        ("Pages", pages),
    ]
    if summary.get("dashboard_path"):
        link = f"<a href='#' onclick=\"{_OPEN.format(path=html.escape(summary['dashboard_path']))}\">open the dashboard</a>"
        rows.append(("Dashboard", link))
    return f"<div>{title}{_table(rows)}</div>"
