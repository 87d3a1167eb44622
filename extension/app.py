"""The ``clamor`` jupyter-server extension app.

Enabled by default when the package is installed
(``etc/jupyter/jupyter_server_config.d/clamor.json``); it serves, under the
server's ``base_url``:

- ``clamor/``: the clusters of the server's running kernels, with links;
- ``clamor/dashboard/{kernel_id}[/heatmap|replication|timeline|lineage]``: live views;
- ``clamor/api/clusters[/{kernel_id}[/workers|pages|lineage|tasks]]``: JSON;
- ``clamor/static/bokeh/``: BokehJS, from the installed bokeh.

The data comes from the kernels' clusters (runtime/observe/cluster_registry.py, the
``Observer`` service of clamor.runtime.observe.observer), queried off the IOLoop.
"""

from __future__ import annotations

from typing import Any

from clamor.extension.clusters import ClusterSource
from clamor.extension.handlers import handlers
from clamor.extension.pages import LiveDocuments
from jupyter_core.paths import jupyter_runtime_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Float, Integer


class ClamorExtension(ExtensionApp):
    """REST API and live dashboards for the Clamor clusters of this server's kernels."""

    name = "clamor"
    extension_url = "/clamor/"
    load_other_extensions = True

    query_timeout = Float(10.0, help="Seconds a query to a kernel's cluster may take.").tag(config=True)
    cache_seconds = Float(0.3, help="Seconds an answer from a cluster is reused by other requests.").tag(
        config=True
    )
    max_live_pages = Integer(32, help="Open dashboard pages kept live at most.").tag(config=True)
    live_page_idle = Float(300.0, help="Seconds without a poll after which a page's view is dropped.").tag(
        config=True
    )

    clusters: ClusterSource
    live_documents: LiveDocuments

    def initialize_settings(self) -> None:
        self.clusters = ClusterSource(
            self._registry_dirs, self._kernel_ids, timeout=self.query_timeout, max_age=self.cache_seconds
        )
        self.live_documents = LiveDocuments(self.max_live_pages, self.live_page_idle)

    def initialize_handlers(self) -> None:
        self.handlers.extend(handlers())

    def _kernel_ids(self) -> list[str]:
        return list(self.serverapp.kernel_manager.list_kernel_ids())

    def _registry_dirs(self) -> list[str]:
        """Where kernels register: Jupyter's runtime dir as the kernels see it (the same
        environment) and the server's own runtime and connection-file dirs."""
        server = self.serverapp
        dirs: list[Any] = [jupyter_runtime_dir(), getattr(server, "runtime_dir", None),
                           getattr(server.kernel_manager, "connection_dir", None)]  # fmt: skip
        return [str(d) for d in dirs if d]

    async def stop_extension(self) -> None:
        self.live_documents.drop()
        self.clusters.close()
