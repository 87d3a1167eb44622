"""What every view is: Bokeh models fed by cluster snapshots.

A view follows the ``source / root / update()`` shape of Dask's dashboard
components: it owns its ``ColumnDataSource`` objects, ``root`` is the Bokeh
model to show (a figure or a layout), and ``update(snapshot)`` refreshes the
sources from a :class:`~clamor.runtime.observe.snapshots.ClusterSnapshot`. Views never
call the cluster: they read snapshots only, so they are tested on snapshots
made by hand as well as on real ones.

Where no widget can render (a plain terminal, nbconvert output), a view falls
back to ``summary(snapshot)`` (text) and ``to_png(snapshot)`` (a static image,
drawn with matplotlib).
"""

from __future__ import annotations

import io
from typing import Any

from clamor.runtime.observe.snapshots import ClusterSnapshot

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
    "computing": "#56B4E9",
    "driver": "#D55E00",
    "peers": "#009E73",
    "mapped": "#0072B2",
}


class View:
    """Base class: subclasses build ``root`` (and their sources) in ``__init__``."""

    #: Shown above the view and in its text summary.
    title = "view"
    #: The widget's CSS class is ``clamor-<css>`` (the browser tests find views by it).
    css = "view"
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
    return render_grid([(title, draw)], width, height)


def render_grid(panels: list[tuple[str, Any]], width: float, height: float, title: str = "") -> bytes:
    """``(title, draw(ax))`` panels on a grid of at most two columns, as PNG bytes."""
    from matplotlib.figure import Figure

    columns = min(2, len(panels))
    rows = -(-len(panels) // columns)
    fig = Figure(figsize=(width, height), dpi=100, layout="constrained")
    if title:
        fig.suptitle(title, fontsize=10, x=0.01, horizontalalignment="left")
    for i, (name, draw) in enumerate(panels):
        ax = fig.add_subplot(rows, columns, i + 1)
        ax.set_title(name, fontsize=9, loc="left")
        draw(ax)
    out = io.BytesIO()
    fig.savefig(out, format="png")
    return out.getvalue()


def set_data(source: Any, data: dict[str, Any], inline: int = 64) -> None:
    """Give ``source`` these columns, sending only what changed (views update a few times
    a second, and each changed column is a message to the browser).

    Columns of at most ``inline`` rows go as lists (inside the patch message, where a
    numpy array would be a separate binary buffer: two more messages each); the same
    set of columns with new values updates only those columns.
    """
    import numpy as np

    def plain(column: Any) -> Any:
        if isinstance(column, np.ndarray) and len(column) <= inline:
            return column.tolist()
        return column

    def same(a: Any, b: Any) -> bool:
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == b.shape
                    and a.dtype == b.dtype and bool(np.array_equal(a, b)))  # fmt: skip
        return bool(a == b)

    new = {k: plain(v) for k, v in data.items()}
    old = source.data
    if set(new) != set(old) or any(len(v) != len(new[next(iter(new))]) for v in new.values()):
        source.data = new
        return
    changed = {k: v for k, v in new.items() if not same(old[k], v)}
    if not changed:
        return
    n = len(next(iter(new.values()))) if new else 0
    if any(len(old[k]) != n for k in old):
        source.data = new
    else:
        source.data.update(changed)
