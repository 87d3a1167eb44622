"""Live views of a Clamor cluster: Bokeh figures shown as ipywidgets.

Each function returns a :class:`LiveView`; displaying it (the last expression of
a cell, or ``display(...)``) shows a widget that updates a few times a second
while stages run::

    import clamor.widgets as views
    views.dashboard(cluster)          # heatmap, replication, timeline, lineage
    views.heatmap(cluster, table)     # the pages of one arena array
    views.lineage(ds)                 # one dataset's partitions

The ``%clamor heatmap|timeline|lineage|dashboard`` magics call these (this
package registers them when loaded as an IPython extension, which the Clamor
kernel does). Without a widget front end the display is a text summary and a
static PNG.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clamor.runtime.errors import VIEW_PACKAGES, require_extra
from clamor.runtime.paging import arena, arena_names
from clamor.widgets.live import LiveView, close_all

if TYPE_CHECKING:
    from clamor.runtime.cluster import Cluster
    from clamor.runtime.data.dataset import Dataset

# The views draw with these (imported where used); without them, say which extra has them.
require_extra("the live views (clamor.widgets)", VIEW_PACKAGES)

__all__ = ["LiveView", "close_all", "dashboard", "heatmap", "lineage", "load_bokehjs", "replication", "timeline"]


def _given(cluster: Cluster | None) -> Cluster:
    if cluster is None:
        raise ValueError("no cluster given: pass one (clamor.widgets.dashboard(cluster)), or use "
                         "the views in the Clamor kernel or after %load_ext clamor")  # fmt: skip
    return cluster


_resolve: Callable[[Cluster | None], Cluster] = _given
_in_notebook: Callable[[], bool] = lambda: False


def attach(resolve: Callable[[Cluster | None], Cluster], in_notebook: Callable[[], bool]) -> None:
    """Called by the kernel's side when it loads the views (clamor.kernel.magics.views):
    ``resolve(cluster)`` gives the cluster to show for ``None`` (the session's) or for a
    stand-in (the kernel's lazy ``cluster``); ``in_notebook()`` says whether output goes to
    a notebook. So the views never import the kernel."""
    global _resolve, _in_notebook
    _resolve, _in_notebook = resolve, in_notebook


def _cluster(cluster: Cluster | None) -> Cluster:
    """The cluster to show: ``cluster`` itself, or as the kernel resolves it (:func:`attach`)."""
    return _resolve(cluster)


_bokehjs_loaded = False


#: Loads BokehJS from the Clamor server extension's copy (``clamor/static/bokeh/``, under
#: the page's base URL), synchronously so that the views' widgets, rendered next, find it;
#: a few hundred bytes in the saved notebook instead of BokehJS itself (~4 MB, twice).
_LOADER = """
(function () {
  if (window.Bokeh && window.Bokeh.version === "%(version)s") { return; }
  var config = document.getElementById("jupyter-config-data");
  var base = config ? JSON.parse(config.textContent).baseUrl : "/";
  var failed = [];
  %(files)s.forEach(function (name) {
    var request = new XMLHttpRequest();
    request.open("GET", base + "clamor/static/bokeh/js/" + name + "?v=%(version)s", false);
    try { request.send(); } catch (e) { failed.push(name); return; }
    if (request.status !== 200) { failed.push(name); return; }
    (0, eval)(request.responseText);
  });
  if (failed.length && element && element.append) {
    element.append("BokehJS could not be loaded from the Clamor server extension (" + failed +
                   "): the views need it; clamor.widgets.load_bokehjs(inline=True) puts it in the notebook.");
  }
})();
"""
#: The BokehJS bundles the views use (no math text: no mathjax bundle).
_BOKEHJS = ("bokeh.min.js", "bokeh-gl.min.js", "bokeh-widgets.min.js", "bokeh-tables.min.js")


def load_bokehjs(inline: bool | None = None) -> None:
    """Put BokehJS into the notebook page (jupyter_bokeh does not bundle it, and its CDN
    is unreachable offline). In a notebook server's kernel (``JPY_SESSION_NAME``, set by
    jupyter-server) a small loader fetches it from the Clamor server extension; elsewhere
    (nbclient, other front ends), or with ``inline=True``, it goes inline (~4 MB)."""
    import json
    import os

    from IPython.display import Javascript, display

    if inline is None:
        inline = "JPY_SESSION_NAME" not in os.environ
    if inline:
        from bokeh.io import output_notebook
        from bokeh.resources import INLINE

        output_notebook(INLINE, hide_banner=True)
        return
    import bokeh

    display(Javascript(_LOADER % {"version": bokeh.__version__, "files": json.dumps(_BOKEHJS)}))


def _load_bokehjs() -> None:
    """:func:`load_bokehjs`, once per kernel, in a notebook."""
    global _bokehjs_loaded
    if _bokehjs_loaded:
        return
    if _in_notebook():
        load_bokehjs()
        _bokehjs_loaded = True


def _show(view: Any, cluster: Cluster | None, live: bool) -> LiveView:
    arena_names.name_after_notebook(cluster)
    _load_bokehjs()
    return LiveView(view, cluster, live=live)


def heatmap(cluster: Cluster | None = None, var: Any = None, *, name: str | None = None,
            span: tuple[int, int] | None = None, live: bool = True) -> LiveView:  # fmt: skip
    """The page heatmap of the arena array ``var`` (``name``: its label; or the pages
    ``span``), or of the whole arena."""
    from clamor.widgets.heatmap_view import PageHeatmap

    cluster = _cluster(cluster)
    if var is not None:
        span = arena.page_span(var, cluster.page_size)
    return _show(PageHeatmap(variable=name, span=span), cluster, live)


def replication(cluster: Cluster | None = None, *, live: bool = True) -> LiveView:
    """Bytes served by the driver vs by peers over time, and holders per page."""
    from clamor.widgets.replication_view import ReplicationView

    return _show(ReplicationView(), _cluster(cluster), live)


def timeline(cluster: Cluster | None = None, *, live: bool = True) -> LiveView:
    """Per-worker task bars with failures, recomputation and speculative copies marked."""
    from clamor.widgets.timeline_view import TimelineView

    return _show(TimelineView(), _cluster(cluster), live)


def lineage(ds: Dataset | None = None, cluster: Cluster | None = None, *, live: bool = True) -> LiveView:
    """The lineage graph of dataset ``ds`` (or of every persisted dataset)."""
    from clamor.widgets.lineage_view import LineageView

    if ds is not None:
        cluster = ds._runner if cluster is None else cluster
        return _show(LineageView(ds.lineage), cluster, live)
    return _show(LineageView(), _cluster(cluster), live)


def dashboard(cluster: Cluster | None = None, ds: Dataset | None = None, *, var: Any = None, name: str | None = None,
              live: bool = True) -> LiveView:  # fmt: skip
    """Status, heatmap, replication, timeline and lineage together."""
    from clamor.widgets.dashboard_view import Dashboard

    cluster = _cluster(ds._runner if ds is not None and cluster is None else cluster)
    span = None if var is None else arena.page_span(var, cluster.page_size)
    graph = None if ds is None else ds.lineage
    return _show(Dashboard(variable=name, span=span, graph_source=graph), cluster, live)


def load_ipython_extension(ip: Any) -> None:
    """``%load_ext clamor.widgets``: the same as ``%load_ext clamor`` (the magics load the views)."""
    ip.extension_manager.load_extension("clamor")
