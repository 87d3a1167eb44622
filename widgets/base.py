"""What every view is: Bokeh models fed by cluster snapshots (DESIGN 8).

A view follows the ``source / root / update()`` shape of Dask's dashboard
components: it owns its ``ColumnDataSource`` objects, ``root`` is the Bokeh
model to show (a figure or a layout), and ``update(snapshot)`` refreshes the
sources from a :class:`~clamor.runtime.snapshots.ClusterSnapshot`. Views never
call the cluster: they read snapshots only, so they are tested on snapshots
made by hand as well as on real ones.

Where no widget can render (a plain terminal, nbconvert output), a view falls
back to ``summary(snapshot)`` (text) and ``to_png(snapshot)`` (a static image,
drawn with matplotlib).
"""

from __future__ import annotations

import io
from typing import Any

from clamor.runtime.snapshots import ClusterSnapshot

#: Colours shared by the views (colour-blind safe, Okabe-Ito).
COLORS = {
    "ok": "#0072B2",
    "running": "#56B4E9",
    "failed": "#D55E00",
    "lost": "#000000",
    "cancelled": "#999999",
    "speculative": "#CC79A7",
    "recompute": "#E69F00",
    "rerun": "#009E73",
    "held": "#0072B2",
    "recomputed": "#E69F00",
    "not computed": "#DDDDDD",
    "driver": "#D55E00",
    "peers": "#009E73",
}


class View:
    """Base class: subclasses build ``root`` (and their sources) in ``__init__``."""

    #: Shown above the view and in its text summary.
    title = "view"
    root: Any

    def update(self, snapshot: ClusterSnapshot) -> None:
        """Refresh the sources from ``snapshot`` (called on the publisher's thread)."""
        raise NotImplementedError

    def summary(self, snapshot: ClusterSnapshot) -> str:
        """A few lines of plain text saying what the view shows."""
        raise NotImplementedError

    def draw(self, snapshot: ClusterSnapshot, ax: Any) -> None:
        """Draw a static picture of ``snapshot`` on the matplotlib axes ``ax``."""
        raise NotImplementedError

    def to_png(self, snapshot: ClusterSnapshot, width: float = 8.0, height: float = 3.0) -> bytes:
        """The static picture as PNG bytes (for nbconvert output and the README)."""
        return render_png(lambda ax: self.draw(snapshot, ax), width, height, self.title)


def render_png(draw: Any, width: float, height: float, title: str) -> bytes:
    """Call ``draw(ax)`` on a fresh matplotlib figure (Agg, no display) and return PNG bytes."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10, loc="left")
    draw(ax)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()
