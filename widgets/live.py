"""A view shown in a notebook and kept live from the cluster's snapshots.

:class:`LiveView` wraps a :class:`~clamor.widgets.base.View` in a jupyter_bokeh
``BokehModel`` (an ipywidget, so it renders in JupyterLab 4 and Notebook 7) and
subscribes it to ``cluster.publisher``: each snapshot updates the view's sources
on the publisher's thread, and Bokeh sends the changes over the widget's comm
while the cell that runs the stage is still busy.

Where widgets cannot render, the display falls back: ``text/plain`` is the view's
text summary (a terminal IPython prints it) and ``image/png`` a static picture
(what nbconvert output and viewers without the widget manager show).
"""

from __future__ import annotations

import base64
import functools
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any

from clamor.runtime.observe.snapshots import ClusterSnapshot
from clamor.widgets.base import View

if TYPE_CHECKING:
    from clamor.runtime.cluster import Cluster

logger = logging.getLogger("clamor.widgets")

#: Live views not closed yet, to close them with their cluster (``close_all``).
_live: weakref.WeakSet[LiveView] = weakref.WeakSet()


class LiveView:
    """``view`` drawn from ``cluster``'s snapshots; ``live=False`` draws it once.

    ``static``: also put a PNG into the display bundle (the nbconvert fallback).
    """

    def __init__(self, view: View, cluster: Cluster, *, live: bool = True, static: bool = True) -> None:
        self.view = view
        self.static = static
        self._cluster = weakref.ref(cluster)
        self._lock = threading.Lock()
        self.updates = 0
        self.snapshot: ClusterSnapshot = cluster.snapshot()
        view.update(self.snapshot)
        self.widget = _bokeh_model(view.root)
        self.widget.add_class("clamor-view")
        self.widget.add_class(f"clamor-{getattr(view, 'css', 'view')}")
        self._unsubscribe = cluster.publisher.subscribe(self._on_snapshot) if live else None
        _live.add(self)

    @property
    def live(self) -> bool:
        return self._unsubscribe is not None

    def _on_snapshot(self, snapshot: ClusterSnapshot) -> None:
        """On the publisher's thread: one held batch of source changes per snapshot."""
        with self._lock:
            if snapshot.seq <= self.snapshot.seq:
                return
            self.snapshot = snapshot
            doc = self.view.root.document
            if doc is not None:
                doc.hold("combine")
            try:
                self.view.update(snapshot)
            finally:
                if doc is not None:
                    doc.unhold()
            self.updates += 1

    def refresh(self) -> None:
        """Draw a snapshot taken now (e.g. after a cell ran with the publisher idle)."""
        cluster = self._cluster()
        if cluster is not None and not cluster.closed:
            self._on_snapshot(cluster.snapshot())

    def close(self) -> None:
        """Stop updating and close the widget."""
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.widget.close()
        _live.discard(self)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict:
        bundle = self.widget._repr_mimebundle_(include=include, exclude=exclude) or {}
        if isinstance(bundle, tuple):
            bundle = bundle[0]
        with self._lock:
            snapshot = self.snapshot
            bundle["text/plain"] = self.view.summary(snapshot)
            if self.static:
                try:
                    png = self.view.to_png(snapshot)
                except Exception:
                    logger.exception("drawing the static %s failed", self.view.title)
                else:
                    bundle["image/png"] = base64.b64encode(png).decode()
        return bundle

    def __repr__(self) -> str:
        return self.view.summary(self.snapshot)


def _bokeh_model(root: Any) -> Any:
    """A jupyter_bokeh ``BokehModel`` of ``root`` whose ``close`` may run twice."""
    return _model_class()(root, combine_events=True)


@functools.cache
def _model_class() -> type:
    """``BokehModel`` with an idempotent ``close`` (4.1's raises ``KeyError`` on a second
    call, which its ``__del__`` makes after ours). Built on first use: importing
    jupyter_bokeh at kernel start would cost every kernel the Bokeh import."""
    from jupyter_bokeh import BokehModel

    class SafeBokehModel(BokehModel):
        def close(self) -> None:
            if not getattr(self, "_clamor_closed", False):
                self._clamor_closed = True
                super().close()

    return SafeBokehModel


def close_all() -> None:
    """Close every live view (the kernel does this when its cluster stops)."""
    for view in list(_live):
        view.close()
