"""The kernel's side of the cluster registry (:mod:`clamor.runtime.observe.cluster_registry`).

A kernel a Jupyter server started registers its cluster under its own kernel id
(from its connection file), so that the server extension finds it; before that,
arena pages are named after the notebook's variables. :func:`watch` keeps the
registry in step with the notebook after every cell.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clamor.runtime.observe import cluster_registry
from clamor.runtime.paging import arena_names

if TYPE_CHECKING:
    from clamor.runtime.cluster import Cluster

logger = logging.getLogger("clamor.kernel.registration")


def kernel_id() -> str | None:
    """This kernel's id (from its connection file ``kernel-<id>.json``), or None outside
    a kernel a Jupyter server started. Outside a kernel ipykernel is not imported, and is
    not imported here either (its import pulls in debugpy: slow, and it once hung a
    test process for good while tracing was being probed)."""
    if "ipykernel.kernelapp" not in sys.modules:
        return None
    try:
        from ipykernel.kernelapp import IPKernelApp
    except ImportError:
        return None
    if not IPKernelApp.initialized():  # instance() would create an app
        return None
    name = os.path.basename(IPKernelApp.instance().connection_file or "")
    if name.startswith("kernel-") and name.endswith(".json") and len(name) > 12:
        return name[len("kernel-"):-len(".json")]
    return None


def publish(cluster: Cluster, kernel: str | None = None,
            directory: str | os.PathLike | None = None) -> Path | None:  # fmt: skip
    """Register ``cluster`` for this kernel (``kernel``: its id, default :func:`kernel_id`);
    the entry's path, or None outside a server's kernel or when it cannot be written."""
    kernel = kernel or kernel_id()
    if kernel is None:
        return None
    cluster.dashboard_path = f"clamor/dashboard/{kernel}"  # its HTML repr links there
    name_variables(cluster)
    return cluster_registry.publish(cluster, kernel, directory)


def name_variables(cluster: Cluster) -> None:
    """Name arena pages after the notebook's variables, so the server's page listing says
    which array a page belongs to (the widgets do the same when shown)."""
    try:
        arena_names.name_after_notebook(cluster)
    except Exception:
        logger.debug("cannot name arena variables", exc_info=True)


def refresh(namespace: dict[str, Any], kernel: str | None = None,
            directory: str | os.PathLike | None = None) -> None:  # fmt: skip
    """Keep the entry in step with the notebook: withdraw clusters closed behind the
    session's back (``cluster.close()``), and publish an open ``clamor.Cluster`` the
    user's cells made (``c = clamor.Cluster(4)``) when none is published."""
    from clamor.runtime.cluster import Cluster

    published = cluster_registry.published()
    for cluster in published:
        if cluster.closed:
            cluster_registry.withdraw(cluster)
    if any(not c.closed for c in published):
        return
    for value in list(namespace.values()):
        if isinstance(value, Cluster) and not value.closed:
            publish(value, kernel, directory)
            return


def watch(shell: Any) -> None:
    """Call :func:`refresh` on ``shell``'s namespace after every cell (the kernel does this)."""
    if kernel_id() is None:
        return

    def post_run_cell(*_: Any) -> None:
        try:
            refresh(shell.user_ns)
        except Exception:
            logger.debug("refreshing the cluster registry failed", exc_info=True)

    shell.events.register("post_run_cell", post_run_cell)
